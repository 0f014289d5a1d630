"""One PyTorch Lightning training job over a dataset on an scdlfs mount, run as a
script by test_lightning.py: DDP on CPU, 2 processes, gloo, Lightning's own launcher
(it runs this script again for rank 1). A tiny model trains on the rows the sampler of
each rank hands out; each rank writes, per epoch, the rows it trained on with their
digests, the mount's plans seen mid-epoch, and the warnings the sampler gave."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sampler_helpers import DigestRows, collate_rows  # noqa: E402

import scdlfs  # noqa: E402


class Rows(L.LightningDataModule):
    """The LightningDataModule README.md recommends: the sampler is built in
    train_dataloader(), where the trainer knows this process's rank."""

    def __init__(self, path: str, seed: int):
        super().__init__()
        self.path, self.seed = path, seed

    def train_dataloader(self):
        sampler = scdlfs.ChunkWindowSampler(self.path, chunks_per_window=1, seed=self.seed,
                                            rank=self.trainer.global_rank, world_size=self.trainer.world_size)  # fmt: skip
        return DataLoader(DigestRows(self.path), batch_size=64, sampler=sampler, collate_fn=collate_rows)


class Model(L.LightningModule):
    """One weight fitted to the rows' mean size; it keeps what each epoch trained on."""

    def __init__(self, scdlfs_bin: str, mountpoint: str):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.scdlfs_bin, self.mountpoint = scdlfs_bin, mountpoint
        self.epochs: list[dict] = []

    def on_train_epoch_start(self):
        self.epochs.append({"epoch": self.current_epoch, "rows": [], "digests": [], "plans": None})

    def training_step(self, batch, batch_idx):
        record = self.epochs[-1]
        record["rows"] += [row for row, _, _ in batch]
        record["digests"] += [digest for _, digest, _ in batch]
        if batch_idx == 2:
            # Both ranks are past their first steps (DDP synchronizes every step), so
            # both samplers have announced their plans.
            out = subprocess.run([self.scdlfs_bin, "status", "--json", self.mountpoint], capture_output=True,
                                 text=True, timeout=30, check=True)  # fmt: skip
            record["plans"] = json.loads(out.stdout)["active_plans"]
        sizes = torch.tensor([float(size) for _, _, size in batch])
        return ((self.weight - sizes.mean() / 1e4) ** 2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--scdlfs", required=True)
    parser.add_argument("--mountpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--use-distributed-sampler", choices=["yes", "no"], required=True)
    args = parser.parse_args()

    model = Model(args.scdlfs, args.mountpoint)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=args.epochs, use_distributed_sampler=args.use_distributed_sampler == "yes",
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=Rows(args.dataset, args.seed))
    result = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "epochs": model.epochs,
        "warnings": [str(w.message) for w in caught if "scdlfs" in str(w.message)],
    }
    Path(args.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
