"""The released bionemo-scdl 0.1.3 reader opens a chunked SCDL dataset served by
scdlfs from S3 (moto on 127.0.0.1) exactly as it opens the original monolithic
archive, and nothing in the bucket changes.

Flow (fixtures in conftest.py): AnnData -> h5ad -> monolithic archive written
by bionemo-scdl -> `scdlfs chunk --chunk-rows 256` -> uploaded with boto3 to
s3://scdlfs-compat/datasets/<name>/ -> `scdlfs mount` -> compared with the
original (bytes of every file, and through SingleCellMemMapDataset).
"""

from __future__ import annotations

import gc
import os
import shlex
import warnings
from pathlib import Path

import numpy as np
import pytest

import scdl_helpers as H
from conftest import CHUNK_ROWS, DATASETS


MONOLITHIC_ENTRIES = {
    "header.sch",
    "data.npy",
    "row_ptr.npy",
    "col_ptr.npy",
    "version.json",
    "metadata.json",
    "var_features",
    "obs_features",
}
NAMES = list(DATASETS)


def _mount_args(*extra):
    return [*extra, *shlex.split(os.environ.get("SCDLFS_TEST_MOUNT_ARGS", ""))]


def _mounted(request, bucket, moto, tmp_path_factory, label, *extra):
    base = tmp_path_factory.mktemp(f"mount-{label}")
    mount = H.ScdlfsMount(bucket.source, base / "mnt", base / "cache", moto.endpoint, extra=_mount_args(*extra))
    failed_before = request.session.testsfailed
    with mount:  # unmounts (forcibly if need be) whatever happens
        yield mount
    if mount.unmount_errors:
        msg = f"unclean unmount of {mount.mountpoint}: {mount.unmount_errors}"
        if request.session.testsfailed > failed_before:
            # A failed test may still hold memmaps on the mount (its traceback
            # keeps them alive), so a busy mount is expected then.
            warnings.warn(msg)
        else:
            pytest.fail(msg)


@pytest.fixture(scope="module")
def mono_mount(request, bucket, moto, tmp_path_factory):
    """The default (monolithic) view."""
    yield from _mounted(request, bucket, moto, tmp_path_factory, "monolithic")


@pytest.fixture(scope="module")
def raw_mount(request, bucket, moto, tmp_path_factory):
    """--view raw: the chunked objects as they are."""
    yield from _mounted(request, bucket, moto, tmp_path_factory, "raw", "--view", "raw")


def _open(path: Path):
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = SingleCellMemMapDataset(str(path))
    # The reader only *warns* when it cannot use header.sch (then falls back to
    # default dtypes); treat that as the failure it is.
    bad = [str(w.message) for w in caught if "header" in str(w.message).lower()]
    assert not bad, f"{path}: {bad}"
    assert ds.header is not None, f"{path}: the reader did not load header.sch"
    return ds


def _header_diff(a: bytes, b: bytes) -> str:
    return f"\n--- original\n{H.annotated_hexdump(a)}\n--- mounted\n{H.annotated_hexdump(b)}"


# --------------------------------------------------------------------------
# The inputs (no scdlfs involved)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_source_archive_written_by_bionemo(name, monolithic, adatas):
    """Sanity of the input: bionemo's writer chose the downcast dtypes we meant to exercise."""
    spec = DATASETS[name]
    mono = monolithic[name]
    h = H.parse_header((mono / "header.sch").read_bytes())
    assert h.backend == 1 and h.version == (0, 1, 0) and h.endianness == 1 and h.trailing == b""
    dtypes = {a[0]: H.DTYPES[a[2]] for a in h.arrays}
    assert tuple(sorted(dtypes.items())) == tuple(sorted(spec.expect_dtypes))
    X = adatas[name].X
    assert h.array("DATA")[1] == X.nnz and h.array("ROWPTR")[1] == spec.n_cells + 1
    np.testing.assert_array_equal(np.fromfile(mono / "row_ptr.npy", dtype=dtypes["ROWPTR"]), X.indptr)
    np.testing.assert_array_equal(np.fromfile(mono / "col_ptr.npy", dtype=dtypes["COLPTR"]), X.indices)
    np.testing.assert_array_equal(np.fromfile(mono / "data.npy", dtype=dtypes["DATA"]), X.data)
    assert sorted(p.name for p in mono.iterdir()) == sorted(MONOLITHIC_ENTRIES)


