"""The training loop's state that a resume restores: step, epoch position, best validation, RNGs, history."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from earl_service.train.readout import StepRecord

log = logging.getLogger(__name__)


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # wall-clock since start at each logged step
    step_times: list[float] = field(default_factory=list)
    lr_factors: list[float] = field(default_factory=list)  # the schedule's multiple of the base rate per step
    eval_steps: list[int] = field(default_factory=list)
    eval_seconds: list[float] = field(default_factory=list)
    eval_mrr: list[float] = field(default_factory=list)
    encoded: list[int] = field(default_factory=list)  # sampled training: entities encoded per step (this rank)

    @property
    def last_mrr(self) -> float | None:
        return self.eval_mrr[-1] if self.eval_mrr else None


# The scalar fields saved under the checkpoint's "state" key.
_SCALARS = ("step", "epoch_order", "epoch_pos", "best_mrr", "best_step", "bad_evals", "elapsed", "stopped")


@dataclass
class TrainState:
    """Where training stands. Together with the weights and the optimizer it is all a resume needs to continue
    exactly as an uninterrupted run would: the generator drives the batch order and the negatives.

    The generator lives on the run's device, so that batches and negatives are drawn there without a transfer
    (a host-to-device copy is a sync on CUDA); its state saves as a CPU tensor on any device. A CPU run and a
    CUDA run draw different numbers from one seed; each resumes exactly on its own kind of device."""

    rng: torch.Generator  # batch order and negatives, on the run's device
    step: int = 0
    epoch_order: torch.Tensor | None = None  # (T,) this epoch's permutation of the training rows
    epoch_pos: int = 0  # rows of epoch_order already used
    best_mrr: float = -1.0  # -1: never validated
    best_step: int = 0
    bad_evals: int = 0  # validations in a row without a better MRR (early stopping's count)
    elapsed: float = 0.0  # training seconds, summed over resumes
    stopped: str = "steps"  # why the loop ended: steps, time_limit, cancelled or early_stopping
    history: History = field(default_factory=History)

    @classmethod
    def start(cls, seed: int, device: torch.device | str = "cpu") -> TrainState:
        return cls(rng=torch.Generator(device=device).manual_seed(seed))

    def next_rows(self, num_rows: int, batch_size: int) -> torch.Tensor:
        """The next batch's row ids (the last batch of an epoch may be shorter); a new permutation per epoch."""
        if self.epoch_order is None or self.epoch_pos >= num_rows:
            self.epoch_order = torch.randperm(num_rows, generator=self.rng, device=self.rng.device)
            self.epoch_pos = 0
        ids = self.epoch_order[self.epoch_pos : self.epoch_pos + batch_size]
        self.epoch_pos += batch_size
        return ids

    def record_steps(self, records: Iterable[StepRecord]) -> None:
        """Log steps whose losses have been read (LossReadout.read), in step order."""
        for record in records:
            self.history.step_times.append(record.seconds)
            self.history.lr_factors.append(record.lr_factor)
            self.history.steps.append(record.step)
            self.history.losses.append(record.loss)
            self.history.seconds.append(record.since_start)

    def record_validation(self, mrr: float, since_start: float) -> bool:
        """Log a validation of the current step; True if it is the best so far (it then resets the bad count)."""
        self.history.eval_steps.append(self.step)
        self.history.eval_seconds.append(since_start)
        self.history.eval_mrr.append(mrr)
        if mrr <= self.best_mrr:
            return False
        self.best_mrr, self.best_step, self.bad_evals = mrr, self.step, 0
        return True

    @property
    def unvalidated(self) -> bool:
        """Steps were taken since the last validation (or none was made)."""
        return self.step > (self.history.eval_steps[-1] if self.history.eval_steps else 0)

    def state_dict(self) -> dict[str, Any]:
        # torch's global RNG too, so that anything drawing from it (dropout, a layer's init) resumes exactly.
        assert len(self.history.losses) == len(self.history.steps), "a step's loss is still unread"
        return {"generator": self.rng.get_state(), "generator_device": self.rng.device.type,
                "torch_rng": torch.get_rng_state(),
                "state": {name: getattr(self, name) for name in _SCALARS}, "history": asdict(self.history)}

    def load_state_dict(self, values: dict[str, Any]) -> None:
        torch.set_rng_state(values["torch_rng"])
        for name in _SCALARS:
            setattr(self, name, values["state"][name])
        saved_on = values.get("generator_device", "cpu")  # checkpoints before the generator moved: the CPU's
        if saved_on == self.rng.device.type:
            self.rng.set_state(values["generator"])
        else:  # another kind of generator (a CUDA run resumed on a CPU): go on with fresh draws, not exactly
            log.warning("the checkpoint's batches and negatives were drawn on %s: this %s run continues with new "
                        "draws, not the ones an uninterrupted run would have made", saved_on, self.rng.device.type)
            self.rng.manual_seed(self.rng.initial_seed() + self.step)
        if self.epoch_order is not None:  # saved from (and loaded onto) the CPU: back where the rng draws
            self.epoch_order = self.epoch_order.to(self.rng.device)
        self.stopped = "steps"  # why the previous attempt stopped is not this run's
        self.history = History(**values["history"])


__all__ = ["History", "TrainState"]

