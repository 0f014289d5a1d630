"""The systems under test: each reads the epochs of one order in one run, on fresh
mounts and caches, and returns their results (driver/registry.py says which run in which
order). `Ctx` is what they share: the run's dataset, endpoints, link and settings."""

import json
import os
import shutil
import subprocess

from .config import BUCKET, CACHE_AWARE, DROPPED, HALF, KEY, PYTHON_LOADER_CHUNKS, REPO, SECRET, TORCH, WARM
from .measure import (Epoch, mount_and_read, prepare, read_epoch, read_torch_epoch, run_sampling_rss, size_bytes,
                      tag, with_machine_counters)
from .offline_bound import dataset_chunk_bytes, epoch_chunks, offline_next_epoch_bytes
from .procs import MOUNTS, clean_env, fresh_dir, log, run, spawn, stop, unmount, wait_mounted
from .servers import proxy_bytes
from .summary import med
from .tools import BIN


class Ctx:
    """The run's dataset (`name`, `info`, `digests`), server and link (`endpoint`, `proxy`,
    `stats`), and settings (`work`, `seed`, `limit`, `cache_size`, `mount_args`, the
    Pythons, `args`); systems copy it to read another dataset or through another link
    (`stats` None: no link, the daemon's own counters count the bytes fetched).
    `order_args`: more options of every reader's order (the large chunks' windows of 2)."""

    mount_args = []
    order_args = []

    def but(self, **changes):
        """A copy with `changes`: another dataset, link or order."""
        other = Ctx()
        other.__dict__.update(self.__dict__)
        other.__dict__.update(changes)
        return other


