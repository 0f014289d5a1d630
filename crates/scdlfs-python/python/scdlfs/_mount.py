"""Mounting from Python: :func:`mount` starts the ``scdlfs`` daemon (the binary in this
package when the wheel carries one, else ``SCDLFS_BIN``, else ``scdlfs`` on ``PATH``),
waits until the mount answers, and unmounts on exit; :func:`open_dataset` opens a
dataset of a bucket as a ``SingleCellMemMapDataset`` on such a mount. Without a
mountpoint, a mount is shared by the processes of a node that ask for the same source
and options (the ranks of a job): the first starts the daemon, the others attach to it
through the root's ``user.scdlfs.users`` attribute, and it goes with the last. A node's
own mount (one a service, a DaemonSet or ``scdlfs mount`` started, which lives until it is
stopped) that shows the source, or a folder above it, is used as it is, and never
unmounted from here: each mount says on its root (``user.scdlfs.source``) which source
and endpoint it shows and whether it lives for its users.

The daemon runs in the foreground of a new session, as a child of this process, and
reports readiness (or the message of the error that stopped it) on a pipe, the
mechanism ``scdlfs mount`` itself uses to detach. Keyword options are the mount
command's flags with underscores (``cache_size="20GiB"``, ``allow_other=True``); their
list comes from the binary (``scdlfs mount-flags``), so it is never written twice.

However this process ends, the daemon does not outlive it: it is started with
``--exit-with-pid`` (it unmounts once this process has exited, killed included, when no
exit handler runs) and ``--scratch-dir`` (it removes the temporary mountpoint, cache and
log after unmounting). The source reaches it in its environment (``env:SCDLFS_SOURCE``),
never on its command line, and messages show it without its credentials.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import errno
import fcntl
import functools
import hashlib
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

__all__ = ["Mount", "MountError", "mount", "open_dataset", "redact", "runtime_dir", "scdlfs_binary"]

#: Options the wrapper sets itself.
_OWN_FLAGS = {"foreground", "cache-dir", "cache-size", "exit-with-pid", "scratch-dir"}

#: The variable that hands the daemon its source (``env:`` on its command line), as
#: ``scdlfs mount`` does for the daemon it detaches: an environment is readable by its
#: owner only, a command line by every local user.
_SOURCE_VAR = "SCDLFS_SOURCE"

#: The root's attribute through which a process attaches to a shared mount (``+PID``)
#: and leaves it (``-PID``); reading it gives ``{"daemon": PID, "users": [PID, ...]}``.
_USERS_XATTR = "user.scdlfs.users"

#: The root's attribute that says what a mount shows: ``{"source": ..., "endpoint": ...,
#: "daemon": PID, "lives_for_users": bool}``, source and endpoint credentials redacted.
_SOURCE_XATTR = "user.scdlfs.source"


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


def redact(text: str) -> str:
    """``text`` with every URL's userinfo (``user:password@``) and query (a presigned
    URL's signature) replaced by ``REDACTED``, as the daemon shows URLs."""
    out = []
    rest = text
    while (scheme_end := rest.find("://")) >= 0:
        out.append(rest[: scheme_end + 3])
        after = rest[scheme_end + 3 :]
        url_len = next((i for i, c in enumerate(after) if c.isspace() or c in "\"'<>),"), len(after))
        out.append(_redact_one(after[:url_len]))
        rest = after[url_len:]
    out.append(rest)
    return "".join(out)


def _redact_one(url: str) -> str:
    """One URL after its ``scheme://``."""
    authority_len = next((i for i, c in enumerate(url) if c in "/?#"), len(url))
    authority, path = url[:authority_len], url[authority_len:]
    at = authority.rfind("@")
    out = f"REDACTED@{authority[at + 1:]}" if at >= 0 else authority
    if "?" in path:
        path, query = path.split("?", 1)
        fragment = "#" + query.split("#", 1)[1] if "#" in query else ""
        return f"{out}{path}?REDACTED{fragment}"
    return out + path


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
# serving). A forked child inherits none: they are its parent's.
_LIVE: set[Mount] = set()
# How many live Mounts of this process use each shared mount (by its lock file): the
# process leaves the mount when the last goes.
_SHARED_USES: dict[Path, int] = {}
os.register_at_fork(after_in_child=_LIVE.clear)
os.register_at_fork(after_in_child=_SHARED_USES.clear)
# The shared mounts this process uses, by their lock file. A forked child keeps them:
# asking for one of them again (a DataLoader worker's dataset opening itself), it is
# given its parent's Mount as it is, and is no user of its own.
_SHARED: dict[Path, Mount] = {}


