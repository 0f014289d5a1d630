"""What the reduced variant (`--quick`, run by scripts/test-all) claims, checked on its
results: every system and state ran, every epoch read enough rows, the cache budget bound
and held on every scdlfs mount, the node scenario's ranks read shares that make up the
epoch, and another user's epoch beside the hostile hint writer read every row right."""

import sys

from .config import (CEILING, DROPPED, HALF, HOSTILE_ALONE, HOSTILE_BESIDE, LARGE, NODE, NODE_SCDL, QUICK_MIN_ROWS,
                     QUICK_NODE_RANKS, RESTART_FIRST, RESTART_LONG, SMALL_CACHE, TORCH, WARM)
from .node import node_label


def quick_checks(args, systems, orders, other_orders, results, startup, info):
    """What --quick claims: every system and state ran, every epoch read enough rows (each
    checked by its reader against the generator), and on every scdlfs mount the cache
    budget bound: parts were evicted, or refused for lack of room (with a plan protecting
    what it will read, the daemon may refuse new parts rather than evict planned ones),
    and held: the cache directory never held more bytes than `--cache-size` at any sample
    taken while the mount read (driver/measure.py's CacheDirSampler)."""
    seen = {(r["system"], r["order"]) for r in results}
    scdlfs_states = ["scdlfs %s, %s" % (s, h) for s in ("cold", "disk-cache warm", "page-cache warm")
                     for h in ("hints", "no hints")]
    local_states = ["local disk, " + DROPPED, "local disk, " + WARM]
    expected = {(s, o) for o in orders for s in local_states} if "local" in systems else set()
    if "scdlfs" in systems:
        expected |= {(s, o) for o in orders for s in scdlfs_states}
    if "halfcache" in systems and "windows" in orders:
        expected |= {("%s, %s, %s" % (HALF, e, h), "windows") for e in ("cold", "next epoch")
                     for h in ("hints", "no hints")}
    for s, name in (("s3fs", "s3fs-fuse"), ("rclone", "rclone mount"), ("python", "Python chunk loader")):
        if s in systems:
            expected |= {(name, o) for o in orders if o in other_orders}
    if "torch" in systems and "windows" in orders:
        expected |= {(TORCH + ", " + s, "windows") for s in local_states + scdlfs_states}
    if "node" in systems and "windows" in orders:
        expected |= {(node_label(ranks, reader), "windows") for ranks in QUICK_NODE_RANKS
                     for reader in (NODE, NODE_SCDL)}
    if "ceiling" in systems and "windows" in orders:
        expected |= {("%s, %s" % (CEILING, s), "windows") for s in local_states + [
            "scdlfs %s, hints" % state for state in ("cold", "disk-cache warm", "page-cache warm")]}
    if "large" in systems and "windows" in orders:
        expected |= {(LARGE + ", " + s, order) for s, order in (
            ("scdlfs cold, hints", "windows"), ("scdlfs cold, no hints", "windows"), ("scdlfs cold, hints", "random"),
            ("s3fs-fuse", "random"), (HALF + ", cold, hints", "windows"), (HALF + ", next epoch, hints", "windows"))}
    if "small-cache" in systems and "windows" in orders:
        expected.add(("%s, %s, scdlfs cold, hints" % (LARGE, SMALL_CACHE), "blocks"))
        expected.add((SMALL_CACHE + ", scdlfs cold, hints", "windows"))
    if "hostile" in systems and "windows" in orders:
        # Beside the hostile writer, the victim's reader checked every row (a wrong row or
        # an EIO fails its epoch, so it has no result), and the writer reached the mount.
        expected |= {(HOSTILE_ALONE, "windows"), (HOSTILE_BESIDE, "windows")}
    if "restart" in systems and "windows" in orders:
        expected |= {(RESTART_LONG, "windows"), (RESTART_FIRST, "windows")}
        expected |= {(r["system"], "startup") for r in startup}
        seen |= {(r["system"], "startup") for r in startup}
        if len(startup) < 2:
            expected.add(("mount to first row, with and without a cache", "startup"))
    problems = ["no result for %s, %s" % k for k in sorted(expected - seen)]
    for r in results:
        # The remount reads what the daemon before it downloaded: adopted, not fetched again
        # (listings and headers are a few KB).
        if r["system"] == RESTART_FIRST and not (
                r["cache"]["adopted_parts"] > 0 and r["bytes_fetched"] < 0.05 * info["bytes"]):
            problems.append("the epoch after a remount adopted %d parts and fetched %d bytes of a %d-byte dataset" % (
                r["cache"]["adopted_parts"], r["bytes_fetched"], info["bytes"]))
    for r in results:
        # The ranks read disjoint shares that make the epoch: a rank reading beyond its
        # share, or none, changes the sum.
        if r["system"].startswith(NODE) and r["epoch_rows"] != info["rows"]:
            problems.append("%s: the %d ranks' shares hold %d rows, the dataset %d" % (
                r["system"], r["ranks"], r["epoch_rows"], info["rows"]))
    for r in startup:
        if r["system"] != "empty cache" and r["adopted_parts"] == 0:
            problems.append("startup with a cache of %d parts adopted none" % r["parts"])
    for r in results:
        if r["rows"] < min(QUICK_MIN_ROWS, r["epoch_rows"]):
            problems.append("%s, %s, epoch %d read %d rows, fewer than %d" % (
                r["system"], r["order"], r["epoch"], r["rows"], QUICK_MIN_ROWS))
        cache = r.get("cache")
        # The budget binds by evicting or refusing parts, or, for a plan over a dataset whose
        # values exceed the cache, by fetching the plan's rows exactly instead of whole parts.
        if cache and ("page-cache warm" in r["system"] or r["system"].startswith(HALF + ", next")) and not (
                cache["evicted_parts"] or cache["parts_not_cached_for_lack_of_room"]
                or r.get("planned_requests_since_mount")):
            problems.append("%s, %s: the budget never bound (no part evicted or refused, no row fetched "
                            "exactly) with a %s cache" % (r["system"], r["order"], args.cache_size))
    for r in results:
        if "cache_dir_peak_bytes" in r and r["cache_dir_peak_bytes"] > r["cache_budget_bytes"]:
            problems.append("%s, %s: the cache directory held %d bytes at its peak (of %d samples), over the "
                            "budget of %d bytes" % (r["system"], r["order"], r["cache_dir_peak_bytes"],
                                                    r["cache_dir_samples"], r["cache_budget_bytes"]))
    if problems:
        sys.exit("bench quick failed:\n  " + "\n  ".join(problems))
