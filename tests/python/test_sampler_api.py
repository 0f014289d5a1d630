"""The samplers' arguments by the names PyTorch users know, and their properties over
many drawn cases: a dataset object or a path; `num_replicas` and `drop_last`;
`shuffle_chunks` and `shuffle_within_window`; `indices=` and splits by chunk (every row
of the part once per epoch, ranks' shares disjoint, parts disjoint and covering, windows
still local); `state_dict()`/`load_state_dict()` (a resumed epoch is the rest of the
uninterrupted one); `ChunkAwareSampler` by the remote-SCDL proposal's signature; and a
hint the mount does not take, warned of once (an error where warnings are).

The dataset is conftest's `synth_3k` (3000 rows), chunked by `scdlfs chunk` into 12
chunks of 256 rows (the last short), read locally: the orders need only its header.
"""

from __future__ import annotations

import itertools
import os
import pickle
import random
import shutil
import warnings

import pytest

import scdlfs

CHUNK_ROWS = 256  # conftest.CHUNK_ROWS
ROWS = 3000
CHUNKS = 12


@pytest.fixture(scope="module")
def path(chunked) -> str:
    return str(chunked["synth_3k"])


def chunk_of(row: int) -> int:
    return row // CHUNK_ROWS


def drawn(count: int, seed: int = 0):
    """`count` reproducible random cases."""
    return [random.Random(seed * 1000 + i) for i in range(count)]


# --------------------------------------------------------------------------
# A dataset object or a path
# --------------------------------------------------------------------------


def test_a_dataset_object_is_taken_for_its_directory(monolithic):
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    directory = monolithic["synth_3k"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = SingleCellMemMapDataset(str(directory))
    by_object = scdlfs.ChunkWindowSampler(dataset, seed=3)
    by_path = scdlfs.ChunkWindowSampler(directory, seed=3)
    assert by_object.dataset_dir == str(directory)
    assert list(by_object) == list(by_path)
    assert len(by_object) == len(dataset) == ROWS
    with pytest.raises(TypeError, match="expected a dataset directory or a SingleCellMemMapDataset"):
        scdlfs.BlockSampler(object())


# --------------------------------------------------------------------------
# torch's names: num_replicas, drop_last
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [scdlfs.ChunkWindowSampler, scdlfs.BlockSampler])
def test_num_replicas_and_drop_last_are_world_size_and_even(kind, path):
    for rank in range(3):
        assert list(kind(path, rank=rank, num_replicas=3, drop_last=True)) == list(
            kind(path, rank=rank, world_size=3, even="drop")
        )
        assert list(kind(path, rank=rank, num_replicas=3, drop_last=False)) == list(
            kind(path, rank=rank, world_size=3, even="pad")
        )
    s = kind(path, rank=1, num_replicas=3, drop_last=True)
    assert (s.num_replicas, s.world_size, s.drop_last) == (3, 3, True)
    assert kind(path, rank=0, world_size=3).drop_last is False  # "pad", DistributedSampler's default
    with pytest.raises(ValueError, match="num_replicas=2 and world_size=3 disagree"):
        kind(path, rank=0, world_size=3, num_replicas=2)
    with pytest.raises(ValueError, match="drop_last=True means even='drop'"):
        kind(path, rank=0, world_size=3, drop_last=True, even="pad")


# --------------------------------------------------------------------------
# shuffle_chunks, shuffle_within_window, and the proposal's ChunkAwareSampler
# --------------------------------------------------------------------------


def windows_of(rows: list[int], chunks_per_window: int) -> list[list[int]]:
    """The rows cut into the windows they were read in (full windows of 256-row chunks)."""
    size = chunks_per_window * CHUNK_ROWS
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def test_shuffle_chunks_and_shuffle_within_window_are_separate(path):
    def rows(**kw):
        return list(scdlfs.ChunkWindowSampler(path, chunks_per_window=2, seed=5, **kw))

    in_order = rows(shuffle=False)
    assert in_order == list(range(ROWS))
    chunks_only = rows(shuffle_chunks=True, shuffle_within_window=False)
    rows_only = rows(shuffle_chunks=False, shuffle_within_window=True)
    both = rows(shuffle_chunks=True, shuffle_within_window=True)
    # Chunks shuffled, rows not: each chunk's rows come out whole and ascending, the
    # short last chunk wherever its window falls.
    runs = [list(run) for _, run in itertools.groupby(chunks_only, key=chunk_of)]
    assert len(runs) == CHUNKS and [chunk_of(r[0]) for r in runs] != list(range(CHUNKS))
    assert all(r[0] % CHUNK_ROWS == 0 and r == list(range(r[0], r[0] + len(r))) for r in runs)
    # Rows shuffled, chunks not: window k holds chunks 2k and 2k + 1, in no row order.
    for k, window in enumerate(windows_of(rows_only, 2)):
        assert {chunk_of(r) for r in window} == {2 * k, 2 * k + 1}
        assert window != sorted(window)
    assert both == rows()  # shuffle=True is both
    assert sorted(chunks_only) == sorted(rows_only) == sorted(both) == in_order


