"""A hostile hint writer beside another user's cold epoch (issue 30): on a mount with
`--allow-other`, the cold windows epoch with hints of `scdlfs-bench read` (the victim,
root) alone, and with the hostile writer of the tests (tests/common/hostile_hints.sh: as
uid 65534, many hint handles, plans of wide `rows` steps restarted as fast as it can)
writing the same dataset's hint file from before the victim's first row to after its
last. The dataset has many small chunks (HOSTILE_CHUNKS), so that a step over every row
spans that many chunks; the mount reads it from a local folder (`file://`), with no
link: a listing of its 30,000 objects takes minutes from moto_server or s3s-fs (2.9 s a
page of 1,000 from s3s-fs, measured), past the lookup deadline that cancels it, and
without a link the daemon's own work, which the writer attacks, bounds the epoch. A
fresh mount and empty cache per epoch; the two epochs of a run in turns (alone first in
even runs, second in odd ones), so that a drift of the machine's load falls on both.
Each epoch with the writer records the writer's refusals from `status`, and fails unless
the writer was refused at least once: a writer that never reached the mount measured
nothing. Epochs stop after HOSTILE_TIME_LIMIT s (--quick: a dataset of fewer chunks, and
the run's time limit)."""

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from .config import (BUCKET, DROPPED, HOSTILE, HOSTILE_ALONE, HOSTILE_BESIDE, HOSTILE_CHUNK_ROWS, HOSTILE_CHUNKS,
                     HOSTILE_MEAN_VALUES, HOSTILE_TIME_LIMIT, QUICK_HOSTILE_CHUNKS, REPO)
from .measure import Epoch, mount_and_read, read_epoch, scdlfs_status
from .procs import clean_env, fresh_dir, log, unmount
from .servers import gen
from .tools import BIN

# The hint file of a dataset directory (scdl_format::hint::HINT_FILE).
HINT_FILE = ".scdlfs-hints"
HOSTILE_SCRIPT = os.path.join(REPO, "tests", "common", "hostile_hints.sh")
# `nobody` on Debian, as in the tests.
HOSTILE_UID = 65534
# How long the writer runs before the victim starts: its handles open and its first plans
# written, so that the victim's first row meets them.
HOSTILE_HEAD_START_S = 1.0
# The writer's own deadline, past any epoch's end (it is stopped when the epoch ends).
HOSTILE_MAX_S = 3600
# Bytes of a row of HOSTILE_MEAN_VALUES values: f32 values and u16 column ids.
ROW_BYTES = 6 * HOSTILE_MEAN_VALUES


