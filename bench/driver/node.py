"""The node scenario (issue 29): R rank processes on one mount, as the ranks of one GPU
node train, each reading its share of the epoch (`scdlfs-bench read --rank --world-size`,
the samplers' sharding) and writing its own hints. One fresh mount and empty cache per
R, the cold windows epoch with the page cache dropped; the ranks start together, and
the epoch ends when the last one does."""

import json
import os
import subprocess
import time

from .config import DROPPED, NODE, NODE_RANKS, QUICK_NODE_RANKS
from .measure import Epoch, mount_and_read
from .procs import clean_env, fresh_dir
from .systems import scdlfs_cmd
from .tools import BIN


def node_label(ranks):
    """The system label of R ranks' epoch."""
    return "%s, %d rank%s" % (NODE, ranks, "" if ranks == 1 else "s")


def read_ranks(ranks):
    """A reader for mount_and_read: `ranks` processes of `scdlfs-bench read`, one per rank,
    started together; their figures joined into one epoch's (rows and bytes summed,
    rows/s over the time until the last rank finished, the latest first row), with each
    rank's own."""

    def read(ctx, dataset_dir, order, epoch, hints=True, limit=None):
        base = [BIN.bench, "read", "--dataset", dataset_dir, "--digests", ctx.digests, "--order", order,
                "--seed", str(ctx.seed), "--epoch", str(epoch), "--world-size", str(ranks)]
        if not hints:
            base.append("--no-hints")
        if limit:
            base += ["--time-limit", str(limit)]
        started = time.time()
        procs = [subprocess.Popen(base + ["--rank", str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for rank in range(ranks)]
        outs = [p.communicate() for p in procs]
        seconds = time.time() - started
        for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
            if p.returncode != 0:
                raise RuntimeError("rank %d of %d failed on %s (%s): %s" % (rank, ranks, dataset_dir, order,
                                                                          err.strip()))
        per_rank = [json.loads(out) for out, _ in outs]
        rows = sum(r["rows"] for r in per_rank)
        finish = [r["seconds"] for r in per_rank]
        return dict(rows=rows, epoch_rows=sum(r["epoch_rows"] for r in per_rank),
                    completed=all(r["completed"] for r in per_rank), seconds=seconds, rows_per_s=rows / seconds,
                    first_row_s=max(r["first_row_s"] for r in per_rank),
                    stall_s=max(r["stall_s"] for r in per_rank),
                    bytes_read=sum(r["bytes_read"] for r in per_rank), hints=all(r["hints"] for r in per_rank),
                    view=per_rank[0]["view"], ranks=ranks, rank_seconds=finish,
                    rank_first_row_s=[r["first_row_s"] for r in per_rank],
                    slowest_over_fastest=max(finish) / min(finish))

    return read


def sys_node(ctx, order, run_i):
    """For each R (1, 2 with --quick; 1, 2, 4, 8 else): a fresh mount and empty cache, and
    R ranks reading the cold epoch 2r with hints."""
    results = []
    for ranks in QUICK_NODE_RANKS if ctx.args.quick else NODE_RANKS:
        mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
        cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
        epoch = Epoch(node_label(ranks), order, 2 * run_i, DROPPED, True, ctx.limit)
        results += mount_and_read(ctx, "scdlfs", scdlfs_cmd(ctx, mnt, cache), clean_env(), mnt,
                                  os.path.join(mnt, ctx.name), [epoch], read_ranks(ranks), layout="flat",
                                  scdlfs=True)
    return results
