"""The samplers (see the package's docstring), apart from the package so that what
needs no torch (the mount, the wheel's ``scdlfs`` command) does not import it: torch
takes a second or more to import."""

from __future__ import annotations

import array
import operator
import os
import sys
import warnings
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Any, Literal

from scdlfs._native import DEFAULT_HINT_LOOKAHEAD, HintWarning, NativePlan, NativeSampler, RowSubset
from scdlfs._native import read_cached_chunks
from scdlfs._native import split_by_chunk as _split_by_chunk

try:  # The samplers are torch Samplers when torch is installed, as it is for training.
    from torch.utils.data import Sampler as _TorchSampler
except ImportError:  # pragma: no cover - the protocol is all a DataLoader needs
    _TorchSampler = object  # type: ignore[assignment,misc]


Even = Literal["pad", "drop", "uneven"]
#: A dataset directory, or a dataset object that knows its directory (bionemo-scdl's
#: ``SingleCellMemMapDataset``, whose ``data_path`` it is).
Dataset = Any
#: Rows to visit instead of all: a :class:`RowSubset` (e.g. a part of
#: :func:`split_by_chunk`), a ``range``, or any iterable of row indices.
Indices = Any


def _directory_of(dataset: Dataset) -> str:
    """The directory of ``dataset``: a path itself, or the ``data_path`` of a
    ``SingleCellMemMapDataset`` (or of any object that has one)."""
    if isinstance(dataset, (str, os.PathLike)):
        return os.fspath(dataset)
    path = getattr(dataset, "data_path", None)
    if isinstance(path, (str, os.PathLike)):
        return os.fspath(path)
    raise TypeError(
        f"expected a dataset directory or a SingleCellMemMapDataset (anything with a data_path), "
        f"got {type(dataset).__name__}"
    )


def _row_subset(indices: Indices) -> RowSubset | None:
    if indices is None or isinstance(indices, RowSubset):
        return indices
    if isinstance(indices, range) and indices.step == 1:
        return RowSubset.from_ranges([(indices.start, indices.stop)] if indices.start < indices.stop else [])
    rows = indices.tolist() if hasattr(indices, "tolist") else list(indices)
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in rows):
        raise TypeError("indices must be non-negative integers (row indices of the dataset)")
    return RowSubset.from_rows(rows)


def split_by_chunk(dataset: Dataset, fractions: list[float], seed: int = 0) -> list[RowSubset]:
    """Splits ``dataset`` into parts of whole chunks (e.g. ``[0.9, 0.1]`` for training and
    validation), the chunks dealt at random by ``seed``: the parts are disjoint, hold every
    row between them, and each reads as locally as the whole dataset. Give a part to a
    sampler as ``indices=``; every rank must use the same seed."""
    return _split_by_chunk(_directory_of(dataset), list(fractions), seed)

def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"the environment variable {name}={value!r} is not an integer") from None


def _initialized_distributed() -> Any:
    """``torch.distributed`` if it is imported and has a process group, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def distributed_rank_and_world_size(
    rank: int | None = None, world_size: int | None = None
) -> tuple[int, int]:
    """This process's rank and the number of ranks, each taken from the argument when
    given, else from ``torch.distributed`` when it is initialized, else from the
    ``RANK`` and ``WORLD_SIZE`` variables that torchrun sets, else 0 and 1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = _initialized_distributed()
    if dist is not None:
        found_rank, found_world = dist.get_rank(), dist.get_world_size()
    else:
        env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        found_rank = 0 if env_rank is None else env_rank
        found_world = 1 if env_world is None else env_world
    return (found_rank if rank is None else rank, found_world if world_size is None else world_size)


# Samplers and plans alive in this process (anything whose _native holds a hint
# handle), so that a forked child (a DataLoader worker) drops the hint handles it
# inherited instead of holding its parent's plans open.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _forget_inherited_hints() -> None:
    for sampler in list(_LIVE):
        sampler._native.forget_inherited_hints()


os.register_at_fork(after_in_child=_forget_inherited_hints)


