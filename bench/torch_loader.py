#!/usr/bin/env python3
"""One epoch the way a PyTorch user reads an SCDL dataset: bionemo-scdl's
SingleCellMemMapDataset on a directory (an scdlfs mount's flat view, or a local
monolithic archive), a DataLoader with worker processes, and the scdlfs package's
sampler choosing the order (and, on a mount, telling the daemon). Every row is checked
against the generator's digest (bench/src/gen.rs) in the worker that reads it.

Prints the figures as JSON, with the fields of `scdlfs-bench read`; seconds, rows/s and
the time limit count from the first batch on, since a DataLoader's start-up (forking
workers, the first batch) takes seconds on its own and is reported as first_row_s; and
the wall-clock times the DataLoader started and the epoch ended (started_at, ended_at),
for the node scenario's ranks. --rank/--world-size read one rank's share, as dealt
(even="uneven": the ranks' shares make up the epoch).

Besides the samplers' orders (windows, blocks), the orders of issue 43: torch's
RandomSampler through scdlfs.Planned (planned-random), the released scDataset's
BlockShuffling and ClassBalancedSampling through scdlfs.plan_scdataset (scdataset-blocks,
scdataset-balanced), each read unwrapped with --no-hints, and the scdlfs BlockSampler in
the same shapes (blocks16: blocks of 32 in fetches of 16 minibatches of 64; random-rows:
blocks of 1).
"""

import argparse
import json
import sys
import time
import zlib

import numpy as np


def row_digest(values, columns):
    """The digest `scdlfs-bench gen` writes per row: CRC-32 of the values' bytes, and of
    the column ids' bytes above it, as stored."""
    return zlib.crc32(np.ascontiguousarray(values).tobytes()) | zlib.crc32(np.ascontiguousarray(columns).tobytes()) << 32


class DigestRows:
    """A map-style dataset over an SCDL directory: item i is (i, digest of row i, bytes
    of row i), read with SingleCellMemMapDataset.get_row. The reader is opened on first
    use in each process, so that spawned workers open their own maps instead of
    unpickling the arrays."""

    def __init__(self, path):
        self.path = path
        self._ds = None

    def _dataset(self):
        if self._ds is None:
            from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

            self._ds = SingleCellMemMapDataset(self.path)
        return self._ds

    def __len__(self):
        return self._dataset().number_of_rows()

    def __getitem__(self, i):
        (values, columns), _, _ = self._dataset().get_row(i)
        return i, row_digest(values, columns), values.nbytes + columns.nbytes

    def __getstate__(self):
        return {"path": self.path, "_ds": None}


class CountedRows(DigestRows):
    """DigestRows that knows its row count, for readers that ask for len() (scDataset):
    bionemo-scdl 0.1.3's number_of_rows() counts the rows of the feature index, which the
    generated dataset has none of."""

    def __init__(self, path, rows):
        super().__init__(path)
        self.rows = rows

    def __len__(self):
        return self.rows

    def __getstate__(self):
        return {**super().__getstate__(), "rows": self.rows}


def fetch_rows(collection, indices):
    """scDataset's fetch callback: the fetch's rows through the SCDL reader."""
    return [collection[int(row)] for row in indices]


def batch_rows(fetched, positions):
    """scDataset's batch callback: a minibatch's rows of the fetch."""
    return [fetched[int(p)] for p in positions]


def collate_rows(items):
    """Keeps the (row, digest, bytes) triples as they are: rows differ in length."""
    return items


# The orders issue 43 compares: others' orders told to the mount through the scdlfs
# package's wrappers (or, with --no-hints, read as they are), beside the scdlfs samplers'
# own orders of the same shape.
OTHER_ORDERS = ["planned-random", "scdataset-blocks", "scdataset-balanced", "blocks16", "random-rows"]


