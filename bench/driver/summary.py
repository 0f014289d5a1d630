"""From one run's saved results to its figures: medians per system and order, ratios
against local disk epoch by epoch, and every target the run measures with what bounds a
miss (`Report`)."""

import statistics

from .config import CEILING, DROPPED, HALF, LARGE, ORDERS, SYSTEM_NAMES, TORCH, WARM


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def family(system):
    """The readers and dataset a system's label belongs to (its prefix): epochs are
    compared within a family only."""
    return next((f for f in (TORCH, CEILING, LARGE) if system.startswith(f)), "")


def pair_key(r):
    """What makes a local-disk epoch the honest reference of another: the same reader family,
    layout, order, epoch and page-cache state, in the same run."""
    return family(r["system"]), r["layout"], r["order"], r["run"], r["epoch"], r["page_cache"]


def is_local(r):
    return "local disk" in r["system"]


def summarize(results):
    """Medians per (system, order); ratios against local disk pair by pair (pair_key)."""
    local = {pair_key(r): r for r in results if is_local(r)}
    rows = {}
    for r in results:
        rows.setdefault((r["system"], r["order"]), []).append(r)
    out = {}
    for key, rs in rows.items():
        ratios = [r["rows_per_s"] / local[pair_key(r)]["rows_per_s"] for r in rs
                  if not is_local(r) and pair_key(r) in local]
        out[key] = dict(
            runs=len(rs),
            completed=all(r["completed"] for r in rs),
            seconds=med([r["seconds"] for r in rs]),
            epoch_s=med([r["seconds"] * r["epoch_rows"] / max(r["rows"], 1) for r in rs]),
            rows_per_s=med([r["rows_per_s"] for r in rs]),
            ratio=med(ratios),
            first_row_s=med([r["first_row_s"] for r in rs]),
            stall_s=med([r.get("stall_s") for r in rs]),
            bytes_fetched=med([r["bytes_fetched"] for r in rs]),
            bytes_per_row=med([r["bytes_fetched"] / max(r["rows"], 1) for r in rs]),
            rss_mib=med([r["daemon_peak_rss_kib"] / 1024 if r.get("daemon_peak_rss_kib") else None for r in rs]),
            served_gb_per_s=med([r["bytes_served"] / r["seconds"] / 1e9 if r.get("bytes_served") else None
                                 for r in rs]),
            link_s=med([r.get("link_s") for r in rs]),
            dataset_bytes=med([r.get("dataset_bytes") for r in rs]),
            dataset_rows=med([r.get("dataset_rows") for r in rs]),
            cpu_s_per_gb=med([r["daemon_cpu_s"] / r["bytes_served"] * 1e9 if r.get("bytes_served") else None
                              for r in rs]),
            disk_read_bytes=med([r.get("disk_read_bytes") for r in rs]),
            cpu_busy_share=med([r.get("cpu_busy_share") for r in rs]),
            iowait_share=med([r.get("iowait_share") for r in rs]),
            fetch_memory_peak_mib=med([r.get("fetch_memory_peak_mib") for r in rs]),
            resident_mib=med([r.get("resident_mib") for r in rs]),
            heap_in_use_mib=med([r.get("heap_in_use_mib") for r in rs]),
            heap_free_kept_mib=med([r.get("heap_free_kept_mib") for r in rs]),
            offline_bound_bytes=med([r.get("offline_bound_bytes") for r in rs]),
            offline_bound_read_ahead_bytes=med([r.get("offline_bound_read_ahead_bytes") for r in rs]),
            step_bytes=med([r.get("step_bytes") for r in rs]),
            slowest_over_fastest=med([r.get("slowest_over_fastest") for r in rs]),
            over_offline_bound=med([r["bytes_fetched"] / r["offline_bound_bytes"]
                                    for r in rs if r.get("offline_bound_bytes") and r["completed"]]),
        )
    return out


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def pct(share):
    return "—" if share is None else "%.0f%%" % (100 * share)


def epoch_text(m):
    return fmt(m["epoch_s"], ".1f") if m["completed"] else "~" + fmt(m["epoch_s"], ".0f")


