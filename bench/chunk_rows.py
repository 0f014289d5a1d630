#!/usr/bin/env python3
"""How to choose `scdlfs chunk --chunk-rows`: for each chunk size, the cold-epoch time of
the chunk-window order with hints (a plan) through scdlfs over an emulated link, and the
minibatch diversity that order gives (distinct chunks in a minibatch of 64 rows).

    bench/chunk_rows.py [--chunk-rows 256 1024 4096] [--size-mb 48] [--runs 3]

Uses the binaries of the ci profile (cargo build --profile ci -p scdlfs -p scdlfs-bench;
or SCDLFS_BIN and SCDLFS_BENCH), moto_server and the scdlfs Python package from the venv
(SCDLFS_VENV, default .venv), and bench/run.py's pieces (bench/driver): its generator,
uploader, link-emulating proxy, mounts and cold epoch (page cache dropped, fresh mount
and cache). Only 127.0.0.1 is used, with dummy keys. Prints a Markdown table of medians (docs/preparing-data.md);
the machine is shared and noisy, so compare rows of one run, not runs."""

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import tempfile

from driver.config import DROPPED
from driver.measure import Epoch, mount_and_read
from driver.procs import clean_env, cleanup, fresh_dir, log
from driver.servers import gen, start_moto, start_proxy, upload
from driver.systems import Ctx, scdlfs_cmd
from driver.tools import moto_server, test_venv, use_binaries

BATCH = 64
CHUNKS_PER_WINDOW = 4  # scdlfs-bench read's chunk-window order


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
    out = subprocess.run([os.path.join(test_venv(), "bin", "python"), "-c", code, dataset_dir, str(chunk_rows)],
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
    use_binaries("ci")
    work = tempfile.mkdtemp(prefix="scdlfs-chunk-rows-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    atexit.register(cleanup)  # runs first: the mounts go before their folders
    os.makedirs(os.path.join(work, "logs"))
    endpoint = start_moto(moto_server(), "moto_server")
    ctx = Ctx()
    ctx.work, ctx.seed, ctx.cache_size = work, 1, args.cache_size
    ctx.proxy, ctx.stats = start_proxy(endpoint, args.rate_mbps, args.latency_ms)
    rows = []
    for chunk_rows in args.chunk_rows:
        name = "ds-%d" % chunk_rows
        local = os.path.join(work, name)
        ctx.digests = os.path.join(work, name + ".digests")
        gen(local, ctx.digests, args.size_mb, chunk_rows, mean_values=200)
        upload(endpoint, name, local)
        seconds = []
        for _ in range(args.runs):
            mnt, cache = fresh_dir(os.path.join(work, "mnt")), fresh_dir(os.path.join(work, "cache"))
            epoch = Epoch("scdlfs cold, hints", "windows", 0, DROPPED)
            [r] = mount_and_read(ctx, "scdlfs", scdlfs_cmd(ctx, mnt, cache), clean_env(), mnt,
                                 os.path.join(mnt, name), [epoch], layout="flat", scdlfs=True)
            seconds.append(r["seconds"])
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


if __name__ == "__main__":
    main()
