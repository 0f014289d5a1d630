#!/usr/bin/env python3
"""The scdlfs benchmark driver: one command, one machine (root, /dev/fuse, Debian).

    bench/run.py            # the full benchmark: regenerates docs/benchmarks.md, its PNG
                            # and README.md's benchmark summary (between its markers)
    bench/run.py --large-size-mb 15000   # the same, plus the daemon's peak RSS on 15 GB
                            # (a whole cold epoch with hints per run)
    bench/run.py --quick    # the reduced variant (CI): small dataset, a cache smaller than
                            # it, one run each; fails unless every epoch read enough rows,
                            # each checked, and the cache budget bound on every mount

It installs what is missing (Debian: fuse3 s3fs rclone nginx-light fonts-dejavu-core;
crates.io: s3s-fs 0.14.1 into the work directory; PyPI: boto3 into a venv), builds the
binaries (`--profile`: release, or ci for --quick, the test suite's build), generates the
synthetic dataset, serves it from an S3-compatible server on 127.0.0.1 behind the
link-emulating proxy (bench/src/proxy.rs), and reads epochs in three orders through every
system, plus scdlfs with a cache of half the dataset (`halfcache`). Only loopback addresses
are used, and every S3 client gets explicit dummy keys. Every figure of the page and of
README's summary is computed from the results file of the run that writes them, kept
beside the page (docs/benchmarks.json; `--report-only` re-renders from it).

The `torch` system is the way PyTorch users read: bionemo-scdl's SingleCellMemMapDataset
through a DataLoader with 2 workers and the scdlfs package's sampler
(bench/torch_loader.py), on scdlfs and on a local copy of the flat archive. Run alone
(`--systems torch`), it updates only its own section of docs/benchmarks.md."""

import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import heapq
import statistics
import struct
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The binaries of the cargo profile the run builds (--profile), set in main().
BENCH = SCDLFS = None
BUCKET = "bench"
KEY, SECRET = "bench", "benchbench"
ORDERS = ["windows", "blocks", "random"]
TORCH = "PyTorch DataLoader"
TORCH_ORDERS = ["windows", "blocks"]  # the orders of the scdlfs package's samplers
TORCH_BEGIN, TORCH_END = "<!-- pytorch section: begin -->", "<!-- pytorch section: end -->"
PYTHON_LOADER_CHUNKS = 8  # the Python chunk loader's LRU, in chunks
QUICK_MIN_ROWS = 100  # --quick fails if an epoch read fewer rows (and was not the whole epoch)
QUICK_SIZE_MB = 50  # --quick's dataset
RESTART_BEGIN, RESTART_END = "<!-- restart section: begin -->", "<!-- restart section: end -->"
RESTART_LONG = "scdlfs warm, long-running mount"
RESTART_FIRST = "scdlfs first epoch after a remount"
STARTUP_PART_SIZE = 4096  # the smallest --read-part-size: many parts from a moderate dataset
STARTUP_PARTS, QUICK_STARTUP_PARTS = 100_000, 10_000  # parts in the cache of the startup case
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


def disk_read_ahead_kib(path):
    """The read-ahead of the disk holding `path` (a partition reads ahead as its disk), in
    KiB, or None where the machine does not say (or `path` was not made: its system did
    not run)."""
    if not os.path.exists(path):
        return None
    dev = os.stat(path).st_dev
    block = "/sys/dev/block/%d:%d" % (os.major(dev), os.minor(dev))
    for f in (block + "/queue/read_ahead_kb", block + "/../queue/read_ahead_kb",
              "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(dev), os.minor(dev))):
        if os.path.exists(f):
            with open(f) as fh:
                return int(fh.read().strip())
    return None


def peak_rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def size_bytes(text):
    """"3GiB", "24MiB", "512KiB" or a number of bytes."""
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * scale)
    return int(text)


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
    log("building the binaries (cargo profile %s)" % args.profile)
    run(["cargo", "build", "--profile", args.profile, "-q", "-p", "scdlfs", "-p", "scdlfs-bench"], cwd=REPO)


def use_binaries(profile):
    global BENCH, SCDLFS
    out = os.path.join(REPO, "target", "debug" if profile == "dev" else profile)
    BENCH, SCDLFS = os.path.join(out, "scdlfs-bench"), os.path.join(out, "scdlfs")


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
    """The S3-compatible server on 127.0.0.1; returns its endpoint and, for s3s-nginx, the
    endpoint of s3s-fs alone (whose own speed the report gives)."""
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
        return "http://127.0.0.1:%d" % port, "http://127.0.0.1:%d" % s3s_port
    port = free_port()
    proc = spawn([args.moto, "-H", "127.0.0.1", "-p", str(port)], "moto_server")
    wait_port(port, proc, "moto_server")
    endpoint = "http://127.0.0.1:%d" % port
    req = urllib.request.Request(endpoint + "/" + BUCKET, method="PUT")
    urllib.request.urlopen(req).read()
    for name in datasets:
        run([BENCH, "upload", "--endpoint", endpoint, "--bucket", BUCKET, "--prefix", name,
             "--src", os.path.join(args.work, "s3root", BUCKET, name)], env=clean_env())
    return endpoint, None


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
    mount_args = []


# The page-cache states an epoch starts in. Every reader is a new process, so no memory
# map of an earlier epoch keeps pages alive across a drop (PITFALLS.md, "Measuring").
DROPPED = "page cache dropped"
WARM = "page cache warm"


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


