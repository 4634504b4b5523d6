"""What both trainers share: the wall-clock `Budget`, the optimisation settings, and the record's common fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from harness import LoadWatch

from earl_service.data import Dataset

THREADS = 2  # the machine's cores; every run in every table uses the same


@dataclass(frozen=True)
class Budget:
    """How long one run may train and how it validates. Validation time counts against `minutes`."""

    minutes: float
    max_steps: int = 1_000_000
    eval_every: int = 100  # steps between validations
    eval_max_triples: int = 0  # validate on a fixed random subset of this many valid triples (0: all)
    patience: int = 20  # validations without improvement before early stopping

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fixed_steps(self, steps: int) -> Budget:
        """This budget training exactly `steps` steps: patience outlasts the run, so early stopping never ends it."""
        return replace(self, max_steps=steps, patience=steps // self.eval_every + 1)

    @property
    def patience_outlasts_run(self) -> bool:
        """Whether the step cap, not early stopping, ends the run (a fixed-step design)."""
        return self.patience * self.eval_every > self.max_steps


@dataclass(frozen=True)
class Optim:
    """The optimisation settings shared by both trainers (the paper's defaults)."""

    batch_size: int = 1024
    negatives: int = 256  # per side: this many head and this many tail corruptions per positive
    lr: float = 1e-3
    margin: float = 10.0
    adversarial_temperature: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PAPER_OPTIM = Optim()  # the trainers' default (frozen, so one instance serves every call)


def seen_subset(ds: Dataset, split: str, limit: int) -> np.ndarray:
    """The triples `Run.evaluate(split, "seen", limit=...)` ranks: seen-entity filter, then the same fixed subset."""
    triples = ds.split(split)
    triples = triples[ds.seen_mask(triples)]
    if limit and len(triples) > limit:
        triples = triples[np.random.default_rng(0).choice(len(triples), limit, replace=False)]
    return triples


def metrics(m: dict) -> dict:
    """The ranking metrics a record keeps."""
    return {k: m[k] for k in ("mrr", "mr", "hits_at_1", "hits_at_3", "hits_at_10", "count") if k in m}


def stopped(budget: Budget, why: str, watch: LoadWatch) -> dict:
    """Why training stopped, the budget, and what else ran on the machine meanwhile."""
    return {"stopped": why, "converged": why == "early_stopping", "budget": budget.to_dict(), **watch.summary()}


def effi(record: dict, protocol: str = "seen") -> float | None:
    """The paper's Effi: MRR per million parameters."""
    mrr = record.get("test", {}).get(protocol, {}).get("mrr")
    return None if mrr is None else mrr / (record["parameters"] / 1e6)