@pytest.mark.parametrize("name", NAMES)
def test_scdlfs_chunk_matches_reference(name, monolithic, chunked, chunker, tmp_path):
    """`scdlfs chunk` writes exactly what the format description says (Python reference)."""
    if chunker == "reference":
        pytest.skip("SCDLFS_TEST_CHUNKER=reference: the chunked archives are the reference")
    ref = H.reference_chunk(monolithic[name], tmp_path / "ref", CHUNK_ROWS)
    got_header = (chunked[name] / "header.sch").read_bytes()
    want_header = (ref / "header.sch").read_bytes()
    assert got_header == want_header, _header_diff(want_header, got_header)
    got = H.tree_files(chunked[name])
    # Beside the format's files, scdlfs writes the dataset's manifest (docs/manifest.md).
    assert got.pop(".scdlfs-manifest", None) is not None, "no manifest written"
    assert got == H.tree_files(ref)


# --------------------------------------------------------------------------
# The default view: a monolithic archive
# --------------------------------------------------------------------------


def test_mount_root_lists_datasets(mono_mount):
    root = mono_mount.mountpoint
    assert {"synth_3k", "edge"} <= set(os.listdir(root))
    assert "empty_chunk" in os.listdir(root / "edge")


@pytest.mark.parametrize("name", NAMES)
def test_monolithic_view_layout(name, mono_mount, monolithic):
    mnt = mono_mount.mountpoint / name
    entries = set(os.listdir(mnt))
    assert MONOLITHIC_ENTRIES <= entries, f"missing: {MONOLITHIC_ENTRIES - entries}"
    assert not [e for e in entries if e.startswith("chunk_")], f"chunk dirs in the monolithic view: {entries}"
    for entry in MONOLITHIC_ENTRIES:
        o, m = monolithic[name] / entry, mnt / entry
        assert o.is_dir() == m.is_dir(), entry
        if o.is_file():
            assert m.stat().st_size == o.stat().st_size, f"{entry}: size {m.stat().st_size} != {o.stat().st_size}"


@pytest.mark.parametrize("name", NAMES)
def test_monolithic_view_header_bytes(name, mono_mount, monolithic):
    want = (monolithic[name] / "header.sch").read_bytes()
    got = (mono_mount.mountpoint / name / "header.sch").read_bytes()
    assert got == want, _header_diff(want, got)


@pytest.mark.parametrize("name", NAMES)
def test_monolithic_view_files_identical(name, mono_mount, monolithic, chunked):
    """data.npy, row_ptr.npy, col_ptr.npy and every other file, byte for byte."""
    mnt = mono_mount.mountpoint / name
    for arr in ("data.npy", "row_ptr.npy", "col_ptr.npy"):
        want = (monolithic[name] / arr).read_bytes()
        got = (mnt / arr).read_bytes()
        assert len(got) == len(want), f"{arr}: {len(got)} bytes, want {len(want)}"
        if got != want:
            first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            pytest.fail(f"{arr}: first differing byte at offset {first}")
    assert H.tree_files(mnt, mount_additions=True) == H.tree_files(monolithic[name])
    # The dataset's objects as stored stay reachable under .chunked/.
    assert H.tree_files(mnt / H.CHUNKED_DIR, mount_additions=True) == H.tree_files(chunked[name])