class _SCDLSampler(_TorchSampler):  # type: ignore[misc,valid-type]
    """What both samplers share: the epoch, the length, iteration and pickling."""

    _native: NativeSampler

    def __init__(
        self,
        dataset: Dataset,
        order: dict[str, Any],
        rank: int | None,
        world_size: int | None,
        even: Even | None,
        hints: bool,
        hint_lookahead: int,
        num_replicas: int | None,
        drop_last: bool | None,
        indices: Indices,
        cache_aware: bool = False,
    ) -> None:
        if num_replicas is not None:
            if world_size is not None and world_size != num_replicas:
                raise ValueError(f"num_replicas={num_replicas} and world_size={world_size} disagree: give one")
            world_size = num_replicas
        if drop_last is not None:
            implied = "drop" if drop_last else "pad"
            if even is not None and even != implied:
                raise ValueError(f"drop_last={drop_last} means even={implied!r}, but even={even!r} was given: give one")
            even = implied
        rank, world_size = distributed_rank_and_world_size(rank, world_size)
        self._dataset_dir = _directory_of(dataset)
        self._settings = dict(order, rank=rank, world_size=world_size, even=even or "pad", hints=hints,
                              hint_lookahead=hint_lookahead, subset=_row_subset(indices))  # fmt: skip
        self._epoch = 0
        self._rows_done = 0
        self._resume_at = 0
        self._loop: _LoopCount | None = None
        self._warned_rewrapped = False
        self._cache_aware = cache_aware
        self._cached: list[tuple[int, int]] | None = None
        self._native = self._build()
        _LIVE.add(self)

    def _build(self) -> NativeSampler:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration yields (as ``DistributedSampler`` does):
        each epoch has its own order, the same in every process. With
        ``cache_aware=True`` it also reads the daemon's announcement of what it holds,
        which the epoch reads first: on rank 0 only, shared with the others through
        ``torch.distributed`` when the world has several ranks (so every rank must call
        it, as a training loop does)."""
        self._select_epoch(epoch)
        if self._cache_aware:
            self._read_cached_chunks()

    def _select_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must not be negative, got {epoch}")
        if epoch != self._epoch:
            # A resume point belongs to its epoch (a training loop calls set_epoch with
            # the resumed epoch after load_state_dict, which must keep it).
            self._resume_at = self._rows_done = 0
            self._loop = None
        self._epoch = epoch
        if self._cache_aware:
            self._cached = None

    def _read_cached_chunks(self) -> None:
        """Reads the announcement for the current epoch: here when this is the only rank,
        on rank 0 and shared when ``torch.distributed`` joins several; left to
        :meth:`set_cached_chunks` when several ranks have no process group."""
        distributed = _initialized_distributed()
        if self.world_size > 1:
            if distributed is None:
                return
            held = [read_cached_chunks(self._dataset_dir) if distributed.get_rank() == 0 else None]
            distributed.broadcast_object_list(held, src=0)
            cached = held[0]
        else:
            cached = read_cached_chunks(self._dataset_dir)
        self._apply_cached(cached or [])

    def _apply_cached(self, cached: list[tuple[int, int]]) -> None:
        self._cached = [(int(a), int(b)) for a, b in cached]
        self._native.set_cache_aware_order(self._cached)

    def set_cached_chunks(self, cached: list[tuple[int, int]]) -> None:
        """Makes the current epoch read the chunks of ``cached`` (``(start, stop)``
        ranges of chunk ids, e.g. :func:`read_cached_chunks` of the dataset directory,
        read once and shared) first. Every rank and every process that computes the
        epoch must be given the same set: each then computes the same order."""
        if not self._cache_aware:
            raise ValueError("set_cached_chunks needs a sampler made with cache_aware=True")
        for start, stop in cached:
            if not 0 <= start <= stop:
                raise ValueError(f"({start}, {stop}) is not a range of chunk ids")
        self._apply_cached(list(cached))

    @property
    def cache_aware(self) -> bool:
        """Whether epochs read the chunks the daemon holds first."""
        return self._cache_aware

    @property
    def cached_chunks(self) -> list[tuple[int, int]] | None:
        """The chunks the current epoch reads first, once known (cache-aware only)."""
        return self._cached

    def _ensure_cached(self) -> None:
        """A cache-aware epoch's set, read now if this is the only rank."""
        if not self._cache_aware or self._cached is not None:
            return
        if self.world_size > 1:
            raise RuntimeError(
                f"cache_aware=True with {self.world_size} ranks needs one announcement shared by all of them: "
                "call set_epoch() on every rank with torch.distributed initialized, or set_cached_chunks() with "
                "read_cached_chunks() read once and shared"
            )
        self._read_cached_chunks()

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
    def num_replicas(self) -> int:
        """``world_size``, by ``DistributedSampler``'s name."""
        return self._settings["world_size"]

    @property
    def drop_last(self) -> bool:
        """Whether ranks are evened out by dropping rows (``even="drop"``)."""
        return self._settings["even"] == "drop"

    @property
    def indices(self) -> RowSubset | None:
        """The rows visited, when not the whole dataset."""
        return self._settings["subset"]

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
        self._ensure_cached()
        return self._native.rows_in_epoch(self._epoch)

    def __iter__(self) -> Iterator[int]:
        self._warn_if_rewrapped(sys._getframe(1))
        for minibatch in self._minibatches():
            for row in minibatch:
                self._rows_done += 1
                yield row
            if self._loop is not None:
                # Reads the loader's count while its iterator lives: a break drops it.
                self._loop.rows(self._rows_done)

    def _warn_if_rewrapped(self, caller: Any) -> None:
        """Warns once when Lightning's ``DistributedSamplerWrapper`` (whose dataset
        ``_DatasetSamplerWrapper`` lists the sampler) iterates this sampler: it would
        reshuffle the rows, shard them a second time and take the whole epoch at once."""
        if self._warned_rewrapped or type(caller.f_locals.get("self")).__name__ != "_DatasetSamplerWrapper":
            return
        self._warned_rewrapped = True
        warnings.warn(
            f"scdlfs.{type(self).__name__} is wrapped by Lightning's DistributedSamplerWrapper, which shuffles "
            "its rows again (losing chunk locality), shards them a second time (each rank reads a share of its "
            "share) and lists the whole epoch at once (the mount is told all of it at the start). The sampler "
            "already shards by rank: pass Trainer(use_distributed_sampler=False) and build the sampler in the "
            "LightningDataModule's train_dataloader().",
            UserWarning,
            stacklevel=3,
        )

    def _minibatches(self) -> Iterator[list[int]]:
        """The order's minibatches from the resume point (then from the epoch's start);
        a consumer counts the rows it hands out in ``_rows_done``."""
        self._ensure_cached()
        native = self._native
        cursor = native.start_epoch(self._epoch, self._resume_at)
        self._rows_done, self._resume_at = self._resume_at, 0
        self._loop = _LoopCount.of(sys._getframe(1), self)
        while (minibatch := native.next_minibatch(cursor)) is not None:
            yield minibatch

    def state_dict(self, rows_done: int | None = None) -> dict[str, Any]:
        """Where this rank is in the current epoch, for :meth:`load_state_dict` to resume
        there: the epoch and the rows of it done so far (or ``rows_done`` when given).
        When a DataLoader iterates the sampler, done are the rows its loop has received,
        not those its workers took ahead: taken inside the loop, the state is exact;
        taken after a ``break`` (the loader's iterator gone), it may be a batch short,
        which the resumed epoch then reads again. Otherwise, done are the rows the
        sampler handed out."""
        if rows_done is None:
            rows_done = self._rows_done if self._loop is None else self._loop.rows(self._rows_done)
        state = {
            "epoch": self._epoch,
            "rows_done": rows_done,
            "seed": self._settings["seed"],
            "rank": self.rank,
            "world_size": self.world_size,
            "rows_in_epoch": len(self),
        }
        if self._cache_aware:
            # The epoch's order depends on it: a resume must not read the cache anew.
            state["cached_chunks"] = self._cached
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next iteration resume ``state``'s epoch after its ``rows_done`` rows,
        yielding exactly the rows the interrupted iteration had still to yield, and
        telling the daemon the plan from there. The sampler must have the settings of the
        one that saved the state (same seed, rank, world size and rows per epoch)."""
        self._select_epoch(state["epoch"])
        if self._cache_aware and state.get("cached_chunks") is not None:
            self._apply_cached(state["cached_chunks"])
        saved = {k: state[k] for k in ("seed", "rank", "world_size")}
        mine = {"seed": self._settings["seed"], "rank": self.rank, "world_size": self.world_size}
        if saved != mine or state["rows_in_epoch"] != len(self):
            raise ValueError(
                f"the state is of another sampler ({saved}, {state['rows_in_epoch']} rows in epoch "
                f"{state['epoch']}) than this one ({mine}, {len(self)} rows)"
            )
        if not 0 <= state["rows_done"] <= len(self):
            raise ValueError(f"rows_done={state['rows_done']} is outside this epoch's {len(self)} rows")
        self._resume_at = self._rows_done = state["rows_done"]
        self._loop = None

    @property
    def hints_active(self) -> bool:
        """Whether this process tells the daemon its plan (False off a mount or with
        ``hints=False``). Opens the hint file if this process has not yet."""
        return self._native.hints_active()

    def take_hint_error(self) -> str | None:
        """The first hint failure in this process since the last call. Hints are advice:
        a failure never changes the rows; iterating warns of the first one with
        :class:`HintWarning`."""
        return self._native.take_hint_error()

    def __getstate__(self) -> dict[str, Any]:
        # The native sampler holds this process's hint handle: a process that unpickles
        # the sampler (a spawned worker) builds its own and opens its own handle.
        return {"dataset_dir": self._dataset_dir, "settings": self._settings, "epoch": self._epoch,
                "resume_at": self._resume_at, "cache_aware": self._cache_aware, "cached": self._cached}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._dataset_dir = state["dataset_dir"]
        self._settings = state["settings"]
        self._epoch = state["epoch"]
        self._rows_done = self._resume_at = state["resume_at"]
        self._loop = None
        self._warned_rewrapped = False
        self._cache_aware = state.get("cache_aware", False)
        self._cached = None
        self._native = self._build()
        if state.get("cached") is not None:
            self._apply_cached(state["cached"])
        _LIVE.add(self)

    def __repr__(self) -> str:
        # A weight or label a row: their count, not the rows.
        shown = {k: f"<{len(v)} rows>" if k in ("weights", "labels") and v is not None else repr(v)
                 for k, v in self._settings.items()}  # fmt: skip
        settings = ", ".join(f"{k}={v}" for k, v in shown.items())
        return f"{type(self).__name__}({self._dataset_dir!r}, {settings}, cache_aware={self._cache_aware}, epoch={self._epoch})"


class _LoopCount:
    """The rows of an epoch a DataLoader's loop has received. Its workers take rows
    ahead of the loop (``prefetch_factor`` batches each), so the rows the sampler handed
    out overstate them; the loader's iterator counts the items it yielded
    (``_num_yielded``, the counter torchdata's StatefulDataLoader builds on): rows,
    batches of ``batch_size`` rows cut by torch's BatchSampler, or batches of
    :class:`BatchSampler`, whose ends it notes."""

    def __init__(self, loader: Any, start: int, batch_size: int | None) -> None:
        # Weakly: the loader's iterator holds this sampler's generator, and must go (its
        # workers with it) when the loop drops it.
        self._loader = weakref.ref(loader)
        self._batch_size = batch_size
        self._start = start
        self._yielded = 0
        self._received = 0
        self._rows = start
        # Rows done after each batch handed out and not yet received by the loop.
        self._ends: deque[int] = deque()

    @staticmethod
    def of(frame: Any, sampler: _SCDLSampler) -> _LoopCount | None:
        """The count of the DataLoader iterator whose next() runs ``frame`` to take
        ``sampler``'s rows, if it takes them in a way known here; else None."""
        while frame is not None:
            loader = frame.f_locals.get("self")
            if hasattr(loader, "_num_yielded") and hasattr(loader, "_index_sampler"):
                taken = loader._index_sampler
                if taken is sampler:
                    return _LoopCount(loader, sampler._rows_done, 1)
                if isinstance(taken, BatchSampler) and taken.sampler is sampler:
                    return _LoopCount(loader, sampler._rows_done, None)
                if getattr(taken, "sampler", None) is sampler and isinstance(getattr(taken, "batch_size", None), int):
                    return _LoopCount(loader, sampler._rows_done, taken.batch_size)
                return None
            frame = frame.f_back
        return None

    def batch_handed_out(self, rows_done: int) -> None:
        self._ends.append(rows_done)

    def rows(self, handed_out: int) -> int:
        """The rows received, as of the loader's count now (or its last while it lived);
        ``handed_out`` bounds a last short batch."""
        loader = self._loader()
        if loader is not None:
            self._yielded = loader._num_yielded
        if self._batch_size is not None:
            return min(self._start + self._yielded * self._batch_size, handed_out)
        while self._received < self._yielded and self._ends:
            self._rows = self._ends.popleft()
            self._received += 1
        return self._rows


class ChunkWindowSampler(_SCDLSampler):
    """The chunk-window order: the dataset's chunks in a random order (new each epoch),
    taken ``chunks_per_window`` at a time, the rows of each window shuffled. A window is
    one step: ranks take whole windows round-robin.

    Args:
        dataset: the dataset directory (an scdlfs mount's flat or raw view, or a local
            SCDL archive, whose chunks are then virtual), or a ``SingleCellMemMapDataset``
            opened there.
        chunks_per_window: chunks read together; more mixes rows better and needs more
            cache.
        seed: the seed every rank must share.
        shuffle: False visits chunks and rows in ascending order; sets both of
            ``shuffle_chunks`` (the chunks' order, new each epoch) and
            ``shuffle_within_window`` (the rows' order inside a window) unless they are
            given.
        rank, world_size (or ``num_replicas``): this process's share; by default from
            ``torch.distributed`` when initialized, else ``RANK``/``WORLD_SIZE``, else 0
            and 1.
        even: how ranks with different row counts are evened out: ``"pad"`` repeats a
            rank's own rows (the default, as ``DistributedSampler``), ``"drop"`` cuts
            every rank to the shortest share, ``"uneven"`` leaves shares as dealt.
            ``drop_last=True``/``False`` is ``"drop"``/``"pad"``, as in ``DistributedSampler``.
        indices: visit only these rows (a part of :func:`split_by_chunk`, a ``range`` or
            any row indices); windows are made of the chunks that hold them.
        hints: tell an scdlfs mount the order (default True; no effect off a mount).
        hint_lookahead: windows announced ahead of the one being read.
        cache_aware: read the chunks the daemon holds first each epoch (default False:
            docs/preparing-data.md has what it does to minibatch diversity); see
            :meth:`set_epoch` and :meth:`set_cached_chunks`.
        weights, labels: draw rows by weight (one a row, any scale), or so that every
            class (one a row, any hashable) comes as often: each unit of the epoch draws a
            chunk by weight and as many of its rows as it holds, by weight, with
            replacement, so windows still read whole chunks (not with ``cache_aware``).
    """

    def __init__(
        self,
        dataset: Dataset,
        chunks_per_window: int = 4,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        even: Even | None = None,
        hints: bool = True,
        hint_lookahead: int = DEFAULT_HINT_LOOKAHEAD,
        *,
        shuffle_chunks: bool | None = None,
        shuffle_within_window: bool | None = None,
        num_replicas: int | None = None,
        drop_last: bool | None = None,
        indices: Indices = None,
        cache_aware: bool = False,
        weights: Any = None,
        labels: Any = None,
    ) -> None:
        order = dict(
            chunks_per_window=chunks_per_window,
            seed=seed,
            shuffle_chunks=shuffle if shuffle_chunks is None else shuffle_chunks,
            shuffle_within_window=shuffle if shuffle_within_window is None else shuffle_within_window,
            **_weighting(weights, labels, cache_aware),
        )
        super().__init__(dataset, order, rank, world_size, even, hints, hint_lookahead, num_replicas, drop_last,
                         indices, cache_aware)  # fmt: skip

    def _build(self) -> NativeSampler:
        return NativeSampler.chunk_windows(self._dataset_dir, **self._settings)

    def batches(self, batch_size: int, drop_last: bool = False) -> BatchSampler:
        """The batch-sampler form, for ``DataLoader(batch_sampler=...)``: this order's
        rows cut into minibatches of ``batch_size``, as ``torch.utils.data.BatchSampler``
        cuts them."""
        return BatchSampler(self, batch_size, drop_last)


class ChunkAwareSampler(ChunkWindowSampler):
    """The chunk-window order by the name and signature of the remote-SCDL proposal's
    sampler: ``ChunkAwareSampler(dataset, chunks_per_window=2, shuffle_chunks=True,
    shuffle_within_window=True)``. Every other argument is :class:`ChunkWindowSampler`'s."""

    def __init__(
        self,
        dataset: Dataset,
        chunks_per_window: int = 2,
        shuffle_chunks: bool = True,
        shuffle_within_window: bool = True,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, chunks_per_window, seed, shuffle_chunks=shuffle_chunks,
                         shuffle_within_window=shuffle_within_window, **kwargs)  # fmt: skip


class BlockSampler(_SCDLSampler):
    """scDataset's block order: contiguous blocks of ``block_size`` rows drawn at
    random, ``fetch_factor`` minibatches' worth read together in ascending order (one
    step, and one ranged read per block), the fetch's rows shuffled and cut into
    minibatches of ``batch_size``. Ranks take whole fetches round-robin.

    With ``weights`` (one a row of the dataset, any scale) or ``labels`` (one a row, any
    hashable class), as :class:`ChunkWindowSampler` takes them, an epoch instead draws
    as many rows as it visits, with replacement,
    each row with a chance in proportion to its weight, or so that every class is drawn
    as often (scDataset's ``BlockWeightedSampling`` and ``ClassBalancedSampling``): each
    unit draws a block by weight and its rows inside the block by weight, so fetches
    still read blocks. Seeded, sharded by rank and resumable as the plain order; not
    with ``cache_aware``.

    Args: as :class:`ChunkWindowSampler` (``indices``: blocks are cut from those rows in
    ascending order), and
        block_size: rows per block (1 gives uniformly random rows).
        batch_size: rows per minibatch.
        fetch_factor: minibatches per fetch.
    """

    def __init__(
        self,
        dataset: Dataset,
        block_size: int = 32,
        fetch_factor: int = 16,
        batch_size: int = 64,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        even: Even | None = None,
        hints: bool = True,
        hint_lookahead: int = DEFAULT_HINT_LOOKAHEAD,
        *,
        num_replicas: int | None = None,
        drop_last: bool | None = None,
        indices: Indices = None,
        cache_aware: bool = False,
        weights: Any = None,
        labels: Any = None,
    ) -> None:
        order = dict(block_size=block_size, batch_size=batch_size, fetch_factor=fetch_factor, seed=seed,
                     **_weighting(weights, labels, cache_aware))  # fmt: skip
        super().__init__(dataset, order, rank, world_size, even, hints, hint_lookahead, num_replicas, drop_last,
                         indices, cache_aware)  # fmt: skip

    def _build(self) -> NativeSampler:
        return NativeSampler.blocks(self._dataset_dir, **self._settings)

    def batches(self) -> BatchSampler:
        """The batch-sampler form, for ``DataLoader(batch_sampler=...)``: the order's own
        minibatches of ``batch_size`` rows (a fetch's last one may be shorter)."""
        return BatchSampler(self, None, False)


def _weighting(weights: Any, labels: Any, cache_aware: bool) -> dict[str, Any]:
    """The native order's ``weights``/``labels`` arguments, checked."""
    if weights is not None and labels is not None:
        raise ValueError("give weights or labels, not both")
    if cache_aware and (weights is not None or labels is not None):
        raise ValueError("a weighted order draws its rows: it cannot read the cached chunks first")
    return dict(weights=None if weights is None else _doubles(weights),
                labels=None if labels is None else _class_codes(labels))  # fmt: skip


def _doubles(values: Any) -> Any:
    """``values`` as a buffer of float64 for the native order: a numpy (or torch) array
    converted without a copy where it already is one, anything else through ``array``."""
    if hasattr(values, "__array__"):
        import numpy as np

        return np.ascontiguousarray(values, dtype=np.float64)
    return array.array("d", values)


def _class_codes(labels: Any) -> Any:
    """A class code (0, 1, …) a row for ``labels`` of any hashable class, as a buffer of
    uint64: which rows share a class is all the order needs."""
    if hasattr(labels, "__array__"):
        import numpy as np

        codes = np.unique(np.asarray(labels), return_inverse=True)[1].reshape(-1)
        return np.ascontiguousarray(codes, dtype=np.uint64)
    seen: dict[Any, int] = {}
    return array.array("Q", (seen.setdefault(label, len(seen)) for label in labels))


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

    def state_dict(self, rows_done: int | None = None) -> dict[str, Any]:
        """The sampler's :meth:`~_SCDLSampler.state_dict`; rows are counted by batches
        handed out."""
        return self.sampler.state_dict(rows_done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    def __iter__(self) -> Iterator[list[int]]:
        sampler = self.sampler
        for batch in self._batches():
            sampler._rows_done += len(batch)
            if sampler._loop is not None:
                sampler._loop.batch_handed_out(sampler._rows_done)
                # Reads the loader's count while its iterator lives (a break drops it),
                # and lets go of the ends of batches the loop has received.
                sampler._loop.rows(sampler._rows_done)
            yield batch

    def _batches(self) -> Iterator[list[int]]:
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
            self.sampler._ensure_cached()
            return self.sampler._native.minibatches_in_epoch(self.sampler.epoch)
        rows = len(self.sampler)
        if self.drop_last:
            return rows // self.batch_size
        return -(-rows // self.batch_size)


#: Rows per step of a wrapped order unless told otherwise: a fetch of the block order's
#: defaults (minibatches of 64, fetch factor 16), the step size the daemon's prefetch
#: is measured with.
DEFAULT_STEP_ROWS = 1024

_END = object()


def _is_row(item: Any) -> bool:
    """Whether an order's item is one row index (a Sampler's) rather than a batch of them
    (a BatchSampler's)."""
    try:
        operator.index(item)
    except TypeError:
        return False
    return True


class _Lookahead:
    """Steps of an order announced a bounded number ahead of the reader, as the samplers'
    own plans are: topped up to ``lookahead`` steps (the one being entered counted) once
    half of them or fewer remain, each top-up written with the reader's step."""

    def __init__(self, native: NativePlan, steps: Iterator[tuple[Any, list[int]]], lookahead: int) -> None:
        self._native = native
        self._steps = steps
        self._lookahead = lookahead
        self._ahead: deque[tuple[Any, list[int]]] = deque()  # announced, not yet entered
        self._done = False
        self._entered = 0

    def enter(self) -> Any:
        """The next step's items, once the daemon has been told of it and of the steps
        after it and that the reader is in it; ``_END`` after the last."""
        fresh = []
        if not self._done and len(self._ahead) <= self._lookahead // 2:
            while len(self._ahead) + len(fresh) < self._lookahead:
                step = next(self._steps, None)
                if step is None:
                    self._done = True
                    break
                fresh.append(step)
            self._ahead.extend(fresh)
        if not self._ahead:
            # The plan's line, if no step went with it: an empty order's plan still
            # replaces the one of the epoch before.
            self._native.advance([], None)
            return _END
        self._native.advance([rows for _, rows in fresh], self._entered)
        self._entered += 1
        return self._ahead.popleft()[0]


class Planned(_TorchSampler):  # type: ignore[misc,valid-type]
    """Any order of rows, told to an scdlfs mount ahead of its reader: wrap a torch
    ``Sampler`` (``RandomSampler``, ``WeightedRandomSampler``, ``SubsetRandomSampler``,
    ``DistributedSampler``, one of your own) or ``BatchSampler``, or any re-iterable of
    row indices or of lists of them, and give the wrapper to the DataLoader in its place:

        sampler = scdlfs.Planned(RandomSampler(dataset), dataset)
        loader = DataLoader(dataset, sampler=sampler, batch_size=64, num_workers=4)

    It yields exactly the wrapped order. On a mount, the process that iterates it (the
    DataLoader's main process) reads the order ahead of what it yields, cuts it into
    steps of ``step_rows`` consecutive rows (a batch sampler's at batch boundaries) and
    writes them as ``rows`` steps of the hint protocol, ``lookahead_rows`` ahead, through
    the writer the samplers use; the daemon fetches those rows before the workers read
    them. Each process (each rank of ``torch.distributed``) writes its own plan. Off a
    mount, or with ``hints=False``, iterating it is iterating the wrapped order.

    Indices must be row indices of the dataset at ``dataset`` (the directory, or a
    ``SingleCellMemMapDataset`` opened there). A step's rows are fetched together: a
    longer step or lookahead asks for more of the cache. ``set_epoch`` is passed on to
    the wrapped order (and numbers the plan).
    """

    def __init__(
        self,
        order: Iterable[Any],
        dataset: Dataset,
        lookahead_rows: int = DEFAULT_HINT_LOOKAHEAD * DEFAULT_STEP_ROWS,
        step_rows: int = DEFAULT_STEP_ROWS,
        hints: bool = True,
    ) -> None:
        if step_rows < 1:
            raise ValueError(f"step_rows must be at least 1, got {step_rows}")
        if lookahead_rows < 1:
            raise ValueError(f"lookahead_rows must be at least 1, got {lookahead_rows}")
        self.order = order
        self.lookahead_rows = lookahead_rows
        self.step_rows = step_rows
        self._dataset_dir = _directory_of(dataset)
        self._hints = hints
        self._epoch = 0
        self._native = NativePlan(self._dataset_dir, hints=hints)
        _LIVE.add(self)

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        set_epoch = getattr(self.order, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def dataset_dir(self) -> str:
        return self._dataset_dir

    def __len__(self) -> int:
        return len(self.order)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        order = iter(self.order)
        if not self._native.start(self._epoch):
            # Not on a mount: the wrapped order's own iterator, not one more layer.
            return order
        lookahead = -(-self.lookahead_rows // self.step_rows)
        return self._planned(_Lookahead(self._native, self._steps(order), lookahead))

    @staticmethod
    def _planned(lookahead: _Lookahead) -> Iterator[Any]:
        while (items := lookahead.enter()) is not _END:
            yield from items

    def _steps(self, order: Iterator[Any]) -> Iterator[tuple[list[Any], list[int]]]:
        """The order cut into steps: (the items as the order gives them, their rows)."""
        first = next(order, _END)
        if first is _END:
            return
        order = chain((first,), order)
        if _is_row(first):
            while items := list(islice(order, self.step_rows)):
                yield items, items
            return
        batches: list[Any] = []
        rows = 0
        for batch in order:
            batches.append(batch)
            rows += len(batch)
            if rows >= self.step_rows:
                yield batches, list(chain.from_iterable(batches))
                batches, rows = [], 0
        if batches:
            yield batches, list(chain.from_iterable(batches))

    @property
    def hints_active(self) -> bool:
        """Whether this process tells the daemon the plan (False off a mount or with
        ``hints=False``)."""
        return self._native.hints_active()

    def take_hint_error(self) -> str | None:
        """The first hint failure in this process since the last call (iterating warns
        of the first one with :class:`HintWarning`)."""
        return self._native.take_hint_error()

    def __getstate__(self) -> dict[str, Any]:
        # The native plan holds this process's hint handle: a process that unpickles
        # the wrapper opens its own.
        return {"order": self.order, "dataset_dir": self._dataset_dir, "lookahead_rows": self.lookahead_rows,
                "step_rows": self.step_rows, "hints": self._hints, "epoch": self._epoch}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.order = state["order"]
        self._dataset_dir = state["dataset_dir"]
        self.lookahead_rows = state["lookahead_rows"]
        self.step_rows = state["step_rows"]
        self._hints = state["hints"]
        self._epoch = state["epoch"]
        self._native = NativePlan(self._dataset_dir, hints=self._hints)
        _LIVE.add(self)

    def __repr__(self) -> str:
        return (f"Planned({self.order!r}, {self._dataset_dir!r}, lookahead_rows={self.lookahead_rows}, "
                f"step_rows={self.step_rows}, hints={self._hints})")  # fmt: skip


def plan_scdataset(
    scdataset: Any,
    dataset: Dataset = None,
    lookahead_rows: int = DEFAULT_HINT_LOOKAHEAD * DEFAULT_STEP_ROWS,
    hints: bool = True,
) -> Any:
    """Makes an ``scdataset.scDataset`` (the released package, 0.3) tell an scdlfs mount
    the order its strategy draws (``Streaming``, ``BlockShuffling``,
    ``BlockWeightedSampling``, ``ClassBalancedSampling`` or your own), and returns it:

        data = scdlfs.plan_scdataset(scDataset(reader, BlockShuffling(block_size=32), batch_size=64,
                                               fetch_factor=16, fetch_callback=read_rows))
        loader = DataLoader(data, batch_size=None, num_workers=4)

    Each process that iterates it (each DataLoader worker, each rank) announces its own
    fetches, one ``rows`` step per fetch, ``lookahead_rows`` ahead, through the writer
    :class:`Planned` uses, and says which fetch it reads as it reads it. The package is
    unchanged: the instance's strategy is wrapped to see the epoch's indices, and its
    ``fetch_callback`` (or the plain ``collection[indices]``) to see each fetch. Its
    indices must be row indices of ``dataset`` (by default the directory of the
    scDataset's collection, e.g. a ``SingleCellMemMapDataset``). Should a fetch not be
    the one planned (an scDataset that deals fetches otherwise than 0.3 does), that
    process stops planning for the epoch and warns once."""
    plan = _ScDatasetPlan(scdataset, _directory_of(scdataset.collection if dataset is None else dataset),
                          lookahead_rows, hints)  # fmt: skip
    scdataset.strategy = plan
    scdataset.fetch_callback = plan.fetch
    return scdataset


class _ScDatasetPlan:
    """An scDataset's strategy and fetch callback, seen by the plan: the strategy's
    indices are cut into this process's fetches as ``scDataset.__iter__`` (0.3) deals
    them (round-robin over ranks, then contiguous runs over DataLoader workers), and each
    fetch read enters the next step."""

    def __init__(self, owner: Any, dataset_dir: str, lookahead_rows: int, hints: bool) -> None:
        if lookahead_rows < 1:
            raise ValueError(f"lookahead_rows must be at least 1, got {lookahead_rows}")
        # Weak: the scDataset holds this plan, and a cycle would keep its hint handle
        # open until a garbage collection rather than until the scDataset goes.
        self._owner = weakref.ref(owner)
        self.strategy = owner.strategy
        self.fetch_callback = owner.fetch_callback
        self.dataset_dir = dataset_dir
        self.lookahead_rows = lookahead_rows
        self.hints = hints
        self._native = NativePlan(dataset_dir, hints=hints)
        self._lookahead: _Lookahead | None = None
        self._warned = False
        _LIVE.add(self)

    def __getattr__(self, name: str) -> Any:
        # Everything else scDataset asks of its strategy (get_len, _shuffle_before_yield).
        if name.startswith("__") or "strategy" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def get_indices(self, data_collection: Any, seed: int | None = None, rng: Any = None) -> Any:
        indices = self.strategy.get_indices(data_collection, seed=seed, rng=rng)
        owner = self._owner()
        self._lookahead = None
        # scDataset counts the epoch up just before it asks for the indices.
        if owner is not None and self._native.start(owner._epoch - 1):
            lookahead = max(1, self.lookahead_rows // owner.fetch_size)
            self._lookahead = _Lookahead(self._native, self._fetches(owner, indices), lookahead)
        return indices

    @staticmethod
    def _fetches(owner: Any, indices: Any) -> Iterator[tuple[Any, list[int]]]:
        """This process's fetches, as scDataset 0.3's ``__iter__`` deals them, sorted as
        it reads them: (the rows as an array, as a list)."""
        import numpy as np
        from torch.utils.data import get_worker_info

        n = len(indices)
        size = owner.fetch_size
        ids = list(range(owner.rank, -(-n // size), owner.world_size))
        worker = get_worker_info()
        if worker is not None and ids:
            per_worker, remainder = divmod(len(ids), worker.num_workers)
            start = worker.id * per_worker + min(worker.id, remainder)
            ids = ids[start : start + per_worker + (worker.id < remainder)]
        for i in ids:
            rows = np.sort(indices[i * size : min((i + 1) * size, n)])
            yield rows, rows.tolist()

    def fetch(self, collection: Any, fetch_indices: Any) -> Any:
        if self._lookahead is not None:
            self._enter(fetch_indices)
        if self.fetch_callback is not None:
            return self.fetch_callback(collection, fetch_indices)
        return collection[fetch_indices]

    def _enter(self, fetch_indices: Any) -> None:
        import numpy as np

        planned = self._lookahead.enter()  # type: ignore[union-attr]
        if planned is not _END and np.array_equal(planned, fetch_indices):
            return
        self._lookahead = None
        if not self._warned:
            self._warned = True
            warnings.warn(
                "scdlfs.plan_scdataset: a fetch of this scDataset is not the one its plan foresaw (a version that "
                "deals fetches otherwise than scdataset 0.3?); the mount is told no more of this epoch's order "
                "(rows are unaffected)",
                HintWarning,
                stacklevel=3,
            )

    def take_hint_error(self) -> str | None:
        """The first hint failure in this process since the last call."""
        return self._native.take_hint_error()

    def __getstate__(self) -> dict[str, Any]:
        # A spawned DataLoader worker opens its own hint handle.
        return {"owner": self._owner(), "strategy": self.strategy, "fetch_callback": self.fetch_callback,
                "dataset_dir": self.dataset_dir, "lookahead_rows": self.lookahead_rows, "hints": self.hints}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        owner = state.pop("owner")
        self.__dict__.update(state)
        self._owner = weakref.ref(owner)
        self._native = NativePlan(self.dataset_dir, hints=self.hints)
        self._lookahead = None
        self._warned = False
        _LIVE.add(self)
