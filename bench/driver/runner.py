"""One benchmark run: the tools, the dataset, the server and the link; every registered
system's epochs for each run and order; the results saved; then the reduced variant's
checks (`--quick`), or the report rendered (a system run alone updates only its own
section of the page)."""

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from .atlas import ATLAS_BEGIN, ATLAS_END, atlas_problems, atlas_section, run_atlas
from .config import (BUCKET, PLANNED_BEGIN, PLANNED_END, QUICK_MIN_ROWS, QUICK_SIZE_MB, REPO, RESTART_BEGIN,
                     RESTART_END, SMALL_BEGIN, SMALL_END,
                     SYSTEM_NAMES, TORCH_BEGIN, TORCH_END)
from .cpu import CPU_BEGIN, CPU_END, cpu_problems, cpu_section, run_cpu
from .measure import SERVER_FILES, disk_read_ahead_kib
from .procs import cleanup, log
from .quick import quick_checks
from .registry import REGISTRY
from .report import (planned_section, restart_section, results_copy, side_results, small_cache_section, splice,
                     splice_hostile,
                     torch_section,
                     write_report)
from .servers import generate, probe, start_proxy, start_server
from .summary import Report, fmt
from .systems import Ctx, sys_scdlfs
from .tools import build_binaries, ensure_tools, use_binaries


def configure(args):
    """The defaults that depend on other options: the cargo profile, and what --quick
    reduces."""
    args.profile = args.profile or ("ci" if args.quick else "release")
    use_binaries(args.profile)
    if args.quick:
        args.size_mb, args.runs, args.chunk_rows = QUICK_SIZE_MB, 1, 1024
        args.time_limit = min(args.time_limit, 8.0)
        args.server = args.server or "moto"
        args.work = os.path.join(REPO, "target", "bench-quick")
        # Smaller than the dataset, so that eviction runs during every scdlfs epoch.
        args.cache_size = "24MiB"
        # The page is rendered (which checks the report code) but not into the repository.
        args.report = os.path.join(args.work, "benchmarks.md")
        args.readme = os.path.join(args.work, "README.md")
        if args.systems == ",".join(SYSTEM_NAMES):
            # The node scenario's short variant (R = 1 and 2), and the hostile writer's.
            args.systems += ",node,hostile,small-cache,atlas,cpu"


