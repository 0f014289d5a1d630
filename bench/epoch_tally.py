"""The tally of one epoch of a Python reader of the bench (the chunk loader, the
MosaicML Streaming peer): every row checked against the generator's digest (CRC-32 of
its values' bytes and of its column ids' bytes) and counted the same way, and the
figures printed as one JSON line, like `scdlfs-bench read`."""

import json
import sys
import time
import zlib


class EpochTally:
    def __init__(self, digests, reader, time_limit=None):
        """`digests`: the generator's digests file; `reader`: the reader's name in errors."""
        self.started = time.monotonic()
        self.digests = memoryview(open(digests, "rb").read()).cast("Q")
        self.reader, self.time_limit = reader, time_limit
        self.rows = self.read_bytes = 0
        self.first_row = None
        self.out_of_time = False

    def row(self, r, values, cols):
        """Row `r` as read; whether the epoch is out of time after it."""
        if (zlib.crc32(values) | zlib.crc32(cols) << 32) != self.digests[r]:
            sys.exit("row %d read through %s differs from the generator's" % (r, self.reader))
        if self.first_row is None:
            self.first_row = time.monotonic() - self.started
        self.rows += 1
        self.read_bytes += len(values) + len(cols)
        if self.time_limit and time.monotonic() - self.started >= self.time_limit:
            self.out_of_time = True
        return self.out_of_time

    def print_figures(self, epoch_rows, seconds, view, stall_s=None):
        """The epoch's figures, `seconds` from the start; fails if it ended short of
        `epoch_rows` rows without running out of time."""
        if not self.out_of_time and self.rows != epoch_rows:
            sys.exit("the epoch yielded %d rows, not %d" % (self.rows, epoch_rows))
        print(json.dumps({
            "rows": self.rows,
            "epoch_rows": epoch_rows,
            "completed": self.rows == epoch_rows,
            "seconds": seconds,
            "rows_per_s": self.rows / seconds,
            "first_row_s": self.first_row if self.first_row is not None else seconds,
            "stall_s": stall_s,
            "bytes_read": self.read_bytes,
            "hints": False,
            "view": view,
        }))