def test_chunk_aware_sampler_takes_the_proposals_arguments(path):
    proposal = scdlfs.ChunkAwareSampler(path, chunks_per_window=2, shuffle_chunks=True, shuffle_within_window=True)
    assert list(proposal) == list(scdlfs.ChunkWindowSampler(path, chunks_per_window=2, seed=0))
    assert sorted(proposal) == list(range(ROWS))
    assert list(scdlfs.ChunkAwareSampler(path, shuffle_chunks=False, shuffle_within_window=False)) == list(range(ROWS))
    distributed = scdlfs.ChunkAwareSampler(path, seed=4, num_replicas=2, rank=1, drop_last=True)
    assert list(distributed) == list(scdlfs.ChunkWindowSampler(path, 2, seed=4, rank=1, world_size=2, even="drop"))


# --------------------------------------------------------------------------
# indices= and splits by chunk
# --------------------------------------------------------------------------


def test_indices_are_visited_once_per_epoch_and_nothing_else(path):
    for rng in drawn(12):
        indices = rng.sample(range(ROWS), rng.randrange(1, ROWS))
        kind = rng.choice(["windows", "blocks"])
        cpw = rng.randrange(1, 4)

        def make(**kw):
            if kind == "windows":
                return scdlfs.ChunkWindowSampler(path, chunks_per_window=cpw, seed=rng.randrange(99), **kw)
            return scdlfs.BlockSampler(path, block_size=rng.randrange(1, 40), batch_size=16, fetch_factor=2, **kw)

        sampler = make(indices=indices)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            rows = list(sampler)
            assert sorted(rows) == sorted(indices), (kind, epoch)
            assert len(sampler) == len(indices)
        if kind == "windows":
            # Locality: the rows fall into ceil(chunks touched / cpw) runs of at most
            # `cpw` chunks each, the windows (counted greedily, which is exact here).
            runs, current = 1, set()
            for row in rows:
                if chunk_of(row) not in current and len(current) == cpw:
                    runs, current = runs + 1, set()
                current.add(chunk_of(row))
            touched = {chunk_of(r) for r in indices}
            assert runs == -(-len(touched) // cpw)


def test_indices_accept_a_range_an_array_and_a_row_subset(path):
    import numpy as np

    by_range = scdlfs.BlockSampler(path, indices=range(100, 900), seed=2)
    by_array = scdlfs.BlockSampler(path, indices=np.arange(100, 900), seed=2)
    by_subset = scdlfs.BlockSampler(path, indices=scdlfs.RowSubset.from_ranges([(100, 900)]), seed=2)
    assert list(by_range) == list(by_array) == list(by_subset)
    assert sorted(by_range) == list(range(100, 900))
    with pytest.raises(ValueError, match="row 3000 is out of range: the dataset has 3000 rows"):
        scdlfs.ChunkWindowSampler(path, indices=[5, 3000])
    with pytest.raises(TypeError, match="non-negative integers"):
        scdlfs.ChunkWindowSampler(path, indices=[-1])


def test_ranks_share_the_indices_without_overlap(path):
    for rng in drawn(8, seed=1):
        indices = rng.sample(range(ROWS), rng.randrange(ROWS // 2, ROWS))
        world = rng.randrange(2, 4)
        shares = [set(scdlfs.BlockSampler(path, block_size=8, batch_size=16, fetch_factor=2, seed=7, rank=r,
                                          num_replicas=world, even="uneven", indices=indices))
                  for r in range(world)]  # fmt: skip
        assert sum(len(s) for s in shares) == len(set().union(*shares)) == len(indices)
        assert set().union(*shares) == set(indices)


def test_a_split_by_chunk_is_disjoint_covering_and_keeps_chunks_whole(path, monolithic):
    for rng in drawn(10, seed=2):
        weights = [rng.randrange(1, 5) for _ in range(rng.randrange(1, 4))]
        fractions = [w / sum(weights) for w in weights]
        seed = rng.randrange(1000)
        parts = scdlfs.split_by_chunk(path, fractions, seed=seed)
        assert scdlfs.split_by_chunk(path, fractions, seed=seed) == parts
        rows = [[row for start, stop in part.ranges() for row in range(start, stop)] for part in parts]
        assert sum(len(r) for r in rows) == ROWS and sorted(sum(rows, [])) == list(range(ROWS))
        chunks = [{chunk_of(r) for r in part} for part in rows]
        for a in range(len(chunks)):
            for b in range(a + 1, len(chunks)):
                assert not chunks[a] & chunks[b], "a chunk is cut between two parts"
        for part, part_rows in zip(parts, rows):
            sampler = scdlfs.ChunkWindowSampler(path, chunks_per_window=2, seed=1, indices=part)
            assert sorted(sampler) == part_rows
    train, validation = scdlfs.split_by_chunk(path, [0.75, 0.25], seed=1)
    assert len({chunk_of(r) for s, e in validation.ranges() for r in range(s, e)}) == 3
    with pytest.raises(ValueError, match="must be positive and add up to 1"):
        scdlfs.split_by_chunk(path, [0.5, 0.6])
    with pytest.raises(ValueError, match="gives part 1 .* no chunk"):
        scdlfs.split_by_chunk(path, [0.99, 0.01])


# --------------------------------------------------------------------------
# state_dict / load_state_dict
# --------------------------------------------------------------------------


def test_a_resumed_epoch_is_the_rest_of_the_uninterrupted_one(path):
    for rng in drawn(16, seed=3):
        kw = dict(seed=rng.randrange(100), rank=rng.randrange(2), num_replicas=2,
                  indices=rng.sample(range(ROWS), 2000) if rng.random() < 0.5 else None)  # fmt: skip
        cpw = rng.randrange(1, 3)
        if rng.random() < 0.5:
            make = lambda: scdlfs.ChunkWindowSampler(path, chunks_per_window=cpw, **kw)  # noqa: E731
        else:
            make = lambda: scdlfs.BlockSampler(path, block_size=16, batch_size=32, fetch_factor=4, **kw)  # noqa: E731
        interrupted, resumed = make(), make()
        epoch = rng.randrange(3)
        interrupted.set_epoch(epoch)
        whole = list(interrupted)
        cut = rng.randrange(len(whole) + 1)
        rows = iter(interrupted)
        for _ in range(cut):
            next(rows)
        state = interrupted.state_dict()
        assert state["rows_done"] == cut and state["epoch"] == epoch
        # Through pickle, as a checkpoint would carry it, into a fresh sampler.
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        resumed.set_epoch(epoch)  # a training loop's set_epoch of the resumed epoch keeps it
        assert list(resumed) == whole[cut:]
        assert list(resumed) == whole, "the resume point outlived its epoch"


def test_a_batch_sampler_resumes_at_the_next_batch(path):
    sampler = scdlfs.BlockSampler(path, block_size=16, batch_size=32, fetch_factor=4, seed=3)
    batches = sampler.batches()
    whole = list(batches)
    it = iter(batches)
    for _ in range(5):
        next(it)
    state = batches.state_dict()
    assert state["rows_done"] == sum(len(b) for b in whole[:5])
    fresh = scdlfs.BlockSampler(path, block_size=16, batch_size=32, fetch_factor=4, seed=3).batches()
    fresh.load_state_dict(state)
    assert list(fresh) == whole[5:]


def _loaders(path):
    """A DataLoader's three ways of taking a sampler's rows (rows batched by its own
    BatchSampler, the sampler's batches, rows one by one), with workers that take rows
    ahead of the loop; each with the sampler that must be given the state."""
    from torch.utils.data import DataLoader

    def window():
        return scdlfs.ChunkWindowSampler(path, chunks_per_window=2, seed=5)

    def blocks():
        return scdlfs.BlockSampler(path, block_size=16, batch_size=32, fetch_factor=4, seed=5)

    def by_rows(sampler):
        return sampler, DataLoader(range(ROWS), batch_size=50, sampler=sampler, num_workers=2)

    def by_batches(sampler):
        return sampler, DataLoader(range(ROWS), batch_sampler=sampler.batches(), num_workers=2)

    def one_by_one(sampler):
        return sampler, DataLoader(range(ROWS), batch_size=None, sampler=sampler, num_workers=2)

    return [lambda: by_rows(window()), lambda: by_batches(blocks()), lambda: one_by_one(window())]


@pytest.mark.parametrize("way", range(3), ids=["rows", "batches", "one-by-one"])
def test_a_state_taken_in_a_dataloader_loop_counts_the_rows_the_loop_received(path, way):
    make = _loaders(path)[way]
    sampler, loader = make()
    sampler.set_epoch(1)
    whole = [i for batch in loader for i in torch_rows(batch)]
    sampler, loader = make()
    sampler.set_epoch(1)
    received = []
    for n, batch in enumerate(loader):
        received += torch_rows(batch)
        if n == 9:
            # The workers have taken more rows than these ahead of the loop.
            state = sampler.state_dict()
            break
    assert state["rows_done"] == len(received)
    resumed, loader = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    assert received + [i for batch in loader for i in torch_rows(batch)] == whole


def torch_rows(batch) -> list[int]:
    """A batch's rows; a row alone when the loader batches nothing (batch_size=None)."""
    return [batch] if isinstance(batch, int) else batch.tolist()


def test_a_state_from_another_sampler_is_refused(path):
    state = scdlfs.ChunkWindowSampler(path, seed=1).state_dict()
    with pytest.raises(ValueError, match="the state is of another sampler"):
        scdlfs.ChunkWindowSampler(path, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="the state is of another sampler"):
        scdlfs.ChunkWindowSampler(path, seed=1, indices=range(100)).load_state_dict(state)
    with pytest.raises(ValueError, match="outside this epoch's 3000 rows"):
        scdlfs.ChunkWindowSampler(path, seed=1).load_state_dict(dict(state, rows_done=3001))


def test_changing_the_epoch_drops_the_resume_point(path):
    sampler = scdlfs.ChunkWindowSampler(path, seed=1)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    sampler.load_state_dict(dict(sampler.state_dict(rows_done=100), epoch=0))
    sampler.set_epoch(1)
    assert list(sampler) == epoch1


# --------------------------------------------------------------------------
# PyTorch Lightning's DistributedSamplerWrapper
# --------------------------------------------------------------------------


def test_a_plain_dataloader_gets_no_warning(path):
    from torch.utils.data import DataLoader

    sampler = scdlfs.ChunkWindowSampler(path, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(i for batch in DataLoader(range(ROWS), batch_size=100, sampler=sampler) for i in batch.tolist()) == list(range(ROWS))


def test_lightnings_wrapper_is_warned_of_once_with_the_fix(path):
    """Lightning (`use_distributed_sampler=True`, the default) wraps a DataLoader's sampler
    in this wrapper under DDP; the wrapper itself is enough to show the harm."""
    wrapper_module = pytest.importorskip("lightning_fabric.utilities.distributed", reason="Lightning is not installed")
    sampler = scdlfs.ChunkWindowSampler(path, seed=1, rank=0, world_size=1)
    wrapped = wrapper_module.DistributedSamplerWrapper(sampler, num_replicas=2, rank=0, shuffle=False)
    with pytest.warns(UserWarning, match=r"use_distributed_sampler=False\) and build the sampler in the"):
        rows = list(wrapped)
    assert len(rows) == ROWS // 2, "the wrapper took half of the rank's rows"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(wrapped)  # once per sampler


# --------------------------------------------------------------------------
# Hints the mount does not take
# --------------------------------------------------------------------------


@pytest.fixture
def refusing(path, tmp_path) -> str:
    """The dataset's header beside a hint file whose every write fails (/dev/full), as
    a mount of another protocol version refuses the greeting."""
    shutil.copy(os.path.join(path, "header.sch"), tmp_path / "header.sch")
    os.symlink("/dev/full", tmp_path / ".scdlfs-hints")
    return str(tmp_path)


@pytest.mark.parametrize("kind", [scdlfs.ChunkWindowSampler, scdlfs.BlockSampler])
def test_a_hint_the_mount_does_not_take_is_warned_of_once(kind, refusing):
    sampler = kind(refusing, seed=1)
    with pytest.warns(scdlfs.HintWarning, match=r"read-ahead hints.*No space left on device") as caught:
        rows = list(sampler)
    assert sorted(rows) == list(range(ROWS)), "rows are unaffected"
    assert len([w for w in caught if issubclass(w.category, scdlfs.HintWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(sampler) == list(range(ROWS)), "once per sampler"
    assert "No space left on device" in sampler.take_hint_error(), "the failure stays for take_hint_error"


def test_a_hint_failure_raises_in_the_caller_when_warnings_are_errors(refusing):
    sampler = scdlfs.BlockSampler(refusing, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", scdlfs.HintWarning)
        with pytest.raises(scdlfs.HintWarning, match="No space left on device"):
            list(sampler)


def test_without_hints_a_refusing_hint_file_is_not_warned_of(refusing):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(scdlfs.BlockSampler(refusing, seed=1, hints=False)) == list(range(ROWS))
