"""PyTorch samplers for SCDL single-cell datasets on an scdlfs mount.

The samplers yield global row indices for a map-style dataset such as bionemo-scdl's
``SingleCellMemMapDataset``, in an order that reads well from a remote chunked store:
the chunk-window order (:class:`ChunkWindowSampler`) or scDataset's block order
(:class:`BlockSampler`). Every order is computed by the Rust crate ``scdl-sampler``
(through ``scdlfs._native``), the one the daemon's own tools use, so the same seed,
epoch, rank and world size give the same rows from Python as from Rust.

When the dataset directory is on an scdlfs mount, the process that iterates the
sampler (a DataLoader's main process) tells the daemon a bounded lookahead of its
order through the dataset's ``.scdlfs-hints`` file, and the daemon fetches those chunks
before the DataLoader's workers read them. Elsewhere the rows are the same and nothing
is written. ``hints=False`` turns the hints off.

    from torch.utils.data import DataLoader
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset
    import scdlfs

    dataset = SingleCellMemMapDataset("/mnt/atlas/tahoe")
    sampler = scdlfs.ChunkWindowSampler("/mnt/atlas/tahoe", chunks_per_window=4, seed=0)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=2,
                        collate_fn=...)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Iterator
from typing import Any, Literal

from scdlfs._native import DEFAULT_HINT_LOOKAHEAD, NativeSampler, NotADatasetError

try:  # The samplers are torch Samplers when torch is installed, as it is for training.
    from torch.utils.data import Sampler as _TorchSampler
except ImportError:  # pragma: no cover - the protocol is all a DataLoader needs
    _TorchSampler = object  # type: ignore[assignment,misc]

__all__ = [
    "BatchSampler",
    "BlockSampler",
    "ChunkWindowSampler",
    "NotADatasetError",
    "distributed_rank_and_world_size",
]

Even = Literal["pad", "drop", "uneven"]

def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"the environment variable {name}={value!r} is not an integer") from None


def distributed_rank_and_world_size(
    rank: int | None = None, world_size: int | None = None
) -> tuple[int, int]:
    """This process's rank and the number of ranks, each taken from the argument when
    given, else from ``torch.distributed`` when it is initialized, else from the
    ``RANK`` and ``WORLD_SIZE`` variables that torchrun sets, else 0 and 1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        found_rank, found_world = dist.get_rank(), dist.get_world_size()
    else:
        env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        found_rank = 0 if env_rank is None else env_rank
        found_world = 1 if env_world is None else env_world
    return (found_rank if rank is None else rank, found_world if world_size is None else world_size)


# Samplers alive in this process, so that a forked child (a DataLoader worker) drops
# the hint handles it inherited instead of holding its parent's plans open.
_LIVE: weakref.WeakSet[_SCDLSampler] = weakref.WeakSet()


def _forget_inherited_hints() -> None:
    for sampler in list(_LIVE):
        sampler._native.forget_inherited_hints()


os.register_at_fork(after_in_child=_forget_inherited_hints)


