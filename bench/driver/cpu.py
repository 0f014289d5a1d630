"""The cpu system (issue 45): what the daemon's CPU costs per byte when nothing else does.
A local-folder source (the run's generated dataset, read by the daemon from local files,
no network), a fresh mount with an empty cache large enough for it, and CPU_READERS
processes at once, reader k of N reading the k-th N-th of the flat view's `data.npy` and
then of its `col_ptr.npy` in order, in READ_BYTES `read(2)` calls into one buffer:
  cold   the page cache dropped (the source's files read back into it, so the daemon,
         not the disk, bounds the epoch), nothing in the disk cache;
  warm   the same reads again, every byte in the disk cache, the page cache dropped.
The figures: the daemon's user + system CPU seconds (/proc/<pid>/stat) per GB the readers
got, and GB/s from the first reader's start to the last one's end.

`--cpu-baseline PATH`: another `scdlfs` binary (say, built from main before a change)
measured in the same run, alternating which goes first from run to run, so that the two
are compared on the same machine at the same load; the section shows both and the median
of the per-run ratios.

Run alone (`--systems cpu`), it needs no S3 server: its results are kept beside the page
(docs/benchmarks-cpu.json) and only its section is replaced. --quick runs it on the
reduced dataset, time-bounded, and fails unless every reader read its share and the warm
epoch's bytes are the cold epoch's (each reader's CRC-32 of what it read)."""

import json
import os
import shutil
import subprocess
import sys
import time

from .config import BUCKET, REPO
from .measure import cpu_seconds, drop_page_cache, peak_rss_kib
from .procs import MOUNTS, clean_env, fresh_dir, log, spawn, stop, unmount, wait_mounted
from .summary import fmt, med
from .tools import BIN

CPU_READERS = 4
READ_BYTES = 1 << 20
CPU_FILES = ("data.npy", "col_ptr.npy")
CPU_BEGIN, CPU_END = "<!-- cpu section: begin -->", "<!-- cpu section: end -->"
STATES = ("cold", "warm")
# Reader k of n: its share of each file, in order, in READ_BYTES reads into one buffer, until
# `limit` seconds (0: none). `check`: the CRC-32 of what it read (zlib, in the reader's CPU).
READER = """
import json, os, sys, time, zlib
paths, k, n, limit, check = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
buf = memoryview(bytearray(%d))
got, crc, complete = 0, 0, True
started = time.monotonic()
for path in paths:
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        at, end = size * k // n, size * (k + 1) // n
        f.seek(at)
        while at < end:
            if limit and time.monotonic() - started > limit:
                complete = False
                break
            m = f.readinto(buf[:min(len(buf), end - at)])
            if not m:
                sys.exit("%%s: end of file at %%d, before %%d" %% (path, at, end))
            if check:
                crc = zlib.crc32(buf[:m], crc)
            at += m
            got += m
print(json.dumps(dict(bytes=got, started=started, ended=time.monotonic(), crc=crc, complete=complete)))
""" % READ_BYTES


def source_dir(ctx):
    """The folder the mounts read from: the generated datasets' bucket folder."""
    return os.path.join(ctx.work, "s3root", BUCKET)


def read_back(folder):
    """The source's files into the page cache: after a drop, the daemon reads them from
    memory, as a store serving at its ceiling would answer."""
    for d, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(d, name), "rb") as f:
                while f.read(8 << 20):
                    pass


def settle(pid, most_s=3.0):
    """The daemon's CPU seconds once it stopped working (a read-around push or a
    prefetch may outlive the readers by a moment), waiting at most `most_s`."""
    deadline, last = time.monotonic() + most_s, cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = cpu_seconds(pid)
        if now - last < 0.01:
            return now
        last = now
    return last