@atexit.register
def _unmount_all() -> None:
    """At a normal exit: the datasets :func:`open_dataset` returned are closed, then each
    mount stopped. Files still open then (a sampler's hint file, rows a caller kept)
    close as this process exits: the daemon detaches at once, serves them until then,
    and removes its temporary directories itself once they close."""
    for m in list(_LIVE):
        m._close_datasets()
        try:
            m._stop(timeout=10, linger=0)
        except MountError:
            pass


class Mount:
    """A running mount: ``mountpoint`` is the directory that shows the source. Unmounted by
    :meth:`unmount`, at the end of a ``with`` block, when the interpreter exits, or by
    the daemon itself once this process has exited, however it ended. It belongs to the
    process that started it: in a forked child, :meth:`unmount` does nothing. A node's
    own mount (``node_root`` is its root, ``mountpoint`` the source's folder in it) is
    never unmounted from here."""

    def __init__(self, source: str, mountpoint: Path, process: subprocess.Popen | None, log: Path | None,
                 binary: str, daemon: int, shared: Path | None, node_root: Path | None = None) -> None:  # fmt: skip
        self.source = source
        self.mountpoint = mountpoint
        self.log = log
        self.binary = binary
        self.node_root = node_root
        # The daemon, when this process started it; None when attached to another's.
        self._process = process
        self._daemon = daemon
        # A shared mount's lock file: leaving it happens under the lock.
        self._shared = shared
        self._owner = os.getpid()
        self._datasets: list[weakref.ref] = []
        if shared is not None:
            _SHARED_USES[shared] = _SHARED_USES.get(shared, 0) + 1
        if node_root is None:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        return self._daemon

    @property
    def mounted(self) -> bool:
        """Whether the mountpoint is still attached to this mount's daemon."""
        return self._daemon_alive() and _is_mounted(self.node_root or self.mountpoint)

    def _daemon_alive(self) -> bool:
        if self._process is not None and os.getpid() == self._owner:
            return self._process.poll() is None
        try:  # not this process's child: an exited daemon is gone or a zombie
            return Path(f"/proc/{self._daemon}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def status(self) -> dict[str, Any]:
        """The mount's counters (``scdlfs status --json``)."""
        out = subprocess.run([self.binary, "status", "--json", str(self.node_root or self.mountpoint)], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL)  # fmt: skip
        if out.returncode != 0:
            raise MountError(out.stderr.strip())
        return json.loads(out.stdout)

    def unmount(self, timeout: float = 60.0) -> None:
        """Stops the daemon, which unmounts, and waits at most ``timeout`` seconds for it.
        With files still open on the mount (a dataset's memory maps), the mountpoint is
        detached at once and the daemon serves those files until they close, then exits
        and removes the temporary directories: this returns once detached, with a
        warning. A shared mount (one :func:`mount` made without a mountpoint) is only
        left while other processes use it: it stops when the last one leaves or exits.
        In a process other than the one that mounted (a forked child), this does
        nothing: the mount is its creator's; and so for a node's own mount, which its
        service stops."""
        if os.getpid() != self._owner or self.node_root is not None:
            return
        if self._stop(timeout, linger=2):
            warnings.warn(f"files are still open on {self.mountpoint}: it is detached, and its "
                          f"daemon (pid {self.pid}) exits once they are closed", stacklevel=2)  # fmt: skip

    def _stop(self, timeout: float, linger: float) -> bool:
        """Stops the daemon (leaves a shared mount); returns whether it still serves
        files of the detached mount after ``linger`` more seconds for files that were
        closing as it was stopped."""
        deadline = time.monotonic() + timeout
        if self._shared is None:
            if self._process.poll() is None:
                self._process.send_signal(signal.SIGTERM)
            return self._wait_stopped(deadline, linger)
        if self not in _LIVE:  # left already
            return False
        _LIVE.discard(self)
        _SHARED_USES[self._shared] -= 1
        if _SHARED_USES[self._shared] > 0:
            return False
        _SHARED.pop(self._shared, None)
        # Under the lock, so that nobody attaches between this leave and the stop the
        # last one starts.
        with _locked(self._shared, deadline):
            try:
                os.setxattr(self.mountpoint, _USERS_XATTR, f"-{os.getpid()}".encode())
                others = json.loads(os.getxattr(self.mountpoint, _USERS_XATTR))["users"]
            except OSError:  # stopping already, or gone
                others = []
            if others:
                return False
            serving = self._wait_stopped(deadline, linger)
            _forget(self._shared)
            return serving

    def _wait_stopped(self, deadline: float, linger: float) -> bool:
        while self._daemon_alive():
            if time.monotonic() > deadline:
                raise MountError(f"the daemon did not stop in time; see {self.log}")
            if not _is_mounted(self.mountpoint) and _detached_lazily(self.log):
                if self._process is None:
                    return True
                try:
                    self._process.wait(linger)
                except subprocess.TimeoutExpired:
                    return True
                break
            time.sleep(0.05)
        # The daemon removed the temporary directories as it exited (--scratch-dir).
        _LIVE.discard(self)
        if self._process is not None and self._process.returncode != 0:
            raise MountError(f"unmounting {self.mountpoint} failed: {_last_error(self.log)}")
        return False

    def _close_datasets(self) -> None:
        """Drops the memory maps of the datasets :func:`open_dataset` opened here, so that
        the mount can go at once: a dataset is unusable after."""
        import numpy as np

        closed = False
        for ref in self._datasets:
            dataset = ref()
            if dataset is None:
                continue
            for name, value in list(vars(dataset).items()):
                if isinstance(value, np.memmap):
                    setattr(dataset, name, None)
                    closed = True
        if closed:
            import gc

            gc.collect()

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
        node = f" (the node's mount at {self.node_root})" if self.node_root is not None else ""
        return f"<scdlfs.Mount {redact(self.source)} at {self.mountpoint}{node}, {state}>"


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
    node_mount: bool = True,
    **options: Any,
) -> Mount:
    """Mounts ``source`` (``s3://BUCKET/PREFIX``, ``gs://…``, ``http(s)://…``,
    ``file:///PATH`` or a local folder) and returns once the mount answers; use it as a
    context manager or call :meth:`Mount.unmount`.

    Without a mountpoint the mount is shared on this node: a process that asks for the
    same source with the same options (another rank of the job) attaches to the mount
    a first one started instead of starting its own, and the mount goes when the last
    of them leaves or exits, however it exits. The first to arrive starts it under a
    lock in :func:`runtime_dir`, where the others find it.

    A node's own mount that shows ``source`` (or a folder above it) from the same
    endpoint, one started by the systemd unit, a DaemonSet or ``scdlfs mount`` and living
    until it is stopped, is used as it is instead, when this user may read it: the
    returned Mount's ``mountpoint`` is ``source``'s folder in it, ``node_root`` its root,
    and it is never unmounted from here. Its cache and options are its own: ``cache_dir``,
    ``cache_size`` and the other options (``endpoint_url`` aside) do not apply to it.

    Args:
        mountpoint: an empty directory, this call's alone; by default a new temporary
            one, shared as above and removed after.
        cache_dir: the cache (it outlives the mount, and a later mount of the same source
            adopts it); by default the mount command's own for a given mountpoint, and
            a temporary one, removed after, for a temporary mountpoint.
        cache_size: the cache budget in bytes or as ``"20GiB"``.
        timeout: seconds to wait for the mount to answer (and for another process
            starting the same shared mount).
        node_mount: use a node's own mount of ``source`` where there is one (as above);
            False starts (or shares) a mount of this job's own.
        options: any ``scdlfs mount`` flag with underscores, e.g.
            ``endpoint_url="http://127.0.0.1:9000"``, ``allow_other=True``,
            ``read_part_size="8MiB"``.

    Raises:
        MountError: the daemon could not mount; the message is the daemon's.
        TypeError: an option is not a mount flag.
    """
    binary = scdlfs_binary()
    flags = mount_arguments(options, binary)
    if cache_dir is not None:
        flags += ["--cache-dir", os.fspath(cache_dir)]
    if cache_size is not None:
        flags += ["--cache-size", str(cache_size)]
    source = os.fspath(source)
    if mountpoint is None and node_mount:
        found = _node_mount(source, options.get("endpoint_url"), binary)
        if found is not None:
            return found
    if mountpoint is not None:
        return _new_mount(binary, source, Path(mountpoint).absolute(), flags, timeout, shared=None)
    deadline = time.monotonic() + timeout
    # Local folders by their absolute path: the same text from another directory is
    # another source.
    where = source if "://" in source else os.path.abspath(source)
    key = hashlib.sha256(json.dumps([binary, where, flags, cache_dir is None]).encode()).hexdigest()[:32]
    runtime = runtime_dir()
    lock, pointer = runtime / f"{key}.lock", runtime / f"{key}.json"
    inherited = _SHARED.get(lock)
    if inherited is not None and inherited._owner != os.getpid() and inherited.mounted:
        return inherited
    _sweep(runtime)
    with _locked(lock, deadline):
        m = _attach(pointer, source, binary, lock)
        if m is None:
            m = _new_mount(binary, source, None, flags, deadline - time.monotonic(), shared=lock,
                           temporary_cache=cache_dir is None)  # fmt: skip
            pointer.write_text(json.dumps({"mountpoint": str(m.mountpoint), "log": str(m.log)}))
        _SHARED[lock] = m
        return m


