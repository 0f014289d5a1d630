"""The restart system: a full cache across a daemon's restart (the first epoch after a
remount against a long-running mount), and mount to first row with a large cache."""

import os
import subprocess
import time

from .config import (BUCKET, DROPPED, QUICK_STARTUP_PARTS, RESTART_FIRST, RESTART_LONG, STARTUP_PART_SIZE,
                     STARTUP_PARTS)
from .measure import Epoch, drop_page_cache, mount_and_read, read_epoch, scdlfs_status
from .procs import MOUNTS, clean_env, fresh_dir, is_mounted, log, run, spawn, stop, unmount, wait_mounted
from .servers import generate, start_moto, start_proxy, upload
from .systems import Ctx, scdlfs_cmd
from .tools import BIN, moto_server


def etag_link(ctx, args):
    """The main dataset on an S3 endpoint behind the link whose listings carry ETags, which
    adoption needs (s3s-fs lists none, so nothing of its objects is adopted after a
    restart): the run's own server if it is moto_server, else a moto_server of its own
    behind a second proxy with the same link. Returns a copy of ctx pointing there."""
    if getattr(ctx, "etag_ctx", None):
        return ctx.etag_ctx
    other = Ctx()
    other.__dict__.update(ctx.__dict__)
    if args.server != "moto":
        endpoint = start_moto(moto_server(), "moto_server (restarts)")
        log("uploading %s to moto_server for the restart case" % ctx.name)
        upload(endpoint, ctx.name, os.path.join(args.work, "s3root", BUCKET, ctx.name))
        other.proxy, other.stats = start_proxy(endpoint, args.rate_mbps, args.latency_ms,
                                               os.path.join(args.work, "logs", "proxy.log"))
    ctx.etag_ctx = other
    return other


def sys_restart(ctx, args, run_i):
    """A full cache across a restart. A fresh mount reads the dataset through once (its cache,
    twice the dataset, then holds all of it) and reads windows epoch 2r+1 (*warm, long-running
    mount*); its daemon is stopped, a new one mounts the same cache directory, and reads epoch
    2r+1 again (*first epoch after a remount*): what it reads was downloaded by the daemon
    before. Before each epoch the page cache is dropped and the cache directory's files read
    back: the state after a service restart (the mount's own page cache is gone, the part
    files' pages are not), so that the ratio shows the daemon's costs, not the disk's."""
    e = etag_link(ctx, args)
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "restart"))
    cmd = scdlfs_cmd(e, mnt, cache, str(2 * ctx.info["bytes"] + (64 << 20)))
    dataset = os.path.join(mnt, ctx.name)
    epoch = 2 * run_i + 1
    results = mount_and_read(e, "scdlfs", cmd, clean_env(), mnt, dataset,
                             [Epoch(RESTART_LONG, "windows", epoch, DROPPED, True, ctx.limit, fill=True,
                                    reread=cache)], layout="flat", scdlfs=True)
    results += mount_and_read(e, "scdlfs", cmd, clean_env(), mnt, dataset,
                              [Epoch(RESTART_FIRST, "windows", epoch, DROPPED, True, ctx.limit, reread=cache)],
                              layout="flat", scdlfs=True)
    return results