def hostile_ctx(ctx):
    """The run's dataset of many small chunks (made and served once), as a `Ctx` reading
    through the run's link."""
    if getattr(ctx, "hostile", None) is None:
        args = ctx.args
        chunks = QUICK_HOSTILE_CHUNKS if args.quick else HOSTILE_CHUNKS
        name = "hostile-%dx%d" % (chunks, HOSTILE_CHUNK_ROWS)
        ds = os.path.join(args.work, "s3root", BUCKET, name)
        digests = os.path.join(args.work, "digests", name)
        if not (os.path.exists(digests + ".json") and os.path.isdir(ds)):
            os.makedirs(os.path.dirname(digests), exist_ok=True)
            log("generating %s" % name)
            # At least `chunks` chunks: the generator takes whole MB.
            size_mb = -(-chunks * HOSTILE_CHUNK_ROWS * ROW_BYTES // 1_000_000)
            gen(ds, digests, size_mb, HOSTILE_CHUNK_ROWS, HOSTILE_MEAN_VALUES)
        info = json.load(open(digests + ".json"))
        if info["num_chunks"] < chunks:
            raise RuntimeError("%s has %d chunks, not the %d asked for" % (name, info["num_chunks"], chunks))
        # No link: the daemon's bytes fetched come from its own counters.
        # The other user must reach the dataset through the mountpoint: under the system's
        # temporary directory, not the work directory, which may sit in a home of mode 700.
        mnt_parent = tempfile.mkdtemp(prefix="scdlfs-bench-hostile-")
        os.chmod(mnt_parent, 0o755)
        atexit.register(lambda: (unmount(os.path.join(mnt_parent, "scdlfs")), shutil.rmtree(mnt_parent, True)))
        ctx.hostile = ctx.but(name=name, info=info, digests=digests, proxy=None, stats=None,
                              source=os.path.dirname(ds), mnt_parent=mnt_parent)
    return ctx.hostile


def hostile_mount_cmd(h, mnt, cache):
    """The mount of the folder holding the dataset, open to other users."""
    return [BIN.scdlfs, "mount", "file://" + h.source, mnt, "--cache-dir", cache, "--cache-size", h.cache_size,
            "--foreground", "--log-level", "warn", "--allow-other"] + h.mount_args


def start_hostile_writer(hints, rows, log_path):
    """tests/common/hostile_hints.sh as uid 65534 on `hints`, in a session of its own (its
    sleepers hold handles too, and stop with it)."""
    # The script's text, not its path: uid 65534 may not reach the repository (a home
    # directory of mode 700), as it may not reach the work directory.
    with open(HOSTILE_SCRIPT) as f:
        script = f.read()
    return subprocess.Popen(["bash", "-c", script, "hostile", hints, str(HOSTILE_MAX_S), str(rows)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log_path, "a"),
                            user=HOSTILE_UID, group=HOSTILE_UID, extra_groups=[], start_new_session=True)


def stop_hostile_writer(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def hostile_refused(mnt):
    """The hostile writer's refused hint writes and opens so far, and how many of them were
    answered late (0 from a daemon that answers every refusal at once), from the mount's
    status."""
    mine = [r for r in scdlfs_status(mnt)["hint_refusals"] if r["uid"] == HOSTILE_UID]
    return (mine[0]["refused"], mine[0].get("answered_late", 0)) if mine else (0, 0)


def read_beside_hostile(mnt, rows, log_path):
    """A reader for mount_and_read: read_epoch with the hostile writer running from
    HOSTILE_HEAD_START_S before it to its end; adds the writer's refusals."""

    def read(ctx, dataset_dir, order, epoch, hints=True, limit=None):
        writer = start_hostile_writer(os.path.join(dataset_dir, HINT_FILE), rows, log_path)
        try:
            time.sleep(HOSTILE_HEAD_START_S)
            if writer.poll() is not None:
                raise RuntimeError("the hostile writer exited with %s before the epoch (see %s)"
                                   % (writer.returncode, log_path))
            r = read_epoch(ctx, dataset_dir, order, epoch, hints, limit)
        finally:
            stop_hostile_writer(writer)
        r["hostile_refused"], r["hostile_answered_late"] = hostile_refused(mnt)
        if r["hostile_refused"] == 0:
            raise RuntimeError("the hostile writer was never refused: it did not reach the mount (see %s)" % log_path)
        return r

    return read


def sys_hostile(ctx, order, run_i):
    h = hostile_ctx(ctx)
    limit = HOSTILE_TIME_LIMIT if not ctx.args.quick else ctx.limit
    log_path = os.path.join(ctx.work, "logs", "hostile-writer.log")
    results = []
    turns = [(HOSTILE_ALONE, False), (HOSTILE_BESIDE, True)]
    for label, beside in turns if run_i % 2 == 0 else reversed(turns):
        mnt = fresh_dir(os.path.join(h.mnt_parent, "scdlfs"))
        os.chmod(mnt, 0o755)
        cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
        reader = read_beside_hostile(mnt, h.info["rows"], log_path) if beside else read_epoch
        epoch = Epoch(label, "windows", 2 * run_i, DROPPED, True, limit)
        results += mount_and_read(h, "scdlfs", hostile_mount_cmd(h, mnt, cache), clean_env(), mnt,
                                  os.path.join(mnt, h.name), [epoch], reader, layout="flat", scdlfs=True)
    for r in results:
        r.update(dataset_bytes=h.info["bytes"], dataset_rows=h.info["rows"], dataset_chunks=h.info["num_chunks"],
                 hostile_family=HOSTILE)
    return results


def epoch_seconds(r):
    """An epoch's seconds, extrapolated from its rows/s where time-bounded."""
    return r["seconds"] * r["epoch_rows"] / max(r["rows"], 1)


def hostile_runs(results):
    """Per run with both epochs: the victim's epoch alone and beside the writer (their
    results), the ratio of their epoch seconds, and which ran first."""
    by_run = {}
    for r in results:
        if r["system"] in (HOSTILE_ALONE, HOSTILE_BESIDE):
            by_run.setdefault(r["run"], {})[r["system"]] = r
    runs = []
    for run_i, pair in sorted(by_run.items()):
        if len(pair) == 2:
            alone, beside = pair[HOSTILE_ALONE], pair[HOSTILE_BESIDE]
            runs.append(dict(run=run_i, alone=alone, beside=beside,
                             ratio=epoch_seconds(beside) / epoch_seconds(alone),
                             alone_first=run_i % 2 == 0))
    return runs
