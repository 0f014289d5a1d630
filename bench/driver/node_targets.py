"""The targets of issue 29 (one GPU node, many ranks, a fast link), each row computed
from the results of the run that renders it: the daemon's CPU per byte, its ceiling
with no link, the node scenario's 8 ranks, the half-cache next epoch, the disk-cache
warm epoch against local disk, and the large chunks. A figure the results lack reads
"not measured"; a missed row says what the run measured of what bounds it."""

from .config import CEILING, HALF, LARGE, NODE, NODE_RANKS, NODE_SCDL
from .node import node_label
from .summary import fmt


class Check:
    """One figure against its bound: `value` (None: not measured), `bound`, and whether
    the figure must stay at most (`at_most`) or at least the bound."""

    def __init__(self, value, bound, at_most=True, spec=".2f", unit="×"):
        self.value, self.bound, self.at_most, self.spec, self.unit = value, bound, at_most, spec, unit

    def met(self):
        if self.value is None:
            return None
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    def text(self):
        return "not measured" if self.value is None else fmt(self.value, self.spec) + self.unit


def verdict(checks):
    known = [c.met() for c in checks if c.met() is not None]
    if not known:
        return "not measured"
    if not all(known):
        return "**missed**"
    return "**met**" if len(known) == len(checks) else "**met** where measured"


def epoch_facts(m):
    """What an epoch measured that bounds it: bytes fetched, first row, stalls, the
    daemon's CPU and the machine's busy share."""
    if not m:
        return ""
    return ("fetched %s× the dataset, first row %s s, stalled reads %s s, daemon CPU %s s per GB, the cores busy "
            "%s of the epoch" % (fmt(m["fetched_share"], ".2f"), fmt(m["first_row_s"], ".2f"), fmt(m["stall_s"], ".1f"),
                                 fmt(m["cpu_s_per_gb"], ".2f"),
                                 "—" if m["cpu_busy_share"] is None else "%.0f%%" % (100 * m["cpu_busy_share"])))


def step_room(m):
    """What a half cache keeps for later steps once the step being read and the next one,
    arriving meanwhile, have their room."""
    if not m or not m.get("step_bytes"):
        return ""
    cache = m["dataset_bytes"] // 2  # the half cache, as its system sizes it
    kept = cache - 2 * m["step_bytes"]
    return "a step is %.2f GB of the cache's %.2f GB, so the step being read and the next one leave %s" % (
        m["step_bytes"] / 1e9, cache / 1e9,
        "nothing for a later step" if kept <= 0 else "%.2f GB for later steps" % (kept / 1e9))


