#!/usr/bin/env python3
"""MosaicML Streaming, the peer of issue 39, for the benchmark.

`write`: the rows of a chunked dataset generated for the bench (its chunks' raw
`data.npy`, `row_ptr.npy` and `col_ptr.npy`, read from the folder the S3 server serves)
written once as Streaming's MDS shards with its defaults (64 MiB shards, no
compression), one sample a row: its index, its values' bytes and its column ids' bytes.

`read`: one epoch of a `StreamingDataset` over those shards through the bench's S3
endpoint (the emulated link), with its default shuffle (py1e, the default block size),
into a fresh local cache of `--cache-limit` bytes (none: it keeps every shard), or from
the shards' local folder (no download); every sample is checked against the generator's
digest, as the other readers check every row, and the figures printed as one JSON line,
like `scdlfs-bench read` (epoch_tally.py).
"""

import argparse
import json
import os
import shutil
import struct
import sys
import time

from epoch_tally import EpochTally


def write(a):
    from streaming import MDSWriter

    info = json.load(open(a.digests + ".json"))
    row_fmt = "<I" if info["values"] < 2**32 else "<Q"
    row_w = struct.calcsize(row_fmt)
    col_w = 1 if info["genes"] <= 2**8 else 2 if info["genes"] <= 2**16 else 4
    tmp = a.out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    columns = {"row": "int64", "values": "bytes", "cols": "bytes"}
    row = 0
    with MDSWriter(out=tmp, columns=columns) as writer:
        for chunk in range(info["num_chunks"]):
            d = os.path.join(a.dataset, "chunk_%05d" % chunk)
            data, row_ptr, col_ptr = (open(os.path.join(d, n), "rb").read()
                                      for n in ("data.npy", "row_ptr.npy", "col_ptr.npy"))
            for local in range(len(row_ptr) // row_w - 1):
                s, e = struct.unpack_from(row_fmt[0] + "2" + row_fmt[1], row_ptr, local * row_w)
                writer.write({"row": row, "values": data[s * 4:e * 4], "cols": col_ptr[s * col_w:e * col_w]})
                row += 1
    if row != info["rows"]:
        sys.exit("wrote %d rows of %s, not %d" % (row, a.dataset, info["rows"]))
    shutil.rmtree(a.out, ignore_errors=True)
    os.rename(tmp, a.out)


def read(a):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    tally = EpochTally(a.digests, "MosaicML Streaming", a.time_limit)
    info = json.load(open(a.digests + ".json"))
    clean_stale_shared_memory()
    shutil.rmtree(a.cache_dir, ignore_errors=True)
    if a.remote.startswith("s3://"):
        ds = StreamingDataset(remote=a.remote, local=a.cache_dir, shuffle=True, shuffle_seed=a.seed, batch_size=64,
                              cache_limit=a.cache_limit)
    else:
        # Shards on local disk: no download.
        ds = StreamingDataset(local=a.remote, shuffle=True, shuffle_seed=a.seed, batch_size=64)
    seen = bytearray(info["rows"])
    for sample in ds:
        r = sample["row"]
        if seen[r]:
            sys.exit("row %d read twice in one epoch" % r)
        seen[r] = 1
        if tally.row(r, sample["values"], sample["cols"]):
            break
    seconds = time.monotonic() - tally.started
    tally.print_figures(info["rows"], seconds, "MDS shards")
    del ds
    clean_stale_shared_memory()
    shutil.rmtree(a.cache_dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--dataset", required=True, help="the chunked dataset's folder")
    w.add_argument("--digests", required=True)
    w.add_argument("--out", required=True, help="the MDS shards' folder (made whole, then renamed)")
    r = sub.add_parser("read")
    r.add_argument("--remote", required=True, help="s3://bucket/prefix of the MDS shards, or their local folder")
    r.add_argument("--digests", required=True)
    r.add_argument("--cache-dir", required=True)
    r.add_argument("--cache-limit", type=int, default=None)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--time-limit", type=float, default=None)
    a = p.parse_args()
    write(a) if a.command == "write" else read(a)


if __name__ == "__main__":
    main()