def read_through(dataset_dir):
    """Reads every file of a dataset directory once (fills scdlfs's disk cache and the page
    cache of the files), closing each."""
    for name in sorted(os.listdir(dataset_dir)):
        path = os.path.join(dataset_dir, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


# The server's files of the main dataset (s3s-nginx serves them from local files): read
# back into the page cache after every drop, so that the server is as fast in every epoch
# as when its ceiling is measured, and only the reader's side starts cold.
SERVER_FILES = []


def drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        raise RuntimeError("cannot drop the page cache (root and a writable /proc/sys needed): %s" % e)
    for root in SERVER_FILES:
        for d, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    while f.read(8 << 20):
                        pass


def cpu_seconds(pid):
    """User + system CPU time of a process and all its threads so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_counters(path):
    """Bytes read so far from the disk holding `path` (None where /proc/diskstats does not
    name it) and the machine's CPU time so far as (busy, waiting on a disk, all), in ticks."""
    dev = os.stat(path).st_dev
    disk_bytes = None
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == (os.major(dev), os.minor(dev)):
                disk_bytes = int(fields[5]) * 512
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return disk_bytes, (user + nice + system + irq + softirq + steal, iowait, sum(ticks))


def with_machine_counters(ctx, read):
    """Runs `read()` and adds to its result what the machine did meanwhile: bytes read from
    the work directory's disk (scdlfs's cache and the local copy are both there) and the
    shares of the CPU time busy and waiting on a disk."""
    disk0, cpu0 = machine_counters(ctx.work)
    r = read()
    disk1, cpu1 = machine_counters(ctx.work)
    busy, iowait, total = (b - a for a, b in zip(cpu0, cpu1))
    r.update(disk_read_bytes=disk1 - disk0 if disk0 is not None else None,
             cpu_busy_share=busy / total if total else None, iowait_share=iowait / total if total else None)
    return r


def scdlfs_status(mnt):
    return json.loads(os.getxattr(mnt, "user.scdlfs.status"))


class Epoch:
    """One epoch to read: `label` in the report, epoch number `epoch` of `order`, starting in
    page-cache state `page_cache` (DROPPED or WARM; a fresh mount's first epoch is DROPPED),
    `fill`: read the files through first (so that a warm epoch finds the whole dataset in
    scdlfs's disk cache even after a time-bounded cold epoch)."""

    def __init__(self, label, order, epoch, page_cache, hints=True, limit=None, fill=False, reread=None):
        self.label, self.order, self.epoch, self.page_cache = label, order, epoch, page_cache
        self.hints, self.limit, self.fill, self.reread = hints, limit, fill, reread


def prepare(dataset_dir, e):
    """`reread`: a directory whose files are read back into the page cache after the drop."""
    if e.fill or e.page_cache == WARM:
        read_through(dataset_dir)
    if e.page_cache == DROPPED:
        drop_page_cache()
    for d, _, names in os.walk(e.reread) if e.reread else ():
        for name in names:
            with open(os.path.join(d, name), "rb") as f:
                while f.read(8 << 20):
                    pass


def tag(r, e, layout):
    r.update(system=e.label, order=e.order, epoch=e.epoch, page_cache=e.page_cache, layout=layout,
             load_1m=os.getloadavg()[0])
    return r


def mount_and_read(ctx, system, cmd, env, mnt, dataset_dir, epochs, reader=read_epoch, layout="chunked",
                   scdlfs=False):
    """Mounts with `cmd` (foreground), runs `epochs` with `reader`, records each, then
    unmounts. After each epoch: the daemon's peak RSS so far (VmHWM) and, for scdlfs, the
    daemon's CPU seconds during the epoch and its cache's status after it."""
    MOUNTS.append(mnt)
    logf = open(os.path.join(ctx.work, "logs", system.split()[0] + ".log"), "a")
    proc = spawn(cmd, system, env=env, stderr=logf, stdout=logf)
    results = []
    try:
        wait_mounted(mnt, proc, system, os.path.join(dataset_dir, "header.sch"))
        for e in epochs:
            prepare(dataset_dir, e)
            counters0 = scdlfs_status(mnt)["counters"] if scdlfs else None
            before = proxy_bytes(ctx.stats)
            cpu0 = cpu_seconds(proc.pid)
            r = with_machine_counters(ctx, lambda: reader(ctx, dataset_dir, e.order, e.epoch, e.hints, e.limit))
            r["bytes_fetched"] = proxy_bytes(ctx.stats) - before
            r["daemon_cpu_s"] = cpu_seconds(proc.pid) - cpu0
            r["daemon_peak_rss_kib"] = peak_rss_kib(proc.pid)
            if scdlfs:
                # The rows' bytes the reader got: through FUSE reads, or pages the daemon
                # stored around them (--cache-read-around), or the page cache.
                r["bytes_served"] = r["bytes_read"]
                status = scdlfs_status(mnt)
                r["cache"] = status["cache"]
                r["hint_writes"] = status["counters"]["hint_writes"] - counters0["hint_writes"]
                r["fetch_memory_peak_mib"] = status["counters"]["fetch_memory_peak_bytes"] / 2**20
                memory = status.get("memory") or {}
                for key in ("resident_bytes", "heap_in_use_bytes", "heap_free_kept_bytes"):
                    if key in memory:
                        r[key.replace("_bytes", "_mib")] = memory[key] / 2**20
            results.append(tag(r, e, layout))
    finally:
        if proc.poll() is None:
            stop(proc)
        unmount(mnt)
    return results


def flat_local_copy(ctx):
    """The flat archive on local disk, as the flat view shows it: the flat view's files
    copied once from a mount straight to the server (not through the link), with
    .chunked/header.sch so that the sampler sees the same chunks as on the mount."""
    dest = os.path.join(ctx.work, "local-flat", ctx.name)
    if os.path.exists(os.path.join(dest, ".complete")):
        return dest
    log("copying the flat view of %s to local disk" % ctx.name)
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


def sys_local(ctx, order, run_i, reader=read_epoch, prefix=""):
    """Local disk reading the flat archive, in the states and epochs scdlfs reads in (see
    sys_scdlfs): epoch 2r and 2r+1 with the page cache dropped, 2r+1 with it warm."""
    local = flat_local_copy(ctx)
    results = []
    for e in (Epoch(prefix + "local disk, " + DROPPED, order, 2 * run_i, DROPPED),
              Epoch(prefix + "local disk, " + DROPPED, order, 2 * run_i + 1, DROPPED),
              Epoch(prefix + "local disk, " + WARM, order, 2 * run_i + 1, WARM)):
        prepare(local, e)
        r = with_machine_counters(ctx, lambda: reader(ctx, local, order, e.epoch, True, None))
        r.update(bytes_fetched=0, daemon_peak_rss_kib=None)
        results.append(tag(r, e, "flat"))
    return results


def scdlfs_cmd(ctx, mnt, cache, cache_size=None):
    return [SCDLFS, "mount", "s3://" + BUCKET, mnt, "--endpoint-url", ctx.proxy, "--region", "us-east-1",
            "--cache-dir", cache, "--cache-size", cache_size or ctx.cache_size, "--foreground", "--log-level", "warn"
            ] + ctx.mount_args


HALF = "scdlfs half cache"


def sys_scdlfs_half(ctx, run_i, hints):
    """The case scdlfs exists for, a cache of half the dataset: on a fresh mount, the cold
    windows epoch 2r, then epoch 2r+1 (a new order) with the page cache dropped; the bytes
    the second epoch fetches are compared with the floor, dataset minus cache."""
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
    h = "hints" if hints else "no hints"
    epochs = [Epoch("%s, cold, %s" % (HALF, h), "windows", 2 * run_i, DROPPED, hints, ctx.limit),
              Epoch("%s, next epoch, %s" % (HALF, h), "windows", 2 * run_i + 1, DROPPED, hints, ctx.limit)]
    cache_bytes = ctx.info["bytes"] // 2
    results = mount_and_read(ctx, "scdlfs", scdlfs_cmd(ctx, mnt, cache, str(cache_bytes)), clean_env(), mnt,
                             os.path.join(mnt, ctx.name), epochs, layout="flat", scdlfs=True)
    sizes = dataset_chunk_bytes(ctx)
    (before, _), (epoch, steps) = (epoch_chunks(ctx, "windows", e.epoch) for e in epochs)
    # A reader that is not to wait on the link has the next step arriving while it reads
    # one: that step's chunks take room the reuse cannot have.
    step_bytes = int(med([sum(sizes[chunk] for chunk in step) for step in steps]))
    for r in results:
        if r["epoch"] == epochs[1].epoch:
            r["offline_bound_bytes"] = offline_next_epoch_bytes(sizes, before, epoch, cache_bytes)
            # With a step most of the cache (the reduced variant), such a cache only thrashes.
            if 2 * step_bytes <= cache_bytes:
                r["offline_bound_read_ahead_bytes"] = offline_next_epoch_bytes(sizes, before, epoch,
                                                                               cache_bytes - step_bytes)
            r["step_bytes"] = step_bytes
    return results


def epoch_chunks(ctx, order, epoch):
    """An epoch in chunks, in the sampler's order (`scdlfs-bench order`): the chunk of every
    row it visits (runs of the same chunk counted once), and the chunks of each step."""
    path = os.path.join(ctx.work, "order-%s-%d.bin" % (order, epoch))
    run([BENCH, "order", "--rows", str(ctx.info["rows"]), "--chunk-rows", str(ctx.info["chunk_rows"]),
         "--order", order, "--seed", str(ctx.seed), "--epoch", str(epoch), "--out", path])
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    values = struct.unpack("<%dQ" % (len(data) // 8), data)
    chunks, steps, i = [], [], 0
    while i < len(values):  # per step: its row count, then its rows
        steps.append(set())
        for row in values[i + 1:i + 1 + values[i]]:
            chunk = row // ctx.info["chunk_rows"]
            steps[-1].add(chunk)
            if not chunks or chunks[-1] != chunk:
                chunks.append(chunk)
        i += 1 + values[i]
    return chunks, steps


def dataset_chunk_bytes(ctx):
    """Each chunk's bytes, its arrays as the server stores them: the cache's unit."""
    root = os.path.join(ctx.work, "s3root", BUCKET, ctx.name)
    sizes = {}
    for name in os.listdir(root):
        if name.startswith("chunk_"):
            d = os.path.join(root, name)
            sizes[int(name[len("chunk_"):])] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return sizes


def offline_next_epoch_bytes(sizes, before, epoch, cache_bytes):
    """What a cache of `cache_bytes` that knew the whole epoch in advance would fetch in it:
    Belady's rule (on a miss, evict the chunk needed furthest ahead) over the epoch's chunk
    sequence, starting from the chunks the epoch `before` read last that fit (what any
    cache holds after an epoch whose successor it could not know). Chunks are the cache's
    unit; the rule reads each on demand, so it needs no room for read-ahead."""
    resident, used = set(), 0
    for chunk in reversed(before):
        if chunk not in resident:
            if used + sizes[chunk] > cache_bytes:
                break
            resident.add(chunk)
            used += sizes[chunk]
    never = len(epoch)
    next_use, seen = [never] * len(epoch), {}
    for i in range(len(epoch) - 1, -1, -1):
        next_use[i] = seen.get(epoch[i], never)
        seen[epoch[i]] = i
    due = {chunk: seen.get(chunk, never) for chunk in resident}
    furthest = [(-due[chunk], chunk) for chunk in resident]  # a heap; stale entries skipped
    heapq.heapify(furthest)
    fetched = 0
    for i, chunk in enumerate(epoch):
        if chunk not in resident:
            fetched += sizes[chunk]
            resident.add(chunk)
            used += sizes[chunk]
        due[chunk] = next_use[i]
        heapq.heappush(furthest, (-next_use[i], chunk))
        while used > cache_bytes:
            when, victim = heapq.heappop(furthest)
            if victim in resident and due[victim] == -when:
                resident.discard(victim)
                used -= sizes[victim]
    return fetched


def sys_scdlfs(ctx, order, run_i, hints, dataset=None, label_suffix="", warm=True, reader=read_epoch, prefix="",
               limit="default"):
    """The flat view on a fresh mount with an empty cache: the cold epoch 2r; then epoch 2r+1
    from the disk cache with the page cache dropped, and again with the page cache warm."""
    dataset = dataset or ctx.name
    limit = ctx.limit if limit == "default" else limit
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
    h = "hints" if hints else "no hints"
    epochs = [Epoch("%sscdlfs cold, %s%s" % (prefix, h, label_suffix), order, 2 * run_i, DROPPED, hints, limit)]
    if warm:
        epochs += [Epoch("%sscdlfs disk-cache warm, %s" % (prefix, h), order, 2 * run_i + 1, DROPPED, hints, limit,
                         fill=True),
                   Epoch("%sscdlfs page-cache warm, %s" % (prefix, h), order, 2 * run_i + 1, WARM, hints, limit)]
    return mount_and_read(ctx, "scdlfs", scdlfs_cmd(ctx, mnt, cache), clean_env(), mnt, os.path.join(mnt, dataset),
                          epochs, reader, layout="flat", scdlfs=True)


def etag_link(ctx, args):
    """The main dataset on an S3 endpoint behind the link whose listings carry ETags, which
    adoption needs (s3s-fs lists none, so nothing of its objects is adopted after a
    restart): the run's own server if it is moto_server, else a moto_server of its own
    behind a second proxy with the same link. Returns a copy of ctx pointing there."""
    if getattr(ctx, "etag_ctx", None):
        return ctx.etag_ctx
    other = Ctx()
    other.__dict__.update(ctx.__dict__)
    if args.server != "moto":
        moto = os.path.join(REPO, ".venv", "bin", "moto_server")
        moto = moto if os.path.exists(moto) else shutil.which("moto_server") or sys.exit(
            "the restart case needs moto_server (scripts/setup-python-venv)")
        port = free_port()
        proc = spawn([moto, "-H", "127.0.0.1", "-p", str(port)], "moto_server (restarts)")
        wait_port(port, proc, "moto_server")
        endpoint = "http://127.0.0.1:%d" % port
        urllib.request.urlopen(urllib.request.Request(endpoint + "/" + BUCKET, method="PUT")).read()
        log("uploading %s to moto_server for the restart case" % ctx.name)
        run([BENCH, "upload", "--endpoint", endpoint, "--bucket", BUCKET, "--prefix", ctx.name,
             "--src", os.path.join(args.work, "s3root", BUCKET, ctx.name)], env=clean_env())
        other.proxy, other.stats = start_proxy(args, endpoint)
    ctx.etag_ctx = other
    return other


def sys_restart(ctx, args, run_i):
    """A full cache across a restart. A fresh mount reads the dataset through once (its cache,
    twice the dataset, then holds all of it) and reads windows epoch 2r+1 (*warm, long-running
    mount*); its daemon is stopped, a new one mounts the same cache directory, and reads epoch
    2r+1 again (*first epoch after a remount*): what it reads was downloaded by the daemon
    before. Before each epoch the page cache is dropped and the cache directory's files read
    back: the state after a service restart (the mount's own page cache is gone, the part
    files' pages are not), so that the ratio shows the daemon's costs, not the disk's."""
    e = etag_link(ctx, args)
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "restart"))
    cmd = scdlfs_cmd(e, mnt, cache, str(2 * ctx.info["bytes"] + (64 << 20)))
    dataset = os.path.join(mnt, ctx.name)
    epoch = 2 * run_i + 1
    results = mount_and_read(e, "scdlfs", cmd, clean_env(), mnt, dataset,
                             [Epoch(RESTART_LONG, "windows", epoch, DROPPED, True, ctx.limit, fill=True,
                                    reread=cache)], layout="flat", scdlfs=True)
    results += mount_and_read(e, "scdlfs", cmd, clean_env(), mnt, dataset,
                              [Epoch(RESTART_FIRST, "windows", epoch, DROPPED, True, ctx.limit, reread=cache)],
                              layout="flat", scdlfs=True)
    return results


def startup_cache(ctx, args):
    """The startup case's source and its cache, made once per run of the driver: a local
    folder (the bucket's folder) with a dataset whose parts of STARTUP_PART_SIZE number at
    least the parts wanted (the main dataset for --quick), and a cache directory holding all
    of them, filled by `scdlfs warm --all` on a mount of that folder."""
    if getattr(ctx, "startup", None):
        return ctx.startup
    wanted = QUICK_STARTUP_PARTS if args.quick else STARTUP_PARTS
    if args.quick:
        name, info = ctx.name, ctx.info
    else:
        # The generator's size is approximate (-2 % here), and the last part of each object short.
        size_mb = -(-wanted * STARTUP_PART_SIZE * 106 // 100 // 10**6)
        name = "ds-startup-%d" % size_mb
        info = generate(args, name, size_mb)
    st = Ctx()
    st.__dict__.update(ctx.__dict__)
    st.name, st.info = name, info
    st.digests = os.path.join(args.work, "digests", name)
    st.source = os.path.join(args.work, "s3root", BUCKET)
    st.cache_size = str(2 * info["bytes"] + (64 << 20))
    st.cache = fresh_dir(os.path.join(ctx.work, "cache", "startup"))
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "startup"))
    MOUNTS.append(mnt)
    log("filling a cache with the parts of %s at %d bytes each (scdlfs warm --all)" % (name, STARTUP_PART_SIZE))
    proc = spawn(startup_cmd(st, mnt, st.cache), "scdlfs (startup fill)")
    started = time.time()
    try:
        wait_mounted(mnt, proc, "scdlfs (startup fill)", os.path.join(mnt, name, "header.sch"))
        run([SCDLFS, "warm", os.path.join(mnt, name), "--all", "--quiet"], stdout=subprocess.DEVNULL)
        st.parts = scdlfs_status(mnt)["cache"]["cached_parts"]
        st.cache_bytes = scdlfs_status(mnt)["cache"]["cached_bytes"]
    finally:
        stop(proc)
        unmount(mnt)
    st.fill_s = time.time() - started
    if st.parts < wanted:
        raise RuntimeError("the startup cache holds %d parts, fewer than %d" % (st.parts, wanted))
    ctx.startup = st
    return st


