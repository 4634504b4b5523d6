"""`run_pykeen`: PyKEEN's training loop under the same `Budget` as run_earl, resumable from a checkpoint."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import LoadWatch

from earl_service.data import Dataset
from earl_service.train.evaluate import KnownAnswers, summarize
from trainers.budget import PAPER_OPTIM, THREADS, Budget, Optim, seen_subset, stopped
from trainers.pykeen_model import NodePieceSpec, build_pykeen_model, pykeen_rotate_ranks, pykeen_version

PYKEEN_CHECKPOINT = "pykeen_checkpoint.pt"


class _BudgetSpent(Exception):
    """Raised from a callback to leave PyKEEN's loop mid-epoch (its own stop flag is read only between epochs)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Attempt:
    """One attempt at a run: the model, Adam, the early-stopping state, the validation curve, the RNG and the
    training seconds spent, which save themselves at every validation (written atomically) and load into the
    next attempt on the same directory."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path, evaluate,
                 valid_triples: np.ndarray | None):
        self.model, self.optimizer, self.path = model, optimizer, path
        self.evaluate, self.valid_triples = evaluate, valid_triples
        self.history: dict[str, list] = {"eval_steps": [], "eval_seconds": [], "eval_mrr": []}
        self.state = {"step": 0, "best_mrr": -1.0, "best_step": 0, "bad": 0, "best": None, "step_times": []}
        self.elapsed_before, self.resumed_from, self.start = 0.0, None, 0.0

    def load(self) -> None:
        if not self.path.exists():
            return
        saved = torch.load(self.path, weights_only=True)
        self.model.load_state_dict(saved["model"])  # NodePiece's token assignments are buffers: restored too
        self.optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
        self.state.update(saved["state"])
        self.history = saved["history"]
        self.elapsed_before, self.resumed_from = saved["train_seconds"], self.state["step"]

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "rng": torch.get_rng_state(), "state": self.state, "history": self.history,
                    "train_seconds": self.elapsed()}, tmp)
        os.replace(tmp, self.path)

    def elapsed(self) -> float:
        """Training seconds of every attempt so far (the clock starts at `elapsed_before`)."""
        return time.perf_counter() - self.start

    def validate(self, step: int) -> bool:
        """Validate the current weights, log them, keep them as the best if they are; True if they were."""
        mrr = self.evaluate(self.valid_triples, restrict=True)["mrr"]
        self.history["eval_steps"].append(step)
        self.history["eval_seconds"].append(self.elapsed())
        self.history["eval_mrr"].append(mrr)
        if mrr <= self.state["best_mrr"]:
            return False
        self.state.update(best_mrr=mrr, best_step=step, bad=0, best=copy.deepcopy(self.model.state_dict()))
        return True

    def already_stopped(self, budget: Budget) -> str | None:
        """Why an attempt interrupted after its last checkpoint but before its record trains no further."""
        state = self.state
        return ("early_stopping" if state["bad"] >= budget.patience else "steps" if state["step"] >= budget.max_steps
                else "time_limit" if self.elapsed_before > budget.minutes * 60 else None)


def _budget_callback(attempt: _Attempt, budget: Budget) -> Any:
    """A PyKEEN callback that counts steps, validates on the cadence and stops when the budget is spent."""
    from pykeen.training.callbacks import TrainingCallback

    class BudgetCallback(TrainingCallback):
        def pre_batch(self, **kwargs: Any) -> None:
            self._t0 = time.perf_counter()

        def post_batch(self, epoch: int, batch, **kwargs: Any) -> None:
            state = attempt.state
            state["step"] += 1
            state["step_times"].append(time.perf_counter() - self._t0)
            step = state["step"]
            if attempt.valid_triples is not None and budget.eval_every and step % budget.eval_every == 0:
                if not attempt.validate(step):
                    state["bad"] += 1
                self.model.train()  # PyKEEN re-enables training mode only at epoch start
                attempt.save()
                if state["bad"] >= budget.patience:
                    raise _BudgetSpent("early_stopping")
            if step >= budget.max_steps:
                raise _BudgetSpent("steps")
            if attempt.elapsed() > budget.minutes * 60:
                raise _BudgetSpent("time_limit")

    return BudgetCallback()


def _train(attempt: _Attempt, factory, budget: Budget, optim: Optim, negatives: int) -> str:
    """PyKEEN's sLCWA loop driven until the budget stops it; returns why it stopped."""
    from pykeen.training import SLCWATrainingLoop

    loop = SLCWATrainingLoop(model=attempt.model, triples_factory=factory, optimizer=attempt.optimizer,
                             negative_sampler="basic",
                             negative_sampler_kwargs={"num_negs_per_pos": negatives, "filtered": True})
    attempt.start = time.perf_counter() - attempt.elapsed_before  # the budget counts every attempt's training time
    stopped_by = attempt.already_stopped(budget)
    if stopped_by is not None:
        return stopped_by
    try:
        loop.train(triples_factory=factory, num_epochs=10**9, batch_size=optim.batch_size, use_tqdm=False,
                   use_tqdm_batch=False, callbacks=[_budget_callback(attempt, budget)])
    except _BudgetSpent as stop:
        return stop.reason
    return "steps"


def _evaluator(model: torch.nn.Module, ds: Dataset):
    """evaluate(triples, restrict) -> metrics; `restrict`: candidates are the training entities (the `seen`
    protocol), as run_earl ranks them."""
    known = KnownAnswers(np.concatenate([x for x in (ds.train, ds.valid, ds.test) if x is not None and len(x)]),
                         ds.num_relations)

    def evaluate(triples: np.ndarray, restrict: bool) -> dict:
        ranks = pykeen_rotate_ranks(model, triples, known, ds.num_train_entities if restrict else ds.num_entities)
        return summarize(ranks)["both"]

    return evaluate


