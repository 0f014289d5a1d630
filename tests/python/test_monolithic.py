"""From a bionemo-scdl archive to a bucket that trains, and monolithic archives in a
bucket served with prefetch:

- `scdlfs chunk` writes the chunked form of a bionemo-made archive straight into the
  moto S3 bucket (no local copy); mounted, the released reader (SingleCellMemMapDataset)
  reads every row equal to the local original;
- a monolithic archive uploaded as it is gets a hint file on the mount; the Python
  sampler discovers its virtual chunks from the daemon, with no extra code, writes
  hints, and the daemon follows them (a plan, prefetches), while every row read is
  right.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import scdl_helpers as H
import scdlfs
from conftest import DATASETS
from sampler_helpers import status
from test_bionemo_compat import _compare_datasets, _open

BUCKET = "scdlfs-monolithic"
NAME = "synth_3k"
CHUNK_ROWS = 256


@pytest.fixture(scope="module")
def mono_bucket(moto, monolithic) -> str:
    """A bucket holding the bionemo-made archive as it is, under `mono/`."""
    client = moto.client()
    client.create_bucket(Bucket=BUCKET)
    H.upload_tree(client, BUCKET, f"mono/{NAME}/", monolithic[NAME])
    return f"s3://{BUCKET}"


def test_scdlfs_chunk_writes_straight_into_the_bucket_and_the_reader_reads_every_row(
    mono_bucket, moto, monolithic, tmp_path
):
    target = f"{mono_bucket}/chunked/{NAME}"
    H.run(
        [H.require_scdlfs(), "chunk", monolithic[NAME], target, "--chunk-rows", CHUNK_ROWS,
         "--endpoint-url", moto.endpoint, "--region", "us-east-1", "--quiet"],
        env=H.safe_aws_env(), timeout=120,
    )  # fmt: skip
    with H.ScdlfsMount(mono_bucket, tmp_path / "mnt", tmp_path / "cache", moto.endpoint) as mount:
        mounted, original = _open(mount.mountpoint / "chunked" / NAME), _open(monolithic[NAME])
        _compare_datasets(mounted, original, DATASETS[NAME])
        del mounted, original
        gc.collect()  # drop the memmaps before unmounting


def test_the_sampler_over_a_monolithic_dataset_on_a_mount_gives_hints_the_daemon_follows(
    mono_bucket, moto, monolithic, tmp_path
):
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    extra = ["--read-part-size", "64KiB"]
    with H.ScdlfsMount(mono_bucket, tmp_path / "mnt", tmp_path / "cache", moto.endpoint, extra=extra) as mount:
        path = mount.mountpoint / "mono" / NAME
        assert (path / ".scdlfs-hints").read_text().startswith("scdlfs-hints 4\nchunk-rows ")
        sampler = scdlfs.ChunkWindowSampler(str(path), chunks_per_window=1, seed=3)
        assert sampler.dataset_kind == "monolithic dataset on a mount"
        mounted = SingleCellMemMapDataset(str(path))
        original = SingleCellMemMapDataset(str(monolithic[NAME]))
        rows = iter(sampler)
        first = next(rows)
        # The hints are written by a thread of the sampler's: taking the error waits for them.
        assert sampler.take_hint_error() is None
        plans = status(H.require_scdlfs(), mount.mountpoint)["active_plans"]
        assert any(p["dataset"].endswith(f"mono/{NAME}") for p in plans), plans
        seen = []
        for row in [first, *rows]:
            (mv, mc), (ov, oc) = mounted.get_row(row)[0], original.get_row(row)[0]
            assert np.array_equal(mv, ov) and np.array_equal(mc, oc), f"row {row}"
            seen.append(row)
        assert sorted(seen) == list(range(DATASETS[NAME].n_cells))
        assert sampler.hints_active and sampler.take_hint_error() is None
        counters = status(H.require_scdlfs(), mount.mountpoint)["counters"]
        assert counters["prefetch_requests"] > 0, counters
        del mounted, original, rows, sampler
        gc.collect()
