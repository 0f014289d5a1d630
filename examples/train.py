#!/usr/bin/env python3
"""Train a tiny model on an SCDL dataset mounted with scdlfs, the way a PyTorch user
would: bionemo-scdl's SingleCellMemMapDataset on the mount, a DataLoader with worker
processes, and scdlfs.ChunkWindowSampler telling the daemon what comes next.

    examples/train.py                          # the demo's synthetic dataset, from a local folder
    examples/train.py --source s3://bucket/prefix --dataset tahoe [--endpoint-url URL]

The mount is made from Python (`scdlfs.mount`, unmounted when the block ends). Prints
rows/s and the mount's counters (`scdlfs status --json`): how many reads waited on the
network, how many the prefetch had already fetched. Needs the scdlfs wheel
(scripts/build-wheel), or the package and a `scdlfs` binary on PATH or given by --scdlfs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

import scdlfs

# Inputs of the model: gene ids hashed into this many buckets, so that any dataset fits.
INPUTS = 1024


def demo_dataset(workdir: Path, rows: int) -> tuple[str, str]:
    """Writes the demo's synthetic chunked dataset into a local folder (`scdlfs demo`
    also reads it once through a mount and checks every row), as the source to mount."""
    subprocess.run([scdlfs.scdlfs_binary(), "demo", "--rows", str(rows), "--workdir", str(workdir / "demo")],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return str(workdir / "demo" / "bucket"), "demo_dataset"


def collate(rows: list[torch.Tensor]) -> torch.Tensor:
    """SingleCellMemMapDataset yields [values; column ids] per row: scatter log1p values
    into a dense batch of hashed gene buckets."""
    batch = torch.zeros(len(rows), INPUTS)
    for i, row in enumerate(rows):
        values, columns = row[0].float(), row[1].long() % INPUTS
        batch[i].index_add_(0, columns, torch.log1p(values.abs()))
    return batch


def train(args, mount: scdlfs.Mount, dataset_dir: Path) -> None:
    from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

    dataset = SingleCellMemMapDataset(str(dataset_dir))
    sampler = scdlfs.ChunkWindowSampler(dataset, chunks_per_window=args.chunks_per_window, seed=args.seed,
                                        hints=not args.no_hints)  # fmt: skip
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                        collate_fn=collate, persistent_workers=args.num_workers > 0)  # fmt: skip
    print(f"{dataset_dir}: {sampler.num_rows} rows in {sampler.num_chunks} chunks ({sampler.dataset_kind}); "
          f"hints {'on' if sampler.hints_active else 'off'}; rank {sampler.rank} of {sampler.world_size}")  # fmt: skip

    # A tiny autoencoder of the bucketed expression profile.
    model = nn.Sequential(nn.Linear(INPUTS, 64), nn.ReLU(), nn.Linear(64, INPUTS))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step, rows, epoch, losses = 0, 0, 0, []
    started = time.monotonic()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = nn.functional.mse_loss(model(batch), batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step, rows = step + 1, rows + len(batch)
            if step % 100 == 0:
                print(f"step {step}: loss {sum(losses[-100:]) / len(losses[-100:]):.4f}")
            if step == args.steps:
                break
        epoch += 1
    seconds = time.monotonic() - started
    counters = mount.status()["counters"]
    problem = sampler.take_hint_error()
    del loader, sampler, dataset  # close the hint file and the maps before unmounting
    print(f"trained {step} steps, {rows} rows in {seconds:.1f} s: {rows / seconds:.0f} rows/s; "
          f"loss {losses[0]:.4f} -> {sum(losses[-20:]) / len(losses[-20:]):.4f}")  # fmt: skip
    print(f"mount: {counters['reads']} reads, {counters['demand_wait_seconds']['count']} waited on the network "
          f"({counters['demand_wait_seconds']['sum']:.2f} s in all), {counters['prefetch_hits']} found prefetched; "
          f"{counters['bytes_fetched'] / 1e6:.1f} MB fetched")  # fmt: skip
    if problem:
        print(f"hints: {problem}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", help="what to mount (s3://, gs://, http(s)://, a folder); default: the demo dataset")
    parser.add_argument("--dataset", help="the dataset's path inside the mount (with --source)")
    parser.add_argument("--endpoint-url", help="S3 endpoint, passed to scdlfs mount")
    parser.add_argument("--no-sign-request", action="store_true", help="passed to scdlfs mount")
    parser.add_argument("--demo-rows", type=int, default=30_000, help="rows of the demo dataset")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--chunks-per-window", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-hints", action="store_true", help="do not tell the mount the order")
    parser.add_argument("--cache-size", default="1GiB")
    parser.add_argument("--workdir", type=Path, help="mountpoint and cache go here (default: a temporary folder)")
    parser.add_argument("--scdlfs", help="the scdlfs binary (default: the wheel's, else on PATH)")
    args = parser.parse_args()
    if bool(args.source) != bool(args.dataset):
        parser.error("--source and --dataset go together")
    if args.scdlfs:
        os.environ["SCDLFS_BIN"] = args.scdlfs

    with tempfile.TemporaryDirectory(prefix="scdlfs-train-") as tmp:
        workdir = (args.workdir or Path(tmp)).absolute()
        source, name = (args.source, args.dataset) if args.source else demo_dataset(workdir, args.demo_rows)
        mountpoint = workdir / "mnt"
        mountpoint.mkdir(parents=True, exist_ok=True)
        with scdlfs.mount(source, mountpoint, cache_dir=workdir / "cache", cache_size=args.cache_size,
                          endpoint_url=args.endpoint_url, no_sign_request=args.no_sign_request) as mount:  # fmt: skip
            train(args, mount, mount.mountpoint / name)

if __name__ == "__main__":
    main()
