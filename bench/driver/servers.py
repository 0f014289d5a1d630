"""The S3 side of a run: the synthetic dataset, the S3-compatible server on 127.0.0.1
(s3s-fs behind nginx, or moto_server), the link-emulating proxy (bench/src/proxy.rs)
every client reaches it through, and the server's own ceiling."""

import json
import os
import shutil
import subprocess
import urllib.request

from .config import BUCKET, KEY, SECRET
from .procs import clean_env, free_port, log, run, spawn, wait_port
from .tools import BIN


def generate(args, name, size_mb):
    ds = os.path.join(args.work, "s3root", BUCKET, name)
    digests = os.path.join(args.work, "digests", name)
    if os.path.exists(digests + ".json") and os.path.isdir(ds):
        return json.load(open(digests + ".json"))
    shutil.rmtree(ds, ignore_errors=True)
    os.makedirs(os.path.dirname(ds), exist_ok=True)
    os.makedirs(os.path.dirname(digests), exist_ok=True)
    log("generating %s (%d MB)" % (name, size_mb))
    gen(ds, digests, size_mb, args.chunk_rows)
    return json.load(open(digests + ".json"))


def gen(out, digests, size_mb, chunk_rows, mean_values=None):
    """`scdlfs-bench gen`: a synthetic chunked dataset in `out`, its row digests in `digests`."""
    cmd = [BIN.bench, "gen", "--out", out, "--digests", digests, "--size-mb", str(size_mb),
           "--chunk-rows", str(chunk_rows)]
    if mean_values:
        cmd += ["--mean-values", str(mean_values)]
    run(cmd, stdout=subprocess.DEVNULL)


