#!/usr/bin/env python3
"""How to choose `scdlfs chunk --chunk-rows`: for each chunk size, the cold-epoch time of
the chunk-window order with hints (a plan) through scdlfs over an emulated link, and the
minibatch diversity that order gives (distinct chunks in a minibatch of 64 rows).

    bench/chunk_rows.py [--chunk-rows 256 1024 4096] [--size-mb 48] [--runs 3]

Uses the binaries of target/ci (cargo build --profile ci -p scdlfs -p scdlfs-bench),
moto_server and the scdlfs Python package from the venv (SCDLFS_VENV, default .venv),
scdlfs-bench's generator, uploader, link-emulating proxy and reader. Only 127.0.0.1 is
used, with dummy keys. Prints a Markdown table of medians (docs/preparing-data.md);
the machine is shared and noisy, so compare rows of one run, not runs."""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(REPO, "target", "ci")
VENV = os.environ.get("SCDLFS_VENV", os.path.join(REPO, ".venv"))
BUCKET = "chunkrows"
BATCH = 64
CHUNKS_PER_WINDOW = 4  # scdlfs-bench read's chunk-window order


def log(msg):
    print("[chunk-rows] " + msg, file=sys.stderr, flush=True)


def env():
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    e.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1",
             AWS_EC2_METADATA_DISABLED="true", NO_PROXY="127.0.0.1")
    return e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("nothing listens on port %d" % port)


def diversity(dataset_dir, chunk_rows):
    """Of the chunk-window order (the scdlfs package's sampler, the same orders as the
    reader's): the mean distinct chunks in a minibatch of BATCH consecutive rows, and
    the share of the dataset (%) a minibatch's window draws its rows from."""
    code = (
        "import json, sys, scdlfs\n"
        "s = scdlfs.ChunkWindowSampler(sys.argv[1], chunks_per_window=%d, seed=1, hints=False)\n"
        "size = int(sys.argv[2])\n"
        "rows = list(s)\n"
        "counts = [len({r // size for r in rows[i:i + %d]}) for i in range(0, len(rows) - %d + 1, %d)]\n"
        "print(json.dumps([sum(counts) / len(counts), 100 * %d * size / s.num_rows]))\n" % (CHUNKS_PER_WINDOW, BATCH, BATCH, BATCH, CHUNKS_PER_WINDOW)
    )
    out = subprocess.run([os.path.join(VENV, "bin", "python"), "-c", code, dataset_dir, str(chunk_rows)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-rows", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--size-mb", type=int, default=48)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--latency-ms", type=int, default=20)
    ap.add_argument("--rate-mbps", type=int, default=400)
    ap.add_argument("--cache-size", default="32MiB")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="scdlfs-chunk-rows-")
    children = []
    try:
        port = free_port()
        children.append(subprocess.Popen([os.path.join(VENV, "bin", "moto_server"), "-H", "127.0.0.1",
                                          "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(port)
        endpoint = "http://127.0.0.1:%d" % port
        urllib.request.urlopen(urllib.request.Request(endpoint + "/" + BUCKET, method="PUT")).read()
        proxy = subprocess.Popen([os.path.join(BIN, "scdlfs-bench"), "proxy", "--upstream", "127.0.0.1:%d" % port,
                                  "--rate-mbps", str(args.rate_mbps), "--latency-ms", str(args.latency_ms)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        children.append(proxy)
        proxied = "http://" + json.loads(proxy.stdout.readline())["listen"]
        rows = []
        for chunk_rows in args.chunk_rows:
            name = "ds-%d" % chunk_rows
            local = os.path.join(work, name)
            digests = os.path.join(work, name + ".digests")
            subprocess.run([os.path.join(BIN, "scdlfs-bench"), "gen", "--out", local, "--digests", digests,
                            "--size-mb", str(args.size_mb), "--mean-values", "200", "--chunk-rows",
                            str(chunk_rows)],
                           check=True, stdout=subprocess.DEVNULL)
            subprocess.run([os.path.join(BIN, "scdlfs-bench"), "upload", "--endpoint", endpoint, "--bucket",
                            BUCKET, "--prefix", name, "--src", local], check=True, env=env())
            seconds = []
            for run in range(args.runs):
                mnt, cache = os.path.join(work, "mnt"), os.path.join(work, "cache-%d-%d" % (chunk_rows, run))
                os.makedirs(mnt, exist_ok=True)
                subprocess.run([os.path.join(BIN, "scdlfs"), "mount", "s3://" + BUCKET, mnt, "--endpoint-url",
                                proxied, "--region", "us-east-1", "--cache-dir", cache, "--cache-size",
                                args.cache_size], check=True, env=env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                try:
                    out = subprocess.run([os.path.join(BIN, "scdlfs-bench"), "read", "--dataset",
                                          os.path.join(mnt, name), "--digests", digests, "--order", "windows",
                                          "--seed", "1", "--epoch", "0"], capture_output=True, text=True)
                    if out.returncode != 0:
                        raise RuntimeError("reader failed: " + out.stderr.strip())
                    seconds.append(json.loads(out.stdout)["seconds"])
                finally:
                    subprocess.run([os.path.join(BIN, "scdlfs"), "unmount", mnt], check=False,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    shutil.rmtree(cache, ignore_errors=True)
            chunks, share = diversity(local, chunk_rows)
            log("chunk rows %d: epochs %s s, %.2f chunks per minibatch" % (chunk_rows, seconds, chunks))
            rows.append((chunk_rows, statistics.median(seconds), chunks, share))
        print("| `--chunk-rows` | cold epoch with a plan, s (median of %d) | distinct chunks per minibatch of %d "
              "| share of the dataset a minibatch is drawn from |" % (args.runs, BATCH))
        print("| ---: | ---: | ---: | ---: |")
        for chunk_rows, secs, chunks, share in rows:
            print("| %d | %.2f | %.2f | %.1f %% |" % (chunk_rows, secs, chunks, share))
        print("\n%d MB synthetic dataset (200 values per row on average), link %d ms / %d Mbit/s, cache %s, chunk windows of %d chunks."
              % (args.size_mb, args.latency_ms, args.rate_mbps, args.cache_size, CHUNKS_PER_WINDOW))
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