def _finish(attempt: _Attempt, ds: Dataset, budget: Budget, protocols: tuple[str, ...],
            final_eval: bool) -> tuple[dict, dict]:
    """Validate the steps since the last validation (as earl_service.train.loop does, outside the budget), restore
    the best weights, and measure them: (valid metrics, test metrics per protocol)."""
    history, state, evaluate = attempt.history, attempt.state, attempt.evaluate
    last_validated = history["eval_steps"][-1] if history["eval_steps"] else 0
    if attempt.valid_triples is not None and budget.eval_every and state["step"] > last_validated:
        attempt.validate(state["step"])
    if state["best"] is not None:
        attempt.model.load_state_dict(state["best"])
    attempt.model.eval()
    valid = evaluate(seen_subset(ds, "valid", 0), restrict=True) if final_eval and ds.valid is not None else {}
    test: dict[str, dict] = {}
    if final_eval and ds.test is not None:
        test["seen"] = evaluate(seen_subset(ds, "test", 0), restrict=True)
        if "all" in protocols:
            test["all"] = dict(test["seen"]) if ds.seen_mask(ds.test).all() else evaluate(ds.test, restrict=False)
    return valid, test


def _quiet_pykeen() -> None:
    warnings.filterwarnings("ignore", module=r"pykeen\..*")
    warnings.filterwarnings("ignore", message=r".*is not complex, but will be viewed as such")
    warnings.filterwarnings("ignore", message=r".*does not comply with the canonical complex tensor shape")
    logging.getLogger("pykeen").setLevel(logging.ERROR)


def run_pykeen(ds: Dataset, kind: str, budget: Budget, out_dir: Path, *, dim: int = 0, width: int = 0,
               spec: NodePieceSpec | None = None, optim: Optim = PAPER_OPTIM, negatives_per_positive: int = 0,
               protocols: tuple[str, ...] = ("seen",), seed: int = 0, final_eval: bool = True) -> dict:
    """Train PyKEEN's RotatE (`kind="rotate"`, complex `dim`) or NodePiece+RotatE (`kind="nodepiece"`, real `width`).

    Same conditions as run_earl: sLCWA with the self-adversarial NSSA loss (margin, temperature), batch size,
    Adam and learning rate from `optim`, `negatives_per_positive` corruptions per positive (0: 2*optim.negatives,
    what run_earl draws; PyKEEN corrupts one side per negative; filtered against train), THREADS threads, the same
    wall-clock budget with validation counted in it, validation every `eval_every` steps on the same valid subset
    with filtered realistic MRR, early stopping with the same patience, best checkpoint tested. PyKEEN's own
    components are wired as its `pipeline()` would; the loop is driven directly so that a callback can stop it
    mid-epoch when the budget is spent.

    Resumable like run_earl: at every validation the run checkpoints itself (`_Attempt`, `PYKEEN_CHECKPOINT`); a
    call on a directory holding one continues from it and the budget counts the training time of every attempt.
    PyKEEN's loop has no mid-epoch resume, so the resumed attempt starts a freshly shuffled epoch.
    """
    _quiet_pykeen()
    torch.set_num_threads(THREADS)
    torch.manual_seed(seed)
    out_dir = Path(out_dir)
    if not (out_dir / PYKEEN_CHECKPOINT).exists():
        shutil.rmtree(out_dir, ignore_errors=True)  # a leftover without a checkpoint is not this run's
    out_dir.mkdir(parents=True, exist_ok=True)
    wall0, watch = time.perf_counter(), LoadWatch()
    model, factory, shape = build_pykeen_model(ds, kind, dim=dim, width=width, spec=spec, optim=optim, seed=seed)
    setup_seconds = time.perf_counter() - wall0
    valid_triples = seen_subset(ds, "valid", budget.eval_max_triples) if ds.valid is not None else None
    attempt = _Attempt(model, torch.optim.Adam(model.parameters(), lr=optim.lr), out_dir / PYKEEN_CHECKPOINT,
                       _evaluator(model, ds), valid_triples)
    attempt.load()
    negatives = negatives_per_positive or 2 * optim.negatives
    why = _train(attempt, factory, budget, optim, negatives)
    train_seconds = attempt.elapsed()
    valid, test = _finish(attempt, ds, budget, protocols, final_eval)
    path = out_dir / "pykeen_state.pt"
    torch.save(model.state_dict(), path)  # weights plus NodePiece's token assignment buffers
    times, state = attempt.state["step_times"][3:], attempt.state
    return {
        "implementation": f"pykeen {pykeen_version()}", "model": kind, **shape,
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "steps": state["step"], "best_step": state["best_step"], **stopped(budget, why, watch),
        "train_seconds": train_seconds, "setup_seconds": setup_seconds,
        "wall_seconds": time.perf_counter() - wall0,  # of the last attempt only, when resumed
        "resumed_from_step": attempt.resumed_from,
        "median_step_seconds": float(np.median(times)) if times else None,
        "step_seconds_total": float(sum(state["step_times"])),  # pre_batch to post_batch: no validation, no loading
        "valid": valid, "test": test, "artifact_bytes": path.stat().st_size,
        "artifact": "torch.save(model.state_dict()) (weights; NodePiece also its token assignments)",
        "history": attempt.history,
        "config": {"optim": optim.to_dict(), "negatives_per_positive": negatives, "seed": seed}, "threads": THREADS,
    }
