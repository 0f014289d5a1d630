"""Defaults for a node shared by several users: with `--allow-other` and no
`--file-mode`, another user runs the released SCDL reader (which opens its files
read-write) and every write is still refused; and a source that is a bare name or a
malformed URL is refused with a message, by `mount` and by `chunk`, before anything is
created."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import scdl_helpers as H
import scdlfs

NAME = "synth_3k"
NOBODY = 65534
ROW = 1500


def row_digest(dataset, row: int) -> str:
    (values, columns), _, _ = dataset.get_row(row)
    return hashlib.sha256(np.asarray(values).tobytes() + np.asarray(columns).tobytes()).hexdigest()


def as_nobody(directory: Path) -> str:
    """In a forked child running as nobody: opens the released reader on `directory`, reads
    row ROW, then tries a write; returns what the child reports."""
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        report = "no report"
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            dataset = SingleCellMemMapDataset(str(directory))
            report = f"read {row_digest(dataset, ROW)}"
            fd = os.open(directory / "data.npy", os.O_RDWR)
            try:
                os.write(fd, b"x")
                report += " wrote"
            except OSError as e:
                report += f" write {errno.errorcode[e.errno]}"
        except OSError as e:
            report = f"{type(e).__name__} {errno.errorcode.get(e.errno, e.errno)} {e}"
        finally:
            os.write(write_end, report.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        report = r.read().decode()
    os.waitpid(pid, 0)
    return report


@pytest.fixture
def shared_dir():
    """A directory every user may enter (pytest's own are the owner's only)."""
    base = Path(tempfile.mkdtemp(prefix="scdlfs-shared-"))
    base.chmod(0o755)
    (base / "mnt").mkdir()
    yield base
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def test_another_user_runs_the_reader_on_an_allow_other_mount_by_default(bucket, moto, monolithic, shared_dir):
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    expected = row_digest(SingleCellMemMapDataset(str(monolithic[NAME])), ROW)
    common = dict(cache_size="64MiB", endpoint_url=moto.endpoint, allow_other=True)
    with scdlfs.mount(bucket.source, shared_dir / "mnt", cache_dir=shared_dir / "cache", **common) as m:
        assert oct((m.mountpoint / NAME / "data.npy").stat().st_mode & 0o777) == "0o666"
        assert as_nobody(m.mountpoint / NAME) == f"read {expected} write EROFS"
    # The trap the default avoids: read-only modes refuse the reader's read-write open.
    with scdlfs.mount(bucket.source, shared_dir / "mnt", cache_dir=shared_dir / "cache", file_mode="0644",
                      **common) as m:  # fmt: skip
        assert as_nobody(m.mountpoint / NAME).startswith("PermissionError EACCES")


MALFORMED = [
    pytest.param("my-bucket", 'source "my-bucket" is neither a URL nor a local path: write s3://my-bucket', id="bare"),
    pytest.param("s3:/bucket/x", 'source "s3:/bucket/x" is a malformed URL: did you mean "s3://bucket/x"?', id="s3:/"),
    pytest.param("s3//bucket/x", 'did you mean "s3://bucket/x"?', id="s3//"),
    pytest.param("ftp://host/x", 'unsupported source "ftp://host/x"', id="scheme"),
]


@pytest.mark.parametrize("source, message", MALFORMED)
def test_a_malformed_source_is_refused_and_nothing_is_created(source, message, monolithic, tmp_path):
    work, mountpoint, cache = tmp_path / "cwd", tmp_path / "mnt", tmp_path / "cache"
    work.mkdir()
    mountpoint.mkdir()
    scdlfs_bin = str(H.require_scdlfs())
    for argv in (
        ["mount", source, str(mountpoint), "--cache-dir", str(cache)],
        ["chunk", str(monolithic[NAME]), source, "--chunk-rows", "256"],
    ):
        p = subprocess.run([scdlfs_bin, *argv], cwd=work, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, env=H.safe_aws_env())  # fmt: skip
        assert p.returncode != 0, argv
        assert message in p.stderr, p.stderr
        assert list(work.iterdir()) == [], f"{argv[0]} created {list(work.iterdir())}"
    assert not cache.exists() and list(mountpoint.iterdir()) == []
    with pytest.raises(scdlfs.MountError, match=re.escape(message)):
        scdlfs.mount(source, mountpoint, cache_dir=cache)
    assert not cache.exists()