def startup_cmd(st, mnt, cache):
    return [SCDLFS, "mount", st.source, mnt, "--cache-dir", cache, "--cache-size", st.cache_size,
            "--read-part-size", str(STARTUP_PART_SIZE), "--foreground", "--log-level", "warn"]


def first_row_after_mount(st, cache, label):
    """With the page cache dropped: the time from starting `scdlfs mount` to the first row a
    new reader gets (no hints), the mount's parts, and when it has read the headers of the
    earlier mount's part files."""
    mnt = fresh_dir(os.path.join(st.work, "mnt", "startup"))
    MOUNTS.append(mnt)
    dataset = os.path.join(mnt, st.name)
    drop_page_cache()
    t0 = time.time()
    proc = spawn(startup_cmd(st, mnt, cache), "scdlfs (startup)")
    try:
        while not (is_mounted(mnt) and os.path.exists(os.path.join(dataset, "header.sch"))):
            if proc.poll() is not None or time.time() - t0 > 120:
                raise RuntimeError("scdlfs did not mount %s" % mnt)
            time.sleep(0.002)
        visible = time.time() - t0
        r = read_epoch(st, dataset, "windows", 0, hints=False, limit=0.001)
        first_row = visible + r["first_row_s"]
        status = scdlfs_status(mnt)
        while not status["cache"]["adoption_done"] and time.time() - t0 < 300:
            time.sleep(0.01)
            status = scdlfs_status(mnt)
        adopted_s = time.time() - t0 if status["cache"]["adoption_done"] else None
    finally:
        stop(proc)
        unmount(mnt)
    return dict(system=label, kind="startup", dataset_visible_s=visible, first_row_s=first_row,
                adoption_done_s=adopted_s, parts_fetched=status["counters"]["parts_fetched"],
                adopted_parts=status["cache"]["adopted_parts"], adopted_by_reads=status["cache"]["adopted_by_reads"],
                cached_parts=status["cache"]["cached_parts"],
                load_1m=os.getloadavg()[0])


def sys_startup(ctx, args, run_i):
    """Mount to first row, with the cache of STARTUP_PARTS parts and with an empty one."""
    st = startup_cache(ctx, args)
    empty = fresh_dir(os.path.join(ctx.work, "cache", "startup-empty"))
    rows = [first_row_after_mount(st, st.cache, "cache of %d parts" % st.parts),
            first_row_after_mount(st, empty, "empty cache")]
    for r in rows:
        r.update(parts=st.parts, cache_bytes=st.cache_bytes, fill_s=st.fill_s, dataset=st.name,
                 dataset_bytes=st.info["bytes"])
    return rows


def sys_torch(ctx, order, run_i):
    """The PyTorch reader on the flat archive: local disk, then scdlfs with and without
    hints, in the same epochs and page-cache states."""
    results = sys_local(ctx, order, run_i, reader=read_torch_epoch, prefix=TORCH + ", ")
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
                          [Epoch("s3fs-fuse", order, 2 * run_i, DROPPED, False, ctx.limit)])


