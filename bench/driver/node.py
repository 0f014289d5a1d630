"""The node scenario (issue 29): R rank processes on one mount, as the ranks of one GPU
node train, each reading its share of the epoch and writing its own hints: processes of
`scdlfs-bench read --rank --world-size` (the samplers' sharding), and, beside them, the
released SCDL reader (bench/torch_loader.py: bionemo-scdl through a DataLoader with
NODE_TORCH_WORKERS workers per rank, the `scdlfs` sampler with rank and world size).
One fresh mount and empty cache per R and reader, the cold windows epoch with the page
cache dropped; the ranks start together, and the epoch ends when the last one does."""

import json
import os
import subprocess
import time

from .config import DROPPED, NODE, NODE_RANKS, NODE_SCDL, NODE_TORCH_WORKERS, QUICK_NODE_RANKS, REPO
from .measure import Epoch, mount_and_read
from .procs import clean_env, fresh_dir
from .systems import scdlfs_cmd
from .tools import BIN


def node_label(ranks, reader=NODE):
    """The system label of R ranks' epoch (`reader`: NODE or NODE_SCDL)."""
    return "%s, %d rank%s" % (reader, ranks, "" if ranks == 1 else "s")


def bench_rank_cmd(ctx, dataset_dir, order, epoch, hints, limit, ranks):
    cmd = [BIN.bench, "read", "--dataset", dataset_dir, "--digests", ctx.digests, "--order", order,
           "--seed", str(ctx.seed), "--epoch", str(epoch), "--world-size", str(ranks)] + ctx.order_args
    if not hints:
        cmd.append("--no-hints")
    if limit:
        cmd += ["--time-limit", str(limit)]
    return cmd


def scdl_rank_cmd(ctx, dataset_dir, order, epoch, hints, limit, ranks):
    cmd = [ctx.torch_python, os.path.join(REPO, "bench", "torch_loader.py"), "--dataset", dataset_dir,
           "--digests", ctx.digests, "--order", order, "--seed", str(ctx.seed), "--epoch", str(epoch),
           "--workers", str(NODE_TORCH_WORKERS), "--world-size", str(ranks)]
    if not hints:
        cmd.append("--no-hints")
    if limit:
        cmd += ["--time-limit", str(limit)]
    return cmd


def read_ranks(ranks, rank_cmd=bench_rank_cmd):
    """A reader for mount_and_read: `ranks` processes of `rank_cmd`, one per rank,
    started together; their figures joined into one epoch's (rows and bytes summed,
    rows/s over the time until the last rank finished, the latest first row), with each
    rank's own. A rank's time runs from when the driver started it, or, where it says
    when its DataLoader started (the SCDL reader, whose Python start-up is no read),
    from then; its first row counts from the same start."""

    def read(ctx, dataset_dir, order, epoch, hints=True, limit=None):
        base = rank_cmd(ctx, dataset_dir, order, epoch, hints, limit, ranks)
        started = time.time()
        procs = [subprocess.Popen(base + ["--rank", str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=clean_env()) for rank in range(ranks)]
        outs = [p.communicate() for p in procs]
        ended = time.time()
        for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
            if p.returncode != 0:
                raise RuntimeError("rank %d of %d failed on %s (%s): %s" % (rank, ranks, dataset_dir, order,
                                                                          err.strip()[-2000:]))
        per_rank = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
        starts = [r.get("started_at", started) for r in per_rank]
        finish = [r["ended_at"] - r["started_at"] if "ended_at" in r else r["seconds"] for r in per_rank]
        seconds = max(r["ended_at"] for r in per_rank) - min(starts) if "ended_at" in per_rank[0] \
            else ended - started
        rows = sum(r["rows"] for r in per_rank)
        stalls = [r["stall_s"] for r in per_rank if r["stall_s"] is not None]
        return dict(rows=rows, epoch_rows=sum(r["epoch_rows"] for r in per_rank),
                    completed=all(r["completed"] for r in per_rank), seconds=seconds, rows_per_s=rows / seconds,
                    first_row_s=max(r["first_row_s"] for r in per_rank),
                    stall_s=max(stalls) if stalls else None,
                    bytes_read=sum(r["bytes_read"] for r in per_rank), hints=all(r["hints"] for r in per_rank),
                    view=per_rank[0]["view"], ranks=ranks, rank_seconds=finish,
                    rank_first_row_s=[r["first_row_s"] for r in per_rank],
                    rank_first_row_read_s=[r.get("first_row_read_s") for r in per_rank],
                    rank_rows=[r["rows"] for r in per_rank],
                    rank_bytes=[r["bytes_read"] for r in per_rank],
                    rank_waited_s=[r.get("lockstep_waited_s") for r in per_rank],
                    slowest_over_fastest=max(finish) / min(finish))

    return read


def sys_node(ctx, order, run_i):
    """For each R (1, 2 with --quick; 1, 2, 4, 8 else) and each reader (scdlfs-bench, and
    the SCDL reader where the test venv has it): a fresh mount and empty cache, and R ranks
    reading the cold epoch 2r with hints."""
    results = []
    readers = [(NODE, bench_rank_cmd)] + ([(NODE_SCDL, scdl_rank_cmd)] if ctx.torch_python else [])
    for reader, rank_cmd in readers:
        for ranks in QUICK_NODE_RANKS if ctx.args.quick else NODE_RANKS:
            mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
            cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
            epoch = Epoch(node_label(ranks, reader), order, 2 * run_i, DROPPED, True, ctx.limit)
            results += mount_and_read(ctx, "scdlfs", scdlfs_cmd(ctx, mnt, cache), clean_env(), mnt,
                                      os.path.join(mnt, ctx.name), [epoch], read_ranks(ranks, rank_cmd),
                                      layout="flat", scdlfs=True)
    return results
