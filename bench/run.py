#!/usr/bin/env python3
"""The scdlfs benchmark driver: one command, one machine (root, /dev/fuse, Debian).

    bench/run.py            # the full benchmark: regenerates docs/benchmarks.md and its PNG
    bench/run.py --quick    # the reduced variant (CI): small dataset, one run each,
                            # checks that every system read the right bytes

It installs what is missing (Debian: fuse3 s3fs rclone nginx-light fonts-dejavu-core;
crates.io: s3s-fs 0.14.1 into the work directory; PyPI: boto3 into a venv), builds the
release binaries, generates the synthetic dataset, serves it from an S3-compatible
server on 127.0.0.1 behind the link-emulating proxy (bench/src/proxy.rs), and reads
epochs in three orders through every system. Only loopback addresses are used, and every
S3 client gets explicit dummy keys.

The `torch` system is the way PyTorch users read: bionemo-scdl's SingleCellMemMapDataset
through a DataLoader with 2 workers and the scdlfs package's sampler
(bench/torch_loader.py), on scdlfs and on a local copy of the flat archive. Run alone
(`--systems torch`), it updates only its own section of docs/benchmarks.md.
"""

import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(REPO, "target", "release")
BENCH = os.path.join(RELEASE, "scdlfs-bench")
SCDLFS = os.path.join(RELEASE, "scdlfs")
BUCKET = "bench"
KEY, SECRET = "bench", "benchbench"
ORDERS = ["windows", "blocks", "random"]
TORCH = "PyTorch DataLoader"
TORCH_ORDERS = ["windows", "blocks"]  # the orders of the scdlfs package's samplers
TORCH_BEGIN, TORCH_END = "<!-- pytorch section: begin -->", "<!-- pytorch section: end -->"
CHILDREN = []  # (Popen, description), ended at exit
MOUNTS = []  # mountpoints to unmount at exit