def _compare_datasets(m, o, spec) -> None:
    """Everything the reader exposes, mounted (m) against original (o)."""
    assert m.number_of_rows() == o.number_of_rows() == spec.n_cells
    assert m.number_nonzero_values() == o.number_nonzero_values()
    assert m.number_of_values() == o.number_of_values()
    assert m.shape() == o.shape()
    assert m.dtypes == o.dtypes
    assert m.header.to_json() == o.header.to_json()
    assert m.metadata == o.metadata
    assert m.version() == o.version()
    for attr in ("data", "row_index", "col_index"):
        a, b = getattr(m, attr), getattr(o, attr)
        assert a.dtype == b.dtype and a.shape == b.shape, attr
        assert np.array_equal(a, b), attr

    # Every row, in a shuffled order (random access through the mount), with
    # values, column ids, var features and obs features.
    order = np.random.default_rng(spec.seed).permutation(spec.n_cells)
    for i in order:
        i = int(i)
        (mv, mc), mvar, mobs = m.get_row(i, return_var_features=True, return_obs_features=True)
        (ov, oc), ovar, oobs = o.get_row(i, return_var_features=True, return_obs_features=True)
        assert mv.dtype == ov.dtype and np.array_equal(mv, ov), f"row {i} values"
        assert mc.dtype == oc.dtype and np.array_equal(mc, oc), f"row {i} columns"
        assert len(mvar) == len(ovar) and all(np.array_equal(a, b) for a, b in zip(mvar, ovar)), f"row {i} var"
        assert len(mobs) == len(oobs) and all(np.array_equal(a, b) for a, b in zip(mobs, oobs)), f"row {i} obs"

    # Named feature selection, the padded (dense) row and the torch path.
    var_names = list(o._var_feature_index._feature_arr[0].keys())
    obs_names = list(o._obs_feature_index._feature_arr[0].keys())
    for i in (0, 1, spec.n_cells // 2, spec.n_cells - 1):
        mr = m.get_row(i, True, var_names[-1:], True, obs_names[:2])
        orr = o.get_row(i, True, var_names[-1:], True, obs_names[:2])
        assert all(np.array_equal(a, b) for a, b in zip(mr[1] + mr[2], orr[1] + orr[2]))
        assert np.array_equal(m.get_row_padded(i)[0], o.get_row_padded(i)[0])
        assert np.array_equal(m[i].numpy(), o[i].numpy())


@pytest.mark.parametrize("name", NAMES)
def test_bionemo_reader_on_mount(name, mono_mount, monolithic, monolithic_digests, bucket):
    """SingleCellMemMapDataset (memmaps opened "r+") reads the mount like the original,
    and opening it that way changes nothing: not the mount, not the bucket."""
    spec = DATASETS[name]
    mnt = mono_mount.mountpoint / name
    m, o = _open(mnt), _open(monolithic[name])
    _compare_datasets(m, o, spec)
    del m, o
    gc.collect()  # drop the memmaps (and their shared writable mappings)

    assert H.tree_files(mnt, mount_additions=True) == monolithic_digests[name], "mounted files changed after the reader ran"
    assert H.tree_files(monolithic[name]) == monolithic_digests[name], "the local original changed"
    assert H.bucket_snapshot(bucket.client, bucket.name) == bucket.snapshot, "the bucket changed"


# --------------------------------------------------------------------------
# --view raw: the chunked objects as they are
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_raw_view_shows_chunked_objects(name, raw_mount, chunked, bucket):
    mnt = raw_mount.mountpoint / name
    want_header = (chunked[name] / "header.sch").read_bytes()
    got_header = (mnt / "header.sch").read_bytes()
    assert got_header == want_header, _header_diff(want_header, got_header)
    h = H.parse_header(got_header)
    n_chunks = -(-DATASETS[name].n_cells // CHUNK_ROWS)
    assert h.backend == 2 and h.chunked == (CHUNK_ROWS, n_chunks, DATASETS[name].n_cells)
    assert sorted(e for e in os.listdir(mnt) if e.startswith("chunk_")) == [f"chunk_{c:05d}" for c in range(n_chunks)]
    last = f"chunk_{n_chunks - 1:05d}"
    for arr in ("data.npy", "row_ptr.npy", "col_ptr.npy"):
        for chunk in ("chunk_00000", last):
            assert (mnt / chunk / arr).read_bytes() == (chunked[name] / chunk / arr).read_bytes(), f"{chunk}/{arr}"
    assert H.tree_files(mnt, mount_additions=True) == H.tree_files(chunked[name])
    assert H.bucket_snapshot(bucket.client, bucket.name) == bucket.snapshot, "the bucket changed"


def test_bucket_unchanged_at_end(bucket):
    assert H.bucket_snapshot(bucket.client, bucket.name) == bucket.snapshot
