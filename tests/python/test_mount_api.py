"""Mounting from Python: `scdlfs.mount(...)` as a context manager and as a plain call
over the moto S3 server on 127.0.0.1, `scdlfs.open_dataset("s3://…/name")` returning
the released reader's dataset, the daemon's own message when it cannot mount, and
options that are the mount command's flags (read from the binary, checked before any
daemon starts)."""

from __future__ import annotations

import gc
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import scdl_helpers as H
import scdlfs

NAME = "synth_3k"


def same_rows(a, b, rows) -> bool:
    """Whether rows `rows` of datasets `a` and `b` hold the same values and columns."""
    pairs = ((a.get_row(i)[0], b.get_row(i)[0]) for i in rows)
    return all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in pairs)


@pytest.fixture(scope="module")
def original(monolithic):
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SingleCellMemMapDataset(str(monolithic[NAME]))


def daemon_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"scdlfs")
    except OSError:
        return False


def test_a_mount_in_a_with_block_serves_the_bucket_and_goes_at_its_end(bucket, moto, original, tmp_path):
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    with scdlfs.mount(bucket.source, cache_size="64MiB", endpoint_url=moto.endpoint, read_part_size="256KiB") as m:
        assert H.is_mounted(m.mountpoint) and daemon_running(m.pid)
        assert sorted(p.name for p in m.mountpoint.iterdir()) == ["edge", NAME]
        dataset = SingleCellMemMapDataset(str(m.mountpoint / NAME))
        assert len(dataset) == len(original)
        assert same_rows(dataset, original, [0, 1, 255, 256, 1500, len(original) - 1])
        assert m.status()["counters"]["parts_fetched"] > 0
        scratch = m.mountpoint.parent
        del dataset
        gc.collect()
    assert not H.is_mounted(m.mountpoint)
    assert not daemon_running(m.pid)
    assert not scratch.exists(), "the temporary mountpoint and cache were left behind"


def test_a_plain_call_mounts_until_unmount(bucket, moto, tmp_path):
    mountpoint, cache = tmp_path / "mnt", tmp_path / "cache"
    mountpoint.mkdir()
    m = scdlfs.mount(bucket.source, mountpoint, cache_dir=cache, cache_size=64 << 20, endpoint_url=moto.endpoint)
    try:
        assert m.mountpoint == mountpoint and H.is_mounted(mountpoint)
        assert (mountpoint / NAME / "header.sch").is_file()
    finally:
        m.unmount()
    m.unmount()  # a second time does nothing
    assert not H.is_mounted(mountpoint) and not m.mounted
    assert mountpoint.is_dir() and cache.is_dir(), "a mountpoint and cache given are the caller's"


def test_open_dataset_is_one_line(bucket, moto, original):
    dataset = scdlfs.open_dataset(f"{bucket.source}/{NAME}", cache_size="64MiB", endpoint_url=moto.endpoint)
    m = dataset.scdlfs_mount
    with m:
        assert H.is_mounted(m.mountpoint)
        assert same_rows(dataset, original, range(0, len(original), 97))
        sampler = scdlfs.ChunkWindowSampler(dataset, seed=1)
        assert sampler.dataset_dir == str(m.mountpoint / NAME) and sampler.hints_active
        del dataset, sampler
        gc.collect()
    assert not H.is_mounted(m.mountpoint)
    with pytest.raises(FileNotFoundError, match=r"no SCDL dataset 'nope' in .*holds \['synth_3k'\]"):
        scdlfs.open_dataset(f"{bucket.source}/nope", endpoint_url=moto.endpoint)
    with pytest.raises(ValueError, match="names no dataset"):
        scdlfs.open_dataset("s3://bucket-only")


def test_the_daemons_message_comes_back_as_an_exception(moto, tmp_path):
    with pytest.raises(scdlfs.MountError) as failed:
        scdlfs.mount("s3://no-such-bucket/x", cache_size="64MiB", endpoint_url=moto.endpoint, timeout=60)
    print(failed.value)
    assert "no-such-bucket" in str(failed.value)
    # A value the CLI refuses: clap's own message.
    with pytest.raises(scdlfs.MountError, match="read-part-size"):
        scdlfs.mount(tmp_path, read_part_size="3")
    assert not any(H._pids_serving(p) for p in (tmp_path,))


def test_options_are_the_mount_flags_checked_before_anything_starts(tmp_path, monkeypatch):
    before = set(os.listdir("/tmp"))
    with pytest.raises(TypeError, match="no option 'cache_sise'; did you mean cache_size"):
        scdlfs.mount(tmp_path, cache_sise="1GiB")
    with pytest.raises(TypeError, match="no option 'foreground'"):
        scdlfs.mount(tmp_path, foreground=True)
    with pytest.raises(TypeError, match="allow_other is a switch"):
        scdlfs.mount(tmp_path, allow_other="yes")
    assert set(os.listdir("/tmp")) == before, "a refused call left something behind"
    from scdlfs._mount import mount_arguments

    assert mount_arguments({"allow_other": True, "allow_root": False, "read_part_size": "1MiB", "uid": 7,
                            "options": ["ro", "nodev"], "metadata_ttl": None}) == [
        "--allow-other", "--read-part-size", "1MiB", "--uid", "7", "--options", "ro", "--options", "nodev",
    ]  # fmt: skip


def test_a_dropped_mount_is_unmounted_when_python_exits(chunked, tmp_path):
    """A plain call whose Mount nobody keeps or unmounts: the daemon must not outlive the
    interpreter that started it, and neither must the temporary directories."""
    script = (
        "import gc, sys, scdlfs\n"
        "m = scdlfs.mount(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3], cache_size='64MiB')\n"
        "print(m.pid, m.log.parent, flush=True)\n"
        "del m\n"
        "gc.collect()\n"
    )
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    out = H.run([sys.executable, "-c", script, chunked[NAME].parent, mountpoint, tmp_path / "cache"], timeout=120)
    pid, scratch = out.stdout.split()
    assert not H.is_mounted(mountpoint)
    assert not daemon_running(int(pid))
    assert not Path(scratch).exists()


def test_the_command_and_the_mount_import_no_torch():
    """The wheel's `scdlfs` command runs through the package, and `scdlfs.mount` needs no
    torch: importing it took over a second a call. The samplers bring it when used."""
    import subprocess

    script = ("import sys, scdlfs, scdlfs._command; scdlfs.mount; "
              "print(any(m.split('.')[0] == 'torch' for m in sys.modules)); scdlfs.ChunkWindowSampler; "
              "print(any(m.split('.')[0] == 'torch' for m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"], out
