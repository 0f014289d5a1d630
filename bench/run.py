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
(`--systems torch`), it updates only its own section of docs/benchmarks.md.

The `node` system (issue 29), read only when named and by --quick: R = 1, 2, 4, 8 rank
processes on one mount (1 and 2 with --quick), each reading its share of the cold
windows epoch with its own hints: `scdlfs-bench read` ranks, and beside them ranks of
the SCDL reader (bionemo-scdl through a DataLoader with 2 workers, the scdlfs package's
sampler with rank and world size). Run alone (`--systems node`), its results are kept
beside the page (docs/benchmarks-node.json) and the page is rendered again with them.

The `hostile` system (issue 30), read only when named and by --quick: on mounts with
`--allow-other`, another user's cold windows epoch with hints alone and beside the tests'
hostile hint writer (tests/common/hostile_hints.sh, as uid 65534), in turns, on a dataset
of 10,000 small chunks (256 with --quick, time-bounded). Run alone (`--systems
hostile`), its results are kept beside the page (docs/benchmarks-hostile.json), and only
its section, its row of the targets and the reduced variant's paragraph are replaced.

The `atlas` system (issue 40), read only when named and by --quick: a dataset of 10^8 rows
(10^7 with --quick) with real row offsets and sparse values (bench/atlas/), behind an
endpoint whose listing pages each take 0.15 s; the first `ls` with and without a manifest,
the released reader's first row, and 8 ranks (2) building each sampler and reading with it
on one mount, with the daemon's RSS. It needs no other system's dataset; run alone
(`--systems atlas`), it keeps its results beside the page (docs/benchmarks-atlas.json) and
replaces only its section.

The `ceiling` system reads scdlfs's windows epochs with no link (the daemon straight to
the S3 server, whose ceiling the run measures) beside local disk: GB/s served and per
daemon core. The `large` system reads a dataset of 8 chunks of 180 MB in windows of 2
behind a 250 MB/s + 20 ms link of its own (issue 29's large-chunk targets). The page's
targets table of issue 29 reads every row from the results. `--perf-dir` records the
daemon of every scdlfs epoch with `perf record -e cpu-clock`, one file per epoch.

The `planned` system (issue 43), read only when named: on the large chunks' dataset and
link, full cache and a tenth, the SCDL reader through a DataLoader in others' orders
(scDataset 0.3.0's BlockShuffling and ClassBalancedSampling, torch's RandomSampler) told
to the mount by `scdlfs.plan_scdataset`/`scdlfs.Planned` and unwrapped, beside the scdlfs
BlockSampler in the same shapes. Run alone (`--systems planned`), its results are kept
beside the page (docs/benchmarks-planned.json) and only its section is replaced.

The `cpu` system (issue 45), read only when named and by --quick: the daemon's CPU per GB
with no network, from a local folder: 4 reader processes at once, each reading its quarter
of the flat view's data.npy and col_ptr.npy in order in 1 MiB read(2) calls, cold and then
warm from the disk cache with the page cache dropped. Run alone (`--systems cpu`, which
needs no S3 server), it keeps its results beside the page (docs/benchmarks-cpu.json) and
replaces only its section; `--cpu-baseline PATH` measures another binary in the same runs.

This file is the command line; the driver is the package bench/driver (its __init__
lists its modules: processes, tools, servers and the link, measurement, the systems'
registry, summaries and targets, the report)."""

import argparse
import os
import sys

from driver.config import ORDERS, REPO, SYSTEM_NAMES
from driver.runner import main as run_benchmark


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
    p.add_argument("--perf-dir", default=None,
                   help="record the scdlfs daemon of every epoch with `perf record -e cpu-clock` into this "
                        "directory, one file per epoch (docs/architecture.md, where the CPU goes per byte)")
    p.add_argument("--cpu-baseline", default=None,
                   help="the cpu system: another scdlfs binary (say, built before a change) measured in the same "
                        "runs, alternating which goes first, and shown beside it")
    p.add_argument("--systems", default=",".join(SYSTEM_NAMES))
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
    run_benchmark(args, command)


if __name__ == "__main__":
    main()