def _node_mount(source: str, endpoint: str | None, binary: str) -> Mount | None:
    """A node's own mount (one that lives until it is stopped, not for its users) that
    shows ``source`` or a folder above it, from ``endpoint``, and that this user may
    read: a Mount of ``source``'s folder in it. Mounts of other users this one may not
    read, of other stores, and those that go with other processes are passed over; only
    FUSE mounts whose mount table entry names such a source are asked (another FUSE
    filesystem, perhaps a stuck one, is never touched)."""
    wanted = _comparable(source)
    for root, named in _fuse_mounts():
        if "://" not in named and not os.path.isabs(named):
            continue  # a folder relative to the daemon's own working directory
        if _folder_in(wanted, _comparable(named)) is None:
            continue
        try:
            note = json.loads(os.getxattr(root, _SOURCE_XATTR))
            shown, lives_for_users = note["source"], note["lives_for_users"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not this user's to read, gone, or not scdlfs
        folder = _folder_in(wanted, _comparable(shown))
        if folder is None or lives_for_users:
            continue
        if _comparable_endpoint(note.get("endpoint")) != _comparable_endpoint(endpoint):
            continue
        if not os.access(root / folder, os.R_OK | os.X_OK):
            continue
        return Mount(source, root / folder, None, None, binary, int(note["daemon"]), shared=None, node_root=root)
    return None


def _folder_in(wanted: str, shown: str) -> str | None:
    """Where ``wanted`` is in a mount that shows ``shown`` ("" at its root), or None if
    it is not in it."""
    if wanted == shown:
        return ""
    if wanted.startswith(shown.rstrip("/") + "/"):
        return wanted[len(shown.rstrip("/")) + 1 :]
    return None


def _comparable(source: str) -> str:
    """``source`` as a mount shows it, to be compared: a URL credentials redacted, a
    folder absolute; no trailing slash."""
    if source.startswith("file://"):
        source = source[len("file://") :]
    if "://" in source:
        return redact(source).rstrip("/")
    return os.path.abspath(source)


def _comparable_endpoint(endpoint: str | None) -> str | None:
    return redact(endpoint).rstrip("/") if endpoint else None


def _fuse_mounts() -> list[tuple[Path, str]]:
    """The FUSE mounts this process sees: each mountpoint, and the source its mount
    table entry names (an scdlfs mount's is the source it shows)."""
    unescape = lambda field: field.encode().decode("unicode_escape")  # noqa: E731
    mounts = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            after = fields.index("-")
            if fields[after + 1].split(".")[0] == "fuse":
                mounts.append((Path(unescape(fields[4])), unescape(fields[after + 2])))
    return mounts


def runtime_dir() -> Path:
    """Where this user's shared mounts on this node are found (a lock and a note per
    source and options): ``$XDG_RUNTIME_DIR/scdlfs``, else ``/run/scdlfs`` for root,
    else ``scdlfs-UID`` in the temporary directory; private to the user."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        directory = Path(os.environ["XDG_RUNTIME_DIR"]) / "scdlfs"
    elif os.geteuid() == 0:
        directory = Path("/run/scdlfs")
    else:
        directory = Path(tempfile.gettempdir()) / f"scdlfs-{os.geteuid()}"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise MountError(f"{directory} is not a directory of this user's alone (mode 0700): no shared mounts there")
    return directory


@contextlib.contextmanager
def _locked(path: Path, deadline: float):
    """Holds ``path``'s lock (flock, released however this process ends) until the
    block ends; waits for it until ``deadline``."""
    while True:
        fd = _try_lock(path)
        if fd is not None:
            break
        if time.monotonic() >= deadline:
            raise MountError(f"{path} stayed locked: another process took too long to start or stop "
                             "this shared mount")  # fmt: skip
        time.sleep(0.05)
    try:
        yield
    finally:
        os.close(fd)


def _try_lock(path: Path) -> int | None:
    """``path`` opened and locked, or None while another process holds it. A lock file
    is removed under its lock (:func:`_forget`): one locked after its removal is another
    file than the path names, and is let go for the path's new one."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
    except BlockingIOError:
        pass
    os.close(fd)
    return None


def _forget(lock: Path) -> None:
    """Removes a shared mount's note and lock file, under that lock, once it is gone:
    the runtime directory would otherwise keep two files of every source and options
    ever mounted."""
    lock.with_suffix(".json").unlink(missing_ok=True)
    lock.unlink(missing_ok=True)


def _sweep(runtime: Path) -> None:
    """Forgets the shared mounts whose users were killed (no exit handler left them):
    their notes name mountpoints no longer mounted."""
    for lock in runtime.glob("*.lock"):
        fd = _try_lock(lock)
        if fd is None:  # in use: starting, attaching or stopping
            continue
        try:
            try:
                noted = json.loads(lock.with_suffix(".json").read_text())["mountpoint"]
            except (OSError, ValueError, KeyError):
                noted = None
            if noted is None or not _is_mounted(Path(noted)):
                _forget(lock)
        finally:
            os.close(fd)


def _attach(pointer: Path, source: str, binary: str, lock: Path) -> Mount | None:
    """The shared mount ``pointer`` notes, with this process attached to it; None when
    there is none to attach to (never started, stopping, or dead: then detached)."""
    try:
        noted = json.loads(pointer.read_text())
    except (OSError, ValueError):
        return None
    mountpoint = Path(noted["mountpoint"])
    if not _is_mounted(mountpoint):
        return None
    try:
        os.setxattr(mountpoint, _USERS_XATTR, f"+{os.getpid()}".encode())
        daemon = json.loads(os.getxattr(mountpoint, _USERS_XATTR))["daemon"]
    except OSError as error:
        if error.errno == errno.ENOTCONN:  # its daemon was killed outright
            subprocess.run([binary, "unmount", "--lazy", str(mountpoint)], capture_output=True,
                           timeout=_STOP_STARTING_SECONDS, stdin=subprocess.DEVNULL)  # fmt: skip
            shutil.rmtree(mountpoint.parent, ignore_errors=True)
        return None  # EBUSY: its last user has gone, and it is stopping
    return Mount(source, mountpoint, None, Path(noted["log"]), binary, daemon, shared=lock)


def _new_mount(binary: str, source: str, mountpoint: Path | None, flags: list[str], timeout: float,
               shared: Path | None, temporary_cache: bool = False) -> Mount:  # fmt: skip
    """Starts a daemon for this process, with a new temporary mountpoint when none is
    given (and a temporary cache with it if asked)."""
    scratch = Path(tempfile.mkdtemp(prefix="scdlfs-"))
    try:
        if mountpoint is None:
            mountpoint = scratch / "mnt"
            mountpoint.mkdir()
            if temporary_cache:
                flags = [*flags, "--cache-dir", str(scratch / "cache")]
        # The daemon removes the scratch directory once it has unmounted, whoever stops
        # it: this process, or its own watch on this process's end.
        flags = [*flags, "--exit-with-pid", str(os.getpid()), "--scratch-dir", str(scratch)]
        log = scratch / "scdlfs.log"
        ready_fd_var = _mount_flags(binary)["ready_fd_var"]
        process, report = _start(binary, source, mountpoint, flags, log, ready_fd_var, timeout)
        if report != "ready":
            # The daemon exits after reporting why it could not mount.
            code = process.wait(30)
            raise MountError(report or f"the daemon exited ({code}) before the mount was ready: {_last_error(log)}")
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return Mount(source, mountpoint, process, log, binary, process.pid, shared)


def _start(binary: str, source: str, mountpoint: Path, flags: list[str], log: Path, ready_fd_var: str,
           timeout: float) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """Starts ``scdlfs mount --foreground`` and reads its verdict: "ready", its error
    message, or "" when it exited without one. Stops it, leaving no mount, when no
    verdict comes in time or the wait is interrupted (Ctrl-C)."""
    was_mounted = _is_mounted(mountpoint)
    read_end, write_end = os.pipe()
    try:
        with open(log, "ab") as log_file:
            process = subprocess.Popen(
                [binary, "mount", "--foreground", f"env:{_SOURCE_VAR}", str(mountpoint), *flags],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, pass_fds=(write_end,),
                env={**os.environ, _SOURCE_VAR: source, ready_fd_var: str(write_end)}, start_new_session=True,
            )  # fmt: skip
    finally:
        os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                raise MountError(f"{redact(source)} was not mounted within {timeout}s: {_last_error(log)}")
            chunk = os.read(read_end, 65536)
            if not chunk:
                return process, b"".join(chunks).decode(errors="replace").strip()
            chunks.append(chunk)
    except BaseException:
        _stop_starting(process, binary, mountpoint, was_mounted)
        raise
    finally:
        os.close(read_end)


#: How long a daemon that has not reported is given to stop before it is killed: its
#: mount's start, through which a stop waits (the root's listing, within --read-timeout),
#: and the unmount.
_STOP_STARTING_SECONDS = 30


def _stop_starting(process: subprocess.Popen, binary: str, mountpoint: Path, was_mounted: bool) -> None:
    """Stops a daemon that has not reported: SIGTERM, which it takes once its mount (if
    it got that far) has started, and unmounts; a daemon that does not stop in time is
    killed, and the dead mount it may leave (ENOTCONN) detached."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(_STOP_STARTING_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(_STOP_STARTING_SECONDS)
    if not was_mounted and _is_mounted(mountpoint):
        subprocess.run([binary, "unmount", "--lazy", str(mountpoint)], capture_output=True,
                       timeout=_STOP_STARTING_SECONDS, stdin=subprocess.DEVNULL)  # fmt: skip


def open_dataset(
    url: str,
    mountpoint: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: int | str | None = None,
    *,
    timeout: float = 120.0,
    **options: Any,
):
    """Opens the dataset at ``url`` (e.g. ``s3://BUCKET/PREFIX/NAME``) as bionemo-scdl's
    ``SingleCellMemMapDataset`` on a mount of ``url``'s parent (arguments as
    :func:`mount`: without a mountpoint, a node's own mount that shows it is used, or the
    node's processes opening datasets of the same parent with the same options share
    one; ``node_mount=False`` passes a node's own mount over). The mount is the
    dataset's ``scdlfs_mount`` attribute;
    it is unmounted at interpreter exit, after the dataset is closed, or by
    ``dataset.scdlfs_mount.unmount()`` once the dataset is dropped.

    A large dataset's first lookup can outlast the mount's ``read_timeout`` (EIO) while
    its listing goes on: the lookup is tried again while the mount lives, within
    ``timeout`` seconds from the call (the mount's start included; the default, 120,
    is the listing's own bound at the default ``read_timeout``)."""
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    deadline = time.monotonic() + timeout
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/") or parent.endswith(":"):
        raise ValueError(f"{redact(url)!r} names no dataset: give the dataset's own URL, e.g. s3://bucket/prefix/name")
    m = mount(parent, mountpoint, cache_dir, cache_size, timeout=timeout, **options)
    try:
        directory = m.mountpoint / name
        # The reader would create a missing directory rather than fail.
        if not _holds_dataset(m, directory, deadline):
            found = sorted(p.name for p in m.mountpoint.iterdir() if (p / "header.sch").is_file())
            raise FileNotFoundError(f"no SCDL dataset {name!r} in {redact(parent)}; it holds {found or 'none'}")
        dataset = SingleCellMemMapDataset(str(directory))
    except BaseException:
        m.unmount()
        raise
    dataset.scdlfs_mount = m
    m._datasets.append(weakref.ref(dataset))
    return dataset


#: Between lookups that failed at once (not at a deadline), so that they do not spin.
_LOOKUP_RETRY_SECONDS = 0.2


def _holds_dataset(m: Mount, directory: Path, deadline: float) -> bool:
    """Whether ``directory`` holds a dataset's header, its lookup tried again after EIO
    while the mount lives, until ``deadline``."""
    while True:
        try:
            return (directory / "header.sch").is_file()
        except OSError as error:
            if error.errno != errno.EIO or time.monotonic() >= deadline or not m.mounted:
                raise
        time.sleep(_LOOKUP_RETRY_SECONDS)

