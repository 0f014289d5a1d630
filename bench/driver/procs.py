"""Child processes, ports and mounts of a benchmark run, and their cleanup at exit.

Every server, proxy and daemon is started through `spawn` (in its own session, so that
`stop` ends it with all its children) and every mountpoint is recorded, so that
`cleanup` (registered at exit) leaves no process or mount behind, whatever failed."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from .config import KEY, SECRET

CHILDREN = []  # (Popen, description), ended at exit
MOUNTS = []  # mountpoints to unmount at exit


def log(msg):
    print("[bench] " + msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit("%s exited with %s" % (what, proc.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("%s did not listen on %d" % (what, port))


def spawn(cmd, what, env=None, stdout=None, stderr=None):
    proc = subprocess.Popen(cmd, env=env, stdout=stdout or subprocess.DEVNULL,
                            stderr=stderr or subprocess.DEVNULL, start_new_session=True)
    # Where its complaints went, quoted when it exits before its job started (a CI log
    # shows the bench's output, not the work directory's logs).
    name = getattr(stderr, "name", None)
    proc.log_path = name if isinstance(name, str) else None
    CHILDREN.append((proc, what))
    return proc


def log_tail(proc, lines=15):
    """The last `lines` of the log `proc` writes to, indented, or "" when it has none."""
    if not getattr(proc, "log_path", None):
        return ""
    try:
        with open(proc.log_path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return ""
    return "".join("\n    " + line for line in tail)


def stop(proc, sig=signal.SIGTERM, timeout=30):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def unmount(path):
    if is_mounted(path):
        subprocess.run(["umount", "-l", path], stderr=subprocess.DEVNULL)


def wait_mounted(path, proc, what, probe_file, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s before mounting%s" % (what, proc.returncode, log_tail(proc)))
        if is_mounted(path) and os.path.exists(probe_file):
            return
        time.sleep(0.2)
    raise RuntimeError("%s did not mount %s" % (what, path))


def fresh_dir(path):
    unmount(path)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def cleanup():
    for m in MOUNTS:
        unmount(m)
    for proc, _ in reversed(CHILDREN):
        stop(proc, timeout=10)
    for m in MOUNTS:
        unmount(m)


def clean_env():
    env = dict(os.environ)
    # Dummy keys, never a metadata service; CA-bundle variables break rclone.
    for k in list(env):
        if k.endswith("CA_BUNDLE") or k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            del env[k]
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_EC2_METADATA_DISABLED="true",
               AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1")
    return env