class _SCDLSampler(_TorchSampler):  # type: ignore[misc,valid-type]
    """What both samplers share: the epoch, the length, iteration and pickling."""

    _native: NativeSampler

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str],
        order: dict[str, Any],
        rank: int | None,
        world_size: int | None,
        even: Even,
        hints: bool,
        hint_lookahead: int,
    ) -> None:
        rank, world_size = distributed_rank_and_world_size(rank, world_size)
        self._dataset_dir = os.fspath(dataset_dir)
        self._settings = dict(order, rank=rank, world_size=world_size, even=even, hints=hints,
                              hint_lookahead=hint_lookahead)  # fmt: skip
        self._epoch = 0
        self._native = self._build()
        _LIVE.add(self)

    def _build(self) -> NativeSampler:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration yields (as ``DistributedSampler`` does):
        each epoch has its own order, the same in every process."""
        if epoch < 0:
            raise ValueError(f"epoch must not be negative, got {epoch}")
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def rank(self) -> int:
        return self._settings["rank"]

    @property
    def world_size(self) -> int:
        return self._settings["world_size"]

    @property
    def dataset_dir(self) -> str:
        return self._dataset_dir

    @property
    def num_rows(self) -> int:
        """Rows in the whole dataset (all ranks)."""
        return self._native.num_rows

    @property
    def num_chunks(self) -> int:
        return self._native.num_chunks

    @property
    def dataset_kind(self) -> str:
        """'flat view' or 'raw view' (an scdlfs mount or a chunked archive), 'monolithic
        dataset on a mount' (the daemon's virtual chunks, as its hint file announces), or
        'plain monolithic directory' (virtual chunks of the size asked for)."""
        return self._native.kind

    def __len__(self) -> int:
        """Rows this rank visits in the current epoch."""
        return self._native.rows_in_epoch(self._epoch)

    def __iter__(self) -> Iterator[int]:
        native = self._native
        cursor = native.start_epoch(self._epoch)
        while (minibatch := native.next_minibatch(cursor)) is not None:
            yield from minibatch

    def _minibatches(self) -> Iterator[list[int]]:
        native = self._native
        cursor = native.start_epoch(self._epoch)
        while (minibatch := native.next_minibatch(cursor)) is not None:
            yield minibatch

    @property
    def hints_active(self) -> bool:
        """Whether this process tells the daemon its plan (False off a mount or with
        ``hints=False``). Opens the hint file if this process has not yet."""
        return self._native.hints_active()

    def take_hint_error(self) -> str | None:
        """The first hint failure in this process since the last call. Hints are advice:
        a failure never changes the rows."""
        return self._native.take_hint_error()

    def __getstate__(self) -> dict[str, Any]:
        # The native sampler holds this process's hint handle: a process that unpickles
        # the sampler (a spawned worker) builds its own and opens its own handle.
        return {"dataset_dir": self._dataset_dir, "settings": self._settings, "epoch": self._epoch}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._dataset_dir = state["dataset_dir"]
        self._settings = state["settings"]
        self._epoch = state["epoch"]
        self._native = self._build()
        _LIVE.add(self)

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self._settings.items())
        return f"{type(self).__name__}({self._dataset_dir!r}, {settings}, epoch={self._epoch})"


class ChunkWindowSampler(_SCDLSampler):
    """The chunk-window order: the dataset's chunks in a random order (new each epoch),
    taken ``chunks_per_window`` at a time, the rows of each window shuffled. A window is
    one step: ranks take whole windows round-robin.

    Args:
        dataset_dir: the dataset directory (an scdlfs mount's flat or raw view, or a
            local SCDL archive, whose chunks are then virtual).
        chunks_per_window: chunks read together; more mixes rows better and needs more
            cache.
        seed: the seed every rank must share.
        shuffle: False visits chunks and rows in ascending order.
        rank, world_size: this process's share; by default from ``torch.distributed``
            when initialized, else ``RANK``/``WORLD_SIZE``, else 0 and 1.
        even: how ranks with different row counts are evened out: ``"pad"`` repeats a
            rank's own rows (the default, as ``DistributedSampler``), ``"drop"`` cuts
            every rank to the shortest share, ``"uneven"`` leaves shares as dealt.
        hints: tell an scdlfs mount the order (default True; no effect off a mount).
        hint_lookahead: windows announced ahead of the one being read.
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str],
        chunks_per_window: int = 4,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        even: Even = "pad",
        hints: bool = True,
        hint_lookahead: int = DEFAULT_HINT_LOOKAHEAD,
    ) -> None:
        order = dict(chunks_per_window=chunks_per_window, seed=seed, shuffle=shuffle)
        super().__init__(dataset_dir, order, rank, world_size, even, hints, hint_lookahead)

    def _build(self) -> NativeSampler:
        return NativeSampler.chunk_windows(self._dataset_dir, **self._settings)

    def batches(self, batch_size: int, drop_last: bool = False) -> BatchSampler:
        """The batch-sampler form, for ``DataLoader(batch_sampler=...)``: this order's
        rows cut into minibatches of ``batch_size``, as ``torch.utils.data.BatchSampler``
        cuts them."""
        return BatchSampler(self, batch_size, drop_last)


class BlockSampler(_SCDLSampler):
    """scDataset's block order: contiguous blocks of ``block_size`` rows drawn at
    random, ``fetch_factor`` minibatches' worth read together in ascending order (one
    step, and one ranged read per block), the fetch's rows shuffled and cut into
    minibatches of ``batch_size``. Ranks take whole fetches round-robin.

    Args: as :class:`ChunkWindowSampler`, and
        block_size: rows per block (1 gives uniformly random rows).
        batch_size: rows per minibatch.
        fetch_factor: minibatches per fetch.
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str],
        block_size: int = 32,
        fetch_factor: int = 16,
        batch_size: int = 64,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        even: Even = "pad",
        hints: bool = True,
        hint_lookahead: int = DEFAULT_HINT_LOOKAHEAD,
    ) -> None:
        order = dict(block_size=block_size, batch_size=batch_size, fetch_factor=fetch_factor, seed=seed)
        super().__init__(dataset_dir, order, rank, world_size, even, hints, hint_lookahead)

    def _build(self) -> NativeSampler:
        return NativeSampler.blocks(self._dataset_dir, **self._settings)

    def batches(self) -> BatchSampler:
        """The batch-sampler form, for ``DataLoader(batch_sampler=...)``: the order's own
        minibatches of ``batch_size`` rows (a fetch's last one may be shorter)."""
        return BatchSampler(self, None, False)


class BatchSampler:
    """Minibatches of a sampler's rows for ``DataLoader(batch_sampler=...)``: a block
    order's own minibatches (``batch_size=None``), or rows cut into ``batch_size``
    as ``torch.utils.data.BatchSampler`` does. Iterating it iterates the sampler, in
    the same process and with the same hints."""

    def __init__(self, sampler: _SCDLSampler, batch_size: int | None, drop_last: bool) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        if self.batch_size is None:
            yield from self.sampler._minibatches()
            return
        size = self.batch_size
        pending: list[int] = []
        for minibatch in self.sampler._minibatches():
            start = 0
            if pending:
                start = size - len(pending)
                pending.extend(minibatch[:start])
                if len(pending) < size:
                    continue
                yield pending
            while start + size <= len(minibatch):
                yield minibatch[start : start + size]
                start += size
            pending = minibatch[start:]
        if pending and not self.drop_last:
            yield pending

    def __len__(self) -> int:
        if self.batch_size is None:
            return self.sampler._native.minibatches_in_epoch(self.sampler.epoch)
        rows = len(self.sampler)
        if self.drop_last:
            return rows // self.batch_size
        return -(-rows // self.batch_size)
