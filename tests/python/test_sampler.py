"""The scdlfs Python package (crates/scdlfs-python): samplers whose orders are the Rust
crate scdl-sampler's, iterated by a PyTorch DataLoader over bionemo-scdl's reader on a
real mount of a moto_server bucket, telling the daemon the plan from the main process
while worker processes read.

The dataset is `scdlfs-bench gen`'s synthetic one (every row's digest known from the
generator), in a bucket of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import scdl_helpers as H
import scdlfs
from sampler_helpers import DigestRows, Link, bench_bin, collate_rows, read_digests, status

BUCKET = "scdlfs-sampler"
DATASET = "synth"
CHUNK_ROWS = 2048
# About 24 MB in 14 chunks (the last one short): several parts per chunk at the part
# size the mounts use, so that a read that was not announced has to wait, and chunks
# large against the 64 KiB the kernel reads around a memory-mapped page (reads that
# spill into the neighbouring chunks, which may be another rank's).
GEN_ARGS = ["--size-mb", "24", "--mean-values", "150", "--genes", "2000", "--chunk-rows", str(CHUNK_ROWS)]
PART_SIZE = "256KiB"


@pytest.fixture(scope="module")
def generated(workdir) -> tuple[Path, np.ndarray]:
    """The local chunked dataset and its row digests."""
    out = workdir / "sampler" / DATASET
    out.parent.mkdir(parents=True, exist_ok=True)
    digests = workdir / "sampler" / "digests.bin"
    H.run([bench_bin(), "gen", "--out", out, "--digests", digests, "--seed", "9", *GEN_ARGS], timeout=120)
    return out, read_digests(digests)


@pytest.fixture(scope="module")
def sampler_bucket(moto, generated) -> str:
    client = moto.client()
    client.create_bucket(Bucket=BUCKET)
    H.upload_tree(client, BUCKET, f"{DATASET}/", generated[0])
    return f"s3://{BUCKET}"


@pytest.fixture(scope="module")
def mount(sampler_bucket, moto, tmp_path_factory):
    base = tmp_path_factory.mktemp("sampler-mount")
    with H.ScdlfsMount(sampler_bucket, base / "mnt", base / "cache", moto.endpoint,
                       extra=["--read-part-size", PART_SIZE], cache_size="256MiB") as m:  # fmt: skip
        yield m


@pytest.fixture(scope="module")
def link(moto, workdir):
    """A slow link in front of moto_server: 20 ms per response, 12 MB/s shared."""
    proxy = Link(moto.endpoint, rate_mbps=12, latency_ms=20, log=workdir / "sampler-link.log")
    yield proxy
    proxy.close()


def make_sampler(kind: str, path, **kw):
    if kind == "windows":
        return scdlfs.ChunkWindowSampler(path, chunks_per_window=4, seed=kw.pop("seed", 1), **kw)
    return scdlfs.BlockSampler(path, block_size=32, fetch_factor=32, batch_size=64, seed=kw.pop("seed", 1), **kw)


def loader_rows(loader) -> list[tuple[int, int]]:
    """(row, digest) of every row a DataLoader over DigestRows yields, in order."""
    return [(row, digest) for batch in loader for row, digest, _ in batch]


def check_rows(pairs, digests: np.ndarray) -> list[int]:
    rows = [row for row, _ in pairs]
    bad = [row for row, digest in pairs if digest != int(digests[row])]
    assert not bad, f"{len(bad)} rows read with the wrong bytes, e.g. {bad[:5]}"
    return rows


# --------------------------------------------------------------------------
# Every row once, through a DataLoader with and without workers, on a mount
# --------------------------------------------------------------------------

LOADERS = [
    pytest.param("windows", 0, None, id="windows-in-process"),
    pytest.param("blocks", 0, None, id="blocks-in-process"),
    pytest.param("windows", 2, "fork", id="windows-2-workers-fork"),
    pytest.param("blocks", 2, "fork", id="blocks-2-workers-fork"),
    # Spawned workers import torch afresh (~20 s on 2 cores): one order is enough.
    pytest.param("windows", 2, "spawn", id="windows-2-workers-spawn"),
]


@pytest.mark.parametrize("kind, num_workers, start_method", LOADERS)
def test_every_row_once_per_epoch(kind, num_workers, start_method, mount, generated):
    path = str(mount.mountpoint / DATASET)
    _, digests = generated
    sampler = make_sampler(kind, path)
    assert sampler.hints_active, sampler.take_hint_error()
    extra = {} if num_workers == 0 else dict(multiprocessing_context=start_method, persistent_workers=True,
                                              prefetch_factor=4)  # fmt: skip
    loader = DataLoader(DigestRows(path), batch_size=64, sampler=sampler, num_workers=num_workers,
                        collate_fn=collate_rows, **extra)  # fmt: skip
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        rows = check_rows(loader_rows(loader), digests)
        assert len(rows) == len(sampler) == len(digests)
        assert sorted(rows) == list(range(len(digests)))
        epochs.append(rows)
    assert epochs[0] != epochs[1], "set_epoch did not change the order"
    # The DataLoader yields the sampler's own order (workers keep batches in order).
    sampler.set_epoch(1)
    assert epochs[1] == list(sampler)
    assert sampler.take_hint_error() is None
    del loader


@pytest.mark.parametrize("kind", ["windows", "blocks"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_form(kind, num_workers, mount, generated):
    path = str(mount.mountpoint / DATASET)
    _, digests = generated
    sampler = make_sampler(kind, path)
    batches = sampler.batches(64) if kind == "windows" else sampler.batches()
    loader = DataLoader(DigestRows(path), batch_sampler=batches, num_workers=num_workers,
                        collate_fn=collate_rows)  # fmt: skip
    got = [[row for row, _, _ in batch] for batch in loader]
    assert len(got) == len(batches)
    assert all(1 <= len(b) <= 64 for b in got)
    rows = check_rows(loader_rows(loader), digests)
    assert sorted(rows) == list(range(len(digests)))
    assert sum(got, []) == list(sampler)
    if kind == "blocks":
        # The block order's own minibatches: a fetch of 32 x 32 rows is 16 full ones.
        assert sum(len(b) == 64 for b in got) >= len(got) - len(got) // 16 - 1


# --------------------------------------------------------------------------
# Orders: the Rust sampler's, per epoch and per rank
# --------------------------------------------------------------------------


def rust_order(tmp_path, rows: int, kind: str, seed: int, epoch: int, rank: int, world_size: int, even: str,
               cached: list[tuple[int, int]] | None = None) -> list[int]:  # fmt: skip
    """The rows of `scdlfs-bench order`: the Rust sampler's share, step by step (in the
    cache-aware order with the chunks of `cached` held, when given)."""
    out = tmp_path / f"order-{kind}-{seed}-{epoch}-{rank}-{world_size}-{even}-{cached}.bin"
    held = [word for start, stop in (cached or []) for word in ("--cached", start, stop)]
    H.run([bench_bin(), "order", "--rows", rows, "--chunk-rows", CHUNK_ROWS, "--order", kind,
           "--seed", seed, "--epoch", epoch, "--rank", rank, "--world-size", world_size, "--even", even,
           "--out", out, *held])  # fmt: skip
    words = np.fromfile(out, dtype="<u8")
    rows, at = [], 0
    while at < len(words):
        count = int(words[at])
        rows.extend(int(r) for r in words[at + 1 : at + 1 + count])
        at += 1 + count
    return rows


@pytest.mark.parametrize("kind", ["windows", "blocks"])
@pytest.mark.parametrize(
    "seed, epoch, rank, world_size, even",
    [(1, 0, 0, 1, "uneven"), (7, 3, 1, 2, "pad"), (7, 3, 0, 2, "pad"), (42, 1, 2, 3, "drop"), (5, 2, 1, 3, "uneven")],
)
def test_python_and_rust_orders_are_equal(kind, seed, epoch, rank, world_size, even, generated, tmp_path):
    local, digests = generated
    # bench's windows: 4 chunks per window; blocks: 32-row blocks, 32 per fetch, 64 per minibatch
    sampler = make_sampler(kind, local, seed=seed, rank=rank, world_size=world_size, even=even)
    sampler.set_epoch(epoch)
    python = list(sampler)
    assert python == rust_order(tmp_path, len(digests), kind, seed, epoch, rank, world_size, even)
    assert len(python) == len(sampler)


HELD = [(2, 5), (9, 10), (13, 14)]


@pytest.mark.parametrize("kind", ["windows", "blocks"])
@pytest.mark.parametrize("seed, epoch, rank, world_size, even", [(1, 0, 0, 1, "uneven"), (7, 3, 1, 2, "pad"),
                                                                 (42, 1, 2, 3, "drop")])  # fmt: skip
def test_cache_aware_orders_are_equal_in_python_and_rust(kind, seed, epoch, rank, world_size, even, generated,
                                                         tmp_path):  # fmt: skip
    local, digests = generated
    sampler = make_sampler(kind, local, seed=seed, rank=rank, world_size=world_size, even=even, cache_aware=True)
    sampler.set_epoch(epoch)
    sampler.set_cached_chunks(HELD)
    python = list(sampler)
    assert python == rust_order(tmp_path, len(digests), kind, seed, epoch, rank, world_size, even, cached=HELD)
    assert len(python) == len(sampler)
    plain = make_sampler(kind, local, seed=seed, rank=rank, world_size=world_size, even=even)
    plain.set_epoch(epoch)
    if world_size == 1:
        assert python != list(plain) and sorted(python) == sorted(plain)


def test_a_cache_aware_epoch_reads_the_held_chunks_first_every_row_once(generated):
    local, digests = generated
    sampler = make_sampler("windows", local, cache_aware=True)
    assert sampler.cache_aware and not make_sampler("windows", local).cache_aware
    sampler.set_epoch(1)
    assert sampler.cached_chunks == [], "off a mount nothing is announced: the plain order"
    assert list(sampler) == _plain(local, 1)
    sampler.set_cached_chunks(HELD)
    rows = list(sampler)
    assert sorted(rows) == list(range(len(digests)))
    # Five chunks held (the last one short): the first window of 4 is held chunks only,
    # at least three whole ones.
    assert all(any(a <= row // CHUNK_ROWS < b for a, b in HELD) for row in rows[: 3 * CHUNK_ROWS])
    # A resume keeps the epoch's set rather than reading the cache again.
    state = sampler.state_dict(rows_done=1000)
    assert state["cached_chunks"] == HELD
    resumed = make_sampler("windows", local, cache_aware=True)
    resumed.load_state_dict(state)
    assert list(resumed) == rows[1000:]
    with pytest.raises(ValueError, match="cache_aware=True"):
        make_sampler("windows", local).set_cached_chunks(HELD)


def _plain(local, epoch: int) -> list[int]:
    plain = make_sampler("windows", local)
    plain.set_epoch(epoch)
    return list(plain)


def test_several_ranks_without_a_process_group_must_be_given_the_set(generated):
    local, _ = generated
    sampler = make_sampler("windows", local, rank=0, world_size=2, cache_aware=True)
    sampler.set_epoch(0)
    with pytest.raises(RuntimeError, match="needs one announcement shared by all of them"):
        list(sampler)
    sampler.set_cached_chunks(HELD)
    assert len(list(sampler)) == len(sampler)


def test_on_a_mount_the_order_follows_the_daemons_announcement(mount, generated, tmp_path):
    path = str(mount.mountpoint / DATASET)
    local, digests = generated
    # Chunk 6 read whole through the raw view: the daemon then holds it.
    raw = mount.mountpoint / DATASET / ".chunked" / "chunk_00006"
    for array in ("data.npy", "row_ptr.npy", "col_ptr.npy"):
        (raw / array).read_bytes()
    # A read is answered as its bytes arrive; the part lands in the cache a moment later.
    deadline = time.monotonic() + 20
    def holds_chunk_6() -> bool:
        return any(a <= 6 < b for a, b in scdlfs.read_cached_chunks(path))

    while not holds_chunk_6():
        assert time.monotonic() < deadline, f"chunk 6 was never announced: {scdlfs.read_cached_chunks(path)}"
        time.sleep(0.05)
    sampler = make_sampler("blocks", path, cache_aware=True)
    sampler.set_epoch(2)
    assert any(a <= 6 < b for a, b in sampler.cached_chunks), "set_epoch read the announcement"
    rows = list(sampler)
    assert rows == rust_order(tmp_path, len(digests), "blocks", 1, 2, 0, 1, "uneven", cached=sampler.cached_chunks)
    assert scdlfs.read_cached_chunks(local) is None, "off a mount there is no announcement"


def test_set_epoch_changes_the_order_deterministically(generated):
    local, _ = generated
    a, b = make_sampler("windows", local, seed=3), make_sampler("windows", local, seed=3)
    orders = []
    for epoch in (0, 1, 2):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        orders.append(list(a))
        assert orders[-1] == list(b) == list(a)
    assert len({tuple(o) for o in orders}) == 3
    assert all(sorted(o) == sorted(orders[0]) for o in orders)
    assert list(make_sampler("windows", local, seed=4)) != orders[0]


@pytest.mark.parametrize("even", ["pad", "drop", "uneven"])
@pytest.mark.parametrize("kind", ["windows", "blocks"])
def test_shares_are_disjoint_and_cover_the_epoch(kind, even, generated):
    local, digests = generated
    shares = [list(make_sampler(kind, local, rank=r, world_size=3, even=even)) for r in range(3)]
    owned = [set(share) for share in shares]
    assert not (owned[0] & owned[1]) and not (owned[0] & owned[2]) and not (owned[1] & owned[2])
    union = owned[0] | owned[1] | owned[2]
    if even == "drop":
        assert len({len(s) for s in shares}) == 1 and len(union) <= len(digests)
    else:
        assert union == set(range(len(digests)))
    if even == "pad":
        assert len({len(s) for s in shares}) == 1
    if even == "uneven":
        assert sum(len(s) for s in shares) == len(digests)


def test_rank_and_world_size_defaults(generated, monkeypatch):
    local, _ = generated
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    s = make_sampler("windows", local)
    assert (s.rank, s.world_size) == (0, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    s = make_sampler("windows", local)
    assert (s.rank, s.world_size) == (1, 2)
    assert list(s) == list(make_sampler("windows", local, rank=1, world_size=2))
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        make_sampler("windows", local)


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_errors_are_clear(generated, tmp_path):
    local, _ = generated
    with pytest.raises(scdlfs.NotADatasetError, match="is not an SCDL dataset"):
        scdlfs.ChunkWindowSampler(tmp_path)
    (tmp_path / "header.sch").write_bytes(b"not a header")
    with pytest.raises(ValueError, match="is not an SCDL dataset"):
        scdlfs.BlockSampler(tmp_path)
    with pytest.raises(ValueError, match="rank 2 does not exist among 2 ranks"):
        scdlfs.ChunkWindowSampler(local, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size must be between 1"):
        scdlfs.ChunkWindowSampler(local, rank=0, world_size=0)
    with pytest.raises(ValueError, match="chunks_per_window must be between 1"):
        scdlfs.ChunkWindowSampler(local, chunks_per_window=0)
    for name in ("block_size", "batch_size", "fetch_factor"):
        with pytest.raises(ValueError, match=f"{name} must be at least 1, got 0"):
            scdlfs.BlockSampler(local, **{name: 0})
    with pytest.raises(ValueError, match="needs every rank to own a step"):
        scdlfs.ChunkWindowSampler(local, chunks_per_window=16, rank=0, world_size=2)
    with pytest.raises(ValueError, match="even must be"):
        scdlfs.ChunkWindowSampler(local, even="evenly")
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        make_sampler("windows", local).batches(0)


# --------------------------------------------------------------------------
# Hints
# --------------------------------------------------------------------------


def test_off_a_mount_the_same_rows_and_nothing_written(generated, mount):
    local, _ = generated
    before = sorted(p.name for p in local.iterdir())
    off_mount = make_sampler("windows", local)
    on_mount = make_sampler("windows", str(mount.mountpoint / DATASET))
    assert not off_mount.hints_active and on_mount.hints_active
    assert list(off_mount) == list(on_mount)
    assert sorted(p.name for p in local.iterdir()) == before
    assert off_mount.take_hint_error() is None


def test_pickled_sampler_opens_its_own_hint_handle(mount):
    import pickle

    path = str(mount.mountpoint / DATASET)
    sampler = make_sampler("blocks", path, seed=5)
    sampler.set_epoch(2)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.epoch == 2 and list(copy) == list(sampler)
    assert copy.hints_active


def _open_hint_handles(hint_file: str) -> int:
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd) == hint_file
        except OSError:
            pass
    return count


def test_a_forked_process_drops_the_inherited_hint_handle(mount):
    """What a DataLoader worker forked from the main process finds: no hint handle of its
    parent's (the at-fork hook closed its copy), and its own if it ever iterates."""
    path = mount.mountpoint / DATASET
    hint_file = str(path / ".scdlfs-hints")
    sampler = make_sampler("windows", str(path))
    rows = iter(sampler)
    next(rows)
    assert _open_hint_handles(hint_file) == 1
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        try:
            inherited = _open_hint_handles(hint_file)
            next(iter(sampler))
            own = _open_hint_handles(hint_file)
            os.write(write_end, f"{inherited} {own}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    report = os.read(read_end, 64).decode()
    os.waitpid(pid, 0)
    assert report == "0 1", f"hint handles in the child before and after it iterated: {report}"
    assert _open_hint_handles(hint_file) == 1
    next(rows)
    assert sampler.take_hint_error() is None


def _epoch_over_link(sampler_bucket, link, tmp_path, hints: bool, digests):
    """One cold epoch, DataLoader with 2 workers, through a fresh mount behind the link;
    returns the mount's counters and the plans `scdlfs status` showed mid-epoch."""
    base = tmp_path / ("hints" if hints else "no-hints")
    with H.ScdlfsMount(sampler_bucket, base / "mnt", base / "cache", link.endpoint,
                       extra=["--read-part-size", PART_SIZE], cache_size="256MiB") as m:  # fmt: skip
        path = str(m.mountpoint / DATASET)
        sampler = make_sampler("windows", path, hints=hints)
        loader = DataLoader(DigestRows(path), batch_size=64, sampler=sampler, num_workers=2,
                            collate_fn=collate_rows)  # fmt: skip
        pairs, plans = [], None
        for i, batch in enumerate(loader):
            pairs.extend((row, digest) for row, digest, _ in batch)
            if i == 20:
                plans = status(m.bin, m.mountpoint)["active_plans"]
        check_rows(pairs, digests)
        counters = status(m.bin, m.mountpoint)["counters"]
        assert sampler.take_hint_error() is None
        del loader, sampler
    return counters, plans


def test_hints_foresee_the_parts_the_reads_need(sampler_bucket, link, tmp_path, generated):
    """With hints the prefetcher asks for the parts before the reader needs them; without,
    the reader starts most downloads itself. Counted as downloads a reader had to start,
    not as reads that waited: how long a prefetched part takes to arrive depends on the
    machine's load, and speed belongs to the benchmarks."""
    _, digests = generated
    hinted, plans = _epoch_over_link(sampler_bucket, link, tmp_path, True, digests)
    unhinted, no_plans = _epoch_over_link(sampler_bucket, link, tmp_path, False, digests)
    print(f"downloads a reader started: {hinted['demand_downloads']} with hints, "
          f"{unhinted['demand_downloads']} without, of {hinted['parts_fetched']} and "
          f"{unhinted['parts_fetched']} parts; reads that waited: {hinted['demand_wait_seconds']['count']} and "
          f"{unhinted['demand_wait_seconds']['count']}; prefetch hits {hinted['prefetch_hits']}")  # fmt: skip
    assert [p["dataset"] for p in plans] == [DATASET] and plans[0]["epoch"] == 0, plans
    assert no_plans == []
    assert unhinted["demand_downloads"] >= 10, unhinted
    assert hinted["demand_downloads"] * 3 <= unhinted["demand_downloads"], (hinted, unhinted)


def test_two_ranks_fetch_their_own_shares(sampler_bucket, link, tmp_path, generated):
    local, digests = generated
    port = H.free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    helper = Path(__file__).resolve().parent / "sampler_helpers.py"
    env = H.safe_aws_env()
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    procs = [
        subprocess.Popen([sys.executable, str(helper), "--rank", str(r), "--world-size", "2", "--port", str(port),
                          "--source", sampler_bucket, "--endpoint", link.endpoint, "--workdir", str(tmp_path),
                          "--dataset", DATASET, "--part-size", PART_SIZE, "--out", str(outs[r])],
                         env=env, stdin=subprocess.DEVNULL)  # fmt: skip
        for r in range(2)
    ]
    try:
        codes = [p.wait(240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0]
    results = [json.loads(o.read_text()) for o in outs]
    assert [(r["rank"], r["world_size"]) for r in results] == [(0, 2), (1, 2)]
    assert all(r["hints_active"] for r in results)
    shares = [set(r["rows"]) for r in results]
    assert not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(range(len(digests)))
    for r in results:
        check_rows(list(zip(r["rows"], r["digests"])), digests)
    stored = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
    fetched = [r["bytes_fetched"] for r in results]
    print(f"dataset {stored} bytes; rank 0 fetched {fetched[0]}, rank 1 {fetched[1]}")
    for r, share in zip(results, shares):
        expected = stored * len(share) / len(digests)
        # Above the share: the 64 KiB the kernel reads around each side of a touched
        # page, at the ends of every chunk of the share (~15% here).
        assert 0.7 * expected <= r["bytes_fetched"] <= 1.35 * expected, (r["bytes_fetched"], expected)
        assert r["bytes_fetched"] <= 0.75 * stored


def test_example_training_loop_runs(tmp_path):
    """examples/train.py, shortened: the demo dataset mounted from a folder, a tiny model
    trained through a DataLoader with 2 workers, rows/s and the wait counters printed."""
    script = H.REPO_ROOT / "examples" / "train.py"
    out = H.run([sys.executable, script, "--scdlfs", H.require_scdlfs(), "--demo-rows", "12000", "--steps", "120",
                 "--workdir", tmp_path], timeout=280)  # fmt: skip
    print(out.stdout)
    assert "hints on" in out.stdout
    assert "rows/s" in out.stdout and "waited on the network" in out.stdout
    trained = [line for line in out.stdout.splitlines() if line.startswith("trained 120 steps")]
    assert trained, out.stdout
