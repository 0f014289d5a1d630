#!/usr/bin/env python3
"""One rank of the atlas system's node (bench/driver/atlas.py). In each of the orders given,
once every rank has imported torch and opened the dataset (a barrier of files, so that the
interpreters' start is not counted), it builds this rank's `scdlfs` sampler, takes len(),
state_dict() and its first 10,000 indices (writing the hints of those). Then, with that
sampler gone, a fresh one of the same seed yields its first ROWS indices one at a time,
each read through the released reader (`SingleCellMemMapDataset.get_row`) as it comes, as
a training loop takes them, and checked against the dataset's row offsets. (Read from the
first sampler's list, the rows would be read while its hints say the reader is at the
step of its 10,000th index: the daemon would take the steps before as read.) Prints one
JSON line per order.

usage: rank.py DATASET_DIR RANK WORLD ROWS BARRIER_DIR ORDERS_JSON"""

import itertools
import json
import os
import sys
import time

import torch  # noqa: F401  (as training does: the samplers' cost is measured after it)
import scdlfs
from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

BARRIER_TIMEOUT_S = 600
FIRST_INDICES = 10_000


def resident_kib():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0])


def barrier(directory, name, rank, world):
    """Returns once all `world` ranks reached `name`; exits after BARRIER_TIMEOUT_S."""
    open(os.path.join(directory, "%s.%d" % (name, rank)), "w").close()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while sum(f.startswith(name + ".") for f in os.listdir(directory)) < world:
        if time.monotonic() > deadline:
            sys.exit("rank %d: the other ranks never reached %r" % (rank, name))
        time.sleep(0.05)


def main():
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    directory, barrier_dir = sys.argv[1], sys.argv[5]
    rank, world, rows = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    orders = json.loads(sys.argv[6])
    dataset = SingleCellMemMapDataset(directory)
    row_ptr = dataset.row_index
    for i, (label, kind, kwargs) in enumerate(orders):
        barrier(barrier_dir, "order%d" % i, rank, world)
        rss = resident_kib()
        started = time.perf_counter()
        sampler = getattr(scdlfs, kind)(directory, seed=0, rank=rank, world_size=world, **kwargs)
        sampler.set_epoch(0)
        length = len(sampler)
        state = sampler.state_dict()
        first = list(itertools.islice(iter(sampler), FIRST_INDICES))
        sampler_s = time.perf_counter() - started
        sampler_mib = (resident_kib() - rss) / 1024
        assert state["rows_in_epoch"] == length and len(first) == min(FIRST_INDICES, length)
        errors = [sampler.take_hint_error()]
        hints_active = sampler.hints_active
        expected_rows = first[:rows]
        del sampler, first
        reader = getattr(scdlfs, kind)(directory, seed=0, rank=rank, world_size=world, **kwargs)
        reader.set_epoch(0)
        started = time.perf_counter()
        read = 0
        for row in itertools.islice(iter(reader), rows):
            if row != expected_rows[read]:
                sys.exit("rank %d, %s: index %d is row %d, the first sampler's was %d" % (
                    rank, label, read, row, expected_rows[read]))
            values, columns = dataset.get_row(row)[0]
            expected = int(row_ptr[row + 1] - row_ptr[row])
            if len(values) != expected or len(columns) != expected:
                sys.exit("rank %d, %s: row %d has %d values, its offsets say %d" % (
                    rank, label, row, len(values), expected))
            read += 1
        read_s = time.perf_counter() - started
        errors.append(reader.take_hint_error())
        error = next((e for e in errors if e is not None), None)
        print(json.dumps(dict(order=label, rank=rank, sampler_s=sampler_s, sampler_mib=sampler_mib, read_s=read_s,
                              rows_read=read, rows_in_epoch=length,
                              hints_active=hints_active, hint_error=None if error is None else str(error))),
              flush=True)
        del reader


if __name__ == "__main__":
    main()
