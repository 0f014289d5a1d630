"""Large chunks (issue 29's targets): a dataset of 8 chunks of about 180 MB read in
windows of 2 chunks, so that the sampler announces the whole epoch's plan (4 steps) at
its start, behind a link of its own (250 MB/s + 20 ms). In one run, on fresh mounts: the
cold windows epoch with hints and without, the random order with its `rows` plan beside
s3fs-fuse in the same order, and a cache of half the dataset (the cold epoch, then the
next one against the floor). --quick reads 8 chunks of about 3 MB.

The `small-cache` system (issue 39) reads the same dataset through the same link with a
cache of a tenth of it: the blocks and random orders with their `rows` plans (random rows
in steps of 1,024, scDataset's fetch factor of 16 minibatches), and the
windows order in windows of one chunk (two windows fit the cache on the main dataset,
whose chunks are 4,096 rows; the large chunks' do not). MosaicML Streaming is the peer
(driver/streaming.py): the same rows as its shards, its own shuffle, every shard cached and
its smallest cache. Random rows over a cache that small
need a GET per row and array, so the link's own ceiling of GETs (row-sized ranges, 256 in
flight, measured once per run) bounds them as its bytes per second bound the others. Beside
them, with the full cache, 8 ranks on one mount each read one large chunk, in lockstep (a
synchronous step every 64 rows, as DDP trains) and free-running."""

import json
import os

from .config import (BUCKET, LARGE, LARGE_CHUNK_ROWS, LARGE_CHUNKS, LARGE_CHUNKS_PER_WINDOW, LARGE_LATENCY_MS,
                     LARGE_RATE_MBPS, QUICK_LARGE_CHUNK_ROWS, FULL_CACHE, SMALL_CACHE, SMALL_CACHE_SHARE)
from .procs import log
from .node import bench_rank_cmd, read_ranks
from .servers import gen, probe, start_proxy, upload
from .streaming import sys_streaming
from .systems import sys_s3fs, sys_scdlfs, sys_scdlfs_half

# Bytes of a row of the generator's default (1,000 values of f32 and u16 column ids).
ROW_BYTES = 6000
# Ranks of one node reading the large chunks, one chunk each; rows per synchronous step
# of those in lockstep (a DDP step of 64 rows).
LARGE_NODE_RANKS, LOCKSTEP_ROWS = 8, 64


def large_ctx(ctx):
    """The run's large-chunk dataset (made and served once) and its link, as a `Ctx`."""
    if getattr(ctx, "large", None) is None:
        args = ctx.args
        chunk_rows = QUICK_LARGE_CHUNK_ROWS if args.quick else LARGE_CHUNK_ROWS
        name = "large-%dx%d" % (LARGE_CHUNKS, chunk_rows)
        info = generate_large(args, name, chunk_rows)
        if args.server == "moto":
            upload(ctx.endpoint, name, os.path.join(args.work, "s3root", BUCKET, name))
        proxy, stats = start_proxy(ctx.endpoint, LARGE_RATE_MBPS, LARGE_LATENCY_MS,
                                   os.path.join(args.work, "logs", "proxy-large.log"))
        log("large chunks: %s, %d chunks of %d rows (%.2f GB), link %s (%.0f MB/s, %.0f ms)" % (
            name, info["num_chunks"], chunk_rows, info["bytes"] / 1e9, proxy, LARGE_RATE_MBPS, LARGE_LATENCY_MS))
        ctx.large = ctx.but(name=name, info=info, digests=os.path.join(args.work, "digests", name), proxy=proxy,
                            stats=stats, order_args=["--chunks-per-window", str(LARGE_CHUNKS_PER_WINDOW)],
                            gets_ceiling=None)
    return ctx.large


