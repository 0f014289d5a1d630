#!/usr/bin/env python3
"""A sparse atlas-like chunked SCDL dataset: real row_ptr.npy files (u64, 2,000 values a
row), data.npy (f32) and col_ptr.npy (u16) made with truncate to their exact sizes.
usage: make.py DIR ROWS CHUNK_ROWS"""
import os, struct, sys
import numpy as np

out, rows, chunk_rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PER_ROW = 2000
chunks = -(-rows // chunk_rows)
nnz = rows * PER_ROW
os.makedirs(out, exist_ok=True)
for c in range(chunks):
    n = min(chunk_rows, rows - c * chunk_rows)
    d = os.path.join(out, f"chunk_{c:05d}")
    os.makedirs(d, exist_ok=True)
    (np.arange(n + 1, dtype="<u8") * PER_ROW).tofile(os.path.join(d, "row_ptr.npy"))
    for name, width in (("data.npy", 4), ("col_ptr.npy", 2)):
        with open(os.path.join(d, name), "wb") as f:
            f.truncate(n * PER_ROW * width)

def array(name, length, dtype):
    b = name.encode()
    return struct.pack(">I", len(b)) + b + struct.pack(">QIB", length, dtype, 0)

header = b"SCDL" + bytes([0, 1, 0, 1]) + struct.pack(">II", 2, 3)
header += array("DATA", nnz, 6) + array("COLPTR", nnz, 2) + array("ROWPTR", rows + 1, 4)
header += struct.pack(">I", 0) + struct.pack(">BIIQ", 1, chunk_rows, chunks, rows)
open(os.path.join(out, "header.sch"), "wb").write(header)
open(os.path.join(out, "version.json"), "w").write('"0.1.3"')
open(os.path.join(out, "metadata.json"), "w").write('{"num_rows": %d}' % rows)
print(out, rows, "rows", chunks, "chunks")
