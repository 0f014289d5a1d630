"""What every part of the benchmark agrees on: where the repository is, the bucket and the
dummy keys, the orders, the labels the results carry for systems and page-cache states,
and the sizes of the reduced variant and of the startup case."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUCKET = "bench"
KEY, SECRET = "bench", "benchbench"
ORDERS = ["windows", "blocks", "random"]
# The page-cache states an epoch starts in. Every reader is a new process, so no memory
# map of an earlier epoch keeps pages alive across a drop (PITFALLS.md, "Measuring").
DROPPED = "page cache dropped"
WARM = "page cache warm"
HALF = "scdlfs half cache"
CACHE_AWARE = "cache-aware order"  # the half-cache case's next epoch in the cache-aware order
TORCH = "PyTorch DataLoader"
TORCH_ORDERS = ["windows", "blocks"]  # the orders of the scdlfs package's samplers
TORCH_BEGIN, TORCH_END = "<!-- pytorch section: begin -->", "<!-- pytorch section: end -->"
PYTHON_LOADER_CHUNKS = 8  # the Python chunk loader's LRU, in chunks
QUICK_MIN_ROWS = 100  # --quick fails if an epoch read fewer rows (and was not the whole epoch)
QUICK_SIZE_MB = 50  # --quick's dataset
RESTART_BEGIN, RESTART_END = "<!-- restart section: begin -->", "<!-- restart section: end -->"
RESTART_LONG = "scdlfs warm, long-running mount"
RESTART_FIRST = "scdlfs first epoch after a remount"
STARTUP_PART_SIZE = 4096  # the smallest --read-part-size: many parts from a moderate dataset
STARTUP_PARTS, QUICK_STARTUP_PARTS = 100_000, 10_000  # parts in the cache of the startup case
# The systems `--systems` names by default, in the order a run reads them (driver/registry.py).
SYSTEM_NAMES = ["local", "scdlfs", "halfcache", "s3fs", "rclone", "python", "torch", "restart", "ceiling", "large"]
# Read only when named (or by --quick): `--systems node` alone updates its own section;
# `halfcache-aware` is the half-cache case with its next epoch in the cache-aware order.
OPT_IN_SYSTEMS = ["node", "halfcache-aware", "hostile", "small-cache", "planned", "atlas", "cpu"]
NODE = "scdlfs node"
NODE_BEGIN, NODE_END = "<!-- node section: begin -->", "<!-- node section: end -->"
NODE_RANKS, QUICK_NODE_RANKS = [1, 2, 4, 8], [1, 2]
NODE_SCDL = NODE + ", SCDL reader"  # the ranks read through bionemo-scdl and the scdlfs sampler
NODE_TORCH_WORKERS = 2  # DataLoader workers per rank of the SCDL reader
# The daemon's own ceiling: the main tables' epochs with no link, the store on 127.0.0.1.
CEILING = "no link"
# Large chunks (issue 29's targets): 8 chunks of about 180 MB (30,000 rows of about 6 KB),
# windows of 2 chunks, behind a link of its own; --quick: 8 chunks of about 6 MB.
LARGE = "large chunks"
LARGE_CHUNKS, LARGE_CHUNK_ROWS, QUICK_LARGE_CHUNK_ROWS = 8, 30_000, 1000
LARGE_CHUNKS_PER_WINDOW = 2
LARGE_RATE_MBPS, LARGE_LATENCY_MS = 250.0, 20.0
# A cache of a tenth of the dataset (issue 39, driver/large.py's sys_small_cache).
SMALL_CACHE, SMALL_CACHE_SHARE = "cache 10%", 0.1
# The same orders with the cache the mount's default gives (all of the dataset), beside them.
FULL_CACHE = "full cache"
SMALL_BEGIN, SMALL_END = "<!-- small-cache section: begin -->", "<!-- small-cache section: end -->"
# Others' orders with and without their plans (issue 43, driver/planned.py).
PLANNED = "any order"
PLANNED_BEGIN, PLANNED_END = "<!-- planned section: begin -->", "<!-- planned section: end -->"
# A hostile hint writer beside another user's cold epoch (issue 30, driver/hostile.py): a
# dataset of HOSTILE_CHUNKS chunks of HOSTILE_CHUNK_ROWS short rows (--quick: fewer).
HOSTILE = "hostile hint writer"
HOSTILE_ALONE, HOSTILE_BESIDE = HOSTILE + ", victim alone", HOSTILE + ", victim beside it"
HOSTILE_BEGIN, HOSTILE_END = "<!-- hostile section: begin -->", "<!-- hostile section: end -->"
HOSTILE_CHUNKS, QUICK_HOSTILE_CHUNKS = 10_000, 256
HOSTILE_CHUNK_ROWS, HOSTILE_MEAN_VALUES = 4, 1000
# Epochs stop after this many seconds, a bound on a slow server (--quick: the run's --time-limit).
HOSTILE_TIME_LIMIT = 120.0
HOSTILE_RATIO_TARGET = 1.2  # the victim's cold epoch beside the writer ÷ alone, at most
