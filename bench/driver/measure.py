"""Measuring one epoch: the page-cache state it starts in, the reader that reads it (one
process per epoch), and what the machine and the daemon did meanwhile (/proc counters
of the disk and the cores, the daemon's CPU seconds and peak RSS, bytes through the
link, the scdlfs daemon's status)."""

import json
import os
import re
import signal
import subprocess
import threading
import time

from .config import DROPPED, REPO, WARM
from .procs import MOUNTS, clean_env, spawn, stop, unmount, wait_mounted
from .servers import proxy_bytes
from .tools import BIN


def read_epoch(ctx, dataset_dir, order, epoch, hints=True, limit=None, cache_aware=False):
    """`cache_aware`: read the chunks the mount announces it holds first."""
    cmd = [BIN.bench, "read", "--dataset", dataset_dir, "--digests", ctx.digests, "--order", order,
           "--seed", str(ctx.seed), "--epoch", str(epoch)] + ctx.order_args
    if not hints:
        cmd.append("--no-hints")
    if cache_aware:
        cmd.append("--cache-aware")
    if limit:
        cmd += ["--time-limit", str(limit)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("reader failed on %s (%s): %s" % (dataset_dir, order, out.stderr.strip()))
    return json.loads(out.stdout)


def read_torch_epoch(ctx, dataset_dir, order, epoch, hints=True, limit=None):
    cmd = [ctx.torch_python, os.path.join(REPO, "bench", "torch_loader.py"), "--dataset", dataset_dir,
           "--digests", ctx.digests, "--order", order, "--seed", str(ctx.seed), "--epoch", str(epoch)]
    if not hints:
        cmd.append("--no-hints")
    if limit:
        cmd += ["--time-limit", str(limit)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=clean_env())
    if out.returncode != 0:
        raise RuntimeError("the DataLoader failed on %s (%s): %s" % (dataset_dir, order, out.stderr.strip()[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def read_through(dataset_dir):
    """Reads every file of a dataset directory once (fills scdlfs's disk cache and the page
    cache of the files), closing each."""
    for name in sorted(os.listdir(dataset_dir)):
        path = os.path.join(dataset_dir, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


# The server's files of the main dataset (s3s-nginx serves them from local files): read
# back into the page cache after every drop, so that the server is as fast in every epoch
# as when its ceiling is measured, and only the reader's side starts cold.
SERVER_FILES = []


def drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        raise RuntimeError("cannot drop the page cache (root and a writable /proc/sys needed): %s" % e)
    for root in SERVER_FILES:
        for d, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    while f.read(8 << 20):
                        pass


def cpu_seconds(pid):
    """User + system CPU time of a process and all its threads so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_sampling_rss(cmd, env):
    """Runs a reader process to its end, sampling its peak RSS while it runs (it exits at
    the end of its epoch, taking its VmHWM along): returns it, its stdout and stderr, and
    that peak in KiB (None if never read)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rss = 0
    while proc.poll() is None:
        rss = max(rss, peak_rss_kib(proc.pid) or 0)
        time.sleep(0.2)
    out, err = proc.communicate()
    return proc, out, err, rss or None


def peak_rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def disk_read_ahead_kib(path):
    """The read-ahead of the disk holding `path` (a partition reads ahead as its disk), in
    KiB, or None where the machine does not say (or `path` was not made: its system did
    not run)."""
    if not os.path.exists(path):
        return None
    dev = os.stat(path).st_dev
    block = "/sys/dev/block/%d:%d" % (os.major(dev), os.minor(dev))
    for f in (block + "/queue/read_ahead_kb", block + "/../queue/read_ahead_kb",
              "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(dev), os.minor(dev))):
        if os.path.exists(f):
            with open(f) as fh:
                return int(fh.read().strip())
    return None


def machine_counters(path):
    """Bytes read so far from the disk holding `path` (None where /proc/diskstats does not
    name it) and the machine's CPU time so far as (busy, waiting on a disk, all), in ticks."""
    dev = os.stat(path).st_dev
    disk_bytes = None
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == (os.major(dev), os.minor(dev)):
                disk_bytes = int(fields[5]) * 512
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return disk_bytes, (user + nice + system + irq + softirq + steal, iowait, sum(ticks))


def with_machine_counters(ctx, read):
    """Runs `read()` and adds to its result what the machine did meanwhile: bytes read from
    the work directory's disk (scdlfs's cache and the local copy are both there) and the
    shares of the CPU time busy and waiting on a disk."""
    disk0, cpu0 = machine_counters(ctx.work)
    r = read()
    disk1, cpu1 = machine_counters(ctx.work)
    busy, iowait, total = (b - a for a, b in zip(cpu0, cpu1))
    r.update(disk_read_bytes=disk1 - disk0 if disk0 is not None else None,
             cpu_busy_share=busy / total if total else None, iowait_share=iowait / total if total else None)
    return r


def scdlfs_status(mnt):
    return json.loads(os.getxattr(mnt, "user.scdlfs.status"))


def fetched_so_far(ctx, mnt, scdlfs):
    """Bytes through the link so far (its proxy's counter); with no link (`ctx.stats`
    None), the bytes the scdlfs daemon fetched, as its status counts them."""
    if ctx.stats is not None:
        return proxy_bytes(ctx.stats)
    if not scdlfs:
        raise RuntimeError("bytes fetched without a link are counted for scdlfs mounts only")
    return scdlfs_status(mnt)["counters"]["bytes_fetched"]


def size_bytes(text):
    """"3GiB", "24MiB", "512KiB" or a number of bytes."""
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * scale)
    return int(text)


# How often the bytes in an scdlfs mount's cache directory are sampled while it is mounted.
CACHE_SAMPLE_S = 0.05


def dir_bytes(path):
    """The bytes of the regular files under `path` (their lengths), listed once per
    directory; a file deleted between its listing and its stat counts nothing."""
    total = 0
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    total += dir_bytes(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return total


class CacheDirSampler:
    """The bytes in a cache directory (`dir_bytes`), sampled every CACHE_SAMPLE_S seconds
    by a thread from `start` to `stop`, independently of what the daemon reports: `take`
    returns the most seen and the number of samples since the last `take`, and starts over."""

    def __init__(self, path):
        self.path, self.peak, self.samples = path, 0, 0
        self.lock, self.done = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._sample_until_done, daemon=True)

    def start(self):
        self.thread.start()

    def _sample(self):
        held = dir_bytes(self.path)
        with self.lock:
            self.peak, self.samples = max(self.peak, held), self.samples + 1

    def _sample_until_done(self):
        while True:
            self._sample()
            if self.done.wait(CACHE_SAMPLE_S):
                return

    def take(self):
        self._sample()
        with self.lock:
            out = self.peak, self.samples
            self.peak, self.samples = 0, 0
        return out

    def stop(self):
        self.done.set()
        self.thread.join()


def option(cmd, name):
    """The value of `name` in a command line."""
    return cmd[cmd.index(name) + 1]


class Epoch:
    """One epoch to read: `label` in the report, epoch number `epoch` of `order`, starting in
    page-cache state `page_cache` (DROPPED or WARM; a fresh mount's first epoch is DROPPED),
    `fill`: read the files through first (so that a warm epoch finds the whole dataset in
    scdlfs's disk cache even after a time-bounded cold epoch)."""

    def __init__(self, label, order, epoch, page_cache, hints=True, limit=None, fill=False, reread=None):
        self.label, self.order, self.epoch, self.page_cache = label, order, epoch, page_cache
        self.hints, self.limit, self.fill, self.reread = hints, limit, fill, reread


def prepare(dataset_dir, e):
    """`reread`: a directory whose files are read back into the page cache after the drop."""
    if e.fill or e.page_cache == WARM:
        read_through(dataset_dir)
    if e.page_cache == DROPPED:
        drop_page_cache()
    for d, _, names in os.walk(e.reread) if e.reread else ():
        for name in names:
            with open(os.path.join(d, name), "rb") as f:
                while f.read(8 << 20):
                    pass


class DaemonProfile:
    """`perf record -e cpu-clock -g` of the daemon (`pid`) while an epoch is read, into
    `perf_dir` (None: nothing recorded): samples of user and kernel time, with the
    kernel's call chains (which system call), for docs/architecture.md's *Where the CPU
    goes per byte*. cpu-clock, because a virtual machine without hardware counters
    (`perf stat -e instructions` unsupported) still has the timer."""

    def __init__(self, perf_dir, pid, label):
        self.proc = None
        if perf_dir:
            os.makedirs(perf_dir, exist_ok=True)
            out = os.path.join(perf_dir, re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-") + ".data")
            self.proc = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "1999", "-g", "-p", str(pid),
                                          "-o", out, "--quiet"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(60)


def tag(r, e, layout):
    r.update(system=e.label, order=e.order, epoch=e.epoch, page_cache=e.page_cache, layout=layout,
             load_1m=os.getloadavg()[0])
    return r


def mount_and_read(ctx, system, cmd, env, mnt, dataset_dir, epochs, reader=read_epoch, layout="chunked",
                   scdlfs=False):
    """Mounts with `cmd` (foreground), runs `epochs` with `reader`, records each, then
    unmounts. After each epoch: the daemon's peak RSS so far (VmHWM) and, for scdlfs, the
    daemon's CPU seconds during the epoch, its cache's status after it, and the most bytes
    its cache directory held at any sample since the previous epoch (or the mount; the
    epoch's preparation included) against the budget the command line states."""
    MOUNTS.append(mnt)
    logf = open(os.path.join(ctx.work, "logs", system.split()[0] + ".log"), "a")
    proc = spawn(cmd, system, env=env, stderr=logf, stdout=logf)
    sampler = CacheDirSampler(option(cmd, "--cache-dir")) if scdlfs else None
    results = []
    try:
        wait_mounted(mnt, proc, system, os.path.join(dataset_dir, "header.sch"))
        if sampler:
            sampler.start()
        for e in epochs:
            prepare(dataset_dir, e)
            counters0 = scdlfs_status(mnt)["counters"] if scdlfs else None
            before = fetched_so_far(ctx, mnt, scdlfs)
            cpu0 = cpu_seconds(proc.pid)
            profile = DaemonProfile(getattr(ctx, "perf_dir", None) if scdlfs else None, proc.pid,
                                    "%s %s %d" % (e.label, e.order, e.epoch))
            try:
                r = with_machine_counters(ctx, lambda: reader(ctx, dataset_dir, e.order, e.epoch, e.hints, e.limit))
            finally:
                profile.stop()
            r["bytes_fetched"] = fetched_so_far(ctx, mnt, scdlfs) - before
            r["daemon_cpu_s"] = cpu_seconds(proc.pid) - cpu0
            r["daemon_peak_rss_kib"] = peak_rss_kib(proc.pid)
            if scdlfs:
                # The rows' bytes the reader got: through FUSE reads, or pages the daemon
                # stored around them (--cache-read-around), or the page cache.
                r["bytes_served"] = r["bytes_read"]
                status = scdlfs_status(mnt)
                r["cache"] = status["cache"]
                # Since the mount started, like the cache's counters: a mount that serves a
                # plan's rows exactly (its dataset's values exceed the cache) never fills it.
                r["planned_requests_since_mount"] = status["counters"]["planned_requests"]
                r["cache_dir_peak_bytes"], r["cache_dir_samples"] = sampler.take()
                r["cache_budget_bytes"] = size_bytes(option(cmd, "--cache-size"))
                r["hint_writes"] = status["counters"]["hint_writes"] - counters0["hint_writes"]
                # What the bytes fetched were: whole parts, or requests for a few bytes.
                r["requests"] = {key: status["counters"][key] - counters0[key] for key in (
                    "parts_fetched", "demand_downloads", "direct_reads", "stray_reads", "edges_fetched",
                    "edge_bytes_reused", "planned_requests", "planned_bytes", "planned_bytes_pushed")}
                r["fetch_memory_peak_mib"] = status["counters"]["fetch_memory_peak_bytes"] / 2**20
                memory = status.get("memory") or {}
                for key in ("resident_bytes", "heap_in_use_bytes", "heap_free_kept_bytes"):
                    if key in memory:
                        r[key.replace("_bytes", "_mib")] = memory[key] / 2**20
            results.append(tag(r, e, layout))
    finally:
        if sampler and sampler.thread.is_alive():
            sampler.stop()
        if proc.poll() is None:
            stop(proc)
        unmount(mnt)
    return results