def log(msg):
    print("[bench] " + msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit("%s exited with %s" % (what, proc.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("%s did not listen on %d" % (what, port))


def spawn(cmd, what, env=None, stdout=None, stderr=None):
    proc = subprocess.Popen(cmd, env=env, stdout=stdout or subprocess.DEVNULL,
                            stderr=stderr or subprocess.DEVNULL, start_new_session=True)
    CHILDREN.append((proc, what))
    return proc


def stop(proc, sig=signal.SIGTERM, timeout=30):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def unmount(path):
    if is_mounted(path):
        subprocess.run(["umount", "-l", path], stderr=subprocess.DEVNULL)


def cleanup():
    for m in MOUNTS:
        unmount(m)
    for proc, _ in reversed(CHILDREN):
        stop(proc, timeout=10)
    for m in MOUNTS:
        unmount(m)


def peak_rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def clean_env():
    env = dict(os.environ)
    # Dummy keys, never a metadata service; CA-bundle variables break rclone.
    for k in list(env):
        if k.endswith("CA_BUNDLE") or k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            del env[k]
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_EC2_METADATA_DISABLED="true",
               AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1")
    return env


# ---------------------------------------------------------------- setup

def ensure_tools(args):
    need = []
    for cmd, pkg in [("fusermount3", "fuse3"), ("s3fs", "s3fs"), ("rclone", "rclone"),
                     ("nginx", "nginx-light")]:
        if shutil.which(cmd) is None and not (cmd == "nginx" and args.server != "s3s-nginx"):
            need.append(pkg)
    if not args.quick and not os.path.exists(args.font):
        need.append("fonts-dejavu-core")
    if need:
        log("installing " + " ".join(need))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + need, env=env,
            stdout=subprocess.DEVNULL)
    if args.server == "s3s-nginx":
        s3s = os.path.join(args.work, "tools", "bin", "s3s-fs")
        if not os.path.exists(s3s):
            log("installing s3s-fs 0.14.1 from crates.io into %s (a few minutes)" % os.path.dirname(s3s))
            run(["cargo", "install", "s3s-fs", "--version", "0.14.1", "--features", "binary", "--locked",
                 "--root", os.path.join(args.work, "tools")],
                env=dict(os.environ, CARGO_TARGET_DIR=os.path.join(args.work, "tools", "target")))
        args.s3s_fs = s3s
    # Python for the chunk loader: boto3 (the repo's test venv has it; else a small venv).
    test_venv = os.environ.get("SCDLFS_VENV", os.path.join(REPO, ".venv"))
    for py in [os.path.join(test_venv, "bin", "python"), os.path.join(args.work, "venv", "bin", "python")]:
        if os.path.exists(py) and subprocess.run([py, "-c", "import boto3"], stderr=subprocess.DEVNULL).returncode == 0:
            args.python = py
            break
    else:
        venv = os.path.join(args.work, "venv")
        log("creating a venv with boto3 at " + venv)
        run([sys.executable, "-m", "venv", venv])
        run([os.path.join(venv, "bin", "pip"), "install", "-q", "boto3==1.40.*"])
        args.python = os.path.join(venv, "bin", "python")
    if "torch" in args.systems.split(","):
        # The test venv (torch, bionemo-scdl) with the scdlfs package installed from this tree.
        py = os.path.join(test_venv, "bin", "python")
        if not os.path.exists(py):
            sys.exit("the torch system needs the venv of scripts/setup-python-venv at %s" % test_venv)
        log("installing the scdlfs Python package into %s" % test_venv)
        run([py, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-build-isolation",
             "--no-deps", os.path.join(REPO, "crates", "scdlfs-python")],
            env=dict(os.environ, PATH=os.path.join(test_venv, "bin") + os.pathsep + os.environ["PATH"]))
        args.torch_python = py
    if args.server == "moto":
        args.moto = os.path.join(REPO, ".venv", "bin", "moto_server")
        if not os.path.exists(args.moto):
            args.moto = shutil.which("moto_server") or sys.exit("moto_server not found (scripts/setup-python-venv)")
    log("building the release binaries")
    run(["cargo", "build", "--release", "-q", "-p", "scdlfs", "-p", "scdlfs-bench"], cwd=REPO)


def generate(args, name, size_mb):
    ds = os.path.join(args.work, "s3root", BUCKET, name)
    digests = os.path.join(args.work, "digests", name)
    if os.path.exists(digests + ".json") and os.path.isdir(ds):
        return json.load(open(digests + ".json"))
    shutil.rmtree(ds, ignore_errors=True)
    os.makedirs(os.path.dirname(ds), exist_ok=True)
    os.makedirs(os.path.dirname(digests), exist_ok=True)
    log("generating %s (%d MB)" % (name, size_mb))
    run([BENCH, "gen", "--out", ds, "--digests", digests, "--size-mb", str(size_mb),
         "--chunk-rows", str(args.chunk_rows)], stdout=subprocess.DEVNULL)
    return json.load(open(digests + ".json"))


NGINX_CONF = """daemon off;
master_process on;
worker_processes 2;
user root;
pid {work}/nginx/nginx.pid;
error_log {work}/nginx/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    default_type application/octet-stream;
    client_body_temp_path {work}/nginx/tmp;
    proxy_temp_path {work}/nginx/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {work}/s3root;
        # Bucket-level requests (ListObjects, HeadBucket, ...) go to s3s-fs.
        location ~ ^/[^/]+/?$ {{
            proxy_pass http://127.0.0.1:{s3s_port};
            proxy_set_header Host $http_host;
            proxy_buffering off;
        }}
        # Object GET/HEAD (with Range, ETag, If-Match) straight from the files; a key that
        # is a directory is a 404 as on S3; anything else goes to s3s-fs.
        location / {{
            if ($args != "") {{ proxy_pass http://127.0.0.1:{s3s_port}; }}
            if ($request_method !~ ^(GET|HEAD)$) {{ proxy_pass http://127.0.0.1:{s3s_port}; }}
            proxy_set_header Host $http_host;
            try_files $uri =404;
        }}
    }}
}}
"""


def start_server(args, datasets):
    """The S3-compatible server on 127.0.0.1; returns its endpoint."""
    logs = os.path.join(args.work, "logs")
    if args.server == "s3s-nginx":
        s3s_port, port = free_port(), free_port()
        proc = spawn([args.s3s_fs, "--host", "127.0.0.1", "--port", str(s3s_port), "--access-key", KEY,
                      "--secret-key", SECRET, os.path.join(args.work, "s3root")], "s3s-fs",
                     stderr=open(os.path.join(logs, "s3s-fs.log"), "w"))
        wait_port(s3s_port, proc, "s3s-fs")
        os.makedirs(os.path.join(args.work, "nginx", "tmp"), exist_ok=True)
        conf = os.path.join(args.work, "nginx", "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(work=args.work, port=port, s3s_port=s3s_port))
        proc = spawn(["nginx", "-c", conf], "nginx", stderr=open(os.path.join(logs, "nginx.log"), "w"))
        wait_port(port, proc, "nginx")
        return "http://127.0.0.1:%d" % port
    port = free_port()
    proc = spawn([args.moto, "-H", "127.0.0.1", "-p", str(port)], "moto_server")
    wait_port(port, proc, "moto_server")
    endpoint = "http://127.0.0.1:%d" % port
    req = urllib.request.Request(endpoint + "/" + BUCKET, method="PUT")
    urllib.request.urlopen(req).read()
    for name in datasets:
        run([BENCH, "upload", "--endpoint", endpoint, "--bucket", BUCKET, "--prefix", name,
             "--src", os.path.join(args.work, "s3root", BUCKET, name)], env=clean_env())
    return endpoint


def start_proxy(args, endpoint):
    upstream = endpoint.replace("http://", "")
    proc = spawn([BENCH, "proxy", "--upstream", upstream, "--rate-mbps", str(args.rate_mbps),
                  "--latency-ms", str(args.latency_ms)], "proxy", stdout=subprocess.PIPE,
                 stderr=open(os.path.join(args.work, "logs", "proxy.log"), "w"))
    ports = json.loads(proc.stdout.readline())
    return "http://" + ports["listen"], "http://" + ports["stats"]


def proxy_bytes(stats_url):
    return json.loads(urllib.request.urlopen(stats_url).read())["bytes_down"]


def probe(endpoint, prefix, concurrency, max_mb):
    out = subprocess.run([BENCH, "s3probe", "--endpoint", endpoint, "--bucket", BUCKET, "--prefix", prefix,
                          "--concurrency", str(concurrency), "--max-mb", str(max_mb)],
                         check=True, capture_output=True, text=True, env=clean_env())
    return json.loads(out.stdout)


# ---------------------------------------------------------------- systems

class Ctx:
    pass


def read_epoch(ctx, dataset_dir, order, epoch, hints=True, limit=None):
    cmd = [BENCH, "read", "--dataset", dataset_dir, "--digests", ctx.digests, "--order", order,
           "--seed", str(ctx.seed), "--epoch", str(epoch)]
    if not hints:
        cmd.append("--no-hints")
    if limit:
        cmd += ["--time-limit", str(limit)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("reader failed on %s (%s): %s" % (dataset_dir, order, out.stderr.strip()))
    return json.loads(out.stdout)


def read_torch_epoch(ctx, dataset_dir, order, epoch, hints=True, limit=None):
    cmd = [ctx.torch_python, os.path.join(REPO, "bench", "torch_loader.py"), "--dataset", dataset_dir,
           "--digests", ctx.digests, "--order", order, "--seed", str(ctx.seed), "--epoch", str(epoch)]
    if not hints:
        cmd.append("--no-hints")
    if limit:
        cmd += ["--time-limit", str(limit)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=clean_env())
    if out.returncode != 0:
        raise RuntimeError("the DataLoader failed on %s (%s): %s" % (dataset_dir, order, out.stderr.strip()[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_mounted(path, proc, what, probe_file, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s before mounting" % (what, proc.returncode))
        if is_mounted(path) and os.path.exists(probe_file):
            return
        time.sleep(0.2)
    raise RuntimeError("%s did not mount %s" % (what, path))


def fresh_dir(path):
    unmount(path)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def mount_and_read(ctx, system, cmd, env, mnt, dataset_dir, epochs, reader=read_epoch):
    """Mounts with `cmd` (foreground), runs `epochs` [(label, order, epoch, hints, limit, prefill)]
    with `reader`, records each, then unmounts. The daemon's peak RSS is read at the end."""
    MOUNTS.append(mnt)
    logf = open(os.path.join(ctx.work, "logs", system.split()[0] + ".log"), "a")
    proc = spawn(cmd, system, env=env, stderr=logf, stdout=logf)
    results = []
    try:
        wait_mounted(mnt, proc, system, os.path.join(dataset_dir, "header.sch"))
        for label, order, epoch, hints, limit, prefill in epochs:
            if prefill and (order == "random" or not results[-1]["completed"]):
                for name in ("data.npy", "row_ptr.npy", "col_ptr.npy"):
                    with open(os.path.join(dataset_dir, name), "rb") as f:
                        while f.read(8 << 20):
                            pass
            before = proxy_bytes(ctx.stats)
            r = reader(ctx, dataset_dir, order, epoch, hints, limit)
            r["bytes_fetched"] = proxy_bytes(ctx.stats) - before
            r["system"], r["order"] = label, order
            results.append(r)
        rss = peak_rss_kib(proc.pid)
        for r in results:
            r["daemon_peak_rss_kib"] = rss
    finally:
        if proc.poll() is None:
            stop(proc)
        unmount(mnt)
    return results


def sys_local(ctx, order, run_i):
    r = read_epoch(ctx, ctx.local_dir, order, run_i, True, None)
    r.update(system="local disk", order=order, bytes_fetched=0, daemon_peak_rss_kib=None)
    return [r]


def sys_scdlfs(ctx, order, run_i, hints, dataset=None, label_suffix="", warm=True, reader=read_epoch, prefix=""):
    dataset = dataset or ctx.name
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
    cmd = [SCDLFS, "mount", "s3://" + BUCKET, mnt, "--endpoint-url", ctx.proxy, "--region", "us-east-1",
           "--cache-dir", cache, "--cache-size", ctx.cache_size, "--foreground", "--log-level", "warn"]
    h = "hints" if hints else "no hints"
    epochs = [("%sscdlfs cold, %s%s" % (prefix, h, label_suffix), order, 2 * run_i, hints, ctx.limit, False)]
    if warm:
        # Warm: the next epoch on the same mount; after an incomplete cold epoch the files
        # are read through first, so that the cache holds the whole dataset.
        epochs.append(("%sscdlfs warm, %s" % (prefix, h), order, 2 * run_i + 1, hints, ctx.limit, True))
    return mount_and_read(ctx, "scdlfs", cmd, clean_env(), mnt, os.path.join(mnt, dataset), epochs, reader)


def torch_local_copy(ctx):
    """The flat archive on local disk, as SingleCellMemMapDataset opens it: the flat view's
    files copied once from a mount straight to the server (not through the link), with
    .chunked/header.sch so that the sampler sees the same chunks as on the mount."""
    dest = os.path.join(ctx.work, "local-flat", ctx.name)
    if os.path.exists(os.path.join(dest, ".complete")):
        return dest
    log("copying the flat view of %s to local disk for the PyTorch reader" % ctx.name)
    shutil.rmtree(dest, ignore_errors=True)
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "copy"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "copy"))
    cmd = [SCDLFS, "mount", "s3://" + BUCKET, mnt, "--endpoint-url", ctx.endpoint, "--region", "us-east-1",
           "--cache-dir", cache, "--cache-size", "1GiB", "--foreground", "--log-level", "warn"]
    MOUNTS.append(mnt)
    proc = spawn(cmd, "scdlfs (copy)", env=clean_env(), stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        src = os.path.join(mnt, ctx.name)
        wait_mounted(mnt, proc, "scdlfs (copy)", os.path.join(src, "header.sch"))
        shutil.copytree(src, dest, ignore=lambda d, names: [n for n in names if n.startswith(".")])
        os.makedirs(os.path.join(dest, ".chunked"))
        shutil.copy(os.path.join(src, ".chunked", "header.sch"), os.path.join(dest, ".chunked", "header.sch"))
        open(os.path.join(dest, ".complete"), "w").close()
    finally:
        stop(proc)
        unmount(mnt)
    return dest


def sys_torch(ctx, order, run_i):
    """The PyTorch reader: local disk (page cache warm), then scdlfs cold and warm, with and
    without hints."""
    local = read_torch_epoch(ctx, torch_local_copy(ctx), order, run_i, True, None)
    local.update(system=TORCH + ", local disk", order=order, bytes_fetched=0, daemon_peak_rss_kib=None)
    results = [local]
    for hints in (True, False):
        results += sys_scdlfs(ctx, order, run_i, hints, reader=read_torch_epoch, prefix=TORCH + ", ")
    return results


def sys_s3fs(ctx, order, run_i):
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "s3fs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "s3fs"))
    passwd = os.path.join(ctx.work, "s3fs.passwd")
    with open(passwd, "w") as f:
        f.write("%s:%s\n" % (KEY, SECRET))
    os.chmod(passwd, 0o600)
    cmd = ["s3fs", BUCKET, mnt, "-f", "-o", "url=" + ctx.proxy, "-o", "use_path_request_style",
           "-o", "passwd_file=" + passwd, "-o", "endpoint=us-east-1", "-o", "ro",
           "-o", "use_cache=" + cache, "-o", "kernel_cache", "-o", "parallel_count=16",
           "-o", "multireq_max=16", "-o", "max_stat_cache_size=100000", "-o", "stat_cache_expire=3600",
           "-o", "enable_noobj_cache", "-o", "dbglevel=err"]
    return mount_and_read(ctx, "s3fs-fuse", cmd, clean_env(), mnt, os.path.join(mnt, ctx.name),
                          [("s3fs-fuse", order, 2 * run_i, False, ctx.limit, False)])


def sys_rclone(ctx, order, run_i):
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "rclone"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "rclone"))
    env = clean_env()
    env.update(RCLONE_CONFIG_BENCH_TYPE="s3", RCLONE_CONFIG_BENCH_PROVIDER="Other",
               RCLONE_CONFIG_BENCH_ENDPOINT=ctx.proxy, RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=KEY,
               RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=SECRET, RCLONE_CONFIG_BENCH_REGION="us-east-1",
               RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE="true", RCLONE_CONFIG="/dev/null")
    cmd = ["rclone", "mount", "bench:" + BUCKET, mnt, "--read-only", "--vfs-cache-mode", "full",
           "--cache-dir", cache, "--vfs-cache-max-size", ctx.cache_size.replace("GiB", "G"),
           "--vfs-read-chunk-size", "8M", "--vfs-read-ahead", "64M", "--buffer-size", "16M",
           "--dir-cache-time", "1h", "--attr-timeout", "1h", "--no-modtime", "--log-level", "ERROR"]
    return mount_and_read(ctx, "rclone", cmd, env, mnt, os.path.join(mnt, ctx.name),
                          [("rclone mount", order, 2 * run_i, False, ctx.limit, False)])


def sys_python(ctx, order, run_i):
    order_file = os.path.join(ctx.work, "order.bin")
    run([BENCH, "order", "--rows", str(ctx.info["rows"]), "--chunk-rows", str(ctx.info["chunk_rows"]),
         "--order", order, "--seed", str(ctx.seed), "--epoch", str(2 * run_i), "--out", order_file])
    cache = fresh_dir(os.path.join(ctx.work, "cache", "python"))
    before = proxy_bytes(ctx.stats)
    cmd = [ctx.python, os.path.join(REPO, "bench", "chunk_loader.py"), "--endpoint", ctx.proxy,
           "--bucket", BUCKET, "--prefix", ctx.name, "--order-file", order_file, "--digests", ctx.digests,
           "--cache-dir", cache, "--max-chunks", "8"]
    if ctx.limit:
        cmd += ["--time-limit", str(ctx.limit)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    # The loader's peak RSS: it exits at the end of the epoch, so sample it while it runs.
    rss = 0
    while proc.poll() is None:
        rss = max(rss, peak_rss_kib(proc.pid) or 0)
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("the Python chunk loader failed (%s): %s" % (order, err.strip()[-2000:]))
    r = json.loads(out)
    r.update(system="Python chunk loader", order=order, bytes_fetched=proxy_bytes(ctx.stats) - before,
             daemon_peak_rss_kib=rss or None)
    return [r]


# ---------------------------------------------------------------- report

SYSTEM_ORDER = ["local disk", "scdlfs warm, hints", "scdlfs warm, no hints", "scdlfs cold, hints",
                "scdlfs cold, no hints", "s3fs-fuse", "rclone mount", "Python chunk loader"]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(results):
    """Medians per (system, order); ratios against local disk pair by pair within a run."""
    family = lambda system: TORCH if system.startswith(TORCH) else ""
    local = {(family(r["system"]), r["order"], r["run"]): r for r in results
             if r["system"] in ("local disk", TORCH + ", local disk")}
    rows = {}
    for r in results:
        key = (r["system"], r["order"])
        rows.setdefault(key, []).append(r)
    out = {}
    for key, rs in rows.items():
        ratios = [r["rows_per_s"] / local[(family(r["system"]), r["order"], r["run"])]["rows_per_s"]
                  for r in rs if (family(r["system"]), r["order"], r["run"]) in local]
        out[key] = dict(
            runs=len(rs),
            completed=all(r["completed"] for r in rs),
            seconds=med([r["seconds"] for r in rs]),
            epoch_s=med([r["seconds"] * r["epoch_rows"] / max(r["rows"], 1) for r in rs]),
            rows_per_s=med([r["rows_per_s"] for r in rs]),
            ratio=med(ratios),
            first_row_s=med([r["first_row_s"] for r in rs]),
            stall_s=med([r["stall_s"] for r in rs]),
            bytes_fetched=med([r["bytes_fetched"] for r in rs]),
            bytes_per_row=med([r["bytes_fetched"] / max(r["rows"], 1) for r in rs]),
            rss_mib=med([r["daemon_peak_rss_kib"] / 1024 if r["daemon_peak_rss_kib"] else None for r in rs]),
        )
    return out


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def write_report(args, ctx, results, summary, probes, path_md, path_png, started):
    systems = [s for s in SYSTEM_ORDER if any(k[0] == s for k in summary)]
    link_s = ctx.info["bytes"] / (args.rate_mbps * 1e6)
    lines = []
    w = lines.append
    w("# Benchmarks")
    w("")
    w("<!-- GENERATED by bench/run.py; do not edit by hand. -->")
    w("")
    w("Regenerate (as root, on Debian with /dev/fuse; %d minutes here with the tools installed, plus the "
      "release build and the s3s-fs install on a fresh machine):" % round((time.time() - started) / 60))
    w("")
    w("```sh\nbench/run.py\n```")
    w("")
    w("What was measured, on %s (%d cores), %s:" % (socket.gethostname(), os.cpu_count(),
                                                   time.strftime("%Y-%m-%d")))
    w("")
    w("- **Dataset**: synthetic chunked SCDL, %d rows of %d values on average (%d genes), %d chunks of %d rows, "
      "%.2f GB (values f32, column ids u16). Every row read by every system is checked against the "
      "generator (CRC-32 of its bytes)." % (ctx.info["rows"], ctx.info["mean_values"], ctx.info["genes"],
                                           ctx.info["num_chunks"], ctx.info["chunk_rows"], ctx.info["bytes"] / 1e9))
    w("- **Server**: %s on 127.0.0.1. Its ceiling alone, ranged GETs of 8 MiB: **%.0f MB/s** with 1 connection, "
      "**%.0f MB/s** with 8." % (SERVER_DESC[args.server], probes["server_1"]["mb_per_s"], probes["server_8"]["mb_per_s"]))
    w("- **Link**: bench/src/proxy.rs between every client and the server: %.0f MB/s shared by all connections "
      "(token bucket), %.0f ms added before every response. Measured through it: %.0f MB/s with 8 connections. "
      "Link limit for one pass over the dataset (bytes ÷ bandwidth): **%.1f s**."
      % (args.rate_mbps, args.latency_ms, probes["link_8"]["mb_per_s"], link_s))
    w("- **Orders** (from `scdl-sampler`): `windows` = shuffled windows of 4 chunks, rows shuffled inside; "
      "`blocks` = scDataset block order (blocks of 32 rows, 32 blocks per fetch, minibatches of 64); "
      "`random` = minibatches of 64 uniformly random rows. Epochs stop after %.0f s (then *epoch s* is "
      "extrapolated from rows/s and marked ~)." % args.time_limit)
    w("- **Systems**: local disk = the chunked dataset read from local files (page cache warm: the limit); "
      "scdlfs = the flat view through memory maps (`--read-part-size 8MiB`, cache %s, cold = empty cache, "
      "warm = the next epoch on the same mount); s3fs-fuse %s and rclone %s (Debian), with disk caches, read "
      "the chunk files directly through memory maps; Python chunk loader = bench/chunk_loader.py, the original "
      "loader's design (whole-chunk downloads with boto3 into an LRU of 8 chunks, the next window prefetched by "
      "a thread)." % (ctx.cache_size, ctx.versions.get("s3fs", "?"), ctx.versions.get("rclone", "?")))
    w("- **Figures**: medians of %d runs; *× local* is the median of per-run ratios of rows/s against local disk "
      "in the same run; *stall* = time in row reads slower than 1 ms (the loader: time waiting for a chunk); "
      "*fetched / dataset* = bytes through the link per row read × rows ÷ dataset bytes (for a time-bounded epoch, "
      "extrapolated to a whole one); *RSS* = the daemon's peak resident memory (VmHWM; for "
      "the loader, the loader process)." % args.runs)
    w("")
    for order in ORDERS:
        w("### Order: %s" % order)
        w("")
        w("| system | epoch s | rows/s | × local | first row s | stall s | fetched / dataset | RSS MiB |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for s in systems:
            m = summary.get((s, order))
            if not m:
                continue
            epoch = fmt(m["epoch_s"], ".1f") if m["completed"] else "~" + fmt(m["epoch_s"], ".0f")
            fetched = m["bytes_per_row"] * ctx.info["rows"] / ctx.info["bytes"] if m["bytes_per_row"] is not None else None
            w("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                s, epoch, fmt(m["rows_per_s"], ",.0f"), fmt(m["ratio"], ".3f"), fmt(m["first_row_s"], ".2f"),
                fmt(m["stall_s"], ".1f"), fmt(fetched, ".2f") + "×" if fetched is not None else "—",
                fmt(m["rss_mib"], ".0f")))
        w("")
    w("![rows per second by system and order](benchmarks.png)")
    w("")
    if any(k[0].startswith(TORCH) for k in summary):
        lines.extend(torch_section(args, ctx, summary, link_s))
        w("")
    w("## Against the targets")
    w("")
    for line in targets(args, ctx, summary, link_s):
        w("- " + line)
    notes = os.path.join(REPO, "bench", "NOTES.md")
    if os.path.exists(notes):
        w("## Analysis")
        w("")
        w("(Hand-written in bench/NOTES.md from the run that produced this page; the numbers above are regenerated.)")
        w("")
        w(open(notes).read().strip())
        w("")
    w("## Reduced variant (CI)")
    w("")
    w("`bench/run.py --quick` (run by `scripts/test-all`): a ~50 MB dataset, moto_server as the S3 server "
      "(no crates.io build in CI), one run of each system and order, time-bounded, and it fails unless every "
      "system read only correct rows and the untimed epochs visited every row.")
    w("")
    w("Raw results: `%s` (per run), summary: `%s`." % (os.path.relpath(ctx.results_path, REPO),
                                                     os.path.relpath(ctx.summary_path, REPO)))
    with open(path_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    plot = dict(title="scdlfs benchmark: %.2f GB, %.0f MB/s + %.0f ms link, median of %d run(s)"
                % (ctx.info["bytes"] / 1e9, args.rate_mbps, args.latency_ms, args.runs),
                orders=ORDERS, systems=systems,
                rows_per_s=[[summary.get((s, o), {}).get("rows_per_s") for o in ORDERS] for s in systems])
    plot_json = os.path.join(args.work, "plot.json")
    with open(plot_json, "w") as f:
        json.dump(plot, f)
    run([BENCH, "plot", "--summary", plot_json, "--out", path_png, "--font", args.font])


def torch_section(args, ctx, summary, link_s):
    """The PyTorch DataLoader section of the report, between markers, so that a run of the
    torch system alone can replace it in the report of a full run."""
    lines = [TORCH_BEGIN, "## PyTorch: the SCDL reader through a DataLoader", ""]
    w = lines.append
    w("How PyTorch users read (bench/torch_loader.py): bionemo-scdl's `SingleCellMemMapDataset` on the directory, "
      "`DataLoader(num_workers=2)` with the `scdlfs` package's sampler (`ChunkWindowSampler`, 4 chunks per window, "
      "batches of 64; `BlockSampler`, the block order above, as batch sampler); each worker checks every row's "
      "digest. The main process iterates the sampler and writes the hints; the workers read. *local disk* = the "
      "flat archive copied to local files (page cache warm). *epoch s* and *rows/s* count from the first batch "
      "on; *first row s* is the DataLoader's start-up (workers forked, first batch read). Measured %s on %s (%d cores): %.2f GB dataset, "
      "%s, link %.0f MB/s + %.0f ms (link limit **%.1f s**), cache %s, medians of %d run(s), epochs stop after "
      "%.0f s (then ~, extrapolated)." % (time.strftime("%Y-%m-%d"), socket.gethostname(), os.cpu_count(),
                                          ctx.info["bytes"] / 1e9, SERVER_DESC[args.server], args.rate_mbps,
                                          args.latency_ms, link_s, ctx.cache_size, args.runs, args.time_limit))
    w("")
    w("| order | reader | epoch s | rows/s | × local | first row s | fetched / dataset |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for order in TORCH_ORDERS:
        for s in ["local disk", "scdlfs cold, hints", "scdlfs cold, no hints", "scdlfs warm, hints",
                  "scdlfs warm, no hints"]:
            m = summary.get((TORCH + ", " + s, order))
            if not m:
                continue
            epoch = fmt(m["epoch_s"], ".1f") if m["completed"] else "~" + fmt(m["epoch_s"], ".0f")
            fetched = m["bytes_per_row"] * ctx.info["rows"] / ctx.info["bytes"]
            w("| %s | %s | %s | %s | %s | %s | %s |" % (order, s, epoch, fmt(m["rows_per_s"], ",.0f"),
                                                       fmt(m["ratio"], ".2f"), fmt(m["first_row_s"], ".2f"),
                                                       fmt(fetched, ".2f") + "×"))
    w("")
    for order in TORCH_ORDERS:
        cold = summary.get((TORCH + ", scdlfs cold, hints", order))
        plain = summary.get((TORCH + ", scdlfs cold, no hints", order))
        if cold and plain:
            w("- %s order, cold epoch with hints %s s = %.2f× the link limit (target ≤ 1.2×: %s); without hints "
              "(what users got before the package) %s s." % (
                  order, fmt(cold["epoch_s"], ".1f"), cold["epoch_s"] / link_s,
                  "**met**" if cold["epoch_s"] <= 1.2 * link_s else "**missed**", fmt(plain["epoch_s"], ".1f")))
    w(TORCH_END)
    return lines


def splice_torch_section(path_md, section):
    """Replaces the PyTorch section of an existing report (or adds it before the targets)."""
    text = open(path_md).read() if os.path.exists(path_md) else "# Benchmarks\n"
    block = "\n".join(section)
    if TORCH_BEGIN in text and TORCH_END in text:
        head, rest = text.split(TORCH_BEGIN, 1)
        text = head + block + rest.split(TORCH_END, 1)[1]
    elif "## Against the targets" in text:
        text = text.replace("## Against the targets", block + "\n\n## Against the targets", 1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path_md, "w") as f:
        f.write(text)


SERVER_DESC = {
    "s3s-nginx": "s3s-fs 0.14.1 (crates.io) for listings and bucket requests, with Debian's nginx serving "
                 "object GET/HEAD (Range, ETag, If-Match) from the same folder in front of it, because s3s-fs "
                 "alone streams bodies in 4 KiB pieces (measured here: ~0.05 GB/s on one connection, ~0.14 GB/s "
                 "on eight, below the link) and answers HEAD on a directory key with 500 (nginx answers 404)",
    "moto": "moto_server (PyPI)",
}


def targets(args, ctx, summary, link_s):
    out = []
    g = lambda s, o, k: summary.get((s, o), {}).get(k)
    worst = min((g("scdlfs warm, hints", o, "ratio") or 0) for o in ORDERS)
    out.append("Warm-cache epoch ≥ 0.9× local-disk rows/s: windows %s, blocks %s, random %s → %s." % (
        fmt(g("scdlfs warm, hints", "windows", "ratio"), ".2f"), fmt(g("scdlfs warm, hints", "blocks", "ratio"), ".2f"),
        fmt(g("scdlfs warm, hints", "random", "ratio"), ".2f"), "**met**" if worst >= 0.9 else "**missed**"))
    for o in ("windows", "blocks"):
        e = g("scdlfs cold, hints", o, "epoch_s")
        if e is not None:
            out.append("Cold epoch with hints within 1.2× of the link limit (%.1f s), %s order: %.1f s = %.2f× → %s." % (
                link_s, o, e, e / link_s, "**met**" if e <= 1.2 * link_s else "**missed**"))
    best = max([x for x in (g("s3fs-fuse", "windows", "rows_per_s"), g("rclone mount", "windows", "rows_per_s")) if x] or [0])
    ours = g("scdlfs cold, hints", "windows", "rows_per_s")
    if best and ours:
        out.append("≥ 3× the best of s3fs-fuse and rclone on chunk-window order (cold): %.1f× → %s." % (
            ours / best, "**met**" if ours >= 3 * best else "**missed**"))
    small = ctx.rss_small
    big = g("scdlfs cold, hints", "windows", "rss_mib")
    if small and big:
        out.append("Daemon peak RSS independent of dataset size: %.0f MiB at %.2f GB, %.0f MiB at %.2f GB (same "
                   "settings, cold windows epoch)." % (small[0], small[1] / 1e9, big, ctx.info["bytes"] / 1e9))
    return out


# ---------------------------------------------------------------- main

def report_only(args):
    path = os.path.join(args.work, "results.json")
    saved = json.load(open(path))
    ctx = Ctx()
    ctx.info, ctx.rss_small, ctx.versions = saved["info"], saved["rss_small"], saved["versions"]
    ctx.cache_size = saved["cache_size"]
    ctx.results_path, ctx.summary_path = path, os.path.join(args.work, "summary.json")
    for k in ("runs", "rate_mbps", "latency_ms", "time_limit", "server"):
        setattr(args, k, saved["args"][k])
    write_report(args, ctx, saved["results"], summarize(saved["results"]), saved["probes"], args.report,
                 os.path.join(os.path.dirname(args.report), "benchmarks.png"), time.time() - saved["minutes"] * 60)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the reduced CI variant")
    p.add_argument("--work", default=os.path.join(REPO, "target", "bench"))
    p.add_argument("--size-mb", type=int, default=1500)
    p.add_argument("--small-size-mb", type=int, default=400, help="second size, for the daemon's RSS")
    p.add_argument("--chunk-rows", type=int, default=4096)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate-mbps", type=float, default=200.0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--time-limit", type=float, default=15.0, help="seconds per epoch at most")
    p.add_argument("--cache-size", default="3GiB")
    p.add_argument("--server", choices=["s3s-nginx", "moto"], default=None)
    p.add_argument("--systems", default="local,scdlfs,s3fs,rclone,python,torch")
    p.add_argument("--orders", default=",".join(ORDERS))
    p.add_argument("--font", default="/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
    p.add_argument("--report", default=os.path.join(REPO, "docs", "benchmarks.md"))
    p.add_argument("--report-only", action="store_true",
                   help="re-render the report from the last run's results.json (after editing bench/NOTES.md)")
    args = p.parse_args()
    if args.report_only:
        return report_only(args)
    if args.quick:
        args.size_mb, args.runs, args.chunk_rows = 50, 1, 1024
        args.time_limit = min(args.time_limit, 8.0)
        args.server = args.server or "moto"
        args.work = os.path.join(REPO, "target", "bench-quick")
    args.server = args.server or "s3s-nginx"
    started = time.time()
    for d in ("logs", "mnt", "cache"):
        os.makedirs(os.path.join(args.work, d), exist_ok=True)
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    ensure_tools(args)
    ctx = Ctx()
    ctx.work, ctx.seed, ctx.limit, ctx.python = args.work, 1, args.time_limit, args.python
    ctx.torch_python = getattr(args, "torch_python", None)
    ctx.cache_size = args.cache_size
    ctx.name = "ds-%d" % args.size_mb
    ctx.info = generate(args, ctx.name, args.size_mb)
    small_name = None
    datasets = [ctx.name]
    if not args.quick and "scdlfs" in args.systems.split(","):
        small_name = "ds-%d" % args.small_size_mb
        ctx.small_info = generate(args, small_name, args.small_size_mb)
        datasets.append(small_name)
    ctx.digests = os.path.join(args.work, "digests", ctx.name)
    ctx.local_dir = os.path.join(args.work, "s3root", BUCKET, ctx.name)
    ctx.versions = {}
    for tool, cmd in (("s3fs", ["s3fs", "--version"]), ("rclone", ["rclone", "version"])):
        try:
            ctx.versions[tool] = subprocess.run(cmd, capture_output=True, text=True).stdout.split("\n")[0].split()[-1]
        except (OSError, IndexError):
            pass

    endpoint = start_server(args, datasets)
    ctx.endpoint = endpoint
    ctx.proxy, ctx.stats = start_proxy(args, endpoint)
    log("server %s, link %s (%.0f MB/s, %.0f ms)" % (endpoint, ctx.proxy, args.rate_mbps, args.latency_ms))
    probes = {
        "server_1": probe(endpoint, ctx.name, 1, 300 if not args.quick else 40),
        "server_8": probe(endpoint, ctx.name, 8, 600 if not args.quick else 40),
        "link_8": probe(ctx.proxy, ctx.name, 8, 400 if not args.quick else 40),
    }
    log("server ceiling: %.0f MB/s (1 connection), %.0f MB/s (8); through the link %.0f MB/s"
        % (probes["server_1"]["mb_per_s"], probes["server_8"]["mb_per_s"], probes["link_8"]["mb_per_s"]))

    systems = args.systems.split(",")
    orders = args.orders.split(",")
    results = []
    failures = []

    def record(fn, *a, **kw):
        try:
            for r in fn(*a, **kw):
                r["run"] = run_i
                results.append(r)
                log("run %d %-24s %-8s %9.0f rows/s%s  %6.1f s  fetched %6.0f MB  rss %s" % (
                    run_i, r["system"], r["order"], r["rows_per_s"], "" if r["completed"] else " (time-bounded)",
                    r["seconds"], r["bytes_fetched"] / 1e6,
                    "%d MiB" % (r["daemon_peak_rss_kib"] // 1024) if r["daemon_peak_rss_kib"] else "—"))
        except RuntimeError as e:
            failures.append(str(e))
            log("FAILED: %s" % e)

    ctx.rss_small = None
    for run_i in range(args.runs):
        for order in orders:
            if "local" in systems:
                record(sys_local, ctx, order, run_i)
            if "scdlfs" in systems:
                record(sys_scdlfs, ctx, order, run_i, True)
                record(sys_scdlfs, ctx, order, run_i, False)
            if "s3fs" in systems:
                record(sys_s3fs, ctx, order, run_i)
            if "rclone" in systems:
                record(sys_rclone, ctx, order, run_i)
            if "python" in systems:
                record(sys_python, ctx, order, run_i)
            if "torch" in systems and order in TORCH_ORDERS and (order == "windows" or not args.quick):
                record(sys_torch, ctx, order, run_i)
        if small_name and "scdlfs" in systems:
            # The same daemon settings on the smaller dataset, for peak RSS against size.
            small = Ctx()
            small.__dict__.update(ctx.__dict__)
            small.name, small.info = small_name, ctx.small_info
            small.digests = os.path.join(args.work, "digests", small_name)
            try:
                r = sys_scdlfs(small, "windows", run_i, True, dataset=small_name,
                               label_suffix=" (%s)" % small_name, warm=False)[0]
                rss = r["daemon_peak_rss_kib"] / 1024
                ctx.rss_small = (rss if ctx.rss_small is None else max(ctx.rss_small[0], rss), small.info["bytes"])
                log("run %d scdlfs on %s: peak RSS %.0f MiB" % (run_i, small_name, rss))
            except RuntimeError as e:
                failures.append(str(e))

    ctx.results_path = os.path.join(args.work, "results.json")
    ctx.summary_path = os.path.join(args.work, "summary.json")
    summary = summarize(results)
    with open(ctx.results_path, "w") as f:
        json.dump(dict(probes=probes, results=results, args=vars(args), info=ctx.info, rss_small=ctx.rss_small,
                       versions=ctx.versions, cache_size=ctx.cache_size, minutes=(time.time() - started) / 60),
                  f, indent=1)
    with open(ctx.summary_path, "w") as f:
        json.dump({"%s | %s" % k: v for k, v in summary.items()}, f, indent=1)
    if failures:
        for msg in failures:
            log("FAILED: " + msg)
        sys.exit("%d system runs failed" % len(failures))
    if args.quick:
        expected = {("local disk", o) for o in orders} if "local" in systems else set()
        if "scdlfs" in systems:
            expected |= {(s, o) for o in orders for s in SYSTEM_ORDER[1:5]}
        for s, name in (("s3fs", "s3fs-fuse"), ("rclone", "rclone mount"), ("python", "Python chunk loader")):
            if s in systems:
                expected |= {(name, o) for o in orders}
        if "torch" in systems and "windows" in orders:
            expected |= {(TORCH + ", " + s, "windows") for s in ["local disk"] + SYSTEM_ORDER[1:5]}
        missing = expected - set(summary)
        if missing:
            sys.exit("no result for %s" % sorted(missing))
        print("bench quick: %d passed, 0 failed (every system read only correct rows; %.0f s)"
              % (len(results), time.time() - started))
        return
    if systems == ["torch"]:
        link_s = ctx.info["bytes"] / (args.rate_mbps * 1e6)
        splice_torch_section(args.report, torch_section(args, ctx, summary, link_s))
        log("updated the PyTorch section of %s in %.0f s" % (args.report, time.time() - started))
        return
    write_report(args, ctx, results, summary, probes, args.report,
                 os.path.join(os.path.dirname(args.report), "benchmarks.png"), started)
    log("wrote %s in %.0f s" % (args.report, time.time() - started))


if __name__ == "__main__":
    main()
