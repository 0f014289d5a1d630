"""A job's mount ends with the job, however the job ends, and leaves nothing behind: no
daemon in the process table, no mount in /proc/mounts, no scratch directory (the
temporary mountpoint, cache and log). Each job is a Python script run as a subprocess
on a real mount of the moto bucket: killed by SIGTERM, SIGKILL, SIGHUP or SIGINT inside
`with scdlfs.mount(...)`; exiting normally after `open_dataset` (at once and without a
warning); forking a child that exits normally (the parent's mount stays whole);
interrupted by Ctrl-C, or timing out, while the mount starts. The source is on no
command line, and with its password in no message; a dataset whose listing outlasts
the mount's read timeout is waited for, not given up with the mount; and the ranks of
a node (4 under torchrun) share one daemon, which fetches the dataset once and goes
with the last of them, or use the node's own mount (`scdlfs mount`, as the systemd unit
starts it) as it is, leaving it mounted."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

import scdl_helpers as H
import scdlfs

NAME = "synth_3k"
#: How long a test waits for a job, a daemon or a mount before it fails.
PATIENCE = 60.0


def daemon_running(pid: int) -> bool:
    """Whether `pid` is a live scdlfs process (an exited one not yet reaped has no
    command line)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"scdlfs")
    except OSError:
        return False


def mounts_under(directory: Path) -> list[str]:
    """The mountpoints in /proc/mounts at or under `directory` (dead ones included)."""
    root = os.path.realpath(directory)
    with open("/proc/mounts") as table:
        points = [line.split()[1].encode().decode("unicode_escape") for line in table]
    return [p for p in points if p == root or p.startswith(root + "/")]


def wait_until(what: str, condition, limit: float = PATIENCE, what_is_left=None) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        left = f": still there: {what_is_left()}" if what_is_left else ""
        assert time.monotonic() < deadline, f"gave up waiting {limit}s for {what}{left}"
        time.sleep(0.05)


def left_behind(daemon: int, scratch: Path) -> list[str]:
    """What a finished job left: its daemon, its mount, its scratch directory."""
    left = []
    if daemon_running(daemon):
        left.append(f"the daemon (pid {daemon})")
    left += [f"the mount {p}" for p in mounts_under(scratch)]
    if scratch.exists():
        left.append(f"the scratch directory {scratch}: {sorted(p.name for p in scratch.iterdir())}")
    return left


@pytest.fixture
def job_tmp(tmp_path) -> Path:
    """The jobs' TMPDIR: their scratch directories go there, and nobody else's."""
    d = tmp_path / "tmp"
    d.mkdir()
    return d