def startup_cache(ctx, args):
    """The startup case's source and its cache, made once per run of the driver: a local
    folder (the bucket's folder) with a dataset whose parts of STARTUP_PART_SIZE number at
    least the parts wanted (the main dataset for --quick), and a cache directory holding all
    of them, filled by `scdlfs warm --all` on a mount of that folder."""
    if getattr(ctx, "startup", None):
        return ctx.startup
    wanted = QUICK_STARTUP_PARTS if args.quick else STARTUP_PARTS
    if args.quick:
        name, info = ctx.name, ctx.info
    else:
        # The generator's size is approximate (-2 % here), and the last part of each object short.
        size_mb = -(-wanted * STARTUP_PART_SIZE * 106 // 100 // 10**6)
        name = "ds-startup-%d" % size_mb
        info = generate(args, name, size_mb)
    st = Ctx()
    st.__dict__.update(ctx.__dict__)
    st.name, st.info = name, info
    st.digests = os.path.join(args.work, "digests", name)
    st.source = os.path.join(args.work, "s3root", BUCKET)
    st.cache_size = str(2 * info["bytes"] + (64 << 20))
    st.cache = fresh_dir(os.path.join(ctx.work, "cache", "startup"))
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "startup"))
    MOUNTS.append(mnt)
    log("filling a cache with the parts of %s at %d bytes each (scdlfs warm --all)" % (name, STARTUP_PART_SIZE))
    proc = spawn(startup_cmd(st, mnt, st.cache), "scdlfs (startup fill)")
    started = time.time()
    try:
        wait_mounted(mnt, proc, "scdlfs (startup fill)", os.path.join(mnt, name, "header.sch"))
        run([BIN.scdlfs, "warm", os.path.join(mnt, name), "--all", "--quiet"], stdout=subprocess.DEVNULL)
        st.parts = scdlfs_status(mnt)["cache"]["cached_parts"]
        st.cache_bytes = scdlfs_status(mnt)["cache"]["cached_bytes"]
    finally:
        stop(proc)
        unmount(mnt)
    st.fill_s = time.time() - started
    if st.parts < wanted:
        raise RuntimeError("the startup cache holds %d parts, fewer than %d" % (st.parts, wanted))
    ctx.startup = st
    return st


def startup_cmd(st, mnt, cache):
    return [BIN.scdlfs, "mount", st.source, mnt, "--cache-dir", cache, "--cache-size", st.cache_size,
            "--read-part-size", str(STARTUP_PART_SIZE), "--foreground", "--log-level", "warn"]


def first_row_after_mount(st, cache, label):
    """With the page cache dropped: the time from starting `scdlfs mount` to the first row a
    new reader gets (no hints), the mount's parts, and when it has read the headers of the
    earlier mount's part files."""
    mnt = fresh_dir(os.path.join(st.work, "mnt", "startup"))
    MOUNTS.append(mnt)
    dataset = os.path.join(mnt, st.name)
    drop_page_cache()
    t0 = time.time()
    proc = spawn(startup_cmd(st, mnt, cache), "scdlfs (startup)")
    try:
        while not (is_mounted(mnt) and os.path.exists(os.path.join(dataset, "header.sch"))):
            if proc.poll() is not None or time.time() - t0 > 120:
                raise RuntimeError("scdlfs did not mount %s" % mnt)
            time.sleep(0.002)
        visible = time.time() - t0
        r = read_epoch(st, dataset, "windows", 0, hints=False, limit=0.001)
        first_row = visible + r["first_row_s"]
        status = scdlfs_status(mnt)
        while not status["cache"]["adoption_done"] and time.time() - t0 < 300:
            time.sleep(0.01)
            status = scdlfs_status(mnt)
        adopted_s = time.time() - t0 if status["cache"]["adoption_done"] else None
    finally:
        stop(proc)
        unmount(mnt)
    return dict(system=label, kind="startup", dataset_visible_s=visible, first_row_s=first_row,
                adoption_done_s=adopted_s, parts_fetched=status["counters"]["parts_fetched"],
                adopted_parts=status["cache"]["adopted_parts"], adopted_by_reads=status["cache"]["adopted_by_reads"],
                cached_parts=status["cache"]["cached_parts"],
                load_1m=os.getloadavg()[0])


def sys_startup(ctx, args, run_i):
    """Mount to first row, with the cache of STARTUP_PARTS parts and with an empty one."""
    st = startup_cache(ctx, args)
    empty = fresh_dir(os.path.join(ctx.work, "cache", "startup-empty"))
    rows = [first_row_after_mount(st, st.cache, "cache of %d parts" % st.parts),
            first_row_after_mount(st, empty, "empty cache")]
    for r in rows:
        r.update(parts=st.parts, cache_bytes=st.cache_bytes, fill_s=st.fill_s, dataset=st.name,
                 dataset_bytes=st.info["bytes"])
    return rows
