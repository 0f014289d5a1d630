"""Type stubs of scdlfs._native, the Rust extension (crates/scdlfs-python/src/lib.rs)."""

import os

#: Steps (windows or fetches) announced ahead of the reader by default; the sampler
#: crate's DEFAULT_HINT_LOOKAHEAD.
DEFAULT_HINT_LOOKAHEAD: int

class NotADatasetError(ValueError):
    """The directory is not an SCDL dataset (no readable header.sch, or an inconsistent one)."""

class NativeEpoch:
    """A position in one epoch, advanced by NativeSampler.next_minibatch."""

    @property
    def rows_done(self) -> int: ...

class RowSubset:
    """A set of rows of a dataset for a sampler to visit instead of all of them."""

    @staticmethod
    def from_rows(rows: list[int]) -> RowSubset: ...
    @staticmethod
    def from_ranges(ranges: list[tuple[int, int]]) -> RowSubset: ...
    def ranges(self) -> list[tuple[int, int]]: ...
    def __len__(self) -> int: ...
    def __contains__(self, row: int) -> bool: ...

def read_cached_chunks(dataset_dir: str | os.PathLike[str]) -> list[tuple[int, int]] | None: ...
def split_by_chunk(dataset_dir: str | os.PathLike[str], fractions: list[float], seed: int) -> list[RowSubset]: ...

class NativeSampler:
    """One order over one dataset for one rank, with this process's hint handle."""

    @staticmethod
    def chunk_windows(
        dataset_dir: str | os.PathLike[str],
        *,
        chunks_per_window: int,
        seed: int,
        shuffle_chunks: bool,
        shuffle_within_window: bool,
        rank: int,
        world_size: int,
        even: str,
        hints: bool,
        hint_lookahead: int,
        subset: RowSubset | None = None,
        weights: object | None = None,
        labels: object | None = None,
    ) -> NativeSampler: ...
    @staticmethod
    def blocks(
        dataset_dir: str | os.PathLike[str],
        *,
        block_size: int,
        batch_size: int,
        fetch_factor: int,
        seed: int,
        rank: int,
        world_size: int,
        even: str,
        hints: bool,
        hint_lookahead: int,
        subset: RowSubset | None = None,
        weights: object | None = None,
        labels: object | None = None,
    ) -> NativeSampler: ...
    def start_epoch(self, epoch: int, rows_done: int = 0) -> NativeEpoch: ...
    def next_minibatch(self, epoch: NativeEpoch) -> list[int] | None: ...
    def set_cache_aware_order(self, cached: list[tuple[int, int]] | None) -> None: ...
    def rows_in_epoch(self, epoch: int) -> int: ...
    def minibatches_in_epoch(self, epoch: int) -> int: ...
    def hints_active(self) -> bool: ...
    def take_hint_error(self) -> str | None: ...
    def forget_inherited_hints(self) -> None: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def num_chunks(self) -> int: ...
    @property
    def kind(self) -> str: ...

class NativePlan:
    """The plan of an order given from outside, written through this process's hint handle."""

    def __init__(self, dataset_dir: str | os.PathLike[str], *, hints: bool) -> None: ...
    def start(self, epoch: int) -> bool: ...
    def advance(self, steps: list[list[int]], reading: int | None = None) -> None: ...
    def hints_active(self) -> bool: ...
    def take_hint_error(self) -> str | None: ...
    def forget_inherited_hints(self) -> None: ...
