"""Any order gets the plan (issue 43): `scdlfs.Planned` around torch's samplers, batch
samplers and plain lists of rows, `scdlfs.plan_scdataset` around the released
scDataset 0.3.0 with its own strategies, and `BlockSampler`'s own weighted and
class-balanced orders.

The plan's exact lines are checked against a regular `.scdlfs-hints` file in a local
copy of conftest's `synth_3k` (3000 rows in chunks of 256), decoded here as the protocol
defines them (docs/hint-protocol.md). The rest runs over a real mount of a moto_server
bucket holding `scdlfs-bench gen`'s dataset, whose rows are checked by digest: the
wrapped order comes out exactly, and the daemon reports each process's plan.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, WeightedRandomSampler

import scdl_helpers as H
import scdlfs
from sampler_helpers import (CountedRows, DigestRows, batch_rows, bench_bin, collate_rows, fetch_rows, read_digests,
                             status)

ROWS = 3000  # synth_3k
BUCKET = "scdlfs-planned"
DATASET = "synth"
# About 8 MB in 4 chunks of 2048 rows (the last one short), parts of 256 KiB.
GEN_ARGS = ["--size-mb", "8", "--mean-values", "150", "--genes", "2000", "--chunk-rows", "2048"]


# --------------------------------------------------------------------------
# The plan's lines, in a regular hint file
# --------------------------------------------------------------------------


@pytest.fixture
def hinted(chunked, tmp_path) -> Path:
    """A local copy of synth_3k with an empty regular hint file: the writer greets and
    writes into it as into a mount's."""
    copy = tmp_path / "synth_3k"
    shutil.copytree(chunked["synth_3k"], copy)
    (copy / ".scdlfs-hints").write_bytes(b"")
    return copy


def plan_lines(directory: Path) -> list[list[str]]:
    return [line.split() for line in (directory / ".scdlfs-hints").read_text().splitlines() if line]


def steps_of(lines: list[list[str]]) -> tuple[list[list[int]], list[int]]:
    """The rows of each step after the last `plan` line (`rows+` lines joined to the
    `rows` line that ends their step), and the steps `reading` names."""
    last_plan = max(i for i, line in enumerate(lines) if line[0] == "plan")
    steps, positions, rows = [], [], []
    for word, *numbers in lines[last_plan + 1 :]:
        if word in ("rows", "rows+"):
            pairs = list(map(int, numbers))
            rows += [r for start, stop in zip(pairs[::2], pairs[1::2]) for r in range(start, stop)]
            if word == "rows":
                steps.append(rows)
                rows = []
        elif word == "reading":
            positions.append(int(numbers[0]))
    return steps, positions


def test_the_plan_is_the_order_cut_into_steps(hinted):
    order = np.random.default_rng(4).permutation(ROWS).tolist()
    planned = scdlfs.Planned(order, hinted, lookahead_rows=400, step_rows=100)
    planned.set_epoch(5)
    assert planned.hints_active
    assert list(planned) == order
    assert planned.take_hint_error() is None
    lines = plan_lines(hinted)
    assert lines[:3] == [["scdlfs-hints", "4"], ["chunk-rows", "256"], ["plan", "5"]]
    steps, positions = steps_of(lines)
    assert steps == [sorted(order[i : i + 100]) for i in range(0, ROWS, 100)]
    assert positions == list(range(30))


def test_the_plan_stays_a_bounded_lookahead_ahead(hinted):
    """While step k is read, more than k + lookahead/2 and at most k + lookahead steps
    are announced (4 steps here), as with the samplers' own plans."""
    order = list(range(ROWS))
    planned = scdlfs.Planned(order, hinted, lookahead_rows=400, step_rows=100)
    for i, row in enumerate(planned):
        if i % 100:
            continue
        reading = i // 100
        planned.take_hint_error()  # waits for the writes queued so far
        announced = len(steps_of(plan_lines(hinted))[0])
        assert min(reading + 2, 29) < announced <= min(reading + 4, 30), (reading, announced)


