"""The learning rate over a run: a budget-aware warm-up and decay, and separate rates for tables and encoder.

Budgeted training (Li, Yumer and Ramanan, "Budgeted Training", ICLR 2020): when a run's end is known, decaying
the rate to (near) zero at that end beats a constant rate stopped at the same point. The end is whichever comes
first of `--steps` and `--time-limit`, so the rate is a pure function of (step, elapsed seconds): a resumed run
continues on exactly the same curve with nothing extra in the checkpoint.
"""

from __future__ import annotations

import math

import torch

from earl_service.config import TrainConfig
from earl_service.train.rows import RowAdam, wants_row_updates

SCHEDULES = ("constant", "cosine", "linear")


def budget_used(cfg: TrainConfig, step: int, elapsed: float) -> float:
    """How much of the run's budget is spent, in [0, 1]: the larger of the step and time fractions; the time is
    `schedule_minutes` from `schedule_start_minutes` where it is set (a run continued in slices: compress's
    halving rungs), else the time limit."""
    used = step / cfg.steps if cfg.steps else 0.0
    minutes = cfg.schedule_minutes or cfg.time_limit_minutes
    if minutes:
        start = cfg.schedule_start_minutes * 60 if cfg.schedule_minutes else 0.0
        used = max(used, (elapsed - start) / (minutes * 60))
    return min(max(used, 0.0), 1.0)


def lr_factor(cfg: TrainConfig, used: float) -> float:
    """The multiple of the base rate at budget fraction `used`: a linear warm-up, the base rate held until the
    last `decay_share` of the budget, then the decay to `lr_floor` (warm-up, hold, decay)."""
    if cfg.lr_schedule == "constant":
        return 1.0
    if cfg.warmup and used < cfg.warmup:
        return max(used / cfg.warmup, 1e-3)  # never exactly 0: the first step still moves
    start = max(cfg.warmup, 1.0 - cfg.decay_share)  # where the decay begins
    if used <= start and start < 1.0:
        return 1.0
    progress = (used - start) / (1.0 - start) if start < 1.0 else 1.0
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.lr_schedule == "cosine" else 1.0 - progress
    return cfg.lr_floor + (1.0 - cfg.lr_floor) * shape


def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict]:
    """Adam's parameter groups: one at `lr`, or, with `encoder_lr`, the tables (parameters a module holds itself:
    reserved entities, relations, ConRel ends, RotatE's entities) at `lr` and the shared encoder at `encoder_lr`.

    One group unless asked, so that checkpoints written before the split still resume.
    """
    if not cfg.encoder_lr:
        return [{"params": list(model.parameters()), "base_lr": cfg.lr}]
    tables = [p for name, p in model.named_parameters() if "." not in name]
    encoder = [p for name, p in model.named_parameters() if "." in name]
    groups = [{"params": tables, "base_lr": cfg.lr}, {"params": encoder, "base_lr": cfg.encoder_lr}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam over param_groups; RowAdam (the same maths, lazy on sparse row gradients) where `model`'s steps update
    rows (train/rows.py)."""
    groups = [{**g, "lr": g["base_lr"] * lr_factor(cfg, 0.0)} for g in param_groups(model, cfg)]
    return RowAdam(groups) if wants_row_updates(model, cfg) else torch.optim.Adam(groups)


def set_lr(optimizer: torch.optim.Optimizer, cfg: TrainConfig, step: int, elapsed: float) -> float:
    """Set every group's rate for the coming step; returns the factor applied (for the history)."""
    factor = lr_factor(cfg, budget_used(cfg, step, elapsed))
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):  # a graphed step's rate (train/graphed.py): written in place
            group["lr"].fill_(group["base_lr"] * factor)
        else:
            group["lr"] = group["base_lr"] * factor
    return factor


__all__ = ["SCHEDULES", "budget_used", "build_optimizer", "lr_factor", "param_groups", "set_lr"]