def rare_labels(rows):
    """Cell types for the class-balanced orders: a rare type of a twentieth of the rows,
    in runs of 1,000 as types lie in an atlas, the rest one common type."""
    import numpy as np

    return (np.arange(rows) // 1000) % 20 == 0


def loader_of(args, rows):
    """The DataLoader of `args.order`, the rows an epoch has, and the sampler whose hint
    errors can be asked for (None where the plans are the workers')."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    import scdlfs

    hints = not args.no_hints
    common = dict(num_workers=args.workers, collate_fn=collate_rows)
    shard = dict(rank=args.rank, world_size=args.world_size, even="uneven", hints=hints)
    # The orders of `scdlfs-bench read` (bench/src/read.rs), from the same Rust sampler.
    if args.order == "windows":
        sampler = scdlfs.ChunkWindowSampler(args.dataset, chunks_per_window=4, seed=args.seed, **shard)
        sampler.set_epoch(args.epoch)
        return DataLoader(DigestRows(args.dataset), batch_size=64, sampler=sampler, **common), len(sampler), sampler
    if args.order in ("blocks", "blocks16", "random-rows"):
        # blocks16 and random-rows: scDataset's BlockShuffling(32) and torch's RandomSampler
        # in steps of 1,024 rows, by the scdlfs sampler (fetches of 16 minibatches of 64).
        block_size, fetch_factor = {"blocks": (32, 32), "blocks16": (32, 16), "random-rows": (1, 16)}[args.order]
        sampler = scdlfs.BlockSampler(args.dataset, block_size=block_size, fetch_factor=fetch_factor, batch_size=64,
                                      seed=args.seed, **shard)
        sampler.set_epoch(args.epoch)
        return DataLoader(DigestRows(args.dataset), batch_sampler=sampler.batches(), **common), len(sampler), sampler
    if args.order == "planned-random":
        order = RandomSampler(range(rows), generator=torch.Generator().manual_seed(args.seed * 1000 + args.epoch))
        sampler = scdlfs.Planned(order, args.dataset, hints=hints)
        return DataLoader(DigestRows(args.dataset), batch_size=64, sampler=sampler, **common), rows, sampler
    from scdataset import scDataset
    from scdataset.strategy import BlockShuffling, ClassBalancedSampling

    if args.order == "scdataset-blocks":
        strategy = BlockShuffling(block_size=32)
    else:
        strategy = ClassBalancedSampling(rare_labels(rows), block_size=32)
    data = scDataset(CountedRows(args.dataset, rows), strategy, batch_size=64, fetch_factor=16,
                     fetch_callback=fetch_rows, batch_callback=batch_rows, seed=args.seed * 1000 + args.epoch)
    if hints:
        data = scdlfs.plan_scdataset(data, args.dataset)
    # Each worker plans its own fetches: the main process has no plan to ask about.
    return DataLoader(data, batch_size=None, **common), strategy.get_len(data.collection), None


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", required=True)
    p.add_argument("--digests", required=True)
    p.add_argument("--order", choices=["windows", "blocks"] + OTHER_ORDERS, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rank", type=int, default=0, help="this process's share (the node scenario's ranks)")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--no-hints", action="store_true", help="no plan: the samplers' hints off, others' orders unwrapped")
    p.add_argument("--time-limit", type=float)
    args = p.parse_args()

    # Imported before the workers fork, as a training script does, so that they start warm.
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset  # noqa: F401

    digests = np.fromfile(args.digests, dtype="<u8")
    loader, epoch_rows, sampler = loader_of(args, len(digests))
    hints = not args.no_hints if sampler is None else sampler.hints_active
    rows = bytes_read = 0
    first_batch = None
    completed = True
    started, started_at = time.monotonic(), time.time()
    for batch in loader:
        for row, digest, size in batch:
            if digest != digests[row]:
                sys.exit("row %d: wrong bytes (digest %x, expected %x)" % (row, digest, digests[row]))
            bytes_read += size
        rows += len(batch)
        if first_batch is None:
            first_batch = time.monotonic()
        if args.time_limit and time.monotonic() - first_batch > args.time_limit:
            completed = False
            break
    # From the first batch on: the start-up (workers forked, first batch read) is first_row_s.
    first_row = (first_batch or started) - started
    seconds = time.monotonic() - (first_batch or started)
    ended_at = time.time()
    problem = sampler.take_hint_error() if sampler is not None else None
    if problem:
        sys.exit("hints failed: %s" % problem)
    view = getattr(sampler, "dataset_kind", None)
    print(json.dumps(dict(rows=rows, epoch_rows=epoch_rows, completed=completed, seconds=seconds,
                          rows_per_s=rows / seconds, first_row_s=first_row, stall_s=None,
                          bytes_read=bytes_read, hints=hints, view=view,
                          started_at=started_at, ended_at=ended_at)))


if __name__ == "__main__":
    main()
