"""Helpers for the scdlfs Python compatibility tests.

Independent of scdlfs: synthetic AnnData, monolithic SCDL archives written by
bionemo-scdl itself, a header parser and a reference row-chunker written from
the format description (shared/SCDL-FORMAT.md), tree hashing, S3 (moto) and
mount helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import numpy as np


REPO_ROOT = Path(__file__).resolve().parents[2]

DTYPES = {1: "uint8", 2: "uint16", 3: "uint32", 4: "uint64", 5: "float16", 6: "float32", 7: "float64"}
ARRAY_FILES = {"DATA": "data.npy", "ROWPTR": "row_ptr.npy", "COLPTR": "col_ptr.npy"}
GLOBAL_ENTRIES = ("version.json", "metadata.json", "var_features", "obs_features")


# --------------------------------------------------------------------------
# Synthetic data and monolithic archives (written by bionemo-scdl itself)
# --------------------------------------------------------------------------


def make_anndata(
    n_cells: int,
    n_genes: int,
    density: float,
    seed: int,
    empty_rows: Iterable[int] = (),
    empty_fraction: float = 0.0,
    with_columns: bool = True,
    integer_values: bool = False,
):
    """A sparse (CSR) AnnData with some empty rows and optional var/obs columns."""
    import anndata as ad
    import pandas as pd
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    nnz_per_row = rng.binomial(n_genes, density, size=n_cells)
    empty = set(int(r) for r in empty_rows)
    empty |= set(np.flatnonzero(rng.random(n_cells) < empty_fraction).tolist())
    for r in empty:
        nnz_per_row[r] = 0
    indptr = np.zeros(n_cells + 1, dtype=np.int64)
    np.cumsum(nnz_per_row, out=indptr[1:])
    indices = np.concatenate(
        [np.sort(rng.choice(n_genes, size=k, replace=False)) for k in nnz_per_row]
        or [np.zeros(0, dtype=np.int64)]
    ).astype(np.int32)
    nnz = int(indptr[-1])
    if integer_values:
        values = rng.integers(1, 200, size=nnz).astype(np.float32)
    else:
        # Counts plus some non-integer values (exact float32 bytes must survive).
        values = rng.integers(1, 100, size=nnz).astype(np.float32)
        frac = rng.random(nnz) < 0.1
        values[frac] = (rng.random(int(frac.sum())) * 10 + 0.001).astype(np.float32)
    X = sp.csr_matrix((values, indices, indptr), shape=(n_cells, n_genes))

    obs_index = pd.Index([f"cell_{i:06d}" for i in range(n_cells)], name="barcode")
    var_index = pd.Index([f"GENE{j:05d}" for j in range(n_genes)], name="gene")
    if with_columns:
        obs = pd.DataFrame(
            {
                "cell_type": pd.Categorical(rng.choice(["T cell", "B cell", "NK", "monocyte"], size=n_cells)),
                "donor": [f"donor_{d}" for d in rng.integers(0, 7, size=n_cells)],
                "n_counts": np.asarray(X.sum(axis=1)).ravel().astype(np.float64),
                "batch": rng.integers(0, 4, size=n_cells).astype(np.int64),
            },
            index=obs_index,
        )
        var = pd.DataFrame(
            {
                "feature_id": [f"ENSG{j:011d}" for j in range(n_genes)],
                "feature_name": list(var_index),
                "highly_variable": rng.random(n_genes) < 0.2,
                "mean_expr": rng.random(n_genes) * 3,
            },
            index=var_index,
        )
    else:
        obs = pd.DataFrame(index=obs_index)
        var = pd.DataFrame(index=var_index)
    return ad.AnnData(X=X, obs=obs, var=var)


def build_monolithic(adata, workdir: Path, name: str, data_dtype: Optional[str] = None) -> Path:
    """Writes adata to h5ad and converts it with bionemo-scdl; returns the archive dir."""
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    workdir.mkdir(parents=True, exist_ok=True)
    h5ad = workdir / f"{name}.h5ad"
    adata.write_h5ad(h5ad)
    out = workdir / name
    ds = SingleCellMemMapDataset(str(out), h5ad_path=str(h5ad), use_X_not_raw=True, data_dtype=data_dtype)
    ds.save()  # what the collection/convert script does after loading; writes nothing new here
    del ds
    return out


# --------------------------------------------------------------------------
# header.sch
# --------------------------------------------------------------------------


@dataclass
class Header:
    version: tuple
    endianness: int
    backend: int
    arrays: list = field(default_factory=list)  # (name, length, dtype, shape)
    feature_indices: list = field(default_factory=list)  # (name, length, dtype, files, shape)
    chunked: Optional[tuple] = None  # (chunk_size, num_chunks, total_rows)
    trailing: bytes = b""
    spans: list = field(default_factory=list)  # (start, end, description) for annotation

    def array(self, name: str):
        for a in self.arrays:
            if a[0] == name:
                return a
        raise KeyError(name)


def parse_header(raw: bytes) -> Header:
    """Parses header.sch per SCDL-FORMAT.md (big-endian), recording byte spans."""
    off = 0
    spans = []

    def take(n, what):
        nonlocal off
        if off + n > len(raw):
            raise ValueError(f"header truncated reading {what} at {off}")
        b = raw[off : off + n]
        spans.append((off, off + n, what))
        off += n
        return b

    def u8(what):
        return take(1, what)[0]

    def u32(what):
        return struct.unpack(">I", take(4, what))[0]

    def u64(what):
        return struct.unpack(">Q", take(8, what))[0]

    def string(what):
        n = u32(f"{what} length")
        return take(n, f"{what} (UTF-8)").decode("utf-8")

    def shape(what):
        if u8(f"{what} has_shape"):
            dims = u32(f"{what} shape dims")
            return tuple(u32(f"{what} shape[{i}]") for i in range(dims))
        return None

    magic = take(4, "magic 'SCDL'")
    if magic != b"SCDL":
        raise ValueError(f"bad magic {magic!r}")
    version = (u8("version major"), u8("version minor"), u8("version point"))
    endianness = u8("endianness (1 = network/big)")
    backend = u32("backend (1 = MEMMAP_V0, 2 = CHUNKED_MEMMAP_V0)")
    h = Header(version=version, endianness=endianness, backend=backend)
    for i in range(u32("array_count")):
        name = string(f"array[{i}] name")
        length = u64(f"array[{i}] length (elements)")
        dtype = u32(f"array[{i}] dtype")
        h.arrays.append((name, length, dtype, shape(f"array[{i}]")))
    if off < len(raw):
        for i in range(u32("feature_index_count")):
            name = string(f"feature_index[{i}] name")
            length = u64(f"feature_index[{i}] length (rows)")
            dtype = u32(f"feature_index[{i}] dtype")
            files = [string(f"feature_index[{i}] file[{j}]") for j in range(u32(f"feature_index[{i}] file_count"))]
            h.feature_indices.append((name, length, dtype, files, shape(f"feature_index[{i}]")))
    if backend == 2:
        if u8("has_chunked_info"):
            h.chunked = (u32("chunk_size (rows)"), u32("num_chunks"), u64("total_rows"))
    h.trailing = raw[off:]
    h.spans = spans
    return h


def annotated_hexdump(raw: bytes) -> str:
    """One line per header field: offset, hex bytes, meaning."""
    h = parse_header(raw)
    lines = []
    for start, end, what in h.spans:
        chunk = raw[start:end]
        hx = chunk.hex(" ")
        if len(hx) > 47:
            hx = hx[:44] + "..."
        shown = chunk.decode("utf-8", "replace") if "UTF-8" in what or "magic" in what else ""
        if not shown and end - start in (1, 4, 8):
            shown = str(int.from_bytes(chunk, "big"))
        lines.append(f"{start:04x}-{end - 1:04x}  {hx:<47}  {what} = {shown}")
    if h.trailing:
        lines.append(f"{len(raw) - len(h.trailing):04x}-      {h.trailing.hex(' ')}  TRAILING BYTES")
    return "\n".join(lines)


def chunked_header_bytes(mono_raw: bytes, chunk_rows: int, num_chunks: int, total_rows: int) -> bytes:
    """The chunked header: the monolithic one with backend 2 and the 17-byte trailer."""
    h = parse_header(mono_raw)
    assert h.backend == 1 and not h.trailing, "expected a monolithic header with no trailing bytes"
    return (
        mono_raw[:8]
        + struct.pack(">I", 2)
        + mono_raw[12:]
        + struct.pack(">BIIQ", 1, chunk_rows, num_chunks, total_rows)
    )


# --------------------------------------------------------------------------
# Reference chunker (Python, from the format description)
# --------------------------------------------------------------------------


def reference_chunk(mono: Path, out: Path, chunk_rows: int) -> Path:
    """Partitions a monolithic archive into the chunked layout (reference for `scdlfs chunk`)."""
    raw = (mono / "header.sch").read_bytes()
    h = parse_header(raw)
    dt = {name: np.dtype(DTYPES[dtype]) for name, _, dtype, _ in h.arrays}
    row_ptr = np.fromfile(mono / "row_ptr.npy", dtype=dt["ROWPTR"])
    data = (mono / "data.npy").read_bytes()
    col = (mono / "col_ptr.npy").read_bytes()
    total_rows = len(row_ptr) - 1
    num_chunks = -(-total_rows // chunk_rows)
    out.mkdir(parents=True)
    for c in range(num_chunks):
        r0, r1 = c * chunk_rows, min((c + 1) * chunk_rows, total_rows)
        s, e = int(row_ptr[r0]), int(row_ptr[r1])
        d = out / f"chunk_{c:05d}"
        d.mkdir()
        (d / "row_ptr.npy").write_bytes((row_ptr[r0 : r1 + 1] - row_ptr[r0]).astype(dt["ROWPTR"]).tobytes())
        (d / "data.npy").write_bytes(data[s * dt["DATA"].itemsize : e * dt["DATA"].itemsize])
        (d / "col_ptr.npy").write_bytes(col[s * dt["COLPTR"].itemsize : e * dt["COLPTR"].itemsize])
    (out / "header.sch").write_bytes(chunked_header_bytes(raw, chunk_rows, num_chunks, total_rows))
    for entry in GLOBAL_ENTRIES:
        src = mono / entry
        if src.is_dir():
            shutil.copytree(src, out / entry)
        elif src.exists():
            shutil.copy2(src, out / entry)
    return out


# --------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------


# What an scdlfs mount adds to a dataset directory: the read-ahead hint file, and in
# the flat view the dataset's objects as stored under .chunked/ (docs/usage.md).
HINT_FILE = ".scdlfs-hints"
CHUNKED_DIR = ".chunked"


def tree_files(root: Path, *, mount_additions: bool = False) -> dict:
    """{relative path: (size, sha256)} of every regular file under root.

    With mount_additions=True the entries scdlfs adds (hint files, .chunked/) are
    left out, so a mounted view compares with the archive it stands for."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if mount_additions:
            dirnames[:] = [d for d in dirnames if d != CHUNKED_DIR]
            filenames = [f for f in filenames if f != HINT_FILE]
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            rel = p.relative_to(root).as_posix()
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[rel] = (p.stat().st_size, h.hexdigest())
    return out