def main(args, command):
    """`args` as bench/run.py parsed them; `command`: the command line, for the page."""
    configure(args)
    png = None if args.quick else os.path.join(os.path.dirname(args.report), "benchmarks.png")
    if args.report_only:
        saved = json.load(open(results_copy(args.report)))
        write_report(saved, args.report, png, args.font, args.readme)
        return
    args.server = args.server or "s3s-nginx"
    started = time.time()
    for d in ("logs", "mnt", "cache"):
        os.makedirs(os.path.join(args.work, d), exist_ok=True)
    if args.quick:
        shutil.copy(os.path.join(REPO, "README.md"), args.readme)
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    systems = args.systems.split(",")
    if systems == ["cpu"]:
        # A local folder, no server: the binaries and the dataset only.
        build_binaries(args)
        run_cpu_alone(args, command, started)
        return
    ensure_tools(args)
    if systems == ["atlas"]:
        # Its own dataset and endpoint, no epochs: the page's atlas section alone.
        run_atlas_alone(args, command, started)
        return
    ctx = Ctx()
    ctx.args = args
    ctx.work, ctx.seed, ctx.limit, ctx.python = args.work, 1, args.time_limit, args.python
    ctx.torch_python = getattr(args, "torch_python", None)
    ctx.cache_size = args.cache_size
    ctx.perf_dir = args.perf_dir
    ctx.mount_args = args.mount_args.split()
    ctx.name = "ds-%d" % args.size_mb
    ctx.info = generate(args, ctx.name, args.size_mb)
    extra = {}  # dataset name -> its info, for the daemon's RSS against size
    if not args.quick and "scdlfs" in systems:
        for size in (args.small_size_mb, args.large_size_mb):
            if size:
                extra["ds-%d" % size] = generate(args, "ds-%d" % size, size)
    ctx.digests = os.path.join(args.work, "digests", ctx.name)
    versions = tool_versions()
    probes = start_link(args, ctx, extra)

    results, startup, failures = read_epochs(args, ctx, systems, extra)
    saved = dict(path=os.path.join(args.work, "results.json"), command=command, probes=probes, results=results,
                 startup=startup,
                 args=vars(args), info=ctx.info, name=ctx.name,
                 sizes=dict({ctx.name: ctx.info["bytes"]}, **{n: i["bytes"] for n, i in extra.items()}),
                 versions=versions, cache_size=ctx.cache_size, minutes=(time.time() - started) / 60,
                 read_ahead_kib=dict(local_disk=disk_read_ahead_kib(os.path.join(args.work, "local-flat")),
                                     cache_disk=disk_read_ahead_kib(os.path.join(args.work, "cache"))),
                 mount_args=ctx.mount_args,
                 host=socket.gethostname(), cores=os.cpu_count(), date=time.strftime("%Y-%m-%d"))
    with open(saved["path"], "w") as f:
        json.dump(saved, f, indent=1)
    if failures:
        for msg in failures:
            log("FAILED: " + msg)
        sys.exit("%d system runs failed" % len(failures))
    if args.quick:
        orders = args.orders.split(",")
        other_orders = (args.other_orders or args.orders).split(",")
        quick_checks(args, systems, orders, other_orders, results, startup, ctx.info)
        write_report(saved, args.report, None, args.font, args.readme)
        if "atlas" in systems:
            atlas = dict(run_atlas(args), date=saved["date"], host=saved["host"])
            problems = atlas_problems(atlas)
            if problems:
                sys.exit("bench quick failed:\n  " + "\n  ".join(problems))
            splice(args.report, ATLAS_BEGIN, ATLAS_END, atlas_section(atlas, os.path.join(args.work, "atlas.json")))
            with open(os.path.join(args.work, "atlas.json"), "w") as f:
                json.dump(atlas, f, indent=1)
        if "cpu" in systems:
            cpu = run_cpu(args, ctx, args.cpu_baseline)
            problems = cpu_problems(cpu)
            if problems:
                sys.exit("bench quick failed:\n  " + "\n  ".join(problems))
            cpu_results = os.path.join(args.work, "cpu.json")
            splice(args.report, CPU_BEGIN, CPU_END, cpu_section(cpu, cpu_results))
            with open(cpu_results, "w") as f:
                json.dump(cpu, f, indent=1)
        sampled = [r for r in results if "cache_dir_peak_bytes" in r]
        print("bench quick: %d epochs passed, 0 failed (every epoch read ≥ %d rows or all, each checked; the cache "
              "budget bound on every scdlfs mount, and its directory held at most %.1f%% of the budget in %d "
              "samples; report rendered to %s; %.0f s)"
              % (len(results), QUICK_MIN_ROWS,
                 100 * max((r["cache_dir_peak_bytes"] / r["cache_budget_bytes"] for r in sampled), default=0),
                 sum(r["cache_dir_samples"] for r in sampled), os.path.relpath(args.report, REPO),
                 time.time() - started))
        return
    if systems == ["node"]:
        # Run alone, the node system keeps its results beside the page, which is rendered
        # again from the page's own results with them.
        with open(side_results(args.report, "node"), "w") as f:
            json.dump(saved, f, indent=1)
        write_report(json.load(open(results_copy(args.report))), args.report, png, args.font, args.readme)
        log("updated the node section of %s in %.0f s" % (args.report, time.time() - started))
        return
    if systems == ["hostile"]:
        # Run alone, the hostile system keeps its results beside the page and replaces only
        # its own section, row of the targets and the reduced variant's paragraph.
        results = side_results(args.report, "hostile")
        with open(results, "w") as f:
            json.dump(saved, f, indent=1)
        splice_hostile(args.report, saved, results)
        log("updated the hostile section of %s in %.0f s" % (args.report, time.time() - started))
        return
    for alone, begin, end, section in (("torch", TORCH_BEGIN, TORCH_END, torch_section),
                                       ("restart", RESTART_BEGIN, RESTART_END, restart_section),
                                       ("small-cache", SMALL_BEGIN, SMALL_END, small_cache_section),
                                       ("planned", PLANNED_BEGIN, PLANNED_END, planned_section)):
        if systems == [alone]:
            # Run alone, a system updates only its own section of the page.
            results = side_results(args.report, alone)
            with open(results, "w") as f:
                json.dump(saved, f, indent=1)
            splice(args.report, begin, end, section(Report(saved), results))
            log("updated the %s section of %s in %.0f s" % (alone, args.report, time.time() - started))
            return
    write_report(saved, args.report, png, args.font, args.readme)
    log("wrote %s and the summary in %s in %.0f s" % (args.report, args.readme, time.time() - started))


def run_atlas_alone(args, command, started):
    """The atlas system run alone: its results beside the page, its section replaced."""
    atlas = dict(run_atlas(args), command=command, date=time.strftime("%Y-%m-%d"), host=socket.gethostname(),
                 cores=os.cpu_count(), minutes=(time.time() - started) / 60)
    results = side_results(args.report, "atlas")
    with open(results, "w") as f:
        json.dump(atlas, f, indent=1)
    splice(args.report, ATLAS_BEGIN, ATLAS_END, atlas_section(atlas, results))
    log("updated the atlas section of %s in %.0f s" % (args.report, time.time() - started))


def run_cpu_alone(args, command, started):
    """The cpu system run alone: the run's dataset from a local folder, its results beside
    the page, its section replaced."""
    ctx = Ctx()
    ctx.args, ctx.work, ctx.mount_args = args, args.work, args.mount_args.split()
    ctx.name = "ds-%d" % args.size_mb
    ctx.info = generate(args, ctx.name, args.size_mb)
    cpu = dict(run_cpu(args, ctx, args.cpu_baseline), command=command, minutes=(time.time() - started) / 60)
    problems = cpu_problems(cpu)
    if problems:
        sys.exit("bench cpu failed:\n  " + "\n  ".join(problems))
    results = os.path.join(args.work, "cpu.json") if args.quick else side_results(args.report, "cpu")
    with open(results, "w") as f:
        json.dump(cpu, f, indent=1)
    splice(args.report, CPU_BEGIN, CPU_END, cpu_section(cpu, results))
    log("updated the cpu section of %s in %.0f s" % (args.report, time.time() - started))


