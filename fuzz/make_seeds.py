"""Writes the committed seed corpora of the fuzz targets (fuzz/seeds/<target>/): valid
inputs of each decoder, written from the formats' descriptions (shared/SCDL-FORMAT.md for
header.sch, docs/hint-protocol.md, the layouts in src/cache/part_file.rs and
src/cache/adopt.rs, src/chunker/journal.rs), so that a short run starts past the
decoders' first checks. Run from anywhere: python3 fuzz/make_seeds.py"""
import json
import os
import struct

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds"))


def s(b): return struct.pack(">I", len(b)) + b
def header(backend, arrays, features, trailer=None):
    out = b"SCDL" + bytes([0, 1, 0, 1]) + struct.pack(">II", backend, len(arrays))
    for name, length, dtype, shape in arrays:
        out += s(name.encode()) + struct.pack(">QI", length, dtype)
        out += (b"\x01" + struct.pack(">I", len(shape)) + b"".join(struct.pack(">I", d) for d in shape)) if shape else b"\x00"
    out += struct.pack(">I", len(features))
    for name, length, dtype, files in features:
        out += s(name.encode()) + struct.pack(">QII", length, dtype, len(files))
        out += b"".join(s(f.encode()) for f in files) + b"\x00"
    if trailer:
        out += struct.pack(">BIIQ", 1, *trailer)
    return out
arrays = [("DATA", 123456, 6, None), ("ROWPTR", 1001, 3, None), ("COLPTR", 123456, 2, [123456])]
feats = [("var_features", 2000, 8, ["dataframe_0.parquet", "cumulative_sum_index.npy"])]
seeds = {
  "header_decode": {
    "monolithic": header(1, arrays, feats),
    "chunked": header(2, arrays, feats, (97, 11, 1000)),
    "bare": header(1, arrays[:1], []),
  },
  "hint_decode": {
    "v2_plan": b"\x10scdlfs-hints 2\nchunk-rows 1024\nplan 3\nwindow 17 4 9\nrows 1024 1088 5120 5184\n",
    "v1_windows": b"\x03scdlfs-hints 1\nplan 0\nwindow 0 1 2 3\nwindow 4\nplan 1\nrows 0 10\n",
  },
  "source_record_decode": {
    "with_endpoint": json.dumps({"layout_version": 3, "source": "s3://bucket/atlas", "endpoint": "http://127.0.0.1:9000"}, indent=2).encode() + b"\n",
    "plain": json.dumps({"layout_version": 3, "source": "/data/atlas"}, indent=2).encode() + b"\n",
  },
  "chunk_journal_decode": {
    "valid": b"\x80" + json.dumps({"format": 1, "chunk_rows": 1024, "source_header_crc32c": 7, "source_array_bytes": [1, 2, 3]}).encode()
             + json.dumps({"size": 5, "crc32c": 9, "e_tag": "\"etag\""}).encode(),
    "no_etag": b"\x70" + json.dumps({"format": 1, "chunk_rows": 97, "source_header_crc32c": 4294967295, "source_array_bytes": [0, 18446744073709551615, 3]}).encode()
             + json.dumps({"size": 0, "crc32c": 0, "e_tag": None}).encode(),
  },
}
# Part file headers (src/cache/part_file.rs): the golden one, and one without ETag.
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
def part_header(key, etag, offset, data_len, block_crcs, crc_fn):
    fixed = b"SCDLFSPT" + struct.pack("<I", 2)
    table = (40 + len(key) + len(etag) + 3) // 4 * 4
    total = ((table + 4 * len(block_crcs) + 4) + 4095) // 4096 * 4096
    fixed += struct.pack("<IQQIHH", total, offset, data_len, 65536, len(key), len(etag))
    out = fixed + key + etag
    out += b"\x00" * (table - len(out))
    out += b"".join(struct.pack("<I", c) for c in block_crcs)
    out += b"\x00" * (total - 4 - len(out))
    return out + struct.pack("<I", crc_fn(out))
golden = part_header(b"ds/chunk_00001/data.npy", b'"abc"', 8 << 20, 150000, [0x0daafcde, 0xf1439ecd, 0x0deb8fef], crc32c)
assert struct.unpack("<I", golden[-4:])[0] == 919616147, "golden checksum"
data = bytes(range(256)) * 1000
blocks = [crc32c(data[i:i + 65536]) for i in range(0, len(data), 65536)]
seeds["part_header_decode"] = {
    "golden": golden,
    "no_etag_with_data": part_header(b"atlas/chunk_00000/col_ptr.npy", b"", 0, len(data), blocks, crc32c) + data[:5000],
}
for target, files in seeds.items():
    os.makedirs(target, exist_ok=True)
    for name, data in files.items():
        open(os.path.join(target, name), "wb").write(data)