def read_state(dataset_dir, pid, limit, check):
    """One epoch: the readers at once; their bytes, the wall time, the daemon's CPU."""
    paths = ",".join(os.path.join(dataset_dir, f) for f in CPU_FILES)
    cpu0 = cpu_seconds(pid)
    procs = [subprocess.Popen([sys.executable, "-c", READER, paths, str(k), str(CPU_READERS), str(limit or 0),
                               "1" if check else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(CPU_READERS)]
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError("cpu reader failed: %s" % err.strip()[-2000:])
        outs.append(json.loads(out))
    cpu = settle(pid) - cpu0
    total = sum(o["bytes"] for o in outs)
    seconds = max(o["ended"] for o in outs) - min(o["started"] for o in outs)
    return dict(bytes=total, seconds=seconds, gb_per_s=total / seconds / 1e9, daemon_cpu_s=cpu,
                cpu_s_per_gb=cpu / total * 1e9 if total else None, crcs=[o["crc"] for o in outs],
                complete=all(o["complete"] for o in outs), load_1m=os.getloadavg()[0])


def cpu_cache_size(dataset_bytes):
    """Room for the whole dataset and a margin, and no more: a budget larger than the
    cache's filesystem has free is refused at mount, and shared machines run low."""
    return "%dMiB" % (dataset_bytes * 5 // 4 // (1 << 20) + 64)


def measure_binary(ctx, binary, label, run_i, limit, check):
    """A fresh mount of the source folder by `binary` with an empty cache: the cold
    epoch, then the warm one."""
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "cpu"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "cpu"))
    source = source_dir(ctx)
    cmd = [binary, "mount", source, mnt, "--cache-dir", cache, "--cache-size", cpu_cache_size(ctx.info["bytes"]), "--foreground",
           "--log-level", "warn"] + ctx.mount_args
    MOUNTS.append(mnt)
    logf = open(os.path.join(ctx.work, "logs", "cpu-%s.log" % label), "a")
    proc = spawn(cmd, "scdlfs (cpu, %s)" % label, env=clean_env(), stderr=logf, stdout=logf)
    dataset_dir = os.path.join(mnt, ctx.name)
    results = []
    try:
        wait_mounted(mnt, proc, "scdlfs (cpu)", os.path.join(dataset_dir, "header.sch"))
        for state in STATES:
            drop_page_cache()
            read_back(os.path.join(source, ctx.name))
            r = read_state(dataset_dir, proc.pid, limit, check)
            r.update(state=state, binary=label, run=run_i, daemon_peak_rss_kib=peak_rss_kib(proc.pid))
            log("run %d cpu %-8s %-5s %5.2f GB/s  %.2f CPU s/GB  %.2f GB in %.1f s%s" % (
                run_i, label, state, r["gb_per_s"], r["cpu_s_per_gb"], r["bytes"] / 1e9, r["seconds"],
                "" if r["complete"] else " (time-bounded)"))
            results.append(r)
    finally:
        if proc.poll() is None:
            stop(proc)
        unmount(mnt)
        shutil.rmtree(cache, ignore_errors=True)
    return results


def run_cpu(args, ctx, baseline=None):
    """Every run: the binary measured (and `baseline`, the other first in odd runs).
    Returns the saved results of the system."""
    binaries = [("measured", BIN.scdlfs)] + ([("baseline", baseline)] if baseline else [])
    limit = args.time_limit if args.quick else None
    results = []
    for run_i in range(args.runs):
        order = binaries if run_i % 2 == 0 else binaries[::-1]
        for label, binary in order:
            results += measure_binary(ctx, binary, label, run_i, limit, check=args.quick)
    return dict(results=results, readers=CPU_READERS, read_bytes=READ_BYTES, files=list(CPU_FILES),
                dataset=ctx.name, dataset_bytes=ctx.info["bytes"], cache_size=cpu_cache_size(ctx.info["bytes"]),
                baseline=baseline, mount_args=ctx.mount_args, runs=args.runs, profile=args.profile,
                date=time.strftime("%Y-%m-%d"), host=os.uname().nodename, cores=os.cpu_count())


def cpu_problems(saved):
    """What --quick claims: each epoch read bytes, and each reader's warm bytes are its
    cold ones."""
    problems = []
    for r in saved["results"]:
        if r["bytes"] <= 0:
            problems.append("cpu %s %s, run %d: no bytes read" % (r["binary"], r["state"], r["run"]))
    for run_i in range(saved["runs"]):
        for label in ("measured", "baseline"):
            pair = {r["state"]: r for r in saved["results"] if r["run"] == run_i and r["binary"] == label}
            if len(pair) == 2 and pair["cold"]["complete"] and pair["warm"]["complete"] \
                    and pair["cold"]["crcs"] != pair["warm"]["crcs"]:
                problems.append("cpu %s, run %d: the warm epoch read other bytes than the cold one" % (label, run_i))
    return problems


def cpu_section(saved, results_path):
    """The cpu section of docs/benchmarks.md, between markers."""
    rs = saved["results"]
    lines = [CPU_BEGIN, "## The daemon's CPU per byte: sequential readers, no network", ""]
    w = lines.append
    w("Issue 45: a fresh mount of a local folder (the %s dataset, %.2f GB, read by the daemon from local files "
      "whose pages are in memory: no network, no disk on the source side) with an empty %s cache; %d reader "
      "processes at once, reader k reading the k-th quarter of the flat view's %s in order in %d KiB `read(2)` "
      "calls. *cold*: nothing in the disk cache, the page cache dropped; *warm*: every byte in the disk cache, the "
      "page cache dropped. *CPU s/GB*: the daemon's user + system CPU seconds (/proc/<pid>/stat) per GB the "
      "readers got; *GB/s*: those bytes ÷ the first reader's start to the last one's end. Measured %s on %s "
      "(%d cores), cargo profile `%s`, medians of %d run(s)%s; 1-minute load average at the epochs' ends: median "
      "%.1f." % (saved["dataset"], saved["dataset_bytes"] / 1e9, saved["cache_size"], saved["readers"],
                 " and ".join("`%s`" % f for f in saved["files"]), saved["read_bytes"] >> 10, saved["date"],
                 saved["host"], saved["cores"], saved["profile"], saved["runs"],
                 ", the baseline binary measured in the same runs, alternating which went first"
                 if saved.get("baseline") else "", med([r["load_1m"] for r in rs])))
    w("")
    if saved.get("command"):
        w("Command: `%s`%s." % (saved["command"], "; *baseline*: `%s`" % saved["baseline"] if saved.get("baseline")
                                else ""))
        w("")
    labels = ["measured"] + (["baseline"] if saved.get("baseline") else [])
    if saved.get("baseline"):
        w("| state | binary | GB read | GB/s | CPU s/GB | CPU ÷ baseline (per run) | GB/s ÷ baseline (per run) |")
        w("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    else:
        w("| state | GB read | GB/s | CPU s/GB |")
        w("| --- | ---: | ---: | ---: |")
    for state in STATES:
        for label in labels:
            of = [r for r in rs if r["state"] == state and r["binary"] == label]
            figures = (fmt(med([r["bytes"] / 1e9 for r in of]), ".2f"), fmt(med([r["gb_per_s"] for r in of]), ".2f"),
                       fmt(med([r["cpu_s_per_gb"] for r in of]), ".2f"))
            if not saved.get("baseline"):
                w("| %s | %s | %s | %s |" % ((state,) + figures))
                continue
            ratios = ("—", "—")
            if label == "measured":
                pairs = [(r, next(b for b in rs if b["state"] == state and b["binary"] == "baseline"
                                  and b["run"] == r["run"])) for r in of]
                ratios = (fmt(med([r["cpu_s_per_gb"] / b["cpu_s_per_gb"] for r, b in pairs]), ".2f"),
                          fmt(med([r["gb_per_s"] / b["gb_per_s"] for r, b in pairs]), ".2f"))
            w("| %s | %s | %s | %s | %s | %s | %s |" % ((state, label) + figures + ratios))
    w("")
    w("Raw results of this section: `%s`." % os.path.relpath(results_path, REPO))
    w(CPU_END)
    return lines
