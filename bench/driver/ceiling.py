"""The daemon's own ceiling (issue 29): the main tables' epochs with no link between the
daemon and the store, which serves from 127.0.0.1 at the ceiling the run measured, so
that the daemon, not the link, bounds them. A fresh mount's cold epoch with hints, then
the same order's next epoch from the disk cache with the page cache dropped (and warm),
beside local disk in the same states and epochs; no proxy counts the bytes fetched, so
the daemon's own counters do (driver/measure.py, `fetched_so_far`)."""

from .config import CEILING
from .systems import sys_local, sys_scdlfs


def sys_ceiling(ctx, order, run_i):
    direct = ctx.but(proxy=ctx.endpoint, stats=None)
    prefix = CEILING + ", "
    return sys_local(direct, order, run_i, prefix=prefix) + sys_scdlfs(direct, order, run_i, True, prefix=prefix)
