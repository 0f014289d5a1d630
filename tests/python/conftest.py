"""Session fixtures: synthetic monolithic SCDL archives (written by bionemo-scdl),
their chunked form (`scdlfs chunk`), a moto S3 server on 127.0.0.1 and a bucket
holding the chunked datasets.

Environment:
  SCDLFS_BIN             scdlfs binary (default: <repo>/target/ci/scdlfs)
  SCDLFS_TEST_CHUNKER    "scdlfs" (default) or "reference": make the chunked
                         archives with the Python reference chunker instead of
                         `scdlfs chunk` (to test the mount alone)
  SCDLFS_TEST_MOUNT_ARGS extra arguments appended to `scdlfs mount` (shlex-split)
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

import scdl_helpers as H


CHUNK_ROWS = 256
BUCKET = "scdlfs-compat"
PREFIX = "datasets"  # the mount source is s3://BUCKET/PREFIX


@dataclass(frozen=True)
class DatasetSpec:
    """One synthetic dataset; `name` is its path relative to the mounted prefix."""

    name: str
    n_cells: int
    n_genes: int
    density: float
    seed: int
    empty_rows: tuple
    empty_fraction: float = 0.0
    with_columns: bool = True
    integer_values: bool = False
    data_dtype: str | None = None
    # What bionemo's writer is expected to choose (checked, so that the data
    # really exercises the downcast dtypes).
    expect_dtypes: tuple = ()


DATASETS = {
    # The main case: 3000 x 500 at ~5% density, float32 values, col_ptr
    # downcast to uint16, row_ptr to uint32 (nnz > 65535), var/obs columns,
    # empty rows at chunk boundaries, a short last chunk (3000 = 11*256 + 184).
    "synth_3k": DatasetSpec(
        name="synth_3k",
        n_cells=3000,
        n_genes=500,
        density=0.05,
        seed=1,
        empty_rows=(0, 255, 256, *range(1000, 1010), 2815, 2816, 2999),
        empty_fraction=0.03,
        expect_dtypes=(("DATA", "float32"), ("ROWPTR", "uint32"), ("COLPTR", "uint16")),
    ),
    # Edge cases: nested dataset path, uint8 values, row_ptr uint16, col_ptr
    # uint32 (70000 genes), no var/obs columns (index-only features), rows that
    # divide evenly into chunks, and one chunk with no values at all (its
    # data.npy / col_ptr.npy objects are empty).
    "edge/empty_chunk": DatasetSpec(
        name="edge/empty_chunk",
        n_cells=1024,
        n_genes=70000,
        density=0.0003,
        seed=2,
        empty_rows=tuple(range(512, 768)),
        with_columns=False,
        integer_values=True,
        data_dtype="uint8",
        expect_dtypes=(("DATA", "uint8"), ("ROWPTR", "uint16"), ("COLPTR", "uint32")),
    ),
}


@dataclass
class Bucket:
    client: object
    name: str
    prefix: str
    snapshot: dict  # bucket_snapshot() right after the upload

    @property
    def source(self) -> str:
        return f"s3://{self.name}/{self.prefix}"


def pytest_report_header(config):
    b = H.scdlfs_bin()
    return [
        f"scdlfs binary: {b} ({'present' if b.exists() else 'MISSING'})",
        f"chunker: {os.environ.get('SCDLFS_TEST_CHUNKER', 'scdlfs')}",
    ]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("compat")
    print(f"compat test workdir: {d}")
    return d


@pytest.fixture(scope="session", autouse=True)
def runtime_dir(tmp_path_factory) -> Path:
    """Where the shared mounts' locks and notes go (scdlfs.runtime_dir()): the session's
    own directory, inherited by the jobs the tests run, rather than /run/scdlfs."""
    d = tmp_path_factory.mktemp("run")
    os.environ["XDG_RUNTIME_DIR"] = str(d)
    return d


@pytest.fixture(scope="session")
def adatas():
    return {
        name: H.make_anndata(
            s.n_cells,
            s.n_genes,
            s.density,
            seed=s.seed,
            empty_rows=s.empty_rows,
            empty_fraction=s.empty_fraction,
            with_columns=s.with_columns,
            integer_values=s.integer_values,
        )
        for name, s in DATASETS.items()
    }


@pytest.fixture(scope="session")
def monolithic(workdir, adatas) -> dict:
    """{dataset name: local monolithic archive written by bionemo-scdl}."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, spec in DATASETS.items():
            safe = name.replace("/", "__")
            out[name] = H.build_monolithic(adatas[name], workdir / "mono", safe, data_dtype=spec.data_dtype)
    return out


@pytest.fixture(scope="session")
def monolithic_digests(monolithic) -> dict:
    """File hashes of the local originals, taken before any test opened them."""
    return {name: H.tree_files(path) for name, path in monolithic.items()}


def _chunker() -> str:
    mode = os.environ.get("SCDLFS_TEST_CHUNKER", "scdlfs")
    if mode not in ("scdlfs", "reference"):
        raise ValueError(f"SCDLFS_TEST_CHUNKER must be 'scdlfs' or 'reference', not {mode!r}")
    return mode


@pytest.fixture(scope="session")
def chunker() -> str:
    return _chunker()


@pytest.fixture(scope="session")
def chunked(workdir, monolithic, monolithic_digests, chunker) -> dict:
    """{dataset name: local chunked archive} made by `scdlfs chunk` (or the reference)."""
    out = {}
    for name, mono in monolithic.items():
        dest = workdir / "chunked" / name.replace("/", "__")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if chunker == "reference":
            H.reference_chunk(mono, dest, CHUNK_ROWS)
        else:
            cmd = [H.require_scdlfs(), "chunk", mono, dest, "--chunk-rows", CHUNK_ROWS]
            p = H.run(cmd, timeout=120)
            if not (dest / "header.sch").is_file():
                raise RuntimeError(
                    f"`{' '.join(map(str, cmd))}` exited 0 but wrote no {dest}/header.sch\n"
                    f"--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
                )
        out[name] = dest
    return out


@pytest.fixture(scope="session")
def moto(workdir):
    server = H.MotoServer(workdir / "moto_server.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def bucket(moto, chunked) -> Bucket:
    client = moto.client()
    client.create_bucket(Bucket=BUCKET)
    for name, path in chunked.items():
        H.upload_tree(client, BUCKET, f"{PREFIX}/{name}/", path)
    return Bucket(client=client, name=BUCKET, prefix=PREFIX, snapshot=H.bucket_snapshot(client, BUCKET))
