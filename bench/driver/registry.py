"""The systems under test, in the order a run reads them for each order: each entry is
one `--systems` name's measurement (a name may have several: scdlfs with hints and
without), the orders it reads, and where its results go."""

from .ceiling import sys_ceiling
from .config import OPT_IN_SYSTEMS, SYSTEM_NAMES, TORCH_ORDERS
from .hostile import sys_hostile
from .large import sys_large, sys_small_cache
from .node import sys_node
from .planned import sys_planned
from .restart import sys_restart, sys_startup
from .systems import sys_local, sys_python, sys_rclone, sys_s3fs, sys_scdlfs, sys_scdlfs_half, sys_torch


class System:
    """`name`: the `--systems` name; `reads(order, args)`: whether it reads in that order;
    `measure(ctx, order, run_i)`: its epochs' results (dicts); `startup`: its results are
    mount-to-first-row measurements, not epochs."""

    def __init__(self, name, reads, measure, startup=False):
        assert name in SYSTEM_NAMES + OPT_IN_SYSTEMS, name
        self.name, self.reads, self.measure, self.startup = name, reads, measure, startup


def every_order(order, args):
    return True


def windows_only(order, args):
    return order == "windows"


def other_orders(order, args):
    """The orders s3fs-fuse, rclone and the Python chunk loader read (`--other-orders`)."""
    return order in (args.other_orders or args.orders).split(",")


def torch_orders(order, args):
    """The orders of the scdlfs package's samplers; --quick reads windows only."""
    return order in TORCH_ORDERS and (order == "windows" or not args.quick)


REGISTRY = [
    System("local", every_order, sys_local),
    System("scdlfs", every_order, lambda ctx, order, run_i: sys_scdlfs(ctx, order, run_i, True)),
    System("scdlfs", every_order, lambda ctx, order, run_i: sys_scdlfs(ctx, order, run_i, False)),
    System("halfcache", windows_only, lambda ctx, order, run_i: sys_scdlfs_half(ctx, run_i, True)),
    System("halfcache", windows_only, lambda ctx, order, run_i: sys_scdlfs_half(ctx, run_i, False)),
    System("halfcache-aware", windows_only, lambda ctx, order, run_i: sys_scdlfs_half(ctx, run_i, True, cache_aware=True)),
    System("s3fs", other_orders, sys_s3fs),
    System("rclone", other_orders, sys_rclone),
    System("python", other_orders, sys_python),
    System("torch", torch_orders, sys_torch),
    System("restart", windows_only, lambda ctx, order, run_i: sys_restart(ctx, ctx.args, run_i)),
    System("restart", windows_only, lambda ctx, order, run_i: sys_startup(ctx, ctx.args, run_i), startup=True),
    System("node", windows_only, sys_node),
    # The daemon with no link: its cold and warm windows epochs beside local disk.
    System("ceiling", windows_only, sys_ceiling),
    # Its own dataset and link; reads the windows and random orders of it once per run.
    System("large", windows_only, sys_large),
    # The large chunks' dataset and link with a cache of a tenth of it (issue 39).
    System("small-cache", windows_only, sys_small_cache),
    # The large chunks' dataset and link: others' orders with and without their plans,
    # beside the scdlfs sampler's, full cache and a tenth (issue 43).
    System("planned", windows_only, sys_planned),
    # Its own dataset of many small chunks; the victim's cold epoch alone and beside the
    # hostile hint writer, in turns.
    System("hostile", windows_only, sys_hostile),
]
