"""PyTorch Lightning, for real: a DDP job on CPU (2 processes, gloo, Lightning's own
launcher) trains through an scdlfs mount with the sampler built in the
LightningDataModule. With `use_distributed_sampler=False` (as README.md says) each rank
trains on exactly its share, once per epoch, in the sampler's order, correct bytes, and
the mount follows one plan per rank; with Lightning's default the sampler warns once
with the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scdl_helpers as H
import scdlfs
from sampler_helpers import bench_bin, read_digests

SEED = 5
EPOCHS = 2
JOB = Path(__file__).resolve().parent / "lightning_job.py"


@pytest.fixture(scope="module")
def dataset(workdir) -> tuple[Path, np.ndarray]:
    """A small chunked dataset in a local folder, and its row digests."""
    out = workdir / "lightning" / "cells"
    out.parent.mkdir(parents=True, exist_ok=True)
    digests = out.parent / "digests.bin"
    H.run([bench_bin(), "gen", "--out", out, "--digests", digests, "--seed", "3", "--size-mb", "4",
           "--mean-values", "100", "--genes", "1000", "--chunk-rows", "256"], timeout=120)  # fmt: skip
    return out, read_digests(digests)


def train(dataset, tmp_path, use_distributed_sampler: str) -> list[dict]:
    """Runs the job on a mount of the dataset's folder; each rank's result."""
    local, _ = dataset
    out = tmp_path / "out"
    out.mkdir()
    with scdlfs.mount(str(local.parent), cache_size="64MiB") as m:
        env = {**H.safe_aws_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(H.free_port())}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"):
            env.pop(name, None)
        job = subprocess.run(
            [sys.executable, JOB, "--dataset", m.mountpoint / local.name, "--scdlfs", H.require_scdlfs(),
             "--mountpoint", m.mountpoint, "--out", out, "--epochs", str(EPOCHS), "--seed", str(SEED),
             "--use-distributed-sampler", use_distributed_sampler],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert job.returncode == 0, f"{job.stdout}\n{job.stderr}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_each_rank_trains_on_its_share_once_per_epoch_and_the_mount_follows_a_plan_per_rank(dataset, tmp_path):
    local, digests = dataset
    results = train(dataset, tmp_path, "no")
    assert [(r["rank"], r["world_size"], r["backend"]) for r in results] == [(0, 2, "gloo"), (1, 2, "gloo")]
    for result in results:
        assert result["warnings"] == []
        assert [e["epoch"] for e in result["epochs"]] == list(range(EPOCHS))
    for epoch in range(EPOCHS):
        shares = []
        for result in results:
            trained = result["epochs"][epoch]
            expected = scdlfs.ChunkWindowSampler(local, chunks_per_window=1, seed=SEED, rank=result["rank"], world_size=2)
            expected.set_epoch(epoch)
            assert trained["rows"] == list(expected), f"rank {result['rank']}, epoch {epoch}"
            assert trained["digests"] == [int(digests[row]) for row in trained["rows"]]
            plans = [p for p in trained["plans"] if p["epoch"] == epoch]
            assert len(plans) == 2, trained["plans"]
            shares.append(set(trained["rows"]))
        assert not shares[0] & shares[1]
        assert shares[0] | shares[1] == set(range(len(digests)))
    assert results[0]["epochs"][0]["rows"] != results[0]["epochs"][1]["rows"], "set_epoch reached the sampler"


def test_lightnings_default_wrapping_is_warned_of_with_the_fix(dataset, tmp_path):
    results = train(dataset, tmp_path, "yes")
    for result in results:
        assert len(result["warnings"]) == 1, result["warnings"]
        assert "Trainer(use_distributed_sampler=False)" in result["warnings"][0]
    rows = [len(result["epochs"][0]["rows"]) for result in results]
    assert sum(rows) < len(dataset[1]), "the wrapper shards the rank's share again"