def targets(rep, node_rep):
    """[(case, before, target, measured, verdict, what bounds a miss)] of issue 29, from
    the run's `Report` and the node scenario's (the same, or a run of it alone)."""
    rows = []
    info = rep.info

    def m_of(r, system, order="windows"):
        m = r.summary.get((system, order))
        if m is None:
            return None
        m = dict(m)
        m["fetched_share"] = (m["bytes_per_row"] * (m.get("dataset_rows") or r.info["rows"])
                              / (m.get("dataset_bytes") or r.info["bytes"]))
        m["over_link"] = m["epoch_s"] / (m.get("link_s") or r.link_s)
        return m

    def add(case, before, target, checks, limit_of=None):
        v = verdict(checks)
        rows.append((case, before, target, " / ".join(c.text() for c in checks), v,
                     limit_of() if limit_of and v == "**missed**" else ""))

    cold, warm = m_of(rep, "scdlfs cold, hints"), m_of(rep, "scdlfs disk-cache warm, hints")
    add("daemon CPU s per GB, cold epoch with hints", "2.40", "≤ 0.6",
        [Check(cold and cold["cpu_s_per_gb"], 0.6, unit=" s")],
        lambda: "docs/architecture.md, *Where the CPU goes per byte*: the kernel's copies of each byte (from the "
                "socket, into and out of the part files' page cache, into the mount's through /dev/fuse); at %.0f MB/s "
                "served, %s" % (info["bytes"] / 1e6 / cold["epoch_s"], epoch_facts(cold)))
    add("daemon CPU s per GB, disk-cache warm", "0.66", "≤ 0.25",
        [Check(warm and warm["cpu_s_per_gb"], 0.25, unit=" s")],
        lambda: "docs/architecture.md, *Where the CPU goes per byte*; " + epoch_facts(warm))
    ceiling = m_of(rep, CEILING + ", scdlfs cold, hints")
    store = rep.saved.get("probes", {}).get("server_8", {}).get("mb_per_s")
    served = ceiling and ceiling["served_gb_per_s"]
    add("unthrottled cold epoch, GB/s served ÷ store ceiling", "not measured", "≥ 0.8",
        [Check(served * 1e3 / store if served and store else None, 0.8, at_most=False)],
        lambda: "%.2f GB/s served against the store's %.2f GB/s on 8 connections; %.2f GB served per second of "
                "daemon CPU (%s)" % (served, store / 1e3, 1 / ceiling["cpu_s_per_gb"] if ceiling["cpu_s_per_gb"]
                                     else float("nan"), epoch_facts(ceiling)))
    eight = m_of(node_rep, node_label(max(NODE_RANKS)))
    scdl8 = m_of(node_rep, node_label(max(NODE_RANKS), NODE_SCDL))
    add("8 ranks on one mount, cold, %.0f MB/s link: aggregate × link" % rep.args["rate_mbps"], "not measured",
        "≤ 1.05", [Check(eight and eight["over_link"], 1.05)],
        lambda: "%s; the SCDL reader's 8 ranks (2 DataLoader workers each): %s× the link" % (
            epoch_facts(eight), fmt(scdl8 and scdl8["over_link"], ".2f")))
    add("8 ranks: fetched / dataset", "not measured", "≤ 1.02", [Check(eight and eight["fetched_share"], 1.02)],
        lambda: "the SCDL reader's 8 ranks: %s×" % fmt(scdl8 and scdl8["fetched_share"], ".2f"))
    add("8 ranks: max first row / slowest ÷ fastest rank", "not measured", "≤ 0.2 s / ≤ 1.15",
        [Check(eight and eight["first_row_s"], 0.2, unit=" s"), Check(eight and eight["slowest_over_fastest"], 1.15)],
        lambda: "each rank's first row and finish in docs/benchmarks-node.json (`rank_first_row_s`, "
                "`rank_seconds`); %s" % epoch_facts(eight))
    floor = info["bytes"] - info["bytes"] // 2
    plain = m_of(rep, HALF + ", next epoch, hints")
    aware_label = next((s for s, o in rep.summary if s.startswith(HALF + ", next epoch") and "cache-aware" in s),
                       None)
    aware = m_of(rep, aware_label) if aware_label else None

    def over_floor(m):
        return m and m["bytes_per_row"] * info["rows"] / floor

    add("half cache, next epoch fetched ÷ floor (plain order / cache-aware order)", "1.24 / —", "≤ 1.10 / ≤ 1.02",
        [Check(over_floor(plain), 1.10), Check(over_floor(aware), 1.02)],
        lambda: "the floor is %.2f GB; for the plain order, Belady's bound %s GB, and %s GB with room kept for "
                "the next step arriving while one is read (the table above)" % (
                    floor / 1e9,
                    fmt(plain and plain.get("offline_bound_bytes") and plain["offline_bound_bytes"] / 1e9, ".2f"),
                    fmt(plain and plain.get("offline_bound_read_ahead_bytes")
                        and plain["offline_bound_read_ahead_bytes"] / 1e9, ".2f")))
    warm_orders = [(order, m_of(rep, "scdlfs disk-cache warm, hints", order)) for order in ("blocks", "random")]
    add("disk-cache warm windows × local disk", "0.88", "≥ 0.95",
        [Check(warm and warm["ratio"], 0.95, at_most=False)],
        lambda: "the daemon's CPU beside the reader's on the same cores (%s); in the same run %s" % (
            epoch_facts(warm), ", ".join("%s %s×" % (order, fmt(m and m["ratio"], ".2f")) for order, m in warm_orders)))
    lcold, lplain = m_of(rep, LARGE + ", scdlfs cold, hints"), m_of(rep, LARGE + ", scdlfs cold, no hints")
    lrandom, ls3fs = m_of(rep, LARGE + ", scdlfs cold, hints", "random"), m_of(rep, LARGE + ", s3fs-fuse", "random")
    lhalf, lnext = (m_of(rep, "%s, %s, %s, hints" % (LARGE, HALF, e)) for e in ("cold", "next epoch"))
    add("**large chunks** (8 chunks of 180 MB, windows of 2, the whole plan written at the start, 250 MB/s + "
        "20 ms): cold windows with plan × link", "1.08", "≤ 1.05", [Check(lcold and lcold["over_link"], 1.05)],
        lambda: epoch_facts(lcold))
    add("large chunks: random order with a `rows` plan × link (s3fs-fuse in the same run: %s×)"
        % fmt(ls3fs and ls3fs["over_link"], ".2f"), "1.45 (s3fs-fuse 1.72)", "≤ 1.15",
        [Check(lrandom and lrandom["over_link"], 1.15)], lambda: epoch_facts(lrandom))
    add("large chunks: no hints × link / first row with plan", "1.34 / 0.20 s", "≤ 1.15 / ≤ 0.1 s",
        [Check(lplain and lplain["over_link"], 1.15), Check(lcold and lcold["first_row_s"], 0.1, unit=" s")],
        lambda: "no hints: %s; with plan: %s" % (epoch_facts(lplain), epoch_facts(lcold)))
    lfloor = lnext and lnext["dataset_bytes"] - lnext["dataset_bytes"] // 2
    add("large chunks, cache = half the dataset: cold × link / next epoch ÷ floor", "1.25 / 1.32", "≤ 1.1 / ≤ 1.10",
        [Check(lhalf and lhalf["over_link"], 1.1),
         Check(lnext and lnext["fetched_share"] * lnext["dataset_bytes"] / lfloor, 1.10)],
        lambda: "next epoch: %s; Belady's bound (each chunk fetched when read) %s GB against the floor of %s GB; %s" % (
            epoch_facts(lnext), fmt(lnext and lnext.get("offline_bound_bytes") and lnext["offline_bound_bytes"] / 1e9,
                                    ".2f"), fmt(lfloor and lfloor / 1e9, ".2f"), step_room(lnext)))
    return rows
