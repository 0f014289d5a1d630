"""Helpers of test_sampler.py that rank processes import: the emulated link, the mount's
status, and one rank of the two-rank test (run as a script). The dataset DataLoader
workers read is bench/torch_loader.py's DigestRows, the benchmark's own."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
# bench/torch_loader.py: DigestRows, which DataLoader workers (also spawned ones, which
# get this sys.path) unpickle by module name.
sys.path.append(str(REPO_ROOT / "bench"))

from torch_loader import CountedRows, DigestRows, batch_rows, collate_rows, fetch_rows  # noqa: E402


def bench_bin() -> Path:
    b = Path(os.environ.get("SCDLFS_BENCH") or REPO_ROOT / "target" / "ci" / "scdlfs-bench")
    if not (b.is_file() and os.access(b, os.X_OK)):
        raise RuntimeError(f"scdlfs-bench not found at {b} (cargo build --profile ci --workspace, or set SCDLFS_BENCH)")
    return b


def read_digests(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<u8")


class Link:
    """`scdlfs-bench proxy`: the emulated cloud link (latency per response and a shared
    bandwidth cap) in front of the S3 server."""

    def __init__(self, upstream: str, rate_mbps: float, latency_ms: float, log: Path):
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [str(bench_bin()), "proxy", "--upstream", upstream.removeprefix("http://"),
             "--rate-mbps", str(rate_mbps), "--latency-ms", str(latency_ms)],
            stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        ports = json.loads(self.proc.stdout.readline())
        self.endpoint = "http://" + ports["listen"]

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        self._log.close()


def status(bin_path: Path, mountpoint: Path) -> dict:
    out = subprocess.run([str(bin_path), "status", "--json", str(mountpoint)], capture_output=True,
                         text=True, timeout=30, check=True, stdin=subprocess.DEVNULL)  # fmt: skip
    return json.loads(out.stdout)


def run_rank() -> None:
    """One rank of the two-rank test: joins the gloo group, mounts its own cache, reads
    its share of one epoch through a DataLoader with two workers, and writes what it
    read and what its mount fetched as JSON."""
    parser = argparse.ArgumentParser()
    for name in ("rank", "world-size", "port"):
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in ("source", "endpoint", "workdir", "dataset", "part-size", "out"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import scdl_helpers as H
    import scdlfs

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world_size)  # fmt: skip
    try:
        base = Path(args.workdir) / f"rank{args.rank}"
        mount = H.ScdlfsMount(args.source, base / "mnt", base / "cache", args.endpoint,
                              extra=["--read-part-size", args.part_size], cache_size="256MiB")  # fmt: skip
        with mount:
            path = str(mount.mountpoint / args.dataset)
            # rank and world size come from the initialized process group
            sampler = scdlfs.ChunkWindowSampler(path, chunks_per_window=1, seed=11)
            loader = DataLoader(DigestRows(path), batch_size=64, sampler=sampler, num_workers=2,
                                collate_fn=collate_rows)  # fmt: skip
            triples = [item for batch in loader for item in batch]
            counters = status(mount.bin, mount.mountpoint)["counters"]
            result = {
                "rank": sampler.rank,
                "world_size": sampler.world_size,
                "rows": [row for row, _, _ in triples],
                "digests": [digest for _, digest, _ in triples],
                "bytes_fetched": counters["bytes_fetched"],
                "hints_active": sampler.hints_active,
            }
            del loader, sampler
        Path(args.out).write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    run_rank()
