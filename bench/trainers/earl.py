"""This repository's trainer (`earl_service.train.loop`, EARL or plain RotatE) under a `Budget`."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch
from harness import LoadWatch

from earl_service.config import ModelConfig, TrainConfig
from earl_service.data import Dataset
from earl_service.model.graph import choose_reserved
from earl_service.model.modules import build_model, trainable_parameters
from earl_service.train import loop
from earl_service.train.loop import CHECKPOINT
from earl_service.train.run import load_run
from trainers.budget import PAPER_OPTIM, THREADS, Budget, Optim, metrics, stopped


def earl_parameters(ds: Dataset, cfg: ModelConfig) -> int:
    """Trainable parameters of a model config on this dataset, without training it."""
    n = ds.num_train_entities
    reserved = (choose_reserved(n, cfg.reserved_ratio, cfg.seed) if cfg.model == "earl" and cfg.uses_reserved
                else torch.zeros(0, dtype=torch.long))
    return trainable_parameters(build_model(cfg, n, ds.num_relations, reserved))


def dim_for_parameters(ds: Dataset, base: ModelConfig, target: int, *, lo: int = 1, hi: int = 2000) -> int:
    """The dim whose parameter count is closest to `target` (counts grow with dim, so bisect)."""

    def count(d: int) -> int:
        return earl_parameters(ds, replace(base, dim=d))

    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) < target:
            lo = mid + 1
        else:
            hi = mid
    return min((d for d in (lo - 1, lo) if d >= 1), key=lambda d: abs(count(d) - target))


def _train_config(budget: Budget, optim: Optim, *, bf16: bool, seed: int) -> TrainConfig:
    return TrainConfig(steps=budget.max_steps, batch_size=optim.batch_size, negatives=optim.negatives, lr=optim.lr,
                       adversarial_temperature=optim.adversarial_temperature, eval_every=budget.eval_every,
                       patience=budget.patience, eval_max_triples=budget.eval_max_triples,
                       time_limit_minutes=budget.minutes, compute="bf16" if bf16 else "fp32", threads=THREADS,
                       progress=False, seed=seed, checkpoint_every=budget.eval_every)


def run_earl(ds: Dataset, cfg: ModelConfig, budget: Budget, out_dir: Path, *, optim: Optim = PAPER_OPTIM,
             protocols: tuple[str, ...] = ("seen",), bf16: bool = False, seed: int = 0, final_eval: bool = True) -> dict:
    """Train with `earl_service.train.loop` under the budget; test the best checkpoint under each protocol.

    Resumable: the training state is checkpointed at every validation, and a call on a directory holding a
    checkpoint (an earlier attempt that was interrupted) continues from it; the budget counts the training
    time of every attempt (`train_seconds`), not the time lost between them. Any other leftover is removed.
    """
    out_dir = Path(out_dir)
    resume = (out_dir / CHECKPOINT).exists()
    if not resume:
        shutil.rmtree(out_dir, ignore_errors=True)  # a stale best.pt must not stand in for this run's
    cfg = replace(cfg, gamma=optim.margin)
    t0, watch = time.perf_counter(), LoadWatch()
    resumed_from = torch.load(out_dir / CHECKPOINT, weights_only=True)["state"]["step"] if resume else None
    # loop.train, looked up at call time: a test stands a stub in for it to leave a run between validations.
    m = loop.train(ds, cfg, _train_config(budget, optim, bf16=bf16, seed=seed), out_dir, resume=resume, protocol="seen",
              final_eval=final_eval)
    test = test_earl(ds, out_dir, protocols, seen=m["test"]) if "test" in m else {}
    history = json.loads((out_dir / "history.json").read_text())
    return {
        "implementation": "earl_service",
        "model": cfg.model,
        "dim": cfg.dim,
        "parameters": m["trainable_parameters"],
        "steps": m["steps"],
        "best_step": m["best_step"],
        **stopped(budget, m["stopped"], watch),
        "train_seconds": m["train_seconds"],
        "wall_seconds": time.perf_counter() - t0,  # of the last attempt only, when resumed
        "resumed_from_step": resumed_from,
        "median_step_seconds": m["median_step_seconds"],
        "step_seconds_total": float(sum(history["step_times"])),  # train_seconds less validation and checkpoints
        "valid": metrics(m.get("valid", {})),
        "test": test,
        "artifact_bytes": m["bundle_bytes"],
        "artifact": "bundle.safetensors (fp32 weights, graph, vocabularies)",
        "history": {"eval_steps": history["eval_steps"], "eval_seconds": history["eval_seconds"],
                    "eval_mrr": history["eval_mrr"]},
        "config": {"model": cfg.to_dict(), "optim": optim.to_dict(), "bf16": bf16, "seed": seed},
        "threads": THREADS,
    }


def test_earl(ds: Dataset, out_dir: Path, protocols: tuple[str, ...], *, seen: dict | None = None) -> dict:
    """Test metrics of a finished run's best checkpoint under each protocol (`seen`: pass the trainer's own)."""
    run = None
    if seen is None:
        run = load_run(out_dir, ds, device="cpu")
        seen = run.evaluate("test", "seen")
    test = {"seen": metrics(seen)}
    if "all" in protocols:
        if ds.seen_mask(ds.test).all():
            test["all"] = dict(test["seen"])  # no test triple has an unseen entity: the two protocols coincide
        else:
            test["all"] = metrics((run or load_run(out_dir, ds, device="cpu")).evaluate("test", "all"))
    return test
