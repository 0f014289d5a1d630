"""Mounting from Python: :func:`mount` starts the ``scdlfs`` daemon (the binary in this
package when the wheel carries one, else ``SCDLFS_BIN``, else ``scdlfs`` on ``PATH``),
waits until the mount answers, and unmounts on exit; :func:`open_dataset` opens a
dataset of a bucket as a ``SingleCellMemMapDataset`` on a mount of its own.

The daemon runs in the foreground of a new session, as a child of this process, and
reports readiness (or the message of the error that stopped it) on a pipe, the
mechanism ``scdlfs mount`` itself uses to detach. Keyword options are the mount
command's flags with underscores (``cache_size="20GiB"``, ``allow_other=True``); their
list comes from the binary (``scdlfs mount-flags``), so it is never written twice.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["Mount", "MountError", "mount", "open_dataset", "scdlfs_binary"]

#: Options the wrapper sets itself.
_OWN_FLAGS = {"foreground", "cache-dir", "cache-size"}


class MountError(RuntimeError):
    """The daemon could not mount (the message is the daemon's own) or unmount."""


def scdlfs_binary() -> str:
    """The daemon binary: ``SCDLFS_BIN`` when set, else the one inside this package (the
    wheel's), else ``scdlfs`` on ``PATH``."""
    from_env = os.environ.get("SCDLFS_BIN")
    if from_env:
        return from_env
    from scdlfs._command import BUNDLED

    if BUNDLED.is_file() and os.access(BUNDLED, os.X_OK):
        return str(BUNDLED)
    found = shutil.which("scdlfs")
    if found is not None and _is_script(found):
        found = None  # the wheel's command of an install without the binary
    if found is None:
        raise MountError("no scdlfs binary: install the scdlfs wheel, put scdlfs on PATH or set SCDLFS_BIN")
    return found


def _is_script(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"#!"


@functools.lru_cache(maxsize=None)
def _mount_flags(binary: str) -> dict[str, Any]:
    out = subprocess.run([binary, "mount-flags"], capture_output=True, text=True, timeout=30,
                         stdin=subprocess.DEVNULL)  # fmt: skip
    if out.returncode != 0:
        raise MountError(f"{binary} mount-flags failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def mount_arguments(options: dict[str, Any], binary: str | None = None) -> list[str]:
    """The command-line flags for ``options`` (the mount flags with underscores):
    ``True`` turns a switch on, ``False`` and ``None`` leave a flag out, a list repeats a
    repeatable flag. Raises TypeError for a name that is not a mount flag."""
    flags = {f["long"]: f for f in _mount_flags(binary or scdlfs_binary())["flags"]}
    allowed = sorted(name.replace("-", "_") for name in flags if name != "foreground")
    argv: list[str] = []
    for key, value in options.items():
        long = key.replace("_", "-")
        if long not in flags or long in _OWN_FLAGS:
            # cache_dir and cache_size are mount()'s own arguments: never here.
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; the options are {', '.join(allowed)}"
            raise TypeError(f"scdlfs.mount() has no option {key!r}{hint}")
        flag = flags[long]
        if value is None or value is False:
            continue
        if not flag["takes_value"]:
            if value is not True:
                raise TypeError(f"option {key} is a switch: give True or False, not {value!r}")
            argv.append(f"--{long}")
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if len(values) > 1 and not flag["repeatable"]:
            raise TypeError(f"option {key} takes one value, got {len(values)}")
        for v in values:
            argv += [f"--{long}", os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
    return argv


# Mounts this process started and has not finished with: unmounted at interpreter exit
# even when nothing refers to them any more (a dropped Mount must not leave its daemon
# serving), and their temporary directories removed once their daemons are gone.
_LIVE: set[Mount] = set()


@atexit.register
def _unmount_all() -> None:
    for m in list(_LIVE):
        try:
            m.unmount(timeout=10)
        except MountError:
            pass
        m._forget_if_stopped(wait=2)


class Mount:
    """A running mount: ``mountpoint`` is the mounted directory. Unmounted by
    :meth:`unmount`, at the end of a ``with`` block, or when the interpreter exits."""

    def __init__(self, source: str, mountpoint: Path, process: subprocess.Popen, log: Path,
                 scratch: Path | None, binary: str) -> None:  # fmt: skip
        self.source = source
        self.mountpoint = mountpoint
        self.log = log
        self.binary = binary
        self._process = process
        self._scratch = scratch
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def mounted(self) -> bool:
        """Whether the mountpoint is still attached to this mount's daemon."""
        return self._process.poll() is None and _is_mounted(self.mountpoint)

    def status(self) -> dict[str, Any]:
        """The mount's counters (``scdlfs status --json``)."""
        out = subprocess.run([self.binary, "status", "--json", str(self.mountpoint)], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL)  # fmt: skip
        if out.returncode != 0:
            raise MountError(out.stderr.strip())
        return json.loads(out.stdout)

    def unmount(self, timeout: float = 60.0) -> None:
        """Stops the daemon, which unmounts, and waits at most ``timeout`` seconds for it.
        With files still open on the mount (a dataset's memory maps), the mountpoint is
        detached at once and the daemon serves those files until they close, then exits:
        this returns once detached, with a warning."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self._process.poll() is None:
                if time.monotonic() > deadline:
                    raise MountError(f"the daemon did not stop within {timeout}s; see {self.log}")
                if not _is_mounted(self.mountpoint) and _detached_lazily(self.log):
                    try:  # files that were closing as the daemon was stopped
                        self._process.wait(2)
                    except subprocess.TimeoutExpired:
                        warnings.warn(f"files are still open on {self.mountpoint}: it is detached, and its "
                                      f"daemon (pid {self.pid}) exits once they are closed", stacklevel=2)  # fmt: skip
                    break
                time.sleep(0.05)
        if self._process.returncode not in (0, None):
            _LIVE.discard(self)
            raise MountError(f"unmounting {self.mountpoint} failed: {_last_error(self.log)}")
        self._forget_if_stopped(wait=0)

    def _forget_if_stopped(self, wait: float) -> None:
        """Once the daemon has exited: removes the temporary directories and stops
        tracking the mount. A daemon still serving files of a detached mount is kept
        track of, to clean up after at exit."""
        try:
            self._process.wait(wait)
        except subprocess.TimeoutExpired:
            return
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        _LIVE.discard(self)

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.unmount()
            return
        # An exception is on its way out: it is the news, not a failure to unmount (its
        # traceback may well hold files open on the mount).
        try:
            self.unmount()
        except MountError as error:
            warnings.warn(str(error), stacklevel=2)

    def __repr__(self) -> str:
        state = "mounted" if self.mounted else "unmounted"
        return f"<scdlfs.Mount {self.source} at {self.mountpoint}, {state}>"


def _is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4].encode().decode("unicode_escape") == target for line in mountinfo)


def _detached_lazily(log: Path) -> bool:
    try:
        return "detaching lazily" in log.read_text(errors="replace")
    except OSError:
        return False


def _last_error(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return f"no log at {log}"
    errors = [line for line in lines if "ERROR" in line or line.startswith("scdlfs:") or line.startswith("error")]
    return (errors or lines or [f"nothing in {log}"])[-1]


def mount(
    source: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: int | str | None = None,
    *,
    timeout: float = 120.0,
    **options: Any,
) -> Mount:
    """Mounts ``source`` (``s3://BUCKET/PREFIX``, ``gs://…``, ``http(s)://…``,
    ``file:///PATH`` or a local folder) and returns once the mount answers; use it as a
    context manager or call :meth:`Mount.unmount`.

    Args:
        mountpoint: an empty directory; by default a new temporary one, removed after.
        cache_dir: the cache (it outlives the mount, and a later mount of the same source
            adopts it); by default the mount command's own for a given mountpoint, and
            a temporary one, removed after, for a temporary mountpoint.
        cache_size: the cache budget in bytes or as ``"20GiB"``.
        timeout: seconds to wait for the mount to answer.
        options: any ``scdlfs mount`` flag with underscores, e.g.
            ``endpoint_url="http://127.0.0.1:9000"``, ``allow_other=True``,
            ``read_part_size="8MiB"``.

    Raises:
        MountError: the daemon could not mount; the message is the daemon's.
        TypeError: an option is not a mount flag.
    """
    binary = scdlfs_binary()
    flags = mount_arguments(options, binary)
    scratch = Path(tempfile.mkdtemp(prefix="scdlfs-"))
    try:
        if mountpoint is None:
            mountpoint = scratch / "mnt"
            mountpoint.mkdir()
            if cache_dir is None:
                cache_dir = scratch / "cache"
        if cache_dir is not None:
            flags += ["--cache-dir", os.fspath(cache_dir)]
        if cache_size is not None:
            flags += ["--cache-size", str(cache_size)]
        mountpoint = Path(mountpoint).absolute()
        log = scratch / "scdlfs.log"
        ready_fd_var = _mount_flags(binary)["ready_fd_var"]
        process, report = _start(binary, os.fspath(source), mountpoint, flags, log, ready_fd_var, timeout)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if report != "ready":
        # The daemon exits after reporting why it could not mount.
        code = process.wait(30)
        message = report or f"the daemon exited ({code}) before the mount was ready: {_last_error(log)}"
        shutil.rmtree(scratch, ignore_errors=True)
        raise MountError(message)
    return Mount(os.fspath(source), mountpoint, process, log, scratch, binary)


def _start(binary: str, source: str, mountpoint: Path, flags: list[str], log: Path, ready_fd_var: str,
           timeout: float) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """Starts ``scdlfs mount --foreground`` and reads its verdict: "ready", its error
    message, or "" when it exited without one. Stops it when no verdict comes in time."""
    read_end, write_end = os.pipe()
    try:
        with open(log, "ab") as log_file:
            process = subprocess.Popen(
                [binary, "mount", "--foreground", source, str(mountpoint), *flags],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, pass_fds=(write_end,),
                env={**os.environ, ready_fd_var: str(write_end)}, start_new_session=True,
            )  # fmt: skip
    finally:
        os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                process.kill()
                process.wait(30)
                raise MountError(f"{source} was not mounted within {timeout}s: {_last_error(log)}")
            chunk = os.read(read_end, 65536)
            if not chunk:
                return process, b"".join(chunks).decode(errors="replace").strip()
            chunks.append(chunk)
    finally:
        os.close(read_end)


def open_dataset(
    url: str,
    mountpoint: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: int | str | None = None,
    **options: Any,
):
    """Opens the dataset at ``url`` (e.g. ``s3://BUCKET/PREFIX/NAME``) as bionemo-scdl's
    ``SingleCellMemMapDataset`` on a mount of ``url``'s parent that this call starts
    (arguments as :func:`mount`). The mount is the dataset's ``scdlfs_mount`` attribute;
    it is unmounted at interpreter exit, or by ``dataset.scdlfs_mount.unmount()`` once the
    dataset is closed."""
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/") or parent.endswith(":"):
        raise ValueError(f"{url!r} names no dataset: give the dataset's own URL, e.g. s3://bucket/prefix/name")
    m = mount(parent, mountpoint, cache_dir, cache_size, **options)
    try:
        directory = m.mountpoint / name
        # The reader would create a missing directory rather than fail.
        if not (directory / "header.sch").is_file():
            found = sorted(p.name for p in m.mountpoint.iterdir() if (p / "header.sch").is_file())
            raise FileNotFoundError(f"no SCDL dataset {name!r} in {parent}; it holds {found or 'none'}")
        dataset = SingleCellMemMapDataset(str(directory))
    except BaseException:
        m.unmount()
        raise
    dataset.scdlfs_mount = m
    return dataset