def sys_rclone(ctx, order, run_i):
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "rclone"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "rclone"))
    env = clean_env()
    env.update(RCLONE_CONFIG_BENCH_TYPE="s3", RCLONE_CONFIG_BENCH_PROVIDER="Other",
               RCLONE_CONFIG_BENCH_ENDPOINT=ctx.proxy, RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=KEY,
               RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=SECRET, RCLONE_CONFIG_BENCH_REGION="us-east-1",
               RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE="true", RCLONE_CONFIG="/dev/null")
    cmd = ["rclone", "mount", "bench:" + BUCKET, mnt, "--read-only", "--vfs-cache-mode", "full",
           "--cache-dir", cache, "--vfs-cache-max-size", "%dK" % (size_bytes(ctx.cache_size) // 1024),
           "--vfs-read-chunk-size", "8M", "--vfs-read-ahead", "64M", "--buffer-size", "16M",
           "--dir-cache-time", "1h", "--attr-timeout", "1h", "--no-modtime", "--log-level", "ERROR"]
    return mount_and_read(ctx, "rclone", cmd, env, mnt, os.path.join(mnt, ctx.name),
                          [Epoch("rclone mount", order, 2 * run_i, DROPPED, False, ctx.limit)])


def sys_python(ctx, order, run_i):
    order_file = os.path.join(ctx.work, "order.bin")
    run([BENCH, "order", "--rows", str(ctx.info["rows"]), "--chunk-rows", str(ctx.info["chunk_rows"]),
         "--order", order, "--seed", str(ctx.seed), "--epoch", str(2 * run_i), "--out", order_file])
    cache = fresh_dir(os.path.join(ctx.work, "cache", "python"))
    before = proxy_bytes(ctx.stats)
    cmd = [ctx.python, os.path.join(REPO, "bench", "chunk_loader.py"), "--endpoint", ctx.proxy,
           "--bucket", BUCKET, "--prefix", ctx.name, "--order-file", order_file, "--digests", ctx.digests,
           "--cache-dir", cache, "--max-chunks", str(PYTHON_LOADER_CHUNKS)]
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
    r.update(bytes_fetched=proxy_bytes(ctx.stats) - before, daemon_peak_rss_kib=rss or None)
    return [tag(r, Epoch("Python chunk loader", order, 2 * run_i, DROPPED), "chunked")]

# ---------------------------------------------------------------- report

SYSTEM_ORDER = ["local disk, " + WARM, "scdlfs page-cache warm, hints", "scdlfs page-cache warm, no hints",
                "local disk, " + DROPPED, "scdlfs disk-cache warm, hints", "scdlfs disk-cache warm, no hints",
                "scdlfs cold, hints", "scdlfs cold, no hints", HALF + ", cold, hints", HALF + ", cold, no hints",
                HALF + ", next epoch, hints", HALF + ", next epoch, no hints", "s3fs-fuse", "rclone mount",
                "Python chunk loader"]
README_BEGIN = "<!-- benchmark summary: generated by bench/run.py from its results; do not edit -->"
README_END = "<!-- benchmark summary: end -->"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def family(system):
    return TORCH if system.startswith(TORCH) else ""


def pair_key(r):
    """What makes a local-disk epoch the honest reference of another: the same reader family,
    layout, order, epoch and page-cache state, in the same run."""
    return family(r["system"]), r["layout"], r["order"], r["run"], r["epoch"], r["page_cache"]


def is_local(r):
    return "local disk" in r["system"]


def summarize(results):
    """Medians per (system, order); ratios against local disk pair by pair (pair_key)."""
    local = {pair_key(r): r for r in results if is_local(r)}
    rows = {}
    for r in results:
        rows.setdefault((r["system"], r["order"]), []).append(r)
    out = {}
    for key, rs in rows.items():
        ratios = [r["rows_per_s"] / local[pair_key(r)]["rows_per_s"] for r in rs
                  if not is_local(r) and pair_key(r) in local]
        out[key] = dict(
            runs=len(rs),
            completed=all(r["completed"] for r in rs),
            seconds=med([r["seconds"] for r in rs]),
            epoch_s=med([r["seconds"] * r["epoch_rows"] / max(r["rows"], 1) for r in rs]),
            rows_per_s=med([r["rows_per_s"] for r in rs]),
            ratio=med(ratios),
            first_row_s=med([r["first_row_s"] for r in rs]),
            stall_s=med([r.get("stall_s") for r in rs]),
            bytes_fetched=med([r["bytes_fetched"] for r in rs]),
            bytes_per_row=med([r["bytes_fetched"] / max(r["rows"], 1) for r in rs]),
            rss_mib=med([r["daemon_peak_rss_kib"] / 1024 if r.get("daemon_peak_rss_kib") else None for r in rs]),
            cpu_s_per_gb=med([r["daemon_cpu_s"] / r["bytes_served"] * 1e9 if r.get("bytes_served") else None
                              for r in rs]),
            disk_read_bytes=med([r.get("disk_read_bytes") for r in rs]),
            cpu_busy_share=med([r.get("cpu_busy_share") for r in rs]),
            iowait_share=med([r.get("iowait_share") for r in rs]),
            fetch_memory_peak_mib=med([r.get("fetch_memory_peak_mib") for r in rs]),
            resident_mib=med([r.get("resident_mib") for r in rs]),
            heap_in_use_mib=med([r.get("heap_in_use_mib") for r in rs]),
            heap_free_kept_mib=med([r.get("heap_free_kept_mib") for r in rs]),
            offline_bound_bytes=med([r.get("offline_bound_bytes") for r in rs]),
            offline_bound_read_ahead_bytes=med([r.get("offline_bound_read_ahead_bytes") for r in rs]),
            step_bytes=med([r.get("step_bytes") for r in rs]),
            over_offline_bound=med([r["bytes_fetched"] / r["offline_bound_bytes"]
                                    for r in rs if r.get("offline_bound_bytes") and r["completed"]]),
        )
    return out


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def pct(share):
    return "—" if share is None else "%.0f%%" % (100 * share)


def epoch_text(m):
    return fmt(m["epoch_s"], ".1f") if m["completed"] else "~" + fmt(m["epoch_s"], ".0f")


def server_desc(args, probes):
    if args.server == "moto":
        return "moto_server (PyPI)"
    return ("s3s-fs 0.14.1 (crates.io) for listings and bucket requests, with Debian's nginx serving object "
            "GET/HEAD (Range, ETag, If-Match) from the same folder in front of it, because s3s-fs alone answers "
            "HEAD on a directory key with 500 (nginx answers 404) and is slow for bodies: measured in this run, "
            "s3s-fs alone serves %.0f MB/s on 1 connection and %.0f MB/s on 8"
            % (probes["s3s_1"]["mb_per_s"], probes["s3s_8"]["mb_per_s"]))


def sized(label, name):
    return "%s (%s)" % (label, name)


class Report:
    """Everything the page says, computed from one run's saved results."""

    def __init__(self, saved):
        self.saved = saved
        self.args = saved["args"]
        self.info = saved["info"]
        self.summary = summarize(saved["results"])
        self.link_s = self.info["bytes"] / (self.args["rate_mbps"] * 1e6)

    def get(self, system, order, key):
        return self.summary.get((system, order), {}).get(key)

    def rss_by_size(self, hints_label="scdlfs cold, hints", key="rss_mib"):
        """Median peak RSS of the daemon at the end of a cold windows epoch with hints, per
        dataset size: [(bytes, MiB, completed)] (`key`: another figure of those epochs)."""
        out = []
        for name, size in sorted(self.saved["sizes"].items(), key=lambda kv: kv[1]):
            label = hints_label if name == self.saved["name"] else sized(hints_label, name)
            m = self.summary.get((label, "windows"))
            if m and m.get(key) is not None:
                out.append((size, m[key], m["completed"]))
        return out

    def size_figure(self, size, key):
        """`key` of the cold windows epoch with hints on the dataset of `size` bytes."""
        return next((mib for s, mib, _ in self.rss_by_size(key=key) if s == size), None)

    def half_cache_limit(self, floor, fetched, chunk_bytes):
        """What bounds the half-cache next epoch's bytes: the offline optimum for its order."""
        m = self.summary.get((HALF + ", next epoch, hints", "windows"))
        text = "%.2f GB beyond the floor: %.1f chunks of the dataset's %s fetched twice" % (
            (fetched - floor) / 1e9, (fetched - floor) / chunk_bytes, self.info.get("num_chunks") or "?")
        if not m or not m.get("offline_bound_bytes"):
            return text
        bound, ahead = m["offline_bound_bytes"], m.get("offline_bound_read_ahead_bytes")
        text = ("%s. A cache that knew the epoch in advance (Belady's rule over its chunk sequence, from the "
                "chunks the cold epoch read last) would fetch %.2f GB = %.2f× the floor: the floor assumes every "
                "cached chunk is read before one must make room, but until the epoch has read cached chunks, "
                "each chunk it fetches evicts one it reads later" % (text, bound / 1e9, bound / floor))
        if ahead:
            text += (". With room kept for the next step arriving while one is read (a step's chunks, %s GB, "
                     "less for reuse), it would fetch %.2f GB = %.2f× the floor" % (
                         fmt(m.get("step_bytes") and m["step_bytes"] / 1e9, ".2f"), ahead / 1e9, ahead / floor))
        return "%s. scdlfs fetched %s× the first bound" % (text, fmt(m.get("over_offline_bound"), ".2f"))

    def targets(self):
        """(target, measured, verdict, limit) for each target of issue 12 this run measures;
        `limit` is what the run measured of what bounds the figure (empty when met)."""
        g, link_s = self.get, self.link_s
        rate = self.args["rate_mbps"] * 1e6
        rows = []

        def verdict(ok):
            return "not measured" if ok is None else ("**met**" if ok else "**missed**")

        def link_share(m):
            """An epoch cut into the link's time for the bytes it fetched and the rest."""
            if not m or not m["bytes_per_row"]:
                return ""
            fetched = m["bytes_per_row"] * self.info["rows"]
            on_link = fetched / rate
            return ("fetched %.2f× the dataset: %.1f s of the link's time at its rate, %.1f s beyond it (first "
                    "row at %s s; reads that stalled: %s s in all)" % (
                        fetched / self.info["bytes"], on_link, max(m["epoch_s"] - on_link, 0),
                        fmt(m["first_row_s"], ".2f"), fmt(m["stall_s"], ".1f")))

        for system, order, bound in (("scdlfs cold, hints", "windows", 1.05), ("scdlfs cold, hints", "random", 1.15),
                                     ("scdlfs cold, no hints", "windows", 1.3)):
            m = self.summary.get((system, order))
            ok = m["epoch_s"] <= bound * link_s if m else None
            rows.append(("%s, %s order: epoch ≤ %.2f× the link limit (%.1f s)" % (system, order, bound, link_s),
                         "%s s = %.2f×" % (epoch_text(m), m["epoch_s"] / link_s) if m else "—",
                         verdict(ok), "" if ok is not False else link_share(m)))
        firsts = [(h, g("scdlfs cold, " + h, "windows", "first_row_s")) for h in ("hints", "no hints")]
        known = [x for _, x in firsts if x is not None]
        ok = max(known) <= 0.1 if len(known) == 2 else None
        rows.append(("time to first row ≤ 0.1 s, cold windows epoch, with hints and without",
                     ", ".join("%s %s s" % (h, fmt(x, ".2f")) for h, x in firsts),
                     verdict(ok),
                     "" if ok is not False else "%.1f× the link's %.0f ms latency: the reader's requests before "
                     "its first row wait one after another" % (max(known) / (self.args["latency_ms"] / 1e3),
                                                               self.args["latency_ms"])))
        for state, system in ((DROPPED, "scdlfs disk-cache warm, hints"), (WARM, "scdlfs page-cache warm, hints")):
            ratios = [(o, g(system, o, "ratio")) for o in ORDERS]
            known = [x for _, x in ratios if x is not None]
            ok = min(known) >= 0.9 if known else None
            limit = ""
            if ok is False:
                unhinted = system.replace(", hints", ", no hints")
                parts = []
                for o, x in ratios:
                    if x is None or x >= 0.9:
                        continue
                    local = "local disk, " + state
                    text = "%s: daemon CPU %s s per GB read; without hints %s× local" % (
                        o, fmt(g(system, o, "cpu_s_per_gb"), ".2f"), fmt(g(unhinted, o, "ratio"), ".2f"))
                    if g(local, o, "disk_read_bytes") is not None and g(system, o, "disk_read_bytes") is not None:
                        text += ("; in the epoch, local disk / scdlfs: %s / %s s, the disk read %s / %s GB, "
                                 "the %d cores busy %s / %s and waiting on the disk %s / %s of their time") % (
                            fmt(g(local, o, "epoch_s"), ".2f"), fmt(g(system, o, "epoch_s"), ".2f"),
                            fmt(g(local, o, "disk_read_bytes") / 1e9, ".2f"),
                            fmt(g(system, o, "disk_read_bytes") / 1e9, ".2f"), self.saved["cores"],
                            pct(g(local, o, "cpu_busy_share")), pct(g(system, o, "cpu_busy_share")),
                            pct(g(local, o, "iowait_share")), pct(g(system, o, "iowait_share")))
                    parts.append(text)
                limit = "; ".join(parts)
            rows.append(("%s ≥ 0.9× local disk rows/s (%s, same epoch), every order" % (system, state),
                         ", ".join("%s %s×" % (o, fmt(x, ".2f")) for o, x in ratios),
                         verdict(ok), limit))
        half = self.summary.get((HALF + ", cold, hints", "windows"))
        ok = half["epoch_s"] <= 1.1 * link_s if half else None
        rows.append(("cache = half the dataset: cold windows epoch with hints ≤ 1.1× the link limit",
                     "%s s = %.2f× (full-size cache: %s s)" % (
                         epoch_text(half), half["epoch_s"] / link_s,
                         fmt(g("scdlfs cold, hints", "windows", "epoch_s"), ".1f")) if half else "—",
                     verdict(ok), "" if ok is not False else link_share(half)))
        floor = self.info["bytes"] - self.info["bytes"] // 2
        nxt = [(h, self.summary.get((HALF + ", next epoch, " + h, "windows"))) for h in ("hints", "no hints")]
        fetched = {h: m["bytes_per_row"] * self.info["rows"] for h, m in nxt if m}
        ok = fetched["hints"] <= 1.05 * floor if "hints" in fetched else None
        chunk_bytes = self.info["bytes"] / max(self.info.get("num_chunks") or 1, 1)
        rows.append(("cache = half the dataset: the next windows epoch (a new order) fetches ≤ 1.05× the floor "
                     "(dataset − cache = %.2f GB), with hints" % (floor / 1e9),
                     ", ".join("%s %.2f GB = %.2f×%s" % (h, fetched[h] / 1e9, fetched[h] / floor,
                                                        "" if m["completed"] else " (extrapolated)")
                               for h, m in nxt if m) or "—",
                     verdict(ok),
                     "" if ok is not False else self.half_cache_limit(floor, fetched["hints"], chunk_bytes)))
        others = [(s, g(s, "windows", "rows_per_s")) for s in ("s3fs-fuse", "rclone mount")]
        best = max([x for _, x in others if x] or [0])
        ours = g("scdlfs cold, hints", "windows", "rows_per_s")
        rows.append(("scdlfs cold, hints ≥ 3× the rows/s of the better of s3fs-fuse and rclone, windows order",
                     "%.1f×" % (ours / best) if best and ours else "—",
                     verdict(ours >= 3 * best if best and ours else None), ""))
        rss = self.rss_by_size()
        ok = max(mib for _, mib, _ in rss) < 150 if rss else None
        fetcher_peak = g("scdlfs cold, hints", "windows", "fetch_memory_peak_mib")
        rows.append(("daemon peak RSS < 150 MiB with plans (cold windows epoch, hints), every dataset size",
                     ", ".join("%.0f MiB at %.2f GB%s" % (mib, size / 1e9, "" if done else " (time-bounded)")
                               for size, mib, done in rss) or "—",
                     verdict(ok),
                     "" if ok is not False else "the fetcher's own peak: %s MiB" % fmt(fetcher_peak, ".0f")))
        big = [x for x in rss if x[0] > self.info["bytes"]]
        main = [x for x in rss if x[0] == self.info["bytes"]]
        whole = bool(big and main and big[-1][2] and main[0][2])
        ok = big[-1][1] <= 1.1 * main[0][1] if whole else None
        rows.append(("daemon peak RSS flat (within 10%) from the main dataset to the large one (`--large-size-mb`; "
                     "whole cold windows epochs with hints at both sizes)",
                     "%.0f MiB at %.2f GB → %.0f MiB at %.2f GB%s" % (
                         main[0][1], main[0][0] / 1e9, big[-1][1], big[-1][0] / 1e9,
                         "" if whole else " (an epoch was time-bounded: not the same phase)")
                     if big and main else "no larger dataset in this run",
                     verdict(ok),
                     "" if ok is not False else "the fetcher's own peak (downloads, edges, parts kept in memory): "
                     "%s; at the epoch's end, resident / heap in use / heap freed and kept by the allocator: %s"
                     % (", ".join("%.0f MiB at %.2f GB" % (mib, size / 1e9)
                                  for size, mib, _ in self.rss_by_size(key="fetch_memory_peak_mib")),
                        ", ".join("%s / %s / %s MiB at %.2f GB" % (
                            fmt(self.size_figure(size, "resident_mib"), ".0f"),
                            fmt(self.size_figure(size, "heap_in_use_mib"), ".0f"),
                            fmt(self.size_figure(size, "heap_free_kept_mib"), ".0f"), size / 1e9)
                            for size, _, _ in rss))))
        return rows


def results_copy(path_md):
    """The results file kept beside the page (docs/benchmarks.json): what every figure of
    the page and of README's summary is computed from."""
    return os.path.splitext(path_md)[0] + ".json"


def reductions(args):
    """How a run's configuration falls short of the full benchmark, in words (empty for a
    full run)."""
    out = []
    if args["runs"] < 3:
        out.append("%d run(s) instead of 3" % args["runs"])
    missing = [s for s in ("local", "scdlfs", "halfcache", "s3fs", "rclone", "python", "torch", "restart")
               if s not in args["systems"].split(",")]
    if missing:
        out.append("systems not run: " + ", ".join(missing))
    orders = [o for o in ORDERS if o not in args["orders"].split(",")]
    if orders:
        out.append("orders not run: " + ", ".join(orders))
    others = [o for o in args["orders"].split(",") if o not in (args.get("other_orders") or args["orders"]).split(",")]
    if others:
        out.append("s3fs-fuse, rclone and the Python chunk loader not run in the %s order" % ", ".join(others))
    if not args.get("large_size_mb"):
        out.append("no large dataset (`--large-size-mb`)")
    elif args["large_size_mb"] < 15000:
        out.append("large dataset %d MB instead of 15000" % args["large_size_mb"])
    return out


def write_report(saved, path_md, path_png, font, readme):
    rep = Report(saved)
    results = results_copy(path_md)
    if os.path.abspath(results) != os.path.abspath(saved["path"]):
        with open(results, "w") as f:
            json.dump(saved, f, indent=1)
    results_rel = os.path.relpath(results, REPO)
    args, info, summary, link_s, probes = rep.args, rep.info, rep.summary, rep.link_s, saved["probes"]
    systems = [s for s in SYSTEM_ORDER if any(k[0] == s for k in summary)]
    lines = []
    w = lines.append
    w("# Benchmarks")
    w("")
    w("<!-- GENERATED by bench/run.py from %s; do not edit by hand. -->" % results_rel)
    w("")
    w("Regenerate (as root, on Debian with /dev/fuse; this run took %d minutes with the tools installed, plus "
      "the build and the s3s-fs install on a fresh machine):" % round(saved["minutes"]))
    w("")
    w("```sh\n%s\n```" % saved["command"])
    w("")
    reduced = reductions(args)
    if reduced:
        w("**Reduced configuration** (%s): %s. Figures below are of this configuration only." % (
            "the CI variant" if args["quick"] else "what did not fit in the time of this run", "; ".join(reduced)))
        w("")
    w("What was measured, on %s (%d cores), %s:" % (saved["host"], saved["cores"], saved["date"]))
    w("")
    w("- **Dataset**: synthetic chunked SCDL, %d rows of %d values on average (%d genes), %d chunks of %d rows, "
      "%.2f GB (values f32, column ids u16). Every row read by every system is checked against the "
      "generator (CRC-32 of its bytes)." % (info["rows"], info["mean_values"], info["genes"],
                                           info["num_chunks"], info["chunk_rows"], info["bytes"] / 1e9))
    w("- **Server**: %s, on 127.0.0.1. Its ceiling alone, measured in this run with ranged GETs of 8 MiB: "
      "**%.0f MB/s** with 1 connection, **%.0f MB/s** with 8." % (
          server_desc(argparse.Namespace(**args), probes), probes["server_1"]["mb_per_s"],
          probes["server_8"]["mb_per_s"]))
    w("- **Link**: bench/src/proxy.rs between every client and the server: %.0f MB/s shared by all connections "
      "(token bucket), %.0f ms added before every response. Measured through it: %.0f MB/s with 8 connections. "
      "Link limit for one pass over the dataset (bytes ÷ bandwidth): **%.1f s**."
      % (args["rate_mbps"], args["latency_ms"], probes["link_8"]["mb_per_s"], link_s))
    w("- **Orders** (from `scdl-sampler`): `windows` = shuffled windows of 4 chunks, rows shuffled inside; "
      "`blocks` = scDataset block order (blocks of 32 rows, 32 blocks per fetch, minibatches of 64); "
      "`random` = minibatches of 64 uniformly random rows. Epochs stop after %.0f s (then *epoch s* is "
      "extrapolated from rows/s and marked ~)." % args["time_limit"])
    w("- **Same layout, same epoch, same page-cache state.** scdlfs readers map the flat view; *local disk* maps "
      "a local copy of the same flat archive. In run r, a fresh mount with an empty cache (%s) reads epoch 2r "
      "(*cold*); then, with the files read through once so that the disk cache holds them and the page cache "
      "dropped (`echo 3 > /proc/sys/vm/drop_caches`; every reader is a new process, so no map outlives its "
      "epoch), epoch 2r+1 (*disk-cache warm*); then epoch 2r+1 again after reading the files through "
      "(*page-cache warm*). Local disk reads epochs 2r and 2r+1 with the page cache dropped and 2r+1 with it "
      "warm. *× local* is the median of per-run ratios of rows/s against the local-disk epoch with the same "
      "epoch number and page-cache state (the cold epoch against local disk with the page cache dropped). %s"
      % (saved["cache_size"], "After every drop the server's files of the main dataset are read back into the "
         "page cache, so that the server serves as fast as when its ceiling is measured." if args["server"] ==
         "s3s-nginx" else "moto_server keeps the objects in its memory."))
    w("- **The machine during each epoch**: bytes read from the disk holding the work directory, where both "
      "scdlfs's cache and the local copy live (`/proc/diskstats`), and the share of all cores' time busy and "
      "waiting on a disk (`/proc/stat`); the targets table names them where they bound a miss.")
    if any(k[0].startswith(HALF) for k in summary):
        w("- **%s**: scdlfs with a cache of half the dataset (%d bytes), the case it exists for: a fresh mount's "
          "cold windows epoch 2r, then epoch 2r+1 (another order of the windows) with the page cache dropped; "
          "its *fetched / dataset* against the floor, (dataset − cache) ÷ dataset = %.2f×." % (
              HALF, info["bytes"] // 2, (info["bytes"] - info["bytes"] // 2) / info["bytes"]))
    w("- **Other systems** (cold, empty caches, epoch 2r): s3fs-fuse %s and rclone %s (Debian), with disk "
      "caches, map the chunk files; Python chunk loader = bench/chunk_loader.py, the original loader's design "
      "(whole-chunk downloads with boto3 into an LRU of %d chunks, the next window prefetched by a thread). They "
      "read the chunked layout, so they have no *× local*; *× link* compares every cold reader with the bytes "
      "they all need." % (saved["versions"].get("s3fs", "?"), saved["versions"].get("rclone", "?"),
                          PYTHON_LOADER_CHUNKS))
    loads = [r["load_1m"] for r in saved["results"] if r.get("load_1m") is not None]
    ra = saved.get("read_ahead_kib", {})
    w("- **Read-ahead**: around a fault, local disk reads its disk's read-ahead (%s KiB); an scdlfs mount "
      "asks the network for the kernel's 128 KiB around a fault, and a read its disk cache serves stores the "
      "window of the cache's disk read-ahead (%s KiB, `--cache-read-around`) from cached parts into the page "
      "cache. Options of the scdlfs mounts beyond their defaults: %s." % (
          ra.get("local_disk") or "?", ra.get("cache_disk") or "?",
          "`%s`" % " ".join(saved["mount_args"]) if saved.get("mount_args") else "none"))
    w("- **Binaries**: cargo profile `%s`%s. **Machine load**: the 1-minute load average at the end of the "
      "epochs was %s on %d cores (the reader and the daemon count in it; other jobs may have shared the "
      "machine)." % (args.get("profile", "release"),
                     " (release with debug assertions and overflow checks, the test suite's build)"
                     if args.get("profile", "release") == "ci" else "",
                     "median %.1f, max %.1f" % (med(loads), max(loads)) if loads else "not recorded",
                     saved["cores"]))
    w("- **Figures**: medians of %d runs; *× link* = epoch s ÷ link limit; *stall* = time in row reads slower than "
      "1 ms (the loader: time waiting for a chunk); *fetched / dataset* = bytes through the link per row read × "
      "rows ÷ dataset bytes (for a time-bounded epoch, extrapolated to a whole one); *RSS* = the daemon's peak "
      "resident memory (VmHWM) at the end of that epoch, since its mount (for the loader, the loader process); "
      "*CPU s/GB* = the daemon's user + system CPU seconds during the epoch (/proc/<pid>/stat) per GB of rows "
      "the reader read." % args["runs"])
    w("")
    for order in ORDERS:
        w("### Order: %s" % order)
        w("")
        w("| system | epoch s | rows/s | × local | × link | first row s | stall s | fetched / dataset | RSS MiB "
          "| CPU s/GB |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for s in systems:
            m = summary.get((s, order))
            if not m:
                continue
            fetched = m["bytes_per_row"] * info["rows"] / info["bytes"] if m["bytes_per_row"] is not None else None
            cold = s.startswith(("scdlfs cold", HALF)) or s in ("s3fs-fuse", "rclone mount", "Python chunk loader")
            w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                s, epoch_text(m), fmt(m["rows_per_s"], ",.0f"), fmt(m["ratio"], ".2f"),
                fmt(m["epoch_s"] / link_s if cold else None, ".2f"), fmt(m["first_row_s"], ".2f"),
                fmt(m["stall_s"], ".1f"), fmt(fetched, ".2f") + "×" if fetched is not None else "—",
                fmt(m["rss_mib"], ".0f"), fmt(m["cpu_s_per_gb"], ".2f")))
        w("")
    if path_png:
        w("![rows per second by system and order](benchmarks.png)")
        w("")
    rss = rep.rss_by_size()
    if rss:
        w("**Daemon peak RSS against dataset size** (the same phase and statistic at every size: a fresh mount's "
          "cold windows epoch with hints, VmHWM at its end, median of the runs): %s." % ", ".join(
              "%.0f MiB at %.2f GB%s" % (mib, size / 1e9, "" if done else " (time-bounded epoch)")
              for size, mib, done in rss))
        w("")
    if any(k[0].startswith(TORCH) for k in summary):
        lines.extend(torch_section(rep, results))
        w("")
    if saved.get("startup") or any(k[0] == RESTART_FIRST for k in summary):
        lines.extend(restart_section(rep, results))
        w("")
    w("## Against the targets")
    w("")
    w("| target (issue 12) | measured | | what bounds a miss, as this run measured it |")
    w("| --- | --- | --- | --- |")
    for target, measured, verdict, limit in rep.targets():
        w("| %s | %s | %s | %s |" % (target, measured, verdict, limit))
    w("")
    w("## Reduced variant (CI)")
    w("")
    w("`bench/run.py --quick` (run by `scripts/test-all`): a %d MB dataset, moto_server as the S3 server, "
      "the test suite's binaries (cargo profile ci), a cache smaller than the dataset, one run of each system and "
      "order, time-bounded; it renders this page "
      "into its work directory and fails unless every epoch read at least %d rows (or the whole epoch), each "
      "checked against the generator, and on every scdlfs mount the cache budget bound (parts evicted or refused "
      "for lack of room)." % (QUICK_SIZE_MB, QUICK_MIN_ROWS))
    w("")
    w("Raw results: `%s` (per epoch; written by the run with this page)." % results_rel)
    with open(path_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    splice(readme, README_BEGIN, README_END, readme_summary(rep, os.path.relpath(path_md, os.path.dirname(readme))))
    if path_png:
        plot = dict(title="scdlfs benchmark: %.2f GB, %.0f MB/s + %.0f ms link, median of %d run(s)"
                    % (info["bytes"] / 1e9, args["rate_mbps"], args["latency_ms"], args["runs"]),
                    orders=ORDERS, systems=systems,
                    rows_per_s=[[summary.get((s, o), {}).get("rows_per_s") for o in ORDERS] for s in systems])
        plot_json = os.path.join(os.path.dirname(saved["path"]), "plot.json")
        with open(plot_json, "w") as f:
            json.dump(plot, f)
        run([BENCH, "plot", "--summary", plot_json, "--out", path_png, "--font", font])


def readme_summary(rep, link):
    """README's benchmark paragraph: only figures of this run."""
    g, args, info = rep.get, rep.args, rep.info
    orders = [o for o in ORDERS if o in args["orders"].split(",")]
    names = {"windows": "chunk-window", "blocks": "block", "random": "random"}
    cold = ", ".join("%s %s×" % (o, fmt(g("scdlfs cold, hints", o, "epoch_s") and
                                        g("scdlfs cold, hints", o, "epoch_s") / rep.link_s, ".2f")) for o in orders)
    warm = ", ".join("%s %s×" % (o, fmt(g("scdlfs disk-cache warm, hints", o, "ratio"), ".2f")) for o in orders)
    cpu = ", ".join("%s %s" % (state, fmt(g("scdlfs %s, hints" % state, "windows", "cpu_s_per_gb"), ".2f"))
                    for state in ("cold", "disk-cache warm", "page-cache warm"))
    verdicts = [v for _, _, v, _ in rep.targets()]
    reduced = reductions(args)
    text = ("A synthetic %.2f GB dataset served from an S3-compatible server on 127.0.0.1 behind an emulated "
            "%.0f MB/s, %.0f ms link (link limit %.1f s), read in %s order; medians "
            "of %d runs on a %d-core machine (%s). A cold scdlfs epoch with hints takes %s the link limit. From "
            "the disk cache with the page cache dropped, scdlfs reads at %s the rows/s of local disk in the same "
            "state (same flat layout, same epoch). The daemon's CPU seconds per GB of rows read, chunk-window order "
            "with hints: %s. Targets: %d met, %d missed, %d not measured in this run. "
            "Figures, method and every target: [%s](%s)." % (
                info["bytes"] / 1e9, args["rate_mbps"], args["latency_ms"], rep.link_s,
                ", ".join(names[o] for o in orders), args["runs"],
                rep.saved["cores"], rep.saved["date"], cold, warm, cpu, verdicts.count("**met**"),
                verdicts.count("**missed**"), verdicts.count("not measured"), link, link))
    if reduced:
        text += " A reduced configuration: %s." % "; ".join(reduced)
    return [README_BEGIN, text, README_END]


def splice(path, begin, end, block_lines):
    """Replaces the block between `begin` and `end` in a file (or appends it)."""
    text = open(path).read() if os.path.exists(path) else ""
    block = "\n".join(block_lines)
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def torch_section(rep, results):
    """The PyTorch DataLoader section of the report, between markers, so that a run of the
    torch system alone can replace it in the report of a full run."""
    args, info, summary, link_s, saved = rep.args, rep.info, rep.summary, rep.link_s, rep.saved
    lines = [TORCH_BEGIN, "## PyTorch: the SCDL reader through a DataLoader", ""]
    w = lines.append
    w("How PyTorch users read (bench/torch_loader.py): bionemo-scdl's `SingleCellMemMapDataset` on the directory, "
      "`DataLoader(num_workers=2)` with the `scdlfs` package's sampler (`ChunkWindowSampler`, 4 chunks per window, "
      "batches of 64; `BlockSampler`, the block order above, as batch sampler); each worker checks every row's "
      "digest. The main process iterates the sampler and writes the hints; the workers read. Epochs and page-cache "
      "states as above; *local disk* = the same local copy of the flat archive. *epoch s* and *rows/s* count from "
      "the first batch on; *first row s* is the DataLoader's start-up (workers forked, first batch read). Measured "
      "%s on %s (%d cores): %.2f GB dataset, link %.0f MB/s + %.0f ms (link limit **%.1f s**), cache %s, medians "
      "of %d run(s), epochs stop after %.0f s (then ~, extrapolated)." % (
          saved["date"], saved["host"], saved["cores"], info["bytes"] / 1e9, args["rate_mbps"],
          args["latency_ms"], link_s, saved["cache_size"], args["runs"], args["time_limit"]))
    w("")
    w("| order | reader | epoch s | rows/s | × local | first row s | fetched / dataset | CPU s/GB |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for order in TORCH_ORDERS:
        for s in SYSTEM_ORDER[:8]:
            m = summary.get((TORCH + ", " + s, order))
            if not m:
                continue
            fetched = m["bytes_per_row"] * info["rows"] / info["bytes"]
            w("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                order, s, epoch_text(m), fmt(m["rows_per_s"], ",.0f"), fmt(m["ratio"], ".2f"),
                fmt(m["first_row_s"], ".2f"), fmt(fetched, ".2f") + "×", fmt(m["cpu_s_per_gb"], ".2f")))
    w("")
    for order in TORCH_ORDERS:
        cold = summary.get((TORCH + ", scdlfs cold, hints", order))
        plain = summary.get((TORCH + ", scdlfs cold, no hints", order))
        if cold and plain:
            w("- %s order, cold epoch with hints %s s = %.2f× the link limit (target ≤ 1.2×: %s); without hints "
              "(what users got before the package) %s s." % (
                  order, epoch_text(cold), cold["epoch_s"] / link_s,
                  "**met**" if cold["epoch_s"] <= 1.2 * link_s else "**missed**", epoch_text(plain)))
    w("")
    w("Raw results of this section: `%s`." % os.path.relpath(results, REPO))
    w(TORCH_END)
    return lines

def restart_section(rep, results):
    """The restart section of the report, between markers, so that a run of the restart
    system alone can replace it in the report of a full run."""
    saved, info, args = rep.saved, rep.info, rep.args
    epochs = [r for r in saved["results"] if r["system"] in (RESTART_LONG, RESTART_FIRST)]
    startup = saved.get("startup", [])
    lines = [RESTART_BEGIN, "## Restarts: the cache across a remount", ""]
    w = lines.append
    if epochs:
        w("A fresh mount reads the dataset (%.2f GB) through once, so that its cache (twice the dataset) holds "
          "all of it, then reads windows epoch 2r+1 with hints: *long-running*. Its daemon is stopped (SIGTERM), "
          "a new one mounts the same `--cache-dir` and reads the same epoch: *after remount*. The new daemon lists "
          "the store, reads its part files' headers in the background and adopts the parts whose objects are "
          "unchanged, all during that epoch. Before both epochs the page cache is dropped and the cache "
          "directory's files are read back into it: the state after a service restart (the mount's own page "
          "cache is gone, the part files' pages are not), so that the ratio shows what the daemon costs, not the "
          "disk (with the page cache dropped, both epochs read the disk at its speed). The server is "
          "moto_server (PyPI) behind the link of the main tables (%.0f MB/s + %.0f ms): adoption needs ETags in "
          "listings, which s3s-fs does not give. *fetched* = bytes through the link during the epoch. Measured "
          "%s on %s (%d cores), cargo profile `%s`, time limit %.0f s per epoch." % (
              info["bytes"] / 1e9, args["rate_mbps"], args["latency_ms"], saved["date"], saved["host"],
              saved["cores"], args.get("profile", "release"), args["time_limit"]))
        w("")
        w("| run | long-running rows/s | after remount rows/s | ratio | first row s after remount "
          "| fetched after remount | parts adopted |")
        w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        by = {(r["system"], r["run"]): r for r in epochs}
        ratios = []
        for run_i in sorted({r["run"] for r in epochs}):
            a, b = by.get((RESTART_LONG, run_i)), by.get((RESTART_FIRST, run_i))
            if not (a and b):
                continue
            ratios.append(b["rows_per_s"] / a["rows_per_s"])
            w("| %d | %s | %s | %.3f | %.2f | %.1f MB | %d |" % (
                run_i, fmt(a["rows_per_s"], ",.0f"), fmt(b["rows_per_s"], ",.0f"), ratios[-1], b["first_row_s"],
                b["bytes_fetched"] / 1e6, b["cache"]["adopted_parts"]))
        w("")
        m = med(ratios)
        w("- First epoch after a remount against a warm epoch on a long-running mount: median ratio of rows/s "
          "%s over %d run(s) (target ≥ 0.95×: %s)." % (
              fmt(m, ".3f"), len(ratios), "not measured" if m is None else "**met**" if m >= 0.95 else "**missed**"))
        w("")
    if startup:
        st = startup[0]
        w("### Mount to first row with a large cache")
        w("")
        w("A cache of %d parts (%.2f GB on disk): the dataset `%s` (%.2f GB) in a local folder, mounted with "
          "`--read-part-size %d` (the smallest part, to make many parts from a moderate dataset) and filled by "
          "`scdlfs warm --all` (%.0f s). Each measurement drops the page cache, starts `scdlfs mount` on that "
          "folder and cache directory, waits for the dataset's `header.sch` to appear in the mount (*visible*), "
          "then starts a reader whose first row (no hints) ends *first row*; both count from the start of "
          "`scdlfs mount`. *headers read*: when the daemon has read the headers of all the earlier mount's part "
          "files (in the background). *fetched*: parts read from the folder by then (the first row's, if they "
          "were not adopted yet). *by reads*: of the parts adopted, those a read claimed before the background "
          "had read their headers. The same with an empty cache directory, in the same run." % (
              st["parts"], st["cache_bytes"] / 1e9, st["dataset"], st["dataset_bytes"] / 1e9, STARTUP_PART_SIZE,
              st["fill_s"]))
        w("")
        w("| cache | run | visible s | first row s | headers read s | parts fetched | parts adopted | by reads |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in startup:
            w("| %s | %d | %.3f | %.3f | %s | %d | %d | %d |" % (
                r["system"], r["run"], r["dataset_visible_s"], r["first_row_s"], fmt(r["adoption_done_s"], ".2f"),
                r["parts_fetched"], r["adopted_parts"], r["adopted_by_reads"]))
        w("")
        for label in sorted({r["system"] for r in startup}, reverse=True):
            rs = [r for r in startup if r["system"] == label]
            w("- %s: mount to first row, median %.3f s over %d run(s); headers read after %s s; %s parts "
              "fetched for the first row." % (
                  label, med([r["first_row_s"] for r in rs]), len(rs),
                  fmt(med([r["adoption_done_s"] for r in rs]), ".2f"), fmt(med([r["parts_fetched"] for r in rs]), ".0f")))
        by_run = {}
        for r in startup:
            by_run.setdefault(r["run"], {})["empty" if r["system"] == "empty cache" else "full"] = r
        delays = [p["full"]["dataset_visible_s"] - p["empty"]["dataset_visible_s"] for p in by_run.values()
                  if "full" in p and "empty" in p]
        delay = med(delays)
        w("- The cache of %d parts delays the mount (*visible*, against the empty cache in the same run) by "
          "%s s, median of per-run differences (target ≤ ~1 s for 10^5 parts: %s). Before the mount is ready "
          "the part files are only listed (their names carry their lengths, so that the budget holds from the "
          "first second), neither opened nor sized." % (
              st["parts"], fmt(delay, ".2f"), "not measured" if delay is None or st["parts"] < STARTUP_PARTS
              else "**met**" if delay <= 1.0 else "**missed**"))
        w("")
    w("Raw results of this section: `%s`." % os.path.relpath(results, REPO))
    w(RESTART_END)
    return lines

# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the reduced CI variant")
    p.add_argument("--work", default=os.path.join(REPO, "target", "bench"))
    p.add_argument("--size-mb", type=int, default=1500)
    p.add_argument("--small-size-mb", type=int, default=400, help="second size, for the daemon's RSS")
    p.add_argument("--large-size-mb", type=int, default=0,
                   help="also a dataset this large (15000 for the RSS-flat figure): a scdlfs cold windows epoch with "
                        "hints per run, whole, for the daemon's peak RSS")
    p.add_argument("--profile", default=None,
                   help="the cargo profile of the binaries measured (default release; --quick: ci, the test "
                        "suite's build)")
    p.add_argument("--chunk-rows", type=int, default=4096)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate-mbps", type=float, default=200.0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--time-limit", type=float, default=15.0, help="seconds per epoch at most")
    p.add_argument("--cache-size", default="3GiB")
    p.add_argument("--mount-args", default="",
                   help="more options for every scdlfs mount of the main tables, e.g. "
                        "'--cache-read-around 0' (shown on the page)")
    p.add_argument("--server", choices=["s3s-nginx", "moto"], default=None)
    p.add_argument("--systems", default="local,scdlfs,halfcache,s3fs,rclone,python,torch,restart")
    p.add_argument("--orders", default=",".join(ORDERS))
    p.add_argument("--other-orders", default=None,
                   help="the orders s3fs-fuse, rclone and the Python chunk loader read (default: --orders)")
    p.add_argument("--font", default="/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
    p.add_argument("--report", default=os.path.join(REPO, "docs", "benchmarks.md"))
    p.add_argument("--readme", default=os.path.join(REPO, "README.md"),
                   help="the file whose benchmark summary (between its markers) is regenerated")
    p.add_argument("--report-only", action="store_true",
                   help="re-render the report from the results file beside it (docs/benchmarks.json)")
    command = " ".join(["bench/run.py"] + sys.argv[1:])
    args = p.parse_args()
    args.profile = args.profile or ("ci" if args.quick else "release")
    use_binaries(args.profile)
    if args.quick:
        args.size_mb, args.runs, args.chunk_rows = QUICK_SIZE_MB, 1, 1024
        args.time_limit = min(args.time_limit, 8.0)
        args.server = args.server or "moto"
        args.work = os.path.join(REPO, "target", "bench-quick")
        # Smaller than the dataset, so that eviction runs during every scdlfs epoch.
        args.cache_size = "24MiB"
        # The page is rendered (which checks the report code) but not into the repository.
        args.report = os.path.join(args.work, "benchmarks.md")
        args.readme = os.path.join(args.work, "README.md")
    png = None if args.quick else os.path.join(os.path.dirname(args.report), "benchmarks.png")
    if args.report_only:
        saved = json.load(open(results_copy(args.report)))
        write_report(saved, args.report, png, args.font, args.readme)
        return
    args.server = args.server or "s3s-nginx"
    started = time.time()
    for d in ("logs", "mnt", "cache"):
        os.makedirs(os.path.join(args.work, d), exist_ok=True)
    if args.quick:
        shutil.copy(os.path.join(REPO, "README.md"), args.readme)
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    ensure_tools(args)
    ctx = Ctx()
    ctx.work, ctx.seed, ctx.limit, ctx.python = args.work, 1, args.time_limit, args.python
    ctx.torch_python = getattr(args, "torch_python", None)
    ctx.cache_size = args.cache_size
    ctx.mount_args = args.mount_args.split()
    ctx.name = "ds-%d" % args.size_mb
    ctx.info = generate(args, ctx.name, args.size_mb)
    systems = args.systems.split(",")
    extra = {}  # dataset name -> its info, for the daemon's RSS against size
    if not args.quick and "scdlfs" in systems:
        for size in (args.small_size_mb, args.large_size_mb):
            if size:
                extra["ds-%d" % size] = generate(args, "ds-%d" % size, size)
    ctx.digests = os.path.join(args.work, "digests", ctx.name)
    versions = {}
    for tool, cmd in (("s3fs", ["s3fs", "--version"]), ("rclone", ["rclone", "version"])):
        try:
            versions[tool] = subprocess.run(cmd, capture_output=True, text=True).stdout.split("\n")[0].split()[-1]
        except (OSError, IndexError):
            pass

    endpoint, s3s_alone = start_server(args, [ctx.name] + list(extra))
    ctx.endpoint = endpoint
    if args.server == "s3s-nginx":
        SERVER_FILES.append(os.path.join(args.work, "s3root", BUCKET, ctx.name))
    ctx.proxy, ctx.stats = start_proxy(args, endpoint)
    log("server %s, link %s (%.0f MB/s, %.0f ms)" % (endpoint, ctx.proxy, args.rate_mbps, args.latency_ms))
    probes = {
        "server_1": probe(endpoint, ctx.name, 1, 300 if not args.quick else 40),
        "server_8": probe(endpoint, ctx.name, 8, 600 if not args.quick else 40),
        "link_8": probe(ctx.proxy, ctx.name, 8, 400 if not args.quick else 40),
    }
    if s3s_alone:
        probes["s3s_1"] = probe(s3s_alone, ctx.name, 1, 40)
        probes["s3s_8"] = probe(s3s_alone, ctx.name, 8, 80)
    log("server ceiling: %.0f MB/s (1 connection), %.0f MB/s (8); through the link %.0f MB/s"
        % (probes["server_1"]["mb_per_s"], probes["server_8"]["mb_per_s"], probes["link_8"]["mb_per_s"]))

    orders = args.orders.split(",")
    other_orders = (args.other_orders or args.orders).split(",")
    results = []
    startup = []  # the restart system's mount-to-first-row measurements
    failures = []

    def record(fn, *a, **kw):
        try:
            for r in fn(*a, **kw):
                r["run"] = run_i
                results.append(r)
                log("run %d %-40s %-8s %9.0f rows/s%s  %6.1f s  fetched %6.0f MB  rss %s  cpu %s" % (
                    run_i, r["system"], r["order"], r["rows_per_s"], "" if r["completed"] else " (time-bounded)",
                    r["seconds"], r["bytes_fetched"] / 1e6,
                    "%d MiB" % (r["daemon_peak_rss_kib"] // 1024) if r.get("daemon_peak_rss_kib") else "—",
                    "%.1f s" % r["daemon_cpu_s"] if "daemon_cpu_s" in r else "—"))
        except RuntimeError as e:
            failures.append(str(e))
            log("FAILED: %s" % e)

    def other_size(name, hints, limit):
        """The same daemon settings on another dataset: a fresh mount's cold windows epoch."""
        other = Ctx()
        other.__dict__.update(ctx.__dict__)
        other.name, other.info = name, extra[name]
        other.digests = os.path.join(args.work, "digests", name)
        return sys_scdlfs(other, "windows", run_i, hints, dataset=name, label_suffix=" (%s)" % name, warm=False,
                          limit=limit)

    for run_i in range(args.runs):
        for order in orders:
            if "local" in systems:
                record(sys_local, ctx, order, run_i)
            if "scdlfs" in systems:
                record(sys_scdlfs, ctx, order, run_i, True)
                record(sys_scdlfs, ctx, order, run_i, False)
            if "halfcache" in systems and order == "windows":
                for hints in (True, False):
                    record(sys_scdlfs_half, ctx, run_i, hints)
            if "s3fs" in systems and order in other_orders:
                record(sys_s3fs, ctx, order, run_i)
            if "rclone" in systems and order in other_orders:
                record(sys_rclone, ctx, order, run_i)
            if "python" in systems and order in other_orders:
                record(sys_python, ctx, order, run_i)
            if "torch" in systems and order in TORCH_ORDERS and (order == "windows" or not args.quick):
                record(sys_torch, ctx, order, run_i)
            if "restart" in systems and order == "windows":
                record(sys_restart, ctx, args, run_i)
                try:
                    for r in sys_startup(ctx, args, run_i):
                        r["run"] = run_i
                        startup.append(r)
                        log("run %d startup, %-24s first row %.3f s (visible %.3f s), headers read %s s, "
                            "%d parts fetched" % (run_i, r["system"], r["first_row_s"], r["dataset_visible_s"],
                                                  fmt(r["adoption_done_s"], ".2f"), r["parts_fetched"]))
                except RuntimeError as e:
                    failures.append(str(e))
                    log("FAILED: %s" % e)
        if args.small_size_mb and "ds-%d" % args.small_size_mb in extra:
            record(other_size, "ds-%d" % args.small_size_mb, True, ctx.limit)
        if args.large_size_mb and "ds-%d" % args.large_size_mb in extra:
            # A whole epoch with hints (the RSS target is with plans): the peak RSS of a whole
            # pass over a dataset larger than the cache.
            record(other_size, "ds-%d" % args.large_size_mb, True, None)

    saved = dict(path=os.path.join(args.work, "results.json"), command=command, probes=probes, results=results,
                 startup=startup,
                 args=vars(args), info=ctx.info, name=ctx.name,
                 sizes=dict({ctx.name: ctx.info["bytes"]}, **{n: i["bytes"] for n, i in extra.items()}),
                 versions=versions, cache_size=ctx.cache_size, minutes=(time.time() - started) / 60,
                 read_ahead_kib=dict(local_disk=disk_read_ahead_kib(os.path.join(args.work, "local-flat")),
                                     cache_disk=disk_read_ahead_kib(os.path.join(args.work, "cache"))),
                 mount_args=ctx.mount_args,
                 host=socket.gethostname(), cores=os.cpu_count(), date=time.strftime("%Y-%m-%d"))
    with open(saved["path"], "w") as f:
        json.dump(saved, f, indent=1)
    if failures:
        for msg in failures:
            log("FAILED: " + msg)
        sys.exit("%d system runs failed" % len(failures))
    if args.quick:
        quick_checks(args, systems, orders, other_orders, results, startup, ctx.info)
        write_report(saved, args.report, None, args.font, args.readme)
        print("bench quick: %d epochs passed, 0 failed (every epoch read ≥ %d rows or all, each checked; the cache "
              "budget bound on every scdlfs mount; report rendered to %s; %.0f s)"
              % (len(results), QUICK_MIN_ROWS, os.path.relpath(args.report, REPO), time.time() - started))
        return
    for alone, begin, end, section in (("torch", TORCH_BEGIN, TORCH_END, torch_section),
                                       ("restart", RESTART_BEGIN, RESTART_END, restart_section)):
        if systems == [alone]:
            # Run alone, a system updates only its own section of the page.
            results = os.path.splitext(args.report)[0] + "-%s.json" % alone
            with open(results, "w") as f:
                json.dump(saved, f, indent=1)
            splice(args.report, begin, end, section(Report(saved), results))
            log("updated the %s section of %s in %.0f s" % (alone, args.report, time.time() - started))
            return
    write_report(saved, args.report, png, args.font, args.readme)
    log("wrote %s and the summary in %s in %.0f s" % (args.report, args.readme, time.time() - started))


def quick_checks(args, systems, orders, other_orders, results, startup, info):
    """What --quick claims: every system and state ran, every epoch read enough rows (each
    checked by its reader against the generator), and on every scdlfs mount the cache
    budget bound: parts were evicted, or refused for lack of room (with a plan protecting
    what it will read, the daemon may refuse new parts rather than evict planned ones)."""
    seen = {(r["system"], r["order"]) for r in results}
    scdlfs_states = ["scdlfs %s, %s" % (s, h) for s in ("cold", "disk-cache warm", "page-cache warm")
                     for h in ("hints", "no hints")]
    local_states = ["local disk, " + DROPPED, "local disk, " + WARM]
    expected = {(s, o) for o in orders for s in local_states} if "local" in systems else set()
    if "scdlfs" in systems:
        expected |= {(s, o) for o in orders for s in scdlfs_states}
    if "halfcache" in systems and "windows" in orders:
        expected |= {("%s, %s, %s" % (HALF, e, h), "windows") for e in ("cold", "next epoch")
                     for h in ("hints", "no hints")}
    for s, name in (("s3fs", "s3fs-fuse"), ("rclone", "rclone mount"), ("python", "Python chunk loader")):
        if s in systems:
            expected |= {(name, o) for o in orders if o in other_orders}
    if "torch" in systems and "windows" in orders:
        expected |= {(TORCH + ", " + s, "windows") for s in local_states + scdlfs_states}
    if "restart" in systems and "windows" in orders:
        expected |= {(RESTART_LONG, "windows"), (RESTART_FIRST, "windows")}
        expected |= {(r["system"], "startup") for r in startup}
        seen |= {(r["system"], "startup") for r in startup}
        if len(startup) < 2:
            expected.add(("mount to first row, with and without a cache", "startup"))
    problems = ["no result for %s, %s" % k for k in sorted(expected - seen)]
    for r in results:
        # The remount reads what the daemon before it downloaded: adopted, not fetched again
        # (listings and headers are a few KB).
        if r["system"] == RESTART_FIRST and not (
                r["cache"]["adopted_parts"] > 0 and r["bytes_fetched"] < 0.05 * info["bytes"]):
            problems.append("the epoch after a remount adopted %d parts and fetched %d bytes of a %d-byte dataset" % (
                r["cache"]["adopted_parts"], r["bytes_fetched"], info["bytes"]))
    for r in startup:
        if r["system"] != "empty cache" and r["adopted_parts"] == 0:
            problems.append("startup with a cache of %d parts adopted none" % r["parts"])
    for r in results:
        if r["rows"] < min(QUICK_MIN_ROWS, r["epoch_rows"]):
            problems.append("%s, %s, epoch %d read %d rows, fewer than %d" % (
                r["system"], r["order"], r["epoch"], r["rows"], QUICK_MIN_ROWS))
        cache = r.get("cache")
        if cache and ("page-cache warm" in r["system"] or r["system"].startswith(HALF + ", next")) and not (
                cache["evicted_parts"] or cache["parts_not_cached_for_lack_of_room"]):
            problems.append("%s, %s: the budget never bound (no part evicted or refused) with a %s cache" % (
                r["system"], r["order"], args.cache_size))
    if problems:
        sys.exit("bench quick failed:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main()