def tool_versions():
    """The versions of s3fs-fuse and rclone, for the page."""
    versions = {}
    for tool, cmd in (("s3fs", ["s3fs", "--version"]), ("rclone", ["rclone", "version"])):
        try:
            versions[tool] = subprocess.run(cmd, capture_output=True, text=True).stdout.split("\n")[0].split()[-1]
        except (OSError, IndexError):
            pass
    return versions


def start_link(args, ctx, extra):
    """The server with the run's datasets and the emulated link in front of it (their
    endpoints into `ctx`); returns the ceilings measured, of the server and through the link."""
    endpoint, s3s_alone = start_server(args, [ctx.name] + list(extra))
    ctx.endpoint = endpoint
    if args.server == "s3s-nginx":
        SERVER_FILES.append(os.path.join(args.work, "s3root", BUCKET, ctx.name))
    ctx.proxy, ctx.stats = start_proxy(endpoint, args.rate_mbps, args.latency_ms,
                                       os.path.join(args.work, "logs", "proxy.log"))
    log("server %s, link %s (%.0f MB/s, %.0f ms)" % (endpoint, ctx.proxy, args.rate_mbps, args.latency_ms))
    probes = {
        "server_1": probe(endpoint, ctx.name, 1, 300 if not args.quick else 40),
        "server_8": probe(endpoint, ctx.name, 8, 600 if not args.quick else 40),
        "link_8": probe(ctx.proxy, ctx.name, 8, 400 if not args.quick else 40),
    }
    if s3s_alone:
        probes["s3s_1"] = probe(s3s_alone, ctx.name, 1, 40)
        probes["s3s_8"] = probe(s3s_alone, ctx.name, 8, 80)
    log("server ceiling: %.0f MB/s (1 connection), %.0f MB/s (8); through the link %.0f MB/s"
        % (probes["server_1"]["mb_per_s"], probes["server_8"]["mb_per_s"], probes["link_8"]["mb_per_s"]))
    return probes


def log_epoch(run_i, r):
    log("run %d %-40s %-8s %9.0f rows/s%s  %6.1f s  fetched %6.0f MB  rss %s  cpu %s" % (
        run_i, r["system"], r["order"], r["rows_per_s"], "" if r["completed"] else " (time-bounded)",
        r["seconds"], r["bytes_fetched"] / 1e6,
        "%d MiB" % (r["daemon_peak_rss_kib"] // 1024) if r.get("daemon_peak_rss_kib") else "—",
        "%.1f s" % r["daemon_cpu_s"] if "daemon_cpu_s" in r else "—"))


def log_startup(run_i, r):
    log("run %d startup, %-24s first row %.3f s (visible %.3f s), headers read %s s, "
        "%d parts fetched" % (run_i, r["system"], r["first_row_s"], r["dataset_visible_s"],
                              fmt(r["adoption_done_s"], ".2f"), r["parts_fetched"]))


def read_epochs(args, ctx, systems, extra):
    """Every run: for each order, every registered system `--systems` names that reads in
    it; then the daemon's cold epoch on the datasets of other sizes. A system that fails
    is recorded and the run goes on. Returns (epoch results, startup results, failures)."""
    results = []
    startup = []  # the restart system's mount-to-first-row measurements
    failures = []

    def record(run_i, fn, *a, into=results, log_one=log_epoch):
        try:
            for r in fn(*a):
                r["run"] = run_i
                into.append(r)
                log_one(run_i, r)
        except RuntimeError as e:
            failures.append(str(e))
            log("FAILED: %s" % e)

    def other_size(name, run_i, hints, limit):
        """The same daemon settings on another dataset: a fresh mount's cold windows epoch."""
        other = Ctx()
        other.__dict__.update(ctx.__dict__)
        other.name, other.info = name, extra[name]
        other.digests = os.path.join(args.work, "digests", name)
        return sys_scdlfs(other, "windows", run_i, hints, dataset=name, label_suffix=" (%s)" % name, warm=False,
                          limit=limit)

    for run_i in range(args.runs):
        for order in args.orders.split(","):
            for system in REGISTRY:
                if system.name in systems and system.reads(order, args):
                    if system.startup:
                        record(run_i, system.measure, ctx, order, run_i, into=startup, log_one=log_startup)
                    else:
                        record(run_i, system.measure, ctx, order, run_i)
        if args.small_size_mb and "ds-%d" % args.small_size_mb in extra:
            record(run_i, other_size, "ds-%d" % args.small_size_mb, run_i, True, ctx.limit)
        if args.large_size_mb and "ds-%d" % args.large_size_mb in extra:
            # A whole epoch with hints (the RSS target is with plans): the peak RSS of a whole
            # pass over a dataset larger than the cache.
            record(run_i, other_size, "ds-%d" % args.large_size_mb, run_i, True, None)
    return results, startup, failures