def flat_local_copy(ctx):
    """The flat archive on local disk, as the flat view shows it: the flat view's files
    copied once from a mount straight to the server (not through the link), with
    .chunked/header.sch so that the sampler sees the same chunks as on the mount."""
    dest = os.path.join(ctx.work, "local-flat", ctx.name)
    if os.path.exists(os.path.join(dest, ".complete")):
        return dest
    log("copying the flat view of %s to local disk" % ctx.name)
    shutil.rmtree(dest, ignore_errors=True)
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "copy"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "copy"))
    cmd = [BIN.scdlfs, "mount", "s3://" + BUCKET, mnt, "--endpoint-url", ctx.endpoint, "--region", "us-east-1",
           "--cache-dir", cache, "--cache-size", "1GiB", "--foreground", "--log-level", "warn"]
    MOUNTS.append(mnt)
    proc = spawn(cmd, "scdlfs (copy)", env=clean_env(), stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        src = os.path.join(mnt, ctx.name)
        wait_mounted(mnt, proc, "scdlfs (copy)", os.path.join(src, "header.sch"))
        shutil.copytree(src, dest, ignore=lambda d, names: [n for n in names if n.startswith(".")])
        os.makedirs(os.path.join(dest, ".chunked"))
        shutil.copy(os.path.join(src, ".chunked", "header.sch"), os.path.join(dest, ".chunked", "header.sch"))
        open(os.path.join(dest, ".complete"), "w").close()
    finally:
        stop(proc)
        unmount(mnt)
    return dest


def sys_local(ctx, order, run_i, reader=read_epoch, prefix=""):
    """Local disk reading the flat archive, in the states and epochs scdlfs reads in (see
    sys_scdlfs): epoch 2r and 2r+1 with the page cache dropped, 2r+1 with it warm."""
    local = flat_local_copy(ctx)
    results = []
    for e in (Epoch(prefix + "local disk, " + DROPPED, order, 2 * run_i, DROPPED),
              Epoch(prefix + "local disk, " + DROPPED, order, 2 * run_i + 1, DROPPED),
              Epoch(prefix + "local disk, " + WARM, order, 2 * run_i + 1, WARM)):
        prepare(local, e)
        r = with_machine_counters(ctx, lambda: reader(ctx, local, order, e.epoch, True, None))
        r.update(bytes_fetched=0, daemon_peak_rss_kib=None)
        results.append(tag(r, e, "flat"))
    return results


def scdlfs_cmd(ctx, mnt, cache, cache_size=None):
    return [BIN.scdlfs, "mount", "s3://" + BUCKET, mnt, "--endpoint-url", ctx.proxy, "--region", "us-east-1",
            "--cache-dir", cache, "--cache-size", cache_size or ctx.cache_size, "--foreground", "--log-level", "warn"
            ] + ctx.mount_args


def sys_scdlfs_half(ctx, run_i, hints, prefix="", cache_aware=False):
    """The case scdlfs exists for, a cache of half the dataset: on a fresh mount, the cold
    windows epoch 2r, then epoch 2r+1 (a new order) with the page cache dropped; the bytes
    the second epoch fetches are compared with the floor, dataset minus cache.
    `cache_aware`: the second epoch reads the chunks the mount announces it holds first."""
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
    h = ("hints" if hints else "no hints") + (", " + CACHE_AWARE if cache_aware else "")
    epochs = [Epoch("%s%s, cold, %s" % (prefix, HALF, h), "windows", 2 * run_i, DROPPED, hints, ctx.limit),
              Epoch("%s%s, next epoch, %s" % (prefix, HALF, h), "windows", 2 * run_i + 1, DROPPED, hints,
                    ctx.limit)]
    cache_bytes = ctx.info["bytes"] // 2

    def reader(ctx, dataset_dir, order, epoch, hints, limit):
        return read_epoch(ctx, dataset_dir, order, epoch, hints, limit, cache_aware and epoch == epochs[1].epoch)

    results = mount_and_read(ctx, "scdlfs", scdlfs_cmd(ctx, mnt, cache, str(cache_bytes)), clean_env(), mnt,
                             os.path.join(mnt, ctx.name), epochs, reader, layout="flat", scdlfs=True)
    sizes = dataset_chunk_bytes(ctx)
    (before, _), (epoch, steps) = (epoch_chunks(ctx, "windows", e.epoch) for e in epochs)
    # A reader that is not to wait on the link has the next step arriving while it reads
    # one: that step's chunks take room the reuse cannot have.
    step_bytes = int(med([sum(sizes[chunk] for chunk in step) for step in steps]))
    for r in results:
        if r["epoch"] == epochs[1].epoch:
            r["offline_bound_bytes"] = offline_next_epoch_bytes(sizes, before, epoch, cache_bytes)
            # With a step most of the cache (the reduced variant), such a cache only thrashes.
            if 2 * step_bytes <= cache_bytes:
                r["offline_bound_read_ahead_bytes"] = offline_next_epoch_bytes(sizes, before, epoch,
                                                                               cache_bytes - step_bytes)
            r["step_bytes"] = step_bytes
    return results


def sys_scdlfs(ctx, order, run_i, hints, dataset=None, label_suffix="", warm=True, reader=read_epoch, prefix="",
               limit="default"):
    """The flat view on a fresh mount with an empty cache: the cold epoch 2r; then epoch 2r+1
    from the disk cache with the page cache dropped, and again with the page cache warm."""
    dataset = dataset or ctx.name
    limit = ctx.limit if limit == "default" else limit
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "scdlfs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "scdlfs"))
    h = "hints" if hints else "no hints"
    epochs = [Epoch("%sscdlfs cold, %s%s" % (prefix, h, label_suffix), order, 2 * run_i, DROPPED, hints, limit)]
    if warm:
        epochs += [Epoch("%sscdlfs disk-cache warm, %s" % (prefix, h), order, 2 * run_i + 1, DROPPED, hints, limit,
                         fill=True),
                   Epoch("%sscdlfs page-cache warm, %s" % (prefix, h), order, 2 * run_i + 1, WARM, hints, limit)]
    return mount_and_read(ctx, "scdlfs", scdlfs_cmd(ctx, mnt, cache), clean_env(), mnt, os.path.join(mnt, dataset),
                          epochs, reader, layout="flat", scdlfs=True)


def sys_torch(ctx, order, run_i):
    """The PyTorch reader on the flat archive: local disk, then scdlfs with and without
    hints, in the same epochs and page-cache states."""
    results = sys_local(ctx, order, run_i, reader=read_torch_epoch, prefix=TORCH + ", ")
    for hints in (True, False):
        results += sys_scdlfs(ctx, order, run_i, hints, reader=read_torch_epoch, prefix=TORCH + ", ")
    return results


def sys_s3fs(ctx, order, run_i, prefix=""):
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "s3fs"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "s3fs"))
    passwd = os.path.join(ctx.work, "s3fs.passwd")
    with open(passwd, "w") as f:
        f.write("%s:%s\n" % (KEY, SECRET))
    os.chmod(passwd, 0o600)
    cmd = ["s3fs", BUCKET, mnt, "-f", "-o", "url=" + ctx.proxy, "-o", "use_path_request_style",
           "-o", "passwd_file=" + passwd, "-o", "endpoint=us-east-1", "-o", "ro",
           "-o", "use_cache=" + cache, "-o", "kernel_cache", "-o", "parallel_count=16",
           "-o", "multireq_max=16", "-o", "max_stat_cache_size=100000", "-o", "stat_cache_expire=3600",
           "-o", "enable_noobj_cache", "-o", "dbglevel=err"]
    return mount_and_read(ctx, "s3fs-fuse", cmd, clean_env(), mnt, os.path.join(mnt, ctx.name),
                          [Epoch(prefix + "s3fs-fuse", order, 2 * run_i, DROPPED, False, ctx.limit)])