def test_a_batch_samplers_steps_end_at_batch_boundaries(hinted):
    generator = torch.Generator().manual_seed(2)
    batches = list(BatchSampler(RandomSampler(range(ROWS), generator=generator), 64, drop_last=False))
    generator.manual_seed(2)
    planned = scdlfs.Planned(BatchSampler(RandomSampler(range(ROWS), generator=generator), 64, False), hinted,
                             step_rows=100)  # fmt: skip
    assert list(planned) == batches
    planned.take_hint_error()
    steps, _ = steps_of(plan_lines(hinted))
    # Two batches of 64 make the first step of at least 100 rows; the last is short.
    expected = [sorted(batches[i] + batches[i + 1]) if i + 1 < len(batches) else sorted(batches[i])
                for i in range(0, len(batches), 2)]  # fmt: skip
    assert steps == expected


def test_repeated_rows_are_announced_once_per_step(hinted):
    """A weighted draw with replacement repeats rows; each is fetched once per step."""
    weights = [10.0 if row < 300 else 0.1 for row in range(ROWS)]
    generator = torch.Generator().manual_seed(3)
    order = list(WeightedRandomSampler(weights, 2000, replacement=True, generator=generator))
    planned = scdlfs.Planned(order, hinted, step_rows=500)
    assert list(planned) == order
    planned.take_hint_error()
    steps, _ = steps_of(plan_lines(hinted))
    assert steps == [sorted(set(order[i : i + 500])) for i in range(0, 2000, 500)]
    assert any(len(step) < 500 for step in steps)


def test_off_a_mount_it_is_the_wrapped_orders_own_iterator(chunked, tmp_path):
    """No hint file: nothing is read of the directory, nothing is written, and iterating
    the wrapper is iterating the order (no layer in between)."""
    not_a_dataset = tmp_path / "anything"
    not_a_dataset.mkdir()
    order = list(range(10))
    for directory in (chunked["synth_3k"], not_a_dataset):
        planned = scdlfs.Planned(order, directory)
        assert type(iter(planned)) is type(iter(order))
        assert list(planned) == order
        assert not planned.hints_active and planned.take_hint_error() is None
    assert list(not_a_dataset.iterdir()) == []
    off = scdlfs.Planned(order, tmp_path / "anything", hints=False)
    assert not off.hints_active