def sized(label, name):
    return "%s (%s)" % (label, name)


class Report:
    """Everything the page says, computed from one run's saved results."""

    def __init__(self, saved):
        self.saved = saved
        self.args = saved["args"]
        self.info = saved["info"]
        self.summary = summarize(saved["results"])
        self.link_s = self.info["bytes"] / (self.args["rate_mbps"] * 1e6)

    def get(self, system, order, key):
        return self.summary.get((system, order), {}).get(key)

    def rss_by_size(self, hints_label="scdlfs cold, hints", key="rss_mib"):
        """Median peak RSS of the daemon at the end of a cold windows epoch with hints, per
        dataset size: [(bytes, MiB, completed)] (`key`: another figure of those epochs)."""
        out = []
        for name, size in sorted(self.saved["sizes"].items(), key=lambda kv: kv[1]):
            label = hints_label if name == self.saved["name"] else sized(hints_label, name)
            m = self.summary.get((label, "windows"))
            if m and m.get(key) is not None:
                out.append((size, m[key], m["completed"]))
        return out

    def size_figure(self, size, key):
        """`key` of the cold windows epoch with hints on the dataset of `size` bytes."""
        return next((mib for s, mib, _ in self.rss_by_size(key=key) if s == size), None)

    def half_cache_limit(self, floor, fetched, chunk_bytes):
        """What bounds the half-cache next epoch's bytes: the offline optimum for its order."""
        m = self.summary.get((HALF + ", next epoch, hints", "windows"))
        text = "%.2f GB beyond the floor: %.1f chunks of the dataset's %s fetched twice" % (
            (fetched - floor) / 1e9, (fetched - floor) / chunk_bytes, self.info.get("num_chunks") or "?")
        if not m or not m.get("offline_bound_bytes"):
            return text
        bound, ahead = m["offline_bound_bytes"], m.get("offline_bound_read_ahead_bytes")
        text = ("%s. A cache that knew the epoch in advance (Belady's rule over its chunk sequence, from the "
                "chunks the cold epoch read last) would fetch %.2f GB = %.2f× the floor: the floor assumes every "
                "cached chunk is read before one must make room, but until the epoch has read cached chunks, "
                "each chunk it fetches evicts one it reads later" % (text, bound / 1e9, bound / floor))
        if ahead:
            text += (". With room kept for the next step arriving while one is read (a step's chunks, %s GB, "
                     "less for reuse), it would fetch %.2f GB = %.2f× the floor" % (
                         fmt(m.get("step_bytes") and m["step_bytes"] / 1e9, ".2f"), ahead / 1e9, ahead / floor))
        return "%s. scdlfs fetched %s× the first bound" % (text, fmt(m.get("over_offline_bound"), ".2f"))

    def targets(self):
        """(target, measured, verdict, limit) for each target of issue 12 this run measures;
        `limit` is what the run measured of what bounds the figure (empty when met)."""
        g, link_s = self.get, self.link_s
        rate = self.args["rate_mbps"] * 1e6
        rows = []

        def verdict(ok):
            return "not measured" if ok is None else ("**met**" if ok else "**missed**")

        def link_share(m):
            """An epoch cut into the link's time for the bytes it fetched and the rest."""
            if not m or not m["bytes_per_row"]:
                return ""
            fetched = m["bytes_per_row"] * self.info["rows"]
            on_link = fetched / rate
            return ("fetched %.2f× the dataset: %.1f s of the link's time at its rate, %.1f s beyond it (first "
                    "row at %s s; reads that stalled: %s s in all)" % (
                        fetched / self.info["bytes"], on_link, max(m["epoch_s"] - on_link, 0),
                        fmt(m["first_row_s"], ".2f"), fmt(m["stall_s"], ".1f")))

        for system, order, bound in (("scdlfs cold, hints", "windows", 1.05), ("scdlfs cold, hints", "random", 1.15),
                                     ("scdlfs cold, no hints", "windows", 1.3)):
            m = self.summary.get((system, order))
            ok = m["epoch_s"] <= bound * link_s if m else None
            rows.append(("%s, %s order: epoch ≤ %.2f× the link limit (%.1f s)" % (system, order, bound, link_s),
                         "%s s = %.2f×" % (epoch_text(m), m["epoch_s"] / link_s) if m else "—",
                         verdict(ok), "" if ok is not False else link_share(m)))
        firsts = [(h, g("scdlfs cold, " + h, "windows", "first_row_s")) for h in ("hints", "no hints")]
        known = [x for _, x in firsts if x is not None]
        ok = max(known) <= 0.1 if len(known) == 2 else None
        rows.append(("time to first row ≤ 0.1 s, cold windows epoch, with hints and without",
                     ", ".join("%s %s s" % (h, fmt(x, ".2f")) for h, x in firsts),
                     verdict(ok),
                     "" if ok is not False else "%.1f× the link's %.0f ms latency: the reader's requests before "
                     "its first row wait one after another" % (max(known) / (self.args["latency_ms"] / 1e3),
                                                               self.args["latency_ms"])))
        for state, system in ((DROPPED, "scdlfs disk-cache warm, hints"), (WARM, "scdlfs page-cache warm, hints")):
            ratios = [(o, g(system, o, "ratio")) for o in ORDERS]
            known = [x for _, x in ratios if x is not None]
            ok = min(known) >= 0.9 if known else None
            limit = ""
            if ok is False:
                unhinted = system.replace(", hints", ", no hints")
                parts = []
                for o, x in ratios:
                    if x is None or x >= 0.9:
                        continue
                    local = "local disk, " + state
                    text = "%s: daemon CPU %s s per GB read; without hints %s× local" % (
                        o, fmt(g(system, o, "cpu_s_per_gb"), ".2f"), fmt(g(unhinted, o, "ratio"), ".2f"))
                    if g(local, o, "disk_read_bytes") is not None and g(system, o, "disk_read_bytes") is not None:
                        text += ("; in the epoch, local disk / scdlfs: %s / %s s, the disk read %s / %s GB, "
                                 "the %d cores busy %s / %s and waiting on the disk %s / %s of their time") % (
                            fmt(g(local, o, "epoch_s"), ".2f"), fmt(g(system, o, "epoch_s"), ".2f"),
                            fmt(g(local, o, "disk_read_bytes") / 1e9, ".2f"),
                            fmt(g(system, o, "disk_read_bytes") / 1e9, ".2f"), self.saved["cores"],
                            pct(g(local, o, "cpu_busy_share")), pct(g(system, o, "cpu_busy_share")),
                            pct(g(local, o, "iowait_share")), pct(g(system, o, "iowait_share")))
                    parts.append(text)
                limit = "; ".join(parts)
            rows.append(("%s ≥ 0.9× local disk rows/s (%s, same epoch), every order" % (system, state),
                         ", ".join("%s %s×" % (o, fmt(x, ".2f")) for o, x in ratios),
                         verdict(ok), limit))
        half = self.summary.get((HALF + ", cold, hints", "windows"))
        ok = half["epoch_s"] <= 1.1 * link_s if half else None
        rows.append(("cache = half the dataset: cold windows epoch with hints ≤ 1.1× the link limit",
                     "%s s = %.2f× (full-size cache: %s s)" % (
                         epoch_text(half), half["epoch_s"] / link_s,
                         fmt(g("scdlfs cold, hints", "windows", "epoch_s"), ".1f")) if half else "—",
                     verdict(ok), "" if ok is not False else link_share(half)))
        floor = self.info["bytes"] - self.info["bytes"] // 2
        nxt = [(h, self.summary.get((HALF + ", next epoch, " + h, "windows"))) for h in ("hints", "no hints")]
        fetched = {h: m["bytes_per_row"] * self.info["rows"] for h, m in nxt if m}
        ok = fetched["hints"] <= 1.05 * floor if "hints" in fetched else None
        chunk_bytes = self.info["bytes"] / max(self.info.get("num_chunks") or 1, 1)
        rows.append(("cache = half the dataset: the next windows epoch (a new order) fetches ≤ 1.05× the floor "
                     "(dataset − cache = %.2f GB), with hints" % (floor / 1e9),
                     ", ".join("%s %.2f GB = %.2f×%s" % (h, fetched[h] / 1e9, fetched[h] / floor,
                                                        "" if m["completed"] else " (extrapolated)")
                               for h, m in nxt if m) or "—",
                     verdict(ok),
                     "" if ok is not False else self.half_cache_limit(floor, fetched["hints"], chunk_bytes)))
        others = [(s, g(s, "windows", "rows_per_s")) for s in ("s3fs-fuse", "rclone mount")]
        best = max([x for _, x in others if x] or [0])
        ours = g("scdlfs cold, hints", "windows", "rows_per_s")
        rows.append(("scdlfs cold, hints ≥ 3× the rows/s of the better of s3fs-fuse and rclone, windows order",
                     "%.1f×" % (ours / best) if best and ours else "—",
                     verdict(ours >= 3 * best if best and ours else None), ""))
        rss = self.rss_by_size()
        ok = max(mib for _, mib, _ in rss) < 150 if rss else None
        fetcher_peak = g("scdlfs cold, hints", "windows", "fetch_memory_peak_mib")
        rows.append(("daemon peak RSS < 150 MiB with plans (cold windows epoch, hints), every dataset size",
                     ", ".join("%.0f MiB at %.2f GB%s" % (mib, size / 1e9, "" if done else " (time-bounded)")
                               for size, mib, done in rss) or "—",
                     verdict(ok),
                     "" if ok is not False else "the fetcher's own peak: %s MiB" % fmt(fetcher_peak, ".0f")))
        big = [x for x in rss if x[0] > self.info["bytes"]]
        main = [x for x in rss if x[0] == self.info["bytes"]]
        whole = bool(big and main and big[-1][2] and main[0][2])
        ok = big[-1][1] <= 1.1 * main[0][1] if whole else None
        rows.append(("daemon peak RSS flat (within 10%) from the main dataset to the large one (`--large-size-mb`; "
                     "whole cold windows epochs with hints at both sizes)",
                     "%.0f MiB at %.2f GB → %.0f MiB at %.2f GB%s" % (
                         main[0][1], main[0][0] / 1e9, big[-1][1], big[-1][0] / 1e9,
                         "" if whole else " (an epoch was time-bounded: not the same phase)")
                     if big and main else "no larger dataset in this run",
                     verdict(ok),
                     "" if ok is not False else "the fetcher's own peak (downloads, edges, parts kept in memory): "
                     "%s; at the epoch's end, resident / heap in use / heap freed and kept by the allocator: %s"
                     % (", ".join("%.0f MiB at %.2f GB" % (mib, size / 1e9)
                                  for size, mib, _ in self.rss_by_size(key="fetch_memory_peak_mib")),
                        ", ".join("%s / %s / %s MiB at %.2f GB" % (
                            fmt(self.size_figure(size, "resident_mib"), ".0f"),
                            fmt(self.size_figure(size, "heap_in_use_mib"), ".0f"),
                            fmt(self.size_figure(size, "heap_free_kept_mib"), ".0f"), size / 1e9)
                            for size, _, _ in rss))))
        return rows


def reductions(args):
    """How a run's configuration falls short of the full benchmark, in words (empty for a
    full run)."""
    out = []
    if args["runs"] < 3:
        out.append("%d run(s) instead of 3" % args["runs"])
    missing = [s for s in SYSTEM_NAMES
               if s not in args["systems"].split(",")]
    if missing:
        out.append("systems not run: " + ", ".join(missing))
    orders = [o for o in ORDERS if o not in args["orders"].split(",")]
    if orders:
        out.append("orders not run: " + ", ".join(orders))
    others = [o for o in args["orders"].split(",") if o not in (args.get("other_orders") or args["orders"]).split(",")]
    if others:
        out.append("s3fs-fuse, rclone and the Python chunk loader not run in the %s order" % ", ".join(others))
    if not args.get("large_size_mb"):
        out.append("no large dataset (`--large-size-mb`)")
    elif args["large_size_mb"] < 15000:
        out.append("large dataset %d MB instead of 15000" % args["large_size_mb"])
    return out
