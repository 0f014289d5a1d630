#!/usr/bin/env python3
"""What a Python sampler costs before its first rows on an atlas-sized dataset (issue
40): 10^8 rows in chunks of 4096, rank 0 of 8, for each order and block size, plain and
cache-aware (every other chunk held). Each case runs in a fresh interpreter that has
imported scdlfs (and torch, as training does): the time to build the sampler, take
len() and state_dict() and its first 10,000 indices, and have the hints of those
written, and how much the process's resident set grew over it (current and peak, from
/proc/self/status).

    cargo run --release -p scdl-sampler --example sampler_footprint -- write-header DIR
    SCDLFS_VENV=.venv bench/sampler_footprint.py DIR

DIR holds the dataset's chunked header.sch, which is all a sampler reads, and gets a
hint file that is a regular file: the hints are encoded and written as on a mount, and
nothing reads them. Prints a Markdown table."""

import json
import os
import subprocess
import sys

CASES = [
    ("windows of 4 chunks", "ChunkWindowSampler", dict(chunks_per_window=4)),
    ("blocks of 32, batch 64 x fetch 16", "BlockSampler", dict(block_size=32, batch_size=64, fetch_factor=16)),
    ("blocks of 1, batch 256 x fetch 16", "BlockSampler", dict(block_size=1, batch_size=256, fetch_factor=16)),
    ("blocks of 1, batch 64 x fetch 16", "BlockSampler", dict(block_size=1, batch_size=64, fetch_factor=16)),
]

MEASURE = """
import itertools, json, sys, time
import torch, scdlfs

def resident_kib():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

directory, kind, order, aware = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "aware"
rss, peak = resident_kib()
started = time.perf_counter()
sampler = getattr(scdlfs, kind)(directory, seed=0, rank=0, world_size=8, cache_aware=aware, **order)
if aware:
    sampler.set_epoch(0)
    sampler.set_cached_chunks([(c, c + 1) for c in range(0, sampler.num_chunks, 2)])
length = len(sampler)
state = sampler.state_dict()
first = list(itertools.islice(iter(sampler), 10_000))
assert sampler.take_hint_error() is None  # after the hints written so far
elapsed = time.perf_counter() - started
rss_after, peak_after = resident_kib()
assert len(first) == 10_000 and state["rows_in_epoch"] == length
assert sampler.hints_active
print(json.dumps([elapsed, (rss_after - rss) / 1024, (peak_after - peak) / 1024, length]))
"""


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    open(os.path.join(directory, ".scdlfs-hints"), "wb").close()
    venv = os.environ.get("SCDLFS_VENV", os.path.join(os.path.dirname(__file__), "..", ".venv"))
    python = os.path.join(venv, "bin", "python")
    print("| order | cache-aware | seconds | resident MiB | peak resident MiB | len() of rank 0 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, kind, order in CASES:
        for aware in ["plain", "aware"]:
            out = subprocess.run([python, "-c", MEASURE, directory, kind, json.dumps(order), aware],
                                 check=True, capture_output=True, text=True)
            elapsed, rss, peak, length = json.loads(out.stdout)
            held = "half, every other chunk" if aware == "aware" else "no"
            print(f"| {name} | {held} | {elapsed:.4f} | {rss:+.1f} | {peak:+.1f} | {length} |")


if __name__ == "__main__":
    main()