def test_a_plan_the_mount_does_not_take_is_warned_of_once(chunked, tmp_path):
    """A hint file whose every write fails (/dev/full), as a mount of another protocol
    version refuses the greeting: the order comes out the same, warned of once, and the
    failure stays for take_hint_error."""
    shutil.copy(chunked["synth_3k"] / "header.sch", tmp_path / "header.sch")
    (tmp_path / ".scdlfs-hints").symlink_to("/dev/full")
    order = list(range(ROWS))
    planned = scdlfs.Planned(order, tmp_path)
    with pytest.warns(scdlfs.HintWarning, match=r"plan's read-ahead hints.*No space left on device") as caught:
        assert list(planned) == order
    assert len([w for w in caught if issubclass(w.category, scdlfs.HintWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(planned) == order, "once per plan"
    assert "No space left on device" in planned.take_hint_error()


def test_set_epoch_is_passed_on_and_numbers_the_plan(hinted):
    sampler = DistributedSampler(range(ROWS), num_replicas=3, rank=1, shuffle=True, seed=8)
    planned = scdlfs.Planned(sampler, hinted)
    planned.set_epoch(2)
    twin = DistributedSampler(range(ROWS), num_replicas=3, rank=1, shuffle=True, seed=8)
    twin.set_epoch(2)
    assert list(planned) == list(twin) and sampler.epoch == 2
    planned.take_hint_error()
    assert ["plan", "2"] in plan_lines(hinted)


# --------------------------------------------------------------------------
# On a mount
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated(workdir) -> tuple[Path, np.ndarray]:
    out = workdir / "planned" / DATASET
    out.parent.mkdir(parents=True, exist_ok=True)
    digests = workdir / "planned" / "digests.bin"
    H.run([bench_bin(), "gen", "--out", out, "--digests", digests, "--seed", "5", *GEN_ARGS], timeout=120)
    return out, read_digests(digests)


@pytest.fixture(scope="module")
def mount(moto, generated, tmp_path_factory):
    client = moto.client()
    client.create_bucket(Bucket=BUCKET)
    H.upload_tree(client, BUCKET, f"{DATASET}/", generated[0])
    base = tmp_path_factory.mktemp("planned-mount")
    with H.ScdlfsMount(f"s3://{BUCKET}", base / "mnt", base / "cache", moto.endpoint,
                       extra=["--read-part-size", "256KiB"], cache_size="256MiB") as m:  # fmt: skip
        yield m


def plans_of(m, epoch: int) -> list[dict]:
    """The mount's plans of the dataset for `epoch`: each test plans epochs of its own
    numbers, so that a handle an earlier test closed, whose release the kernel sends the
    daemon after the close returns, is not counted."""
    plans = status(m.bin, m.mountpoint)["active_plans"]
    return [p for p in plans if p["dataset"] == DATASET and p["epoch"] == epoch]


def random_rows(rows: int, seed: int) -> RandomSampler:
    return RandomSampler(range(rows), generator=torch.Generator().manual_seed(seed))


ORDERS = [  # each with an epoch of its own (plans_of)
    pytest.param("random", 0, 20, id="RandomSampler-in-process"),
    pytest.param("random", 2, 21, id="RandomSampler-2-workers"),
    pytest.param("weighted", 2, 22, id="WeightedRandomSampler-2-workers"),
    pytest.param("batches", 2, 23, id="BatchSampler-2-workers"),
]


@pytest.mark.parametrize("kind, num_workers, epoch", ORDERS)
def test_a_wrapped_order_comes_out_exactly_and_the_daemon_has_its_plan(kind, num_workers, epoch, mount, generated):
    path = str(mount.mountpoint / DATASET)
    _, digests = generated
    rows = len(digests)

    def order():
        if kind == "weighted":
            weights = torch.linspace(0.1, 1.0, rows)
            return WeightedRandomSampler(weights, rows, replacement=True, generator=torch.Generator().manual_seed(6))
        if kind == "batches":
            return BatchSampler(random_rows(rows, 6), 64, drop_last=False)
        return random_rows(rows, 6)

    expected = list(order())
    planned = scdlfs.Planned(order(), path, lookahead_rows=2048, step_rows=512)
    planned.set_epoch(epoch)
    assert planned.hints_active, planned.take_hint_error()
    writes_before = status(mount.bin, mount.mountpoint)["counters"]["hint_writes"]
    if kind == "batches":
        loader = DataLoader(DigestRows(path), batch_sampler=planned, num_workers=num_workers, collate_fn=collate_rows)
    else:
        loader = DataLoader(DigestRows(path), batch_size=64, sampler=planned, num_workers=num_workers,
                            collate_fn=collate_rows)  # fmt: skip
    got, plans = [], None
    for i, batch in enumerate(loader):
        got.extend(batch)
        if i == 10:
            assert planned.take_hint_error() is None  # and the steps queued so far written
            plans = plans_of(mount, epoch)
    assert [row for row, _, _ in got] == (sum(expected, []) if kind == "batches" else expected)
    assert all(digest == digests[row] for row, digest, _ in got)
    assert len(plans) == 1 and plans[0]["steps"] >= 1, plans
    assert status(mount.bin, mount.mountpoint)["counters"]["hint_writes"] > writes_before
    assert planned.take_hint_error() is None
    del loader


def test_each_rank_writes_its_own_plan(mount, generated):
    """Two ranks' DistributedSamplers, each wrapped (as each rank's process would): two
    plans on the mount, each of its own rank's rows, together every row once."""
    path = str(mount.mountpoint / DATASET)
    rows = len(generated[1]) // 2 * 2  # DistributedSampler pads an odd count with a repeated row
    ranks = [scdlfs.Planned(DistributedSampler(range(rows), num_replicas=2, rank=r, seed=1), path,
                            lookahead_rows=1024, step_rows=256) for r in range(2)]  # fmt: skip
    for planned in ranks:
        planned.set_epoch(3)
    iterators = [iter(planned) for planned in ranks]
    shares = [[next(it) for _ in range(300)] for it in iterators]
    assert all(planned.take_hint_error() is None for planned in ranks)  # and the steps written
    plans = plans_of(mount, 3)
    assert len(plans) == 2 and all(p["steps"] >= 1 for p in plans), plans
    for share, it in zip(shares, iterators):
        share.extend(it)
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(rows))
    assert all(planned.take_hint_error() is None for planned in ranks)


# --------------------------------------------------------------------------
# scDataset 0.3.0, unchanged
# --------------------------------------------------------------------------


def scdataset_of(path, rows, strategy, seed=0):
    from scdataset import scDataset

    return scDataset(CountedRows(path, rows), strategy, batch_size=64, fetch_factor=16, fetch_callback=fetch_rows,
                     batch_callback=batch_rows, seed=seed)  # fmt: skip


class RecordedFetches:
    """An scDataset fetch callback that keeps the rows of each fetch it reads."""

    def __init__(self):
        self.fetches = []

    def __call__(self, collection, rows):
        self.fetches.append(rows.tolist())
        return collection[rows]


def test_an_scdatasets_plan_is_its_fetches_also_once_pickled(hinted):
    """The plan of an scDataset is its fetches as it reads them, one step each, in order;
    a copy made by pickling (as a spawned DataLoader worker gets it) opens its own handle
    and plans its own epochs."""
    import pickle

    from scdataset import scDataset
    from scdataset.strategy import BlockShuffling

    data = scdlfs.plan_scdataset(scDataset(np.arange(ROWS), BlockShuffling(block_size=32), batch_size=64,
                                           fetch_factor=4, fetch_callback=RecordedFetches(), seed=1), hinted)  # fmt: skip
    copy = pickle.loads(pickle.dumps(data))
    rows = np.concatenate(list(copy)).tolist()
    fetches = copy.strategy.fetch_callback.fetches
    assert sorted(rows) == list(range(ROWS))
    assert copy.strategy.take_hint_error() is None
    lines = plan_lines(hinted)
    assert ["plan", "0"] in lines
    steps, positions = steps_of(lines)
    assert steps == fetches and len(fetches) == -(-ROWS // 256)
    assert positions == list(range(len(fetches)))


def test_scdataset_block_shuffling_in_workers_every_row_once_with_plans(mount, generated):
    from scdataset.strategy import BlockShuffling

    path = str(mount.mountpoint / DATASET)
    _, digests = generated
    data = scdlfs.plan_scdataset(scdataset_of(path, len(digests), BlockShuffling(block_size=32)), path)
    loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True, collate_fn=collate_rows)
    epochs = []
    for epoch in range(2):  # scDataset counts its epochs itself, in each persistent worker
        got = [item for batch in loader for item in batch]
        # The persistent workers keep their handles, and so their plans, past the epoch;
        # each wrote its plan as its first fetch began, a whole epoch ago.
        plans = plans_of(mount, epoch)
        assert sorted(row for row, _, _ in got) == list(range(len(digests)))
        assert all(digest == digests[row] for row, digest, _ in got)
        # One plan per worker.
        assert len(plans) == 2 and all(p["steps"] >= 1 for p in plans), plans
        epochs.append([row for row, _, _ in got])
    assert epochs[0] != epochs[1]
    del loader


def test_scdataset_class_balanced_rows_are_the_strategys_own(mount, generated):
    """ClassBalancedSampling draws with replacement: the epoch is the strategy's own
    multiset, read in process, with every fetch the one planned (no HintWarning)."""
    from scdataset.strategy import ClassBalancedSampling

    path = str(mount.mountpoint / DATASET)
    rows = len(generated[1])
    labels = np.arange(rows) % 5 == 0  # a rare class of a fifth of the rows
    strategy = ClassBalancedSampling(labels, total_size=rows, block_size=16)
    data = scdlfs.plan_scdataset(scdataset_of(path, rows, strategy, seed=7), path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", scdlfs.HintWarning)
        got = [row for batch in data for row, _, _ in batch]
        assert data.strategy.take_hint_error() is None  # and the steps written
        plans = plans_of(mount, 0)
    assert sorted(got) == sorted(strategy.get_indices(data.collection, seed=7).tolist())
    assert len(plans) == 1 and plans[0]["steps"] >= 1, plans
    assert data.strategy.take_hint_error() is None


# --------------------------------------------------------------------------
# Weighted and class-balanced orders of the samplers
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [scdlfs.BlockSampler, scdlfs.ChunkWindowSampler])
def test_a_class_balanced_order_draws_a_rare_class_as_often(kind, chunked):
    path = chunked["synth_3k"]
    labels = ["rare" if row % 500 >= 450 else "common" for row in range(ROWS)]  # 10 % rare, in runs
    drawn = []
    sampler = kind(path, seed=4, labels=labels)
    for epoch in range(4):
        sampler.set_epoch(epoch)
        epoch_rows = list(sampler)
        assert len(epoch_rows) == len(sampler)
        drawn += epoch_rows
    rare = sum(labels[row] == "rare" for row in drawn) / len(drawn)
    assert 0.4 < rare < 0.6, rare
    # Seeded: the same epoch again, whatever form the labels take.
    codes = np.array([label == "rare" for label in labels])
    again = kind(path, seed=4, labels=codes)
    again.set_epoch(3)
    assert list(again) == epoch_rows


def test_a_weighted_window_order_never_reads_rows_of_weight_0(chunked):
    path = chunked["synth_3k"]
    weights = [0.0 if 256 <= row < 768 else 1.0 for row in range(ROWS)]  # chunks 1 and 2 weigh nothing
    sampler = scdlfs.ChunkWindowSampler(path, chunks_per_window=2, seed=6, weights=weights)
    rows = list(sampler)
    assert len(rows) == len(sampler) and not any(256 <= row < 768 for row in rows)


def test_weights_pick_the_rows_and_ranks_share_the_draws(chunked):
    path = chunked["synth_3k"]
    weights = np.zeros(ROWS)
    weights[[3, 4, 5, 700, 2999]] = [1.0, 2.0, 1.0, 5.0, 1.0]
    whole = scdlfs.BlockSampler(path, block_size=4, seed=2, weights=weights, world_size=1)
    rows = list(whole)
    assert set(rows) <= {3, 4, 5, 700, 2999} and len(rows) == ROWS
    assert list(scdlfs.BlockSampler(path, block_size=4, seed=2, weights=weights.tolist(), world_size=1)) == rows
    shares = [list(scdlfs.BlockSampler(path, block_size=4, seed=2, weights=torch.from_numpy(weights), rank=r,
                                       world_size=2, even="uneven")) for r in range(2)]  # fmt: skip
    assert sorted(shares[0] + shares[1]) == sorted(rows)


def test_a_weighted_epoch_resumes_where_it_stopped(chunked):
    path = chunked["synth_3k"]
    labels = [row // 1000 for row in range(ROWS)]
    sampler = scdlfs.BlockSampler(path, seed=9, labels=labels)
    sampler.set_epoch(1)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(777)]
    state = sampler.state_dict()
    rest = list(iterator)
    resumed = scdlfs.BlockSampler(path, seed=9, labels=labels)
    resumed.load_state_dict(state)
    assert list(resumed) == rest and len(head) + len(rest) == ROWS


def test_weights_that_cannot_drive_an_order_are_refused(chunked):
    path = chunked["synth_3k"]
    with pytest.raises(ValueError, match="not both"):
        scdlfs.BlockSampler(path, weights=[1.0] * ROWS, labels=[0] * ROWS)
    with pytest.raises(ValueError, match="cached chunks"):
        scdlfs.BlockSampler(path, labels=[0] * ROWS, cache_aware=True)
    with pytest.raises(ValueError, match="2999 weights"):
        scdlfs.BlockSampler(path, weights=[1.0] * (ROWS - 1))
    with pytest.raises(ValueError, match="finite"):
        scdlfs.BlockSampler(path, weights=[-1.0] + [1.0] * (ROWS - 1))
    with pytest.raises(ValueError, match="weight 0"):
        scdlfs.BlockSampler(path, weights=[0.0] * 100 + [1.0] * (ROWS - 100), indices=range(100))


def test_a_class_balanced_block_order_on_a_mount_tells_its_plan(mount, generated):
    path = str(mount.mountpoint / DATASET)
    _, digests = generated
    labels = np.arange(len(digests)) % 7 == 0
    sampler = scdlfs.BlockSampler(path, block_size=32, fetch_factor=4, labels=labels, seed=5)
    sampler.set_epoch(12)
    loader = DataLoader(DigestRows(path), batch_sampler=sampler.batches(), num_workers=2, collate_fn=collate_rows)
    got, plans = [], None
    for i, batch in enumerate(loader):
        got.extend(batch)
        if i == 5:
            assert sampler.take_hint_error() is None  # and the steps queued so far written
            plans = plans_of(mount, 12)
    assert [row for row, _, _ in got] == list(sampler)
    assert all(digest == digests[row] for row, digest, _ in got)
    assert len(plans) == 1 and plans[0]["steps"] >= 1, plans
    assert sampler.take_hint_error() is None
    del loader
