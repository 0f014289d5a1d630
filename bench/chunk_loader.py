#!/usr/bin/env python3
"""A reimplementation of the original remote chunk loader, for the benchmark.

Whole chunks are downloaded (boto3's transfer manager, ranged GETs in parallel) into a
local cache directory holding at most --max-chunks chunks (least recently used goes
first), and a background thread downloads the next step's chunks while the current
one is read. Rows are visited in the order `scdlfs-bench order` printed (the sampler's,
not a reimplementation), each step's rows grouped by chunk as such a loader does, and
every row is checked against the generator's digest and the figures printed as one JSON
line, like `scdlfs-bench read` (epoch_tally.py).
"""

import argparse
import collections
import json
import mmap
import os
import shutil
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from epoch_tally import EpochTally


def load_steps(path):
    raw = open(path, "rb").read()
    words = memoryview(raw).cast("Q")
    steps, at = [], 0
    while at < len(words):
        n = words[at]
        steps.append(words[at + 1 : at + 1 + n])
        at += 1 + n
    return steps


class Chunk:
    def __init__(self, directory):
        self.maps = []
        for name in ("data.npy", "row_ptr.npy", "col_ptr.npy"):
            with open(os.path.join(directory, name), "rb") as f:
                self.maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))

    def close(self):
        for m in self.maps:
            m.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--order-file", required=True)
    p.add_argument("--digests", required=True)
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--max-chunks", type=int, default=8)
    p.add_argument("--time-limit", type=float, default=None)
    p.add_argument("--stall-ms", type=float, default=1.0)
    a = p.parse_args()
    tally = EpochTally(a.digests, "the chunk loader", a.time_limit)

    info = json.load(open(a.digests + ".json"))
    chunk_rows = info["chunk_rows"]
    row_fmt = "<I" if info["values"] < 2**32 else "<Q"
    row_w = struct.calcsize(row_fmt)
    col_w = 1 if info["genes"] <= 2**8 else 2 if info["genes"] <= 2**16 else 4
    steps = load_steps(a.order_file)

    s3 = boto3.client(
        "s3",
        endpoint_url=a.endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="benchbench",
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=32),
    )
    transfer = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=8)
    os.makedirs(a.cache_dir, exist_ok=True)

    def download(chunk):
        d = os.path.join(a.cache_dir, "chunk_%05d" % chunk)
        tmp = d + ".part"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for name in ("data.npy", "row_ptr.npy", "col_ptr.npy"):
            key = "%s/chunk_%05d/%s" % (a.prefix, chunk, name)
            s3.download_file(a.bucket, key, os.path.join(tmp, name), Config=transfer)
        os.rename(tmp, d)
        return d

    lock = threading.Lock()
    resident = collections.OrderedDict()  # chunk -> Chunk, least recently used first
    inflight = {}  # chunk -> Future
    pool = ThreadPoolExecutor(max_workers=1)  # the prefetch thread

    def evict_to(capacity, keep):
        while len(resident) > capacity:
            victim = next((c for c in resident if c not in keep), None)
            if victim is None:
                return
            resident.pop(victim).close()
            shutil.rmtree(os.path.join(a.cache_dir, "chunk_%05d" % victim), ignore_errors=True)

    def get(chunk, keep):
        """The chunk, downloading it (or waiting for the prefetch) if needed; the wait."""
        with lock:
            if chunk in resident:
                resident.move_to_end(chunk)
                return resident[chunk], 0.0
            future = inflight.get(chunk)
        t0 = time.monotonic()
        d = future.result() if future is not None else download(chunk)
        waited = time.monotonic() - t0
        with lock:
            inflight.pop(chunk, None)
            c = resident.get(chunk) or Chunk(d)
            resident[chunk] = c
            resident.move_to_end(chunk)
            evict_to(a.max_chunks, keep)
        return c, waited

    def prefetch(chunks):
        with lock:
            for chunk in chunks:
                if chunk not in resident and chunk not in inflight:
                    inflight[chunk] = pool.submit(download, chunk)

    stall = 0.0
    epoch_rows = sum(len(s) for s in steps)
    chunks_of = lambda step: sorted({r // chunk_rows for r in step})
    for i, step in enumerate(steps):
        current = chunks_of(step)
        if i + 1 < len(steps):
            room = a.max_chunks - len(current)
            if room > 0:
                prefetch(chunks_of(steps[i + 1])[:room])
        by_chunk = collections.defaultdict(list)
        for r in step:
            by_chunk[r // chunk_rows].append(r)
        keep = set(current)
        for chunk in current:
            c, waited = get(chunk, keep)
            if waited * 1000 > a.stall_ms:
                stall += waited
            data, row_ptr, col_ptr = c.maps
            for r in by_chunk[chunk]:
                local = r - chunk * chunk_rows
                s = struct.unpack_from(row_fmt, row_ptr, local * row_w)[0]
                e = struct.unpack_from(row_fmt, row_ptr, (local + 1) * row_w)[0]
                if tally.row(r, data[s * 4 : e * 4], col_ptr[s * col_w : e * col_w]):
                    break
            if tally.out_of_time:
                break
        if tally.out_of_time:
            break
    seconds = time.monotonic() - tally.started
    pool.shutdown(wait=True, cancel_futures=True)
    for c in resident.values():
        c.close()
    shutil.rmtree(a.cache_dir, ignore_errors=True)
    tally.print_figures(epoch_rows, seconds, "chunks in a local LRU", stall_s=stall)


if __name__ == "__main__":
    main()
