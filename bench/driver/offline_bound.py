"""The half-cache case's yardstick: an epoch in chunks as the sampler orders it, each
chunk's bytes, and what a cache that knew the whole epoch in advance would fetch
(Belady's rule), against which the daemon's next-epoch bytes are reported."""

import heapq
import os
import struct

from .config import BUCKET
from .procs import run
from .tools import BIN


def epoch_chunks(ctx, order, epoch):
    """An epoch in chunks, in the sampler's order (`scdlfs-bench order`): the chunk of every
    row it visits (runs of the same chunk counted once), and the chunks of each step."""
    path = os.path.join(ctx.work, "order-%s-%d.bin" % (order, epoch))
    run([BIN.bench, "order", "--rows", str(ctx.info["rows"]), "--chunk-rows", str(ctx.info["chunk_rows"]),
         "--order", order, "--seed", str(ctx.seed), "--epoch", str(epoch), "--out", path] + ctx.order_args)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    values = struct.unpack("<%dQ" % (len(data) // 8), data)
    chunks, steps, i = [], [], 0
    while i < len(values):  # per step: its row count, then its rows
        steps.append(set())
        for row in values[i + 1:i + 1 + values[i]]:
            chunk = row // ctx.info["chunk_rows"]
            steps[-1].add(chunk)
            if not chunks or chunks[-1] != chunk:
                chunks.append(chunk)
        i += 1 + values[i]
    return chunks, steps


def dataset_chunk_bytes(ctx):
    """Each chunk's bytes, its arrays as the server stores them: the cache's unit."""
    root = os.path.join(ctx.work, "s3root", BUCKET, ctx.name)
    sizes = {}
    for name in os.listdir(root):
        if name.startswith("chunk_"):
            d = os.path.join(root, name)
            sizes[int(name[len("chunk_"):])] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return sizes


def offline_next_epoch_bytes(sizes, before, epoch, cache_bytes):
    """What a cache of `cache_bytes` that knew the whole epoch in advance would fetch in it:
    Belady's rule (on a miss, evict the chunk needed furthest ahead) over the epoch's chunk
    sequence, starting from the chunks the epoch `before` read last that fit (what any
    cache holds after an epoch whose successor it could not know). Chunks are the cache's
    unit; the rule reads each on demand, so it needs no room for read-ahead."""
    resident, used = set(), 0
    for chunk in reversed(before):
        if chunk not in resident:
            if used + sizes[chunk] > cache_bytes:
                break
            resident.add(chunk)
            used += sizes[chunk]
    never = len(epoch)
    next_use, seen = [never] * len(epoch), {}
    for i in range(len(epoch) - 1, -1, -1):
        next_use[i] = seen.get(epoch[i], never)
        seen[epoch[i]] = i
    due = {chunk: seen.get(chunk, never) for chunk in resident}
    furthest = [(-due[chunk], chunk) for chunk in resident]  # a heap; stale entries skipped
    heapq.heapify(furthest)
    fetched = 0
    for i, chunk in enumerate(epoch):
        if chunk not in resident:
            fetched += sizes[chunk]
            resident.add(chunk)
            used += sizes[chunk]
        due[chunk] = next_use[i]
        heapq.heappush(furthest, (-next_use[i], chunk))
        while used > cache_bytes:
            when, victim = heapq.heappop(furthest)
            if victim in resident and due[victim] == -when:
                resident.discard(victim)
                used -= sizes[victim]
    return fetched
