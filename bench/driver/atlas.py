"""The atlas system (issue 40): what a job meets on an atlas-sized dataset before and while
it trains, rather than an epoch. The dataset has ATLAS_ROWS rows in chunks of
ATLAS_CHUNK_ROWS with real `row_ptr.npy` files and sparse value files (bench/atlas/make.py:
2,000 values a row, so 10^8 rows are 24,415 chunks, 73,248 objects and 1.2 TB as listed,
about 0.8 GB on disk), served by bench/atlas/serve.py, an S3-compatible endpoint on
127.0.0.1 that answers each listing page after ATLAS_PAGE_DELAY_S, as a real store takes
time, with nginx in front of it for the objects' GETs. It is made once in the work directory and kept.

Each run, on fresh mounts of the bucket with empty caches:
  1. the first `ls -a` of the dataset with no manifest: seconds, listing pages of the
     dataset's prefix (from the mount's start), daemon CPU;
  2. `scdlfs manifest` writes the dataset's manifest (removed again before the next run's
     first step), and the first `ls -a`
     of a fresh mount again, which should list nothing;
  3. on that mount, the first row through the released reader in a fresh interpreter (its
     modules imported before the clock starts): `SingleCellMemMapDataset` opened, then the
     middle row read;
  4. ATLAS_RANKS processes (bench/atlas/rank.py) take each of SAMPLER_ORDERS in turn, all
     ranks together (a process per rank and order): the sampler built with len(),
     state_dict() and its first 10,000 indices and the resident memory that took, then
     ATLAS_READ_ROWS of those rows read and checked as a fresh sampler of the same seed
     yields them; the daemon's peak RSS and the bytes and requests it fetched; per order,
     the row offsets it fetched against the distinct row-offset bytes the endpoint served.
Run alone (`--systems atlas`), it replaces its section of docs/benchmarks.md and keeps its
results beside the page; --quick runs it on 10^7 rows with 2 ranks and checks what the
steps returned, not how fast."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

from .config import REPO
from .measure import cpu_seconds, peak_rss_kib, scdlfs_status
from .procs import MOUNTS, clean_env, free_port, fresh_dir, log, spawn, stop, unmount, wait_mounted, wait_port
from .servers import start_nginx
from .summary import med
from .tools import BIN, test_venv

ATLAS_ROWS, QUICK_ATLAS_ROWS = 100_000_000, 10_000_000
ATLAS_CHUNK_ROWS = 4096
ATLAS_PAGE_DELAY_S = 0.15
ATLAS_RANKS, QUICK_ATLAS_RANKS = 8, 2
ATLAS_READ_ROWS, QUICK_ATLAS_READ_ROWS = 2048, 256
ATLAS_CACHE_SIZE = "1GiB"
ATLAS_BUCKET = "atlas"
ATLAS_BEGIN, ATLAS_END = "<!-- atlas section: begin -->", "<!-- atlas section: end -->"
# (label, scdlfs sampler class, its arguments beside seed, rank and world size): the orders
# each rank takes in turn.
SAMPLER_ORDERS = [
    ("windows of 4 chunks", "ChunkWindowSampler", dict(chunks_per_window=4)),
    ("blocks of 32, batch 64 x fetch 16", "BlockSampler", dict(block_size=32, batch_size=64, fetch_factor=16)),
    ("blocks of 1, batch 256 x fetch 16", "BlockSampler", dict(block_size=1, batch_size=256, fetch_factor=16)),
]
ATLAS_DIR = os.path.join(REPO, "bench", "atlas")
MANIFEST = ".scdlfs-manifest"  # scdl_format::manifest's object name
# The flat view's files the first `ls` must show.
FLAT_FILES = {"data.npy", "col_ptr.npy", "row_ptr.npy", "header.sch", "metadata.json"}
# Printed by the first-row interpreter: the clock starts once the reader's modules (and
# torch) are imported, which costs the same on local disk.
FIRST_ROW = """
import json, sys, time
from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset
started = time.perf_counter()
dataset = SingleCellMemMapDataset(sys.argv[1])
opened = time.perf_counter()
rows = dataset.row_index.size - 1
values, columns = dataset.get_row(rows // 2)[0]
done = time.perf_counter()
print(json.dumps(dict(open_s=opened - started, first_row_s=done - started, rows=rows, values=len(values))))
"""


def atlas_dataset(args):
    """The atlas of this run's size under the work directory, made if missing, without a
    manifest: (the endpoint's root folder, the dataset's name, its rows)."""
    rows = QUICK_ATLAS_ROWS if args.quick else ATLAS_ROWS
    name = "ds-%d" % rows
    root = os.path.join(args.work, "atlas-root")
    ds = os.path.join(root, ATLAS_BUCKET, name)
    made = os.path.join(root, ".made-%s-%d" % (name, ATLAS_CHUNK_ROWS))
    if not os.path.exists(made):
        log("generating the atlas %s (%d rows in chunks of %d)" % (name, rows, ATLAS_CHUNK_ROWS))
        shutil.rmtree(ds, ignore_errors=True)
        subprocess.run([python(), os.path.join(ATLAS_DIR, "make.py"), ds, str(rows), str(ATLAS_CHUNK_ROWS)],
                       check=True, stdout=subprocess.DEVNULL)
        open(made, "w").close()
    return root, name, rows


def remove_manifest(root, name):
    """The dataset as listed alone: without the manifest an earlier run or bench wrote."""
    manifest = os.path.join(root, ATLAS_BUCKET, name, MANIFEST)
    if os.path.exists(manifest):
        os.remove(manifest)


def python():
    return os.path.join(test_venv(), "bin", "python")


def start_endpoint(args, root):
    """serve.py for listings behind nginx for the objects' GETs (a Python server answered
    about as many GETs a second as the reading ranks asked for, and bounded them)."""
    port = free_port()
    proc = spawn([sys.executable, os.path.join(ATLAS_DIR, "serve.py"), root, str(port), str(ATLAS_PAGE_DELAY_S)],
                 "the atlas endpoint", stderr=open(os.path.join(args.work, "logs", "atlas-serve.log"), "w"))
    wait_port(port, proc, "the atlas endpoint", timeout=300)
    front = start_nginx(os.path.join(args.work, "nginx-atlas"), root, port,
                        os.path.join(args.work, "logs", "atlas-nginx.log"), log_row_offsets=True)
    return "http://127.0.0.1:%d" % front, proc


def list_pages(endpoint, name):
    """Listing pages the endpoint answered so far under the dataset `name` (not the
    bucket's root, which a mount lists whenever it starts)."""
    with urllib.request.urlopen(endpoint + "/__stats", timeout=30) as answer:
        pages = json.load(answer)["list_pages"]
    return sum(n for prefix, n in pages.items() if prefix.startswith(name + "/"))


def mount(args, endpoint, mnt, cache, run_i, what):
    """A fresh mount of the bucket with an empty cache; returns the daemon."""
    fresh_dir(mnt)
    fresh_dir(cache)
    log_path = os.path.join(args.work, "logs", "atlas-%d-%s.log" % (run_i, what))
    proc = spawn([BIN.scdlfs, "mount", "s3://" + ATLAS_BUCKET, mnt, "--endpoint-url", endpoint, "--cache-dir",
                  cache, "--cache-size", ATLAS_CACHE_SIZE, "--foreground"], "scdlfs (atlas)", env=clean_env(),
                 stderr=open(log_path, "w"))
    MOUNTS.append(mnt)
    wait_mounted(mnt, proc, "scdlfs (atlas)", mnt)
    return proc


def first_ls(endpoint, mnt, name, proc, pages):
    """`pages`: the dataset's listing pages before the mount started."""
    cpu = cpu_seconds(proc.pid)
    started = time.perf_counter()
    entries = os.listdir(os.path.join(mnt, name))
    seconds = time.perf_counter() - started
    return dict(seconds=seconds, entries=sorted(entries), list_pages=list_pages(endpoint, name) - pages,
                daemon_cpu_s=cpu_seconds(proc.pid) - cpu)


def write_manifest(endpoint, name):
    subprocess.run([BIN.scdlfs, "manifest", "s3://%s/%s" % (ATLAS_BUCKET, name), "--endpoint-url", endpoint],
                   check=True, env=clean_env(), stdout=subprocess.DEVNULL)


def first_row(dataset_dir):
    out = subprocess.run([python(), "-c", FIRST_ROW, dataset_dir], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def row_offsets_log(args):
    """nginx's log of the row_ptr.npy GETs it answered (servers.ROW_OFFSETS_LOG)."""
    return os.path.join(args.work, "nginx-atlas", "row_offsets.log")


def row_offsets_served(log, since):
    """What the endpoint served of row_ptr.npy objects from byte `since` of its log on:
    bytes in all, distinct bytes (each object's ranges joined), objects."""
    ranges = {}
    with open(log, "rb") as f:
        f.seek(since)
        for line in f.read().decode().splitlines():
            key, asked, status, sent = line.split()
            start = int(asked.split("=", 1)[1].split("-")[0]) if asked.startswith("bytes=") else 0
            if status in ("200", "206") and int(sent) > 0:
                ranges.setdefault(key, []).append((start, start + int(sent)))
    served = distinct = 0
    for spans in ranges.values():
        served += sum(end - start for start, end in spans)
        reach = 0
        for start, end in sorted(spans):
            distinct += max(0, end - max(start, reach))
            reach = max(reach, end)
    return dict(served_bytes=served, distinct_bytes=distinct, objects=len(ranges))


def ranks(args, dataset_dir, proc, mnt, run_i, endpoint):
    """ATLAS_RANKS rank processes through every sampler order, one order at a time; their
    results, the daemon's peak RSS and what it fetched meanwhile, and per order the row
    offsets fetched (the daemon's row_offset_bytes_fetched) against the distinct row-offset
    bytes the endpoint served (nginx's log of them): how often a chunk's row offsets were
    fetched again."""
    world = QUICK_ATLAS_RANKS if args.quick else ATLAS_RANKS
    rows = QUICK_ATLAS_READ_ROWS if args.quick else ATLAS_READ_ROWS
    counters = scdlfs_status(mnt)["counters"]
    results, row_offsets = [], []
    for order in SAMPLER_ORDERS:
        barrier = fresh_dir(os.path.join(args.work, "atlas-barrier"))
        log = row_offsets_log(args)
        since = os.path.getsize(log) if os.path.exists(log) else 0
        before = scdlfs_status(mnt)["counters"].get("row_offset_bytes_fetched", 0)
        children = [subprocess.Popen([python(), os.path.join(ATLAS_DIR, "rank.py"), dataset_dir, str(rank),
                                      str(world), str(rows), barrier, json.dumps([order])],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for rank in range(world)]
        for rank, child in enumerate(children):
            out, err = child.communicate()
            if child.returncode != 0:
                raise RuntimeError("atlas rank %d of %d exited with %d: %s" % (rank, world, child.returncode,
                                                                               err.strip()[-2000:]))
            results += [json.loads(line) for line in out.splitlines()]
        fetched = scdlfs_status(mnt)["counters"].get("row_offset_bytes_fetched", 0) - before
        row_offsets.append(dict(order=order[0], fetched_bytes=fetched, **row_offsets_served(log, since)))
    after = scdlfs_status(mnt)
    fetched = {k: after["counters"][k] - counters[k] for k in (
        "bytes_fetched", "parts_fetched", "direct_reads", "edges_fetched", "planned_requests")}
    return dict(world=world, rows_per_rank=rows, orders=results, daemon_peak_rss_mib=peak_rss_kib(proc.pid) / 1024,
                fetched=fetched, row_offsets=row_offsets, run=run_i)


def run_atlas(args):
    """Every run's measurements (the module's doc), as one results dict."""
    root, name, rows = atlas_dataset(args)
    endpoint, server = start_endpoint(args, root)
    mnt, cache = os.path.join(args.work, "mnt", "atlas"), os.path.join(args.work, "cache", "atlas")
    runs = []
    try:
        for run_i in range(args.runs):
            r = dict(run=run_i)
            remove_manifest(root, name)
            pages = list_pages(endpoint, name)
            proc = mount(args, endpoint, mnt, cache, run_i, "listed")
            r["ls_listed"] = first_ls(endpoint, mnt, name, proc, pages)
            unmount(mnt)
            stop(proc)
            write_manifest(endpoint, name)
            pages = list_pages(endpoint, name)
            proc = mount(args, endpoint, mnt, cache, run_i, "manifest")
            r["ls_manifest"] = first_ls(endpoint, mnt, name, proc, pages)
            r["first_row"] = first_row(os.path.join(mnt, name))
            r["ranks"] = ranks(args, os.path.join(mnt, name), proc, mnt, run_i, endpoint)
            unmount(mnt)
            stop(proc)
            log("atlas run %d: first ls %.2f s listed (%d pages), %.2f s with the manifest (%d pages); first row "
                "%.2f s; %d ranks, daemon peak RSS %.0f MiB" % (
                    run_i, r["ls_listed"]["seconds"], r["ls_listed"]["list_pages"], r["ls_manifest"]["seconds"],
                    r["ls_manifest"]["list_pages"], r["first_row"]["first_row_s"], r["ranks"]["world"],
                    r["ranks"]["daemon_peak_rss_mib"]))
            runs.append(r)
    finally:
        unmount(mnt)
        stop(server)
    chunks = -(-rows // ATLAS_CHUNK_ROWS)
    return dict(rows=rows, chunks=chunks, objects=3 * chunks + 3, chunk_rows=ATLAS_CHUNK_ROWS,
                page_delay_s=ATLAS_PAGE_DELAY_S, cache_size=ATLAS_CACHE_SIZE, runs=runs)


def atlas_problems(saved):
    """What --quick fails on: a step that returned the wrong thing (never a time), or a
    mount with a manifest that listed the dataset (a quarter of the pages listed without)."""
    problems = []
    for r in saved["runs"]:
        for case in ("ls_listed", "ls_manifest"):
            missing = FLAT_FILES - set(r[case]["entries"])
            if missing:
                problems.append("atlas run %d, %s: the first ls lacks %s" % (r["run"], case, sorted(missing)))
        # A page or two besides the manifest were seen at 10^8 rows (of 94 listed without).
        if r["ls_manifest"]["list_pages"] * 4 >= max(r["ls_listed"]["list_pages"], 4):
            problems.append("atlas run %d: the mount with a manifest listed %d pages of the dataset, %d without" % (
                r["run"], r["ls_manifest"]["list_pages"], r["ls_listed"]["list_pages"]))
        if r["first_row"]["rows"] != saved["rows"] or r["first_row"]["values"] != 2000:
            problems.append("atlas run %d: the released reader saw %d rows and a row of %d values" % (
                r["run"], r["first_row"]["rows"], r["first_row"]["values"]))
        got = r["ranks"]["orders"]
        if len(got) != r["ranks"]["world"] * len(SAMPLER_ORDERS):
            problems.append("atlas run %d: %d rank results of %d" % (
                r["run"], len(got), r["ranks"]["world"] * len(SAMPLER_ORDERS)))
        for o in got:
            if o["rows_read"] != r["ranks"]["rows_per_rank"] or not o["hints_active"] or o["hint_error"]:
                problems.append("atlas run %d, rank %d, %s: %d rows read, hints active %s, hint error %s" % (
                    r["run"], o["rank"], o["order"], o["rows_read"], o["hints_active"], o["hint_error"]))
    return problems


def atlas_section(saved, results_path):
    """The atlas section of docs/benchmarks.md, between markers: medians over the runs."""
    runs = saved["runs"]
    lines = [ATLAS_BEGIN, "## An atlas opens at once", ""]
    w = lines.append
    w("Issue 40: a chunked dataset of %s rows in %s chunks of %s rows (%s objects; real `row_ptr` files, sparse "
      "value files), served by bench/atlas/serve.py on 127.0.0.1, which answers each listing page after %.2f s "
      "(the objects' GETs by nginx in front of it); "
      "fresh mounts of the bucket with an empty %s cache. Measured %s on %s, medians of %d run(s)." % (
          format(saved["rows"], ","), format(saved["chunks"], ","), format(saved["chunk_rows"], ","),
          format(saved["objects"], ","), saved["page_delay_s"], saved["cache_size"], saved["date"], saved["host"],
          len(runs)))
    w("")
    w("| step | seconds | listing pages | daemon CPU s |")
    w("| --- | ---: | ---: | ---: |")
    for case, label in (("ls_listed", "first `ls`, no manifest"), ("ls_manifest", "first `ls`, with a manifest")):
        w("| %s | %.2f | %d | %.2f |" % (label, med([r[case]["seconds"] for r in runs]),
                                          med([r[case]["list_pages"] for r in runs]),
                                          med([r[case]["daemon_cpu_s"] for r in runs])))
    w("| released reader: open, then the middle row (modules imported before) | %.2f | — | — |"
      % med([r["first_row"]["first_row_s"] for r in runs]))
    w("")
    world = runs[0]["ranks"]["world"]
    w("%d ranks at once on the mount, each order in turn: *sampler s* and *sampler MiB*: building the rank's "
      "sampler, len(), state_dict() and its first 10,000 indices (their hints written), and the resident memory "
      "that added (the worst rank); *read s*: the slowest rank's first %d rows, from a fresh sampler of the same "
      "seed, each read through `get_row` as the sampler yields it (as a training loop takes them) and checked "
      "against the row offsets. The ranks share the machine's cores with each other and the daemon; one "
      "process alone is measured by bench/sampler_footprint.py (docs/architecture.md, the samplers)."
      % (world, runs[0]["ranks"]["rows_per_rank"]))
    w("")
    w("| order | sampler s | sampler MiB | read s |")
    w("| --- | ---: | ---: | ---: |")
    for label, _, _ in SAMPLER_ORDERS:
        of = [[o for o in r["ranks"]["orders"] if o["order"] == label] for r in runs]
        w("| %s | %.3f | %.1f | %.2f |" % (label, med([max(o["sampler_s"] for o in os_) for os_ in of]),
                                            med([max(o["sampler_mib"] for o in os_) for os_ in of]),
                                            med([max(o["read_s"] for o in os_) for os_ in of])))
    fetched = [r["ranks"]["fetched"] for r in runs]
    w("")
    w("The daemon's peak RSS over the whole mount: **%.0f MiB** (issue 40's target is 128 MiB or less; what the peak "
      "holds, by heaptrack, is in docs/architecture.md, \"The daemon's memory at atlas scale\"). For the ranks' plans "
      "(the first 10,000 indices "
      "of each rank in each order, then the reading sampler's steps as it went) it fetched %.1f MB in %d planned requests, "
      "%d parts and %d direct reads." % (
          med([r["ranks"]["daemon_peak_rss_mib"] for r in runs]), med([f["bytes_fetched"] for f in fetched]) / 1e6,
          med([f["planned_requests"] for f in fetched]), med([f["parts_fetched"] for f in fetched]),
          med([f["direct_reads"] for f in fetched])))
    if all("row_offsets" in r["ranks"] for r in runs):
        w("")
        w("Row offsets, each order (the ranks run one order at a time): *fetched* is the daemon's "
          "`row_offset_bytes_fetched` (the `row_ptr.npy` bytes its GETs were answered with), *distinct* the bytes of "
          "`row_ptr.npy` objects the endpoint served at least once; their ratio is how often a chunk's row offsets "
          "were fetched, over the steps the ranks planned and read (not a whole epoch; issue 40's target for random "
          "blocks is 1.05 or less).")
        w("")
        w("| order | chunks' row offsets served | fetched MB | distinct MB | fetched ÷ distinct |")
        w("| --- | ---: | ---: | ---: | ---: |")
        for label, _, _ in SAMPLER_ORDERS:
            of = [next(o for o in r["ranks"]["row_offsets"] if o["order"] == label) for r in runs]
            w("| %s | %d | %.1f | %.1f | %.3f |" % (
                label, med([o["objects"] for o in of]), med([o["fetched_bytes"] for o in of]) / 1e6,
                med([o["distinct_bytes"] for o in of]) / 1e6,
                med([o["fetched_bytes"] / max(o["distinct_bytes"], 1) for o in of])))
    w("")
    w("Raw results of this section: `%s`." % os.path.relpath(results_path, REPO))
    w(ATLAS_END)
    return lines