class Job:
    """A Python script run as a subprocess, with `scdlfs` importable and TMPDIR `tmp`;
    reports come one JSON object per line on its standard output."""

    def __init__(self, script: str, *args, tmp: Path, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(tmp), **(env or {})},
        )  # fmt: skip

    def line(self, limit: float = PATIENCE) -> str:
        if not select.select([self.proc.stdout], [], [], limit)[0]:
            self.proc.kill()
            raise AssertionError(f"the job said nothing within {limit}s: {self.proc.stderr.read().decode()}")
        line = self.proc.stdout.readline().decode()
        assert line, f"the job exited ({self.proc.wait()}): {self.proc.stderr.read().decode()}"
        return line

    def report(self) -> dict:
        return json.loads(self.line())

    def end(self) -> tuple[int, str]:
        """Closes the job's standard input and waits for its exit; returns its status
        and standard error."""
        try:
            _, err = self.proc.communicate(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return self.proc.returncode, err.decode()


# A training job's shape: the released reader on a mount it holds for its whole life.
JOB_IN_A_WITH_BLOCK = """
import json, sys, time, scdlfs
from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset
with scdlfs.mount(sys.argv[1], cache_size="64MiB", endpoint_url=sys.argv[2]) as m:
    dataset = SingleCellMemMapDataset(str(m.mountpoint / "synth_3k"))
    dataset.get_row(0)
    print(json.dumps({"daemon": m.pid, "scratch": str(m.mountpoint.parent)}), flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)  # fmt: skip
def test_a_killed_job_leaves_no_daemon_mount_or_scratch(bucket, moto, job_tmp, signum):
    job = Job(JOB_IN_A_WITH_BLOCK, bucket.source, moto.endpoint, tmp=job_tmp)
    started = job.report()
    daemon, scratch = started["daemon"], Path(started["scratch"])
    assert daemon_running(daemon) and mounts_under(scratch)
    job.proc.send_signal(signum)
    job.end()
    wait_until(f"the job's daemon, mount and scratch directory to go after {signal.Signals(signum).name}",
               lambda: not left_behind(daemon, scratch), what_is_left=lambda: left_behind(daemon, scratch))  # fmt: skip


# A plain script, with two exit handlers of its own around scdlfs's: registered before
# scdlfs is imported, one runs after scdlfs's; registered last, one runs first. (The
# interpreter's own teardown of torch and the rest is not scdlfs's to time.)
PLAIN_SCRIPT = """
import atexit, json, sys, time
from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset
exiting = []
atexit.register(lambda: print(json.dumps({"exit_took": time.monotonic() - exiting[0]}), flush=True))
import scdlfs
dataset = scdlfs.open_dataset(sys.argv[1] + "/synth_3k", cache_size="64MiB", endpoint_url=sys.argv[2])
row = dataset.get_row(7)
KEEP_OR_DROP_THE_ROW
m = dataset.scdlfs_mount
print(json.dumps({"daemon": m.pid, "scratch": str(m.mountpoint.parent)}), flush=True)
atexit.register(lambda: exiting.append(time.monotonic()))
"""


@pytest.mark.parametrize("keeps_a_row", [False, True], ids=["plain", "keeping-a-row"])
def test_a_script_ends_at_once_after_open_dataset_quietly_and_leaves_nothing(bucket, moto, job_tmp, keeps_a_row):
    """A plain script exits as soon as its last line has run, without a warning. The
    dataset is closed before the unmount, so its mount and scratch are gone by then; a
    row the script kept (a view of the dataset's memory map) holds the detached mount
    until the process exits, and then the daemon cleans up."""
    script = PLAIN_SCRIPT.replace("KEEP_OR_DROP_THE_ROW", "" if keeps_a_row else "del row")
    job = Job(script, bucket.source, moto.endpoint, tmp=job_tmp)
    started = job.report()
    took = job.report()["exit_took"]
    code, stderr = job.end()
    assert code == 0, stderr
    assert "Warning" not in stderr, stderr
    assert took < 1.0, f"scdlfs's exit handler took {took:.1f}s"
    daemon, scratch = started["daemon"], Path(started["scratch"])
    if keeps_a_row:
        wait_until("the daemon to clean up after the job", lambda: not left_behind(daemon, scratch))
    assert not left_behind(daemon, scratch), left_behind(daemon, scratch)
    assert not list(job_tmp.iterdir())


def test_a_forked_child_that_exits_normally_leaves_its_parents_mount_whole(bucket, moto, job_tmp):
    script = """
import json, os, sys, scdlfs
m = scdlfs.mount(sys.argv[1], cache_size="64MiB", endpoint_url=sys.argv[2])
child = os.fork()
if child == 0:
    sys.exit(0)  # a normal exit: the exit handlers run, here in the child
os.waitpid(child, 0)
scratch = m.mountpoint.parent
print(json.dumps({"daemon": m.pid, "scratch": str(scratch), "holds": sorted(p.name for p in scratch.iterdir()),
                  "mounted": m.mounted, "header": len((m.mountpoint / "synth_3k" / "header.sch").read_bytes()),
                  "cache_disk_unusable": m.status()["cache"]["disk_unusable"]}), flush=True)
"""
    job = Job(script, bucket.source, moto.endpoint, tmp=job_tmp)
    after_child = job.report()
    code, stderr = job.end()
    assert code == 0, stderr
    assert after_child["mounted"] and after_child["header"] > 0, after_child
    assert after_child["holds"] == ["cache", "mnt", "scdlfs.log"], after_child
    assert after_child["cache_disk_unusable"] is None, after_child
    assert not left_behind(after_child["daemon"], Path(after_child["scratch"]))


@pytest.fixture
def never_ready(tmp_path) -> Path:
    """A stand-in for the scdlfs binary: the real one, whose mount comes up but whose
    start never ends (it never reports readiness); it notes its pid and arguments."""
    wrapper = tmp_path / "scdlfs-never-ready"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = mount ]; then\n'
        f'    echo $$ > {tmp_path}/daemon.pid\n'
        f'    printf "%s\\n" "$@" > {tmp_path}/daemon.argv\n'
        "    unset SCDLFS_READY_FD\n"
        "fi\n"
        f'exec {H.require_scdlfs()} "$@"\n'
    )  # fmt: skip
    wrapper.chmod(0o755)
    return wrapper


def started_daemon(tmp_path) -> tuple[int, Path]:
    """The pid and mountpoint of the daemon `never_ready` started, once it has mounted."""
    pid_file, argv_file = tmp_path / "daemon.pid", tmp_path / "daemon.argv"
    wait_until("the daemon to start", lambda: pid_file.exists() and argv_file.exists() and pid_file.read_text())
    # scdlfs mount --foreground SOURCE MOUNTPOINT ...
    mountpoint = Path(argv_file.read_text().splitlines()[3])
    wait_until("the daemon to mount", lambda: H.is_mounted(mountpoint))
    return int(pid_file.read_text()), mountpoint


def test_ctrl_c_while_the_mount_starts_leaves_no_daemon_mount_or_scratch(bucket, moto, job_tmp, never_ready, tmp_path):
    script = """
import sys, scdlfs
try:
    scdlfs.mount(sys.argv[1], cache_size="64MiB", endpoint_url=sys.argv[2], timeout=600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.stdin.read()  # the job goes on: what the interrupted start left is checked now
"""
    job = Job(script, bucket.source, moto.endpoint, tmp=job_tmp, env={"SCDLFS_BIN": str(never_ready)})
    daemon, mountpoint = started_daemon(tmp_path)
    job.proc.send_signal(signal.SIGINT)
    assert job.line().strip() == "interrupted"
    assert not left_behind(daemon, mountpoint.parent), left_behind(daemon, mountpoint.parent)
    assert job.end()[0] == 0


def test_a_start_that_times_out_leaves_no_daemon_and_no_dead_mount(bucket, moto, tmp_path, never_ready, monkeypatch):
    import tempfile

    monkeypatch.setenv("SCDLFS_BIN", str(never_ready))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    started = time.monotonic()
    with pytest.raises(scdlfs.MountError, match="was not mounted within 10"):
        scdlfs.mount(bucket.source, mountpoint, cache_dir=tmp_path / "cache", cache_size="64MiB",
                     endpoint_url=moto.endpoint, timeout=10)  # fmt: skip
    assert time.monotonic() - started < 10 + 5
    daemon, _ = int((tmp_path / "daemon.pid").read_text()), None
    assert not daemon_running(daemon)
    assert not mounts_under(mountpoint), "a dead mount (ENOTCONN) was left"
    assert os.listdir(mountpoint) == []
    assert os.listdir(tmp_path / "tmp") == [], "the scratch directory was left"


# --------------------------------------------------------------------------
# The source's secrets


PASSWORD = "pw-Lq7rNw2Xc"


@pytest.fixture
def webdav(chunked, tmp_path):
    """WsgiDAV on 127.0.0.1 serving the chunked datasets, taking any user and password."""
    port = H.free_port()
    log = open(tmp_path / "wsgidav.log", "wb")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "wsgidav"), "--host", "127.0.0.1", "--port", str(port), "--auth",
         "anonymous", "--server", "cheroot", "--root", str(chunked[NAME].parent)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until("WsgiDAV to listen", lambda: server.poll() is None and _answers(port))
        yield f"http://reader:{PASSWORD}@127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait(30)
        log.close()


def _answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("OPTIONS", "/")
        return connection.getresponse().status < 500
    except OSError:
        return False
    finally:
        connection.close()


def test_the_source_is_on_no_command_line_and_its_password_in_no_message(webdav, tmp_path, never_ready, monkeypatch):
    dataset = scdlfs.open_dataset(f"{webdav}/{NAME}", cache_size="64MiB")
    m = dataset.scdlfs_mount
    try:
        assert len(dataset) == 3000
        argv = Path(f"/proc/{m.pid}/cmdline").read_bytes().split(b"\0")
        assert not any(b"127.0.0.1" in arg for arg in argv), f"the source is on the daemon's command line: {argv}"
        assert PASSWORD not in repr(m) and "127.0.0.1" in repr(m), repr(m)
    finally:
        del dataset
        m.unmount()
    with pytest.raises(FileNotFoundError) as missing:
        scdlfs.open_dataset(f"{webdav}/nope", cache_size="64MiB")
    assert PASSWORD not in str(missing.value) and "'nope'" in str(missing.value), missing.value
    with pytest.raises(ValueError) as no_dataset:
        scdlfs.open_dataset(f"http://reader:{PASSWORD}@host")
    assert PASSWORD not in str(no_dataset.value), no_dataset.value

    monkeypatch.setenv("SCDLFS_BIN", str(never_ready))
    with pytest.raises(scdlfs.MountError) as late:
        scdlfs.mount(webdav, cache_size="64MiB", timeout=3)
    assert PASSWORD not in str(late.value) and "not mounted within" in str(late.value), late.value


def test_redaction_is_the_daemons():
    assert scdlfs.redact("https://alice:s3cr3t@example.test/data/x.npy") == "https://REDACTED@example.test/data/x.npy"
    assert scdlfs.redact("GET http://127.0.0.1:9/b/k?X-Amz-Signature=abc failed") == "GET http://127.0.0.1:9/b/k?REDACTED failed"
    assert scdlfs.redact("(http://u:p@h/k?sig=1#f), retrying") == "(http://REDACTED@h/k?REDACTED#f), retrying"
    assert scdlfs.redact("s3://bucket/prefix and no url") == "s3://bucket/prefix and no url"


# --------------------------------------------------------------------------
# A listing longer than the read timeout


class SlowListings:
    """An HTTP proxy in front of the S3 server whose listings of one prefix (a
    dataset's directory: delimited, and recursive for its chunks' objects) answer
    `delay` seconds late, as an atlas's many pages do; `listed` holds each such request
    (a dataset without a usable manifest is listed in key ranges at once: several)."""

    def __init__(self, upstream: str, prefix: str, delay: float):
        host, port = urlsplit(upstream).hostname, urlsplit(upstream).port
        outer = self
        self.listed = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                query = parse_qs(urlsplit(self.path).query)
                if "list-type" in query and query.get("prefix", [""])[0] == prefix:
                    outer.listed.append(self.path)
                    time.sleep(delay)
                upstream = http.client.HTTPConnection(host, port, timeout=PATIENCE)
                upstream.request(self.command, self.path, body, headers=dict(self.headers))
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_HEAD = forward

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_open_dataset_waits_for_a_listing_longer_than_the_read_timeout(bucket, moto):
    # Its discovery (a delimited listing, then the recursive one) takes three read
    # timeouts: the first lookups fail with EIO while the listing goes on.
    proxy = SlowListings(moto.endpoint, f"{bucket.prefix}/{NAME}/", delay=1.5)
    try:
        started = time.monotonic()
        dataset = scdlfs.open_dataset(f"{bucket.source}/{NAME}", cache_size="64MiB", endpoint_url=proxy.endpoint,
                                      read_timeout="1s", timeout=60)  # fmt: skip
        took = time.monotonic() - started
        m = dataset.scdlfs_mount
        try:
            assert len(dataset) == 3000
            assert took > 1.0, f"the listing was not slower than the read timeout ({took:.1f}s)"
            repeated = len(proxy.listed) - len(set(proxy.listed))
            assert repeated == 0, f"{repeated} listings asked again: discovery started over ({proxy.listed})"
        finally:
            del dataset
            m.unmount()
    finally:
        proxy.close()


# --------------------------------------------------------------------------
# One mount per node, shared by its ranks

RANK_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import scdlfs

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = scdlfs.open_dataset(sys.argv[1] + "/synth_3k", cache_size="64MiB", endpoint_url=sys.argv[2])
m = dataset.scdlfs_mount
for row in range(rank, len(dataset), world):
    dataset.get_row(row)
dist.barrier()  # every rank holds the mount and has read its share
report = {"rank": rank, "daemon": m.pid, "mountpoint": str(m.mountpoint)}
if rank == 0:
    report["users"] = json.loads(os.getxattr(m.mountpoint, "user.scdlfs.users"))["users"]
    report["fetched"] = m.status()["counters"]["bytes_fetched"]
# A file per rank: the ranks' lines on one shared stdout were seen run together.
with open(os.path.join(sys.argv[3], "rank%d.json" % rank), "w") as f:
    json.dump(report, f)
dist.barrier()
dist.destroy_process_group()
"""


def test_the_ranks_of_a_node_share_one_daemon_that_fetches_once_and_goes_with_the_last(bucket, moto, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    runtime = tmp_path / "run"
    reported = tmp_path / "reports"
    reported.mkdir()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(script),
         bucket.source, moto.endpoint, str(reported)], capture_output=True, text=True, timeout=300, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    reports = sorted((json.loads(f.read_text()) for f in reported.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1, 2, 3], out.stdout
    assert len({(r["daemon"], r["mountpoint"]) for r in reports}) == 1, f"several daemons: {reports}"
    assert len(reports[0]["users"]) == 4, reports[0]
    stored = sum(size for key, (_, size, _) in bucket.snapshot.items() if key.startswith(f"{bucket.prefix}/{NAME}/"))
    assert reports[0]["fetched"] <= 1.05 * stored, f"fetched {reports[0]['fetched']} of a dataset of {stored} bytes"
    daemon, scratch = reports[0]["daemon"], Path(reports[0]["mountpoint"]).parent
    wait_until("the shared mount to go with the last rank", lambda: not left_behind(daemon, scratch))


NODE_RANK_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import scdlfs

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = scdlfs.open_dataset(sys.argv[1] + "/synth_3k", cache_size="64MiB", endpoint_url=sys.argv[2])
m = dataset.scdlfs_mount
for row in range(rank, len(dataset), world):
    dataset.get_row(row)
dist.barrier()
report = {"rank": rank, "daemon": m.pid, "mountpoint": str(m.mountpoint), "node_root": str(m.node_root)}
with open(os.path.join(sys.argv[3], "rank%d.json" % rank), "w") as f:
    json.dump(report, f)
dist.barrier()
dist.destroy_process_group()
"""


def test_the_ranks_use_the_nodes_own_mount_as_it_is_and_leave_it_mounted(bucket, moto, tmp_path):
    """A node's own mount of the whole bucket, started by `scdlfs mount` as the systemd
    unit and a DaemonSet start it, is found by the `open_dataset` of 4 ranks under
    torchrun and used as it is: they start no daemon, mount or scratch directory of
    their own, the node's daemon fetches the dataset once, and its mount still serves
    after the job. A process that asks for its own mount (`node_mount=False`) gets one."""
    node_mountpoint, job_tmp = tmp_path / "node" / "mnt", tmp_path / "job"
    job_tmp.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(NODE_RANK_SCRIPT)
    reported = tmp_path / "reports"
    reported.mkdir()
    with H.ScdlfsMount(f"s3://{bucket.name}/", node_mountpoint, tmp_path / "node" / "cache", moto.endpoint) as node:
        shown = json.loads(os.getxattr(node_mountpoint, "user.scdlfs.source"))
        assert shown["lives_for_users"] is False, shown
        env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "TMPDIR": str(job_tmp)}
        out = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(script),
             bucket.source, moto.endpoint, str(reported)], capture_output=True, text=True, timeout=300, env=env,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        reports = sorted((json.loads(f.read_text()) for f in reported.glob("rank*.json")), key=lambda r: r["rank"])
        assert [r["rank"] for r in reports] == [0, 1, 2, 3], out.stdout
        for report in reports:
            assert report == {**report, "daemon": shown["daemon"], "node_root": str(node_mountpoint),
                              "mountpoint": str(node_mountpoint / bucket.prefix)}, reports  # fmt: skip
        assert mounts_under(tmp_path) == [os.path.realpath(node_mountpoint)]
        assert [p.name for p in job_tmp.iterdir() if p.name.startswith("scdlfs-")] == []
        assert (node_mountpoint / bucket.prefix / NAME / "header.sch").is_file(), "the node's mount stopped serving"
        status = json.loads(H.run([node.bin, "status", "--json", node_mountpoint], env=node.env).stdout)
        stored = sum(size for key, (_, size, _) in bucket.snapshot.items() if key.startswith(f"{bucket.prefix}/{NAME}/"))
        fetched = status["counters"]["bytes_fetched"]
        assert fetched <= 1.05 * stored, f"fetched {fetched} of a dataset of {stored} bytes"

        own = scdlfs.mount(bucket.source, cache_size="64MiB", endpoint_url=moto.endpoint, node_mount=False)
        try:
            assert own.node_root is None and own.pid != shown["daemon"], own
            assert (own.mountpoint / NAME / "header.sch").is_file()
        finally:
            own.unmount()
        assert node.mountpoint.is_mount()


def test_a_later_process_attaches_and_the_mount_outlives_its_starter(bucket, moto, tmp_path, monkeypatch):
    """The first process to mount starts the daemon; a second, asking for the same
    source and options, attaches to it; the mount goes only when both have gone,
    whichever leaves first. Other options make another mount."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    script = """
import json, sys, scdlfs
m = scdlfs.mount(sys.argv[1], cache_size="64MiB", endpoint_url=sys.argv[2])
print(json.dumps({"daemon": m.pid, "mountpoint": str(m.mountpoint)}), flush=True)
sys.stdin.read()
"""
    starter = Job(script, bucket.source, moto.endpoint, tmp=tmp_path, env={"XDG_RUNTIME_DIR": str(tmp_path / "run")})
    started = starter.report()
    m = scdlfs.mount(bucket.source, cache_size="64MiB", endpoint_url=moto.endpoint)
    other = scdlfs.mount(bucket.source, cache_size="32MiB", endpoint_url=moto.endpoint)
    try:
        assert (m.pid, str(m.mountpoint)) == (started["daemon"], started["mountpoint"])
        assert other.pid != m.pid, "a mount with other options was shared"
        starter.proc.kill()  # the starter goes first, however: the mount stays for this process
        starter.end()
        time.sleep(1)
        assert m.mounted and (m.mountpoint / NAME / "header.sch").is_file()
    finally:
        other.unmount()
        m.unmount()
    scratch = m.mountpoint.parent
    assert not left_behind(m.pid, scratch), left_behind(m.pid, scratch)


def test_dataloader_workers_use_their_parents_shared_mount_without_becoming_users(bucket, moto, tmp_path):
    """A DataLoader's forked workers that mount the same source (a dataset opening itself
    in its worker) get their parent's mount as it is: they live within its life, so the
    daemon counts the parent alone, and they attach nothing, start nothing, leave nothing."""
    script = """
import json, os, sys, scdlfs, torch
source, endpoint = sys.argv[1:]
users = lambda m: json.loads(os.getxattr(m.mountpoint, "user.scdlfs.users"))["users"]
m = scdlfs.mount(source, cache_size="64MiB", endpoint_url=endpoint)

class OpensItsMount(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        w = scdlfs.mount(source, cache_size="64MiB", endpoint_url=endpoint)
        return json.dumps({"pid": os.getpid(), "mountpoint": str(w.mountpoint), "users": users(w)})

seen = [json.loads(s) for s in torch.utils.data.DataLoader(OpensItsMount(), batch_size=None, num_workers=2)]
print(json.dumps({"main": os.getpid(), "mountpoint": str(m.mountpoint), "seen": seen, "after": users(m)}), flush=True)
"""
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    job = Job(script, bucket.source, moto.endpoint, tmp=tmp_path, env=env)
    report = job.report()
    code, stderr = job.end()
    assert code == 0, stderr
    assert len({s["pid"] for s in report["seen"]}) == 2, report
    for seen in report["seen"]:
        assert seen["mountpoint"] == report["mountpoint"] and seen["users"] == [report["main"]], report
    assert report["after"] == [report["main"]], report


def test_the_runtime_directory_keeps_no_lock_or_note_of_a_mount_gone(bucket, moto, tmp_path):
    """A shared mount's lock and note go with it: after a normal exit, and after a
    SIGKILL (found gone by the next mount of the node)."""
    runtime = tmp_path / "run"
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    job = Job(JOB_SHARED, bucket.source, moto.endpoint, "64MiB", tmp=tmp_path, env=env)
    job.report()
    assert len(list((runtime / "scdlfs").iterdir())) == 2, "a lock and a note while it lives"
    job.end()
    assert list((runtime / "scdlfs").iterdir()) == []
    killed = Job(JOB_SHARED, bucket.source, moto.endpoint, "64MiB", tmp=tmp_path, env=env)
    gone = killed.report()
    killed.proc.kill()
    killed.end()
    wait_until("the killed job's daemon to go", lambda: not daemon_running(gone["daemon"]))
    later = Job(JOB_SHARED, bucket.source, moto.endpoint, "32MiB", tmp=tmp_path, env=env)
    later.report()
    assert len(list((runtime / "scdlfs").iterdir())) == 2, "only the later mount's lock and note"
    later.end()
    assert list((runtime / "scdlfs").iterdir()) == []


# A process of a node holding a shared mount until its standard input closes.
JOB_SHARED = """
import json, sys, scdlfs
m = scdlfs.mount(sys.argv[1], cache_size=sys.argv[3], endpoint_url=sys.argv[2])
print(json.dumps({"daemon": m.pid}), flush=True)
sys.stdin.read()
"""