def generate_large(args, name, chunk_rows):
    """The dataset of LARGE_CHUNKS chunks of `chunk_rows` rows (kept across runs)."""
    ds = os.path.join(args.work, "s3root", BUCKET, name)
    digests = os.path.join(args.work, "digests", name)
    if not (os.path.exists(digests + ".json") and os.path.isdir(ds)):
        os.makedirs(os.path.dirname(digests), exist_ok=True)
        log("generating %s" % name)
        gen(ds, digests, LARGE_CHUNKS * chunk_rows * ROW_BYTES // 1_000_000, chunk_rows)
    return json.load(open(digests + ".json"))


def with_link(results, large):
    """Each epoch carries its dataset's bytes and link limit: the report's × link for
    this link, not the main tables'; and the link's GET ceiling where it was measured."""
    for r in results:
        r.update(dataset_bytes=large.info["bytes"], dataset_rows=large.info["rows"],
                 link_s=large.info["bytes"] / (LARGE_RATE_MBPS * 1e6), dataset_chunks=large.info["num_chunks"],
                 link_gets_per_s=large.gets_ceiling and large.gets_ceiling["gets_per_s"])
    return results


def gets_ceiling(large):
    """The large link's GETs per second with 256 ranges of a row's bytes in one array (on
    average: 4 KB of values, 2 KB of column ids) in flight (the daemon's bound of planned requests on the wire), 20,000 of them: what
    bounds random rows when each is a GET of its own. Measured before the epochs, on
    the same server, link and client library (object_store) as the daemon's."""
    if large.gets_ceiling is None:
        row_bytes = ROW_BYTES // 2
        large.gets_ceiling = probe(large.proxy, large.name, 256, 20_000 * row_bytes // 1_000_000, row_bytes)
        log("large link: %.0f GETs/s of %d B ranges, 256 in flight" % (large.gets_ceiling["gets_per_s"], row_bytes))
    return large.gets_ceiling


def sys_large(ctx, order, run_i):
    large = large_ctx(ctx)
    prefix = LARGE + ", "
    results = []
    for hints in (True, False):
        results += sys_scdlfs(large, "windows", run_i, hints, dataset=large.name, prefix=prefix, warm=False)
    results += sys_scdlfs(large, "random", run_i, True, dataset=large.name, prefix=prefix, warm=False)
    results += sys_s3fs(large, "random", run_i, prefix=prefix)
    results += sys_scdlfs_half(large, run_i, True, prefix=prefix)
    return with_link(results, large)


def lockstep_rank_cmd(ctx, dataset_dir, order, epoch, hints, limit, ranks):
    """A rank of `scdlfs-bench read` in lockstep with the others (a synchronous step every
    LOCKSTEP_ROWS rows), through a meeting file made fresh for each epoch."""
    meeting = os.path.join(ctx.work, "lockstep-%d" % epoch)
    with open(meeting, "wb") as f:
        f.write(bytes(8 * ranks))
    return bench_rank_cmd(ctx, dataset_dir, order, epoch, hints, limit, ranks) + [
        "--lockstep", meeting, "--lockstep-rows", str(LOCKSTEP_ROWS)]


def node_of_large_chunks(large, run_i):
    """LARGE_NODE_RANKS ranks on one mount with the full cache, each reading one of the
    large chunks (windows of one chunk, the whole plan written at the start), in lockstep
    as DDP trains and free-running: the link shared by ranks whose windows are whole
    chunks of 180 MB. Each cold epoch is followed by the same epoch warm (the readers'
    own time: what reading adds to the link's where it cannot overlap the download).
    --quick: 2 ranks, in lockstep only, cold only."""
    ranks = 2 if large.args.quick else LARGE_NODE_RANKS
    one_chunk = large.but(order_args=["--chunks-per-window", "1"])
    results = []
    for label, rank_cmd in [("lockstep", lockstep_rank_cmd)] + ([] if large.args.quick else [
            ("free-running", bench_rank_cmd)]):
        results += sys_scdlfs(one_chunk, "windows", run_i, True, dataset=large.name, warm=not large.args.quick,
                              prefix="%s, %d ranks %s, " % (LARGE, ranks, label),
                              reader=read_ranks(ranks, rank_cmd))
    return results


def small_cache_bytes(dataset_bytes):
    """SMALL_CACHE_SHARE of the dataset, but two parts of the daemon's default 8 MiB at
    least, which it refuses to go below (--quick's datasets are about 50 MB)."""
    return max(int(dataset_bytes * SMALL_CACHE_SHARE), 16 << 20)


def sys_small_cache(ctx, order, run_i):
    """Cold epochs on fresh mounts whose cache is SMALL_CACHE_SHARE of the dataset: the
    large chunks in the blocks and random orders with their plans (and beside each, the
    same epoch with the run's full cache), and the main dataset's windows of one chunk."""
    large = large_ctx(ctx)
    prefix = "%s, %s, " % (LARGE, SMALL_CACHE)
    results = []
    # Random rows in steps of 1,024 (16 minibatches of 64), as scDataset fetches them.
    small = large.but(cache_size=str(small_cache_bytes(large.info["bytes"])),
                      order_args=["--random-fetch-factor", "16"])
    # --quick serves moto_server, which copies a whole object for every ranged GET: the
    # random order's two GETs a row would read too few rows in its time limit.
    if not ctx.args.quick:
        gets_ceiling(large)
    for rows_order in ("blocks",) if ctx.args.quick else ("blocks", "random"):
        results += sys_scdlfs(small, rows_order, run_i, True, dataset=large.name, prefix=prefix, warm=False)
        if not ctx.args.quick:
            # Warm too: the reader's own time, which a plan whose first step needs every
            # part (random rows) cannot overlap with the download.
            results += sys_scdlfs(small.but(cache_size=large.cache_size), rows_order, run_i, True,
                                  dataset=large.name, prefix="%s, %s, " % (LARGE, FULL_CACHE))
    # The peer: its venv and shards cost a few minutes once, so --quick leaves it out.
    if not ctx.args.quick:
        results += sys_streaming(large, run_i, prefix="%s, " % LARGE)
    results += node_of_large_chunks(large, run_i)
    results = with_link(results, large)
    windows = ctx.but(cache_size=str(small_cache_bytes(ctx.info["bytes"])),
                      order_args=["--chunks-per-window", "1"])
    return results + sys_scdlfs(windows, "windows", run_i, True, prefix=SMALL_CACHE + ", ", warm=False)