def sys_rclone(ctx, order, run_i):
    mnt = fresh_dir(os.path.join(ctx.work, "mnt", "rclone"))
    cache = fresh_dir(os.path.join(ctx.work, "cache", "rclone"))
    env = clean_env()
    env.update(RCLONE_CONFIG_BENCH_TYPE="s3", RCLONE_CONFIG_BENCH_PROVIDER="Other",
               RCLONE_CONFIG_BENCH_ENDPOINT=ctx.proxy, RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=KEY,
               RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=SECRET, RCLONE_CONFIG_BENCH_REGION="us-east-1",
               RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE="true", RCLONE_CONFIG="/dev/null")
    cmd = ["rclone", "mount", "bench:" + BUCKET, mnt, "--read-only", "--vfs-cache-mode", "full",
           "--cache-dir", cache, "--vfs-cache-max-size", "%dK" % (size_bytes(ctx.cache_size) // 1024),
           "--vfs-read-chunk-size", "8M", "--vfs-read-ahead", "64M", "--buffer-size", "16M",
           "--dir-cache-time", "1h", "--attr-timeout", "1h", "--no-modtime", "--log-level", "ERROR"]
    return mount_and_read(ctx, "rclone", cmd, env, mnt, os.path.join(mnt, ctx.name),
                          [Epoch("rclone mount", order, 2 * run_i, DROPPED, False, ctx.limit)])


def sys_python(ctx, order, run_i):
    order_file = os.path.join(ctx.work, "order.bin")
    run([BIN.bench, "order", "--rows", str(ctx.info["rows"]), "--chunk-rows", str(ctx.info["chunk_rows"]),
         "--order", order, "--seed", str(ctx.seed), "--epoch", str(2 * run_i), "--out", order_file])
    cache = fresh_dir(os.path.join(ctx.work, "cache", "python"))
    before = proxy_bytes(ctx.stats)
    cmd = [ctx.python, os.path.join(REPO, "bench", "chunk_loader.py"), "--endpoint", ctx.proxy,
           "--bucket", BUCKET, "--prefix", ctx.name, "--order-file", order_file, "--digests", ctx.digests,
           "--cache-dir", cache, "--max-chunks", str(PYTHON_LOADER_CHUNKS)]
    if ctx.limit:
        cmd += ["--time-limit", str(ctx.limit)]
    proc, out, err, rss = run_sampling_rss(cmd, clean_env())
    if proc.returncode != 0:
        raise RuntimeError("the Python chunk loader failed (%s): %s" % (order, err.strip()[-2000:]))
    r = json.loads(out)
    r.update(bytes_fetched=proxy_bytes(ctx.stats) - before, daemon_peak_rss_kib=rss)
    return [tag(r, Epoch("Python chunk loader", order, 2 * run_i, DROPPED), "chunked")]
