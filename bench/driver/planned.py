"""Any order with its plan (issue 43): the large chunks' dataset and link of driver/large.py
read through the SCDL reader in a DataLoader (bench/torch_loader.py), in others' orders
told to the mount by the scdlfs package's wrappers and the same orders unwrapped (no
plan), beside the scdlfs BlockSampler in the same shapes: scDataset 0.3.0's
BlockShuffling(block_size=32) (batch 64, fetch factor 16) through `plan_scdataset` beside
the BlockSampler's blocks of 32 in fetches of 1,024 rows; torch's RandomSampler through
`Planned` (steps of 1,024 rows) beside the BlockSampler's blocks of 1; and scDataset's
ClassBalancedSampling (a rare type of a twentieth of the rows) through `plan_scdataset`.
Each cold epoch on a fresh mount, with the full cache and with a tenth of the dataset."""

from .config import LARGE, PLANNED, SMALL_CACHE
from .large import large_ctx, small_cache_bytes, with_link
from .measure import read_torch_epoch
from .systems import sys_scdlfs

# (torch_loader order, whether it is another's order read with and without its plan).
PLANNED_ORDERS = [("blocks16", False), ("scdataset-blocks", True), ("random-rows", False), ("planned-random", True),
                  ("scdataset-balanced", True)]


def sys_planned(ctx, order, run_i):
    large = large_ctx(ctx)
    results = []
    for cache_label, cache_size in (("full cache", None), (SMALL_CACHE, small_cache_bytes(large.info["bytes"]))):
        cached = large if cache_size is None else large.but(cache_size=str(cache_size))
        prefix = "%s, %s, %s, " % (LARGE, PLANNED, cache_label)
        for reader_order, others in PLANNED_ORDERS:
            for hints in (True, False) if others else (True,):
                results += sys_scdlfs(cached, reader_order, run_i, hints, dataset=large.name, prefix=prefix,
                                      warm=False, reader=read_torch_epoch)
    return with_link(results, large)
