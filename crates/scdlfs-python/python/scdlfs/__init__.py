"""PyTorch samplers for SCDL single-cell datasets on an scdlfs mount, and the mount
itself from Python (:func:`mount`, :func:`open_dataset`).

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
is written. ``hints=False`` turns the hints off. Should the mount not take the hints
(another protocol version, a refused write), the sampler warns once with
:class:`HintWarning` (an error under ``-W error``) and keeps yielding the same rows.

With ``cache_aware=True`` (off by default) an epoch reads first the chunks the daemon
announces it holds in its disk cache, then the rest, each in the seeded order: the
same rows, fetched once less where the cache holds them (see
:meth:`_SCDLSampler.set_cached_chunks` for several ranks).

Any other order (torch's samplers, a batch sampler, a user's own) tells the mount its
rows the same way through :class:`Planned`, and the released scDataset's strategies
through :func:`plan_scdataset`.

A sampler visits a part of the rows with ``indices=`` (e.g. a part of
:func:`split_by_chunk`), and resumes an interrupted epoch with
``load_state_dict(state_dict())``.

    from torch.utils.data import DataLoader
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset
    import scdlfs

    dataset = SingleCellMemMapDataset("/mnt/atlas/tahoe")
    sampler = scdlfs.ChunkWindowSampler(dataset, chunks_per_window=4, seed=0)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=2,
                        collate_fn=...)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...
"""

from __future__ import annotations

from typing import Any

from scdlfs._mount import Mount, MountError, mount, open_dataset, redact, runtime_dir, scdlfs_binary
from scdlfs._native import HintWarning, NotADatasetError, RowSubset, read_cached_chunks

__all__ = [
    "BatchSampler",
    "BlockSampler",
    "ChunkAwareSampler",
    "ChunkWindowSampler",
    "HintWarning",
    "Mount",
    "MountError",
    "NotADatasetError",
    "Planned",
    "RowSubset",
    "distributed_rank_and_world_size",
    "mount",
    "open_dataset",
    "plan_scdataset",
    "read_cached_chunks",
    "redact",
    "runtime_dir",
    "scdlfs_binary",
    "split_by_chunk",
]

#: The names :mod:`scdlfs._samplers` defines, imported on first use: with them torch.
_SAMPLERS = {"BatchSampler", "BlockSampler", "ChunkAwareSampler", "ChunkWindowSampler", "Planned",
             "distributed_rank_and_world_size", "plan_scdataset", "split_by_chunk"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _SAMPLERS:
        from scdlfs import _samplers

        return getattr(_samplers, name)
    raise AttributeError(f"module 'scdlfs' has no attribute {name!r}")
