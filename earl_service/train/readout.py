"""Per-step losses kept where the run lives and read to the host in one transfer every few steps.

On a GPU, `float(loss)` after each step is a host sync: the Python side waits for the card to finish the step
before it may queue the next, so the card idles while Python prepares every step. Kept on the device, the
losses are read every `every` steps (and wherever the loop needs them: validation, checkpoints, the end), and
the host runs ahead of the card in between.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from earl_service.train.distributed import Ranks

# On a CPU the value is on the host already: reading every step costs nothing and keeps progress per step.
# Elsewhere a read waits for the card; 32 steps of EARL's ~5-30 ms on a GPU are 0.2-1 s between reports.
DEVICE_READ_EVERY = 32


def read_every(device: torch.device) -> int:
    """Steps between two reads of the losses on `device`."""
    return 1 if device.type == "cpu" else DEVICE_READ_EVERY


@dataclass
class StepRecord:
    """One step as the history records it, once its loss has been read."""

    step: int
    loss: float
    seconds: float  # the step's share of its read window: host seconds of the window's steps plus the read's wait
    since_start: float  # wall-clock seconds since the run started, when the step was queued
    lr_factor: float


class LossReadout:
    """The losses of the steps taken since the last read, still on the device.

    `read()` moves them to the host in one transfer (over all ranks: one all-reduce of the vector) and raises
    FloatingPointError naming the first step whose loss was not finite, so a diverged run stops at the next read.
    Every rank must read at the same steps (the reads are collective); the loop reads on step counts only.
    """

    def __init__(self, every: int, ranks: Ranks | None = None) -> None:
        self.every, self.ranks = every, ranks or Ranks()
        self._losses: list[torch.Tensor] = []  # 0-dim each, this rank's loss weighted by its share of the batch
        self._steps: list[tuple[int, float, float, float]] = []  # (step, host seconds, since start, lr factor)

    def add(self, step: int, loss: torch.Tensor, *, seconds: float = 0.0, since_start: float = 0.0,
            lr_factor: float = 1.0) -> None:
        self._losses.append(loss.detach())
        self._steps.append((step, seconds, since_start, lr_factor))

    @property
    def due(self) -> bool:
        return len(self._losses) >= self.every

    def read(self) -> list[StepRecord]:
        """The pending steps with their losses, in step order; empty when none is pending."""
        if not self._losses:
            return []
        started = time.perf_counter()
        values = self.ranks.sum(torch.stack(self._losses))  # (n,) one transfer; waits for the device
        waited = time.perf_counter() - started
        pending, self._losses, self._steps = self._steps, [], []
        for (step, *_), value in zip(pending, values, strict=True):
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at step {step}; lower the learning rate")
        # The host ran ahead of the device within the window: only the window's total is a step time.
        share = (sum(seconds for _, seconds, _, _ in pending) + waited) / len(pending)
        return [StepRecord(step, value, share, since, factor)
                for (step, _, since, factor), value in zip(pending, values, strict=True)]


__all__ = ["DEVICE_READ_EVERY", "LossReadout", "StepRecord", "read_every"]
