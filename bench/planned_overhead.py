#!/usr/bin/env python3
"""What `scdlfs.Planned` adds per index (issue 43's target: at most 1 µs with the dataset
on local disk): 2,000,000 indices of a plain list and of torch's RandomSampler, iterated
bare, wrapped off a mount (no hint file: the wrapper hands back the order's own
iterator), and wrapped with a plan written (the dataset's hint file is a regular file,
so the steps are encoded and written as on a mount, and nothing reads them). Best of a
few passes each, in nanoseconds per index.

    SCDLFS_VENV=.venv .venv/bin/python bench/planned_overhead.py DIR

DIR is any SCDL dataset directory (its header is all the wrapper reads); the script
works on two copies of it in a temporary directory. Prints a Markdown table."""

import os
import shutil
import sys
import tempfile
import time

import scdlfs
from torch.utils.data import RandomSampler

INDICES = 2_000_000


def seconds(iterable):
    started = time.perf_counter()
    for _ in iterable:
        pass
    return time.perf_counter() - started


def best(measure, passes):
    return min(measure() for _ in range(passes))


def main():
    with tempfile.TemporaryDirectory() as work:
        local, hinted = os.path.join(work, "local"), os.path.join(work, "hinted")
        shutil.copytree(sys.argv[1], local)
        shutil.copytree(sys.argv[1], hinted)
        hint_file = os.path.join(hinted, ".scdlfs-hints")
        open(hint_file, "w").close()  # before any wrapper looks for it

        def planned(order):
            wrapper = scdlfs.Planned(order, hinted)
            assert wrapper.hints_active

            def measure():
                open(hint_file, "w").close()  # a new plan file each pass: only the writes are measured
                took = seconds(wrapper)
                wrapper.take_hint_error()  # waits for the writer's thread
                return took

            return measure

        print("| order | bare ns/index | wrapped, off a mount | wrapped, plan written |")
        print("| --- | ---: | ---: | ---: |")
        for name, order, passes in (("list", list(range(INDICES)), 5), ("RandomSampler", RandomSampler(range(INDICES)), 3)):
            bare = best(lambda: seconds(order), passes)
            off = best(lambda: seconds(scdlfs.Planned(order, local)), passes)
            on = best(planned(order), passes)
            per = lambda s: s / INDICES * 1e9  # noqa: E731
            print("| %s | %.0f | %+.0f | %+.0f |" % (name, per(bare), per(off - bare), per(on - bare)))


if __name__ == "__main__":
    main()