NGINX_CONF = """daemon off;
master_process on;
worker_processes 2;
user root;
pid {nginx_dir}/nginx.pid;
error_log {nginx_dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    {access_log}
    sendfile on;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    default_type application/octet-stream;
    # PUTs go to the S3 server whatever their size (an atlas's manifest is megabytes).
    client_max_body_size 0;
    client_body_temp_path {nginx_dir}/tmp;
    proxy_temp_path {nginx_dir}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        # Bucket-level requests (ListObjects, HeadBucket, ...) go to the S3 server.
        location ~ ^/[^/]+/?$ {{
            proxy_pass http://127.0.0.1:{upstream_port};
            proxy_set_header Host $http_host;
            proxy_buffering off;
        }}
        # Object GET/HEAD (with Range, ETag, If-Match) straight from the files; a key that
        # is a directory is a 404 as on S3; anything else goes to the S3 server.
        location / {{
            if ($args != "") {{ proxy_pass http://127.0.0.1:{upstream_port}; }}
            if ($request_method !~ ^(GET|HEAD)$) {{ proxy_pass http://127.0.0.1:{upstream_port}; }}
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
        s3s_port = free_port()
        proc = spawn([args.s3s_fs, "--host", "127.0.0.1", "--port", str(s3s_port), "--access-key", KEY,
                      "--secret-key", SECRET, os.path.join(args.work, "s3root")], "s3s-fs",
                     stderr=open(os.path.join(logs, "s3s-fs.log"), "w"))
        wait_port(s3s_port, proc, "s3s-fs")
        port = start_nginx(os.path.join(args.work, "nginx"), os.path.join(args.work, "s3root"), s3s_port,
                           os.path.join(logs, "nginx.log"))
        return "http://127.0.0.1:%d" % port, "http://127.0.0.1:%d" % s3s_port
    endpoint = start_moto(args.moto, "moto_server")
    for name in datasets:
        upload(endpoint, name, os.path.join(args.work, "s3root", BUCKET, name))
    return endpoint, None


# The log of row_ptr.npy GETs (`start_nginx(log_row_offsets=True)`): per line the key, the
# Range header and the status and body bytes of the answer.
ROW_OFFSETS_LOG = """log_format row_offsets '$uri $http_range $status $body_bytes_sent';
    map $uri $row_offsets_get {{ ~/row_ptr\\.npy$ 1; default 0; }}
    access_log {nginx_dir}/row_offsets.log row_offsets if=$row_offsets_get;"""


def start_nginx(nginx_dir, root, upstream_port, log_path, log_row_offsets=False):
    """nginx on a free port of 127.0.0.1 serving object GETs and HEADs from the files under
    `root` (`root/<bucket>/<key>`), everything else from the S3 server on `upstream_port`;
    its configuration, pid and temporary files in `nginx_dir`, and with `log_row_offsets`
    the log of its row_ptr.npy GETs (`ROW_OFFSETS_LOG`, `nginx_dir`/row_offsets.log).
    Returns its port."""
    port = free_port()
    os.makedirs(os.path.join(nginx_dir, "tmp"), exist_ok=True)
    conf = os.path.join(nginx_dir, "nginx.conf")
    access_log = ROW_OFFSETS_LOG.format(nginx_dir=nginx_dir) if log_row_offsets else "access_log off;"
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(nginx_dir=nginx_dir, root=root, port=port, upstream_port=upstream_port,
                                  access_log=access_log))
    proc = spawn(["nginx", "-c", conf], "nginx", stderr=open(log_path, "w"))
    wait_port(port, proc, "nginx")
    return port


def start_moto(moto, what, bucket=BUCKET):
    """moto_server on a free port of 127.0.0.1 with `bucket` made; returns its endpoint."""
    port = free_port()
    proc = spawn([moto, "-H", "127.0.0.1", "-p", str(port)], what)
    wait_port(port, proc, "moto_server")
    endpoint = "http://127.0.0.1:%d" % port
    req = urllib.request.Request(endpoint + "/" + bucket, method="PUT")
    urllib.request.urlopen(req).read()
    return endpoint


def upload(endpoint, name, src, bucket=BUCKET):
    """A dataset folder into `bucket` under the prefix `name` (for servers that do not serve a folder)."""
    run([BIN.bench, "upload", "--endpoint", endpoint, "--bucket", bucket, "--prefix", name, "--src", src],
        env=clean_env())


def start_proxy(endpoint, rate_mbps, latency_ms, log_path=None):
    """The emulated link (bench/src/proxy.rs) in front of `endpoint`: `rate_mbps` shared by
    all connections, `latency_ms` before every response. Returns its endpoint and the URL
    of its byte counters."""
    upstream = endpoint.replace("http://", "")
    proc = spawn([BIN.bench, "proxy", "--upstream", upstream, "--rate-mbps", str(rate_mbps),
                  "--latency-ms", str(latency_ms)], "proxy", stdout=subprocess.PIPE,
                 stderr=open(log_path, "w") if log_path else None)
    ports = json.loads(proc.stdout.readline())
    return "http://" + ports["listen"], "http://" + ports["stats"]


def proxy_counters(stats_url):
    """The link's counters since it started: bytes_down, bytes_up, requests, connections."""
    return json.loads(urllib.request.urlopen(stats_url).read())


def proxy_bytes(stats_url):
    return proxy_counters(stats_url)["bytes_down"]


def probe(endpoint, prefix, concurrency, max_mb, part_size=None):
    """Ranged GETs of `part_size` bytes (8 MiB by default) with `concurrency` in flight,
    over the objects under `prefix` in order, up to `max_mb`: their bytes, seconds, MB/s
    and GETs per second."""
    cmd = [BIN.bench, "s3probe", "--endpoint", endpoint, "--bucket", BUCKET, "--prefix", prefix,
           "--concurrency", str(concurrency), "--max-mb", str(max_mb)]
    if part_size:
        cmd += ["--part-size", str(part_size)]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=clean_env()).stdout)
    out["gets_per_s"] = out["bytes"] / out["part_size"] / out["seconds"]
    return out
