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


def collate_rows(items):
    """Keeps the (row, digest, bytes) triples as they are: rows differ in length."""
    return items


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", required=True)
    p.add_argument("--digests", required=True)
    p.add_argument("--order", choices=["windows", "blocks"], required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rank", type=int, default=0, help="this process's share (the node scenario's ranks)")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--no-hints", action="store_true")
    p.add_argument("--time-limit", type=float)
    args = p.parse_args()

    # Imported before the workers fork, as a training script does, so that they start warm.
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset  # noqa: F401
    from torch.utils.data import DataLoader

    import scdlfs

    digests = np.fromfile(args.digests, dtype="<u8")
    # The orders of `scdlfs-bench read` (bench/src/read.rs), from the same Rust sampler.
    if args.order == "windows":
        sampler = scdlfs.ChunkWindowSampler(args.dataset, chunks_per_window=4, seed=args.seed,
                                            rank=args.rank, world_size=args.world_size, even="uneven",
                                            hints=not args.no_hints)
        batch_size = 64
    else:
        sampler = scdlfs.BlockSampler(args.dataset, block_size=32, fetch_factor=32, batch_size=64, seed=args.seed,
                                      rank=args.rank, world_size=args.world_size, even="uneven",
                                      hints=not args.no_hints)
        batch_size = None
    sampler.set_epoch(args.epoch)
    if batch_size is None:
        loader = DataLoader(DigestRows(args.dataset), batch_sampler=sampler.batches(), num_workers=args.workers,
                            collate_fn=collate_rows)
    else:
        loader = DataLoader(DigestRows(args.dataset), batch_size=batch_size, sampler=sampler,
                            num_workers=args.workers, collate_fn=collate_rows)
    hints = sampler.hints_active
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
    problem = sampler.take_hint_error()
    if problem:
        sys.exit("hints failed: %s" % problem)
    print(json.dumps(dict(rows=rows, epoch_rows=len(sampler), completed=completed, seconds=seconds,
                          rows_per_s=rows / seconds, first_row_s=first_row, stall_s=None,
                          bytes_read=bytes_read, hints=hints, view=sampler.dataset_kind,
                          started_at=started_at, ended_at=ended_at)))


if __name__ == "__main__":
    main()