# --------------------------------------------------------------------------
# S3 (moto_server on 127.0.0.1)
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def safe_aws_env(base: Optional[dict] = None) -> dict:
    """Environment with dummy credentials and nothing that could reach a cloud endpoint."""
    env = dict(os.environ if base is None else base)
    for k in list(env):
        if k.startswith("AWS_") and k not in ("AWS_CA_BUNDLE",):
            del env[k]
    env.update(
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


class MotoServer:
    def __init__(self, log_path: Path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc = None

    def start(self, timeout: float = 60.0):
        exe = Path(sys.executable).parent / "moto_server"
        if not exe.exists():
            found = shutil.which("moto_server")
            if not found:
                raise RuntimeError("moto_server not found (run scripts/setup-python-venv)")
            exe = Path(found)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=safe_aws_env(),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2) as r:
                    r.read()
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"moto_server did not answer within {timeout}s; see {self.log_path}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )


def upload_tree(client, bucket: str, prefix: str, root: Path) -> int:
    n = 0
    for rel in sorted(tree_files(root)):
        client.upload_file(str(root / rel), bucket, f"{prefix}{rel}")
        n += 1
    return n


def bucket_snapshot(client, bucket: str) -> dict:
    """{key: (etag, size, last_modified)} of every object in the bucket."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            out[o["Key"]] = (o["ETag"], o["Size"], o["LastModified"].isoformat())
    return out


# --------------------------------------------------------------------------
# scdlfs
# --------------------------------------------------------------------------


def scdlfs_bin() -> Path:
    return Path(os.environ.get("SCDLFS_BIN") or REPO_ROOT / "target" / "ci" / "scdlfs")


def require_scdlfs() -> Path:
    b = scdlfs_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        raise RuntimeError(f"scdlfs binary not found at {b} (build it with `cargo build --profile ci` or set SCDLFS_BIN)")
    return b


def run(cmd, timeout: float = 120, env=None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
    )
    if check and p.returncode != 0:
        raise RuntimeError(
            f"command failed ({p.returncode}): {' '.join(map(str, cmd))}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
        )
    return p


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == target:
                return True
    return False


def _pids_serving(mountpoint: Path) -> list:
    """Processes running the scdlfs binary with this (unique) mountpoint on their command line."""
    pids = []
    needle = str(mountpoint).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == "scdlfs" and needle in argv:
            pids.append(int(d.name))
    return pids


class ScdlfsMount:
    """`scdlfs mount` as a context manager, with a teardown that cannot leave a mount behind."""

    def __init__(self, source: str, mountpoint: Path, cache_dir: Path, endpoint: str, extra=(), cache_size="64MiB"):
        self.bin = require_scdlfs()
        self.source = source
        self.mountpoint = mountpoint
        self.cache_dir = cache_dir
        self.endpoint = endpoint
        self.extra = list(extra)
        self.cache_size = cache_size
        self.env = safe_aws_env()
        self.mount_output = ""

    def __enter__(self):
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.bin, "mount", self.source, self.mountpoint,
            "--endpoint-url", self.endpoint, "--region", "us-east-1",
            "--cache-dir", self.cache_dir, "--cache-size", self.cache_size, *self.extra,
        ]  # fmt: skip
        # Output goes to a file, not a pipe: the daemon it forks may keep the
        # inherited descriptors open, and waiting for EOF on a pipe would hang.
        log_path = self.cache_dir.parent / f"{self.mountpoint.name}-mount.log"
        try:
            with open(log_path, "wb") as log:
                p = subprocess.run(
                    [str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=self.env, timeout=90,
                )  # fmt: skip
            self.mount_output = log_path.read_text(errors="replace")
            if p.returncode != 0:
                raise RuntimeError(
                    f"command failed ({p.returncode}): {' '.join(map(str, cmd))}\n--- output\n{self.mount_output}"
                )
            if not is_mounted(self.mountpoint):
                raise RuntimeError(
                    f"`scdlfs mount` returned 0 but {self.mountpoint} is not a mount point\n"
                    f"--- output\n{self.mount_output}"
                )
        except BaseException:
            self.unmount()
            raise
        return self

    def __exit__(self, *exc):
        self.unmount()
        return False

    def unmount(self):
        errors = []
        if is_mounted(self.mountpoint):
            try:
                p = run([self.bin, "unmount", self.mountpoint], timeout=60, env=self.env, check=False)
                if p.returncode != 0:
                    errors.append(f"scdlfs unmount exited {p.returncode}: {p.stderr.strip()}")
            except subprocess.TimeoutExpired:
                errors.append("scdlfs unmount timed out")
        if is_mounted(self.mountpoint):
            # Last resorts: lazy unmount so that nothing stays mounted after the tests.
            for cmd in (["fusermount3", "-u", "-z", self.mountpoint], ["umount", "-l", self.mountpoint]):
                if shutil.which(cmd[0]):
                    run(cmd, timeout=30, check=False)
                if not is_mounted(self.mountpoint):
                    break
            errors.append("mount point had to be force-unmounted")
        # The daemon should exit once unmounted; end any left (by pid, ours only).
        deadline = time.monotonic() + 10
        while _pids_serving(self.mountpoint) and time.monotonic() < deadline:
            time.sleep(0.1)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = _pids_serving(self.mountpoint)
            if not pids:
                break
            errors.append(f"scdlfs daemon(s) {pids} still running after unmount; sending {sig.name}")
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(2)
        self.unmount_errors = errors
        return errors


def read_json(p: Path):
    return json.loads(p.read_text())
