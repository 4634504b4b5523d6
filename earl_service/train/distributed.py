"""Data-parallel training over torch.distributed: ranks and their shards, rank-0 decisions, the torchrun command.

`earl train --nproc-per-node N` re-runs itself under `torch.distributed.run` (torchrun); every process then
joins the process group (gloo on CPU, NCCL on CUDA) and `train()` sees a world of N. Each rank draws the same
global batch and negatives from the shared seed, takes a contiguous slice of the rows, and encodes the graph
itself (the encoder is replicated; its parameters are small); DistributedDataParallel all-reduces gradients.
Rank 0 alone validates, writes checkpoints, metrics and the bundle, and decides when to stop.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from earl_service.errors import ConfigError

# Why training stopped, as the small integers rank 0 broadcasts.
STOP_REASONS = (None, "time_limit", "cancelled", "early_stopping")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the process group; rank 0 of 1 without one."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # collectives' tensors (CUDA for NCCL)

    @classmethod
    def current(cls, device: torch.device) -> Ranks:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            backend_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
            return cls(dist.get_rank(), dist.get_world_size(), backend_device)
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, rows: int) -> tuple[slice, float]:
        """This rank's contiguous rows of a global batch of `rows`, and its share of the batch mean.

        A rank left without rows (a batch smaller than the world) reuses row 0 with share 0, so that every
        rank still runs forward and backward (DDP needs every rank's gradients).
        """
        lo, hi = rows * self.rank // self.world, rows * (self.rank + 1) // self.world
        if hi == lo:
            return slice(0, 1), 0.0
        return slice(lo, hi), (hi - lo) / rows

    def agree(self, reason: str | None) -> str | None:
        """Rank 0's stop decision, on every rank."""
        if self.world == 1:
            return reason
        code = torch.tensor([STOP_REASONS.index(reason)], device=self.device)
        dist.broadcast(code, 0)
        return STOP_REASONS[int(code.item())]

    def main_value(self, value: float) -> float:
        """Rank 0's `value` on every rank (a clock reading, so that all ranks step with one learning rate)."""
        if self.world == 1:
            return value
        shared = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(shared, 0)
        return float(shared.item())

    def sum(self, values: torch.Tensor) -> list[float]:
        """(n,) values -> their element-wise sums over all ranks, on the host (one transfer, one all-reduce)."""
        if self.world == 1:
            return values.detach().tolist()
        total = values.detach().reshape(-1).to(self.device, torch.float64)
        dist.all_reduce(total)
        return total.tolist()


def init_process_group(device: torch.device, *, timeout_minutes: float = 60.0) -> None:
    """Join the group torchrun describes (env://): NCCL for CUDA devices, gloo on CPU.

    The timeout is generous because the other ranks wait in a collective while rank 0 validates.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))


def wrap(model: torch.nn.Module, ranks: Ranks, device: torch.device) -> torch.nn.Module:
    """The module DDP-wrapped when the world has several ranks (the same module otherwise)."""
    if ranks.world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # The graph arguments are already on the device; buffers (the reserved ids) never change.
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                   broadcast_buffers=False)


def torchrun_command(
    args: Sequence[str],
    *,
    nproc_per_node: int,
    nnodes: str = "1",
    rdzv_endpoint: str | None = None,
    rdzv_backend: str = "c10d",
    rdzv_id: str | None = None,
    node_rank: int | None = None,
) -> list[str]:
    """`python -m torch.distributed.run ... -m earl_service.cli.main <args>`.

    One machine without an endpoint runs `--standalone` (a free local port); several machines share
    `rdzv_endpoint` (host:port of one of them) and the same `nnodes` and `rdzv_id`.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}", f"--nnodes={nnodes}"]
    if rdzv_endpoint is None and nnodes in ("1", "1:1"):
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ConfigError("training on several machines needs --rdzv-endpoint HOST:PORT")
        cmd += [f"--rdzv-backend={rdzv_backend}", f"--rdzv-endpoint={rdzv_endpoint}"]
        if rdzv_id is not None:
            cmd.append(f"--rdzv-id={rdzv_id}")
    if node_rank is not None:
        cmd.append(f"--node-rank={node_rank}")
    return [*cmd, "-m", "earl_service.cli.main", *args]


__all__ = ["STOP_REASONS", "Ranks", "init_process_group", "torchrun_command", "wrap"]
