"""The training loop: set up, the steps, validation on a cadence, early stopping, checkpoints and outputs."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earl_service.bundle.model_io import Bundle, bundle_from_model
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import Dataset
from earl_service.memory import peak_rss_mb
from earl_service.model import kernels
from earl_service.model.modules import trainable_parameters
from earl_service.provenance import provenance
from earl_service.train.checkpoint import CHECKPOINT, Checkpointer
from earl_service.train.distributed import Ranks, wrap
from earl_service.train.graphed import GraphedStep
from earl_service.train.loss import NegativeSampler, loss_fn, sampled_loss
from earl_service.train.memory import MemoryUse
from earl_service.train.outputs import BUNDLE, write_run_outputs
from earl_service.train.readout import LossReadout, StepRecord, read_every
from earl_service.train.rows import RowAdam, gather_rows, negative_chunk, table_config
from earl_service.train.run import GraphCache, Run, bf16_autocast, resolve_device
from earl_service.train.sampling import check_sampled
from earl_service.train.schedule import build_optimizer, set_lr
from earl_service.train.state import TrainState
from earl_service.version import __version__

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # first steps left out of median_step_seconds (allocator, caches and kernels warming up)

ProgressCallback = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class StopRules:
    """When the loop ends before its step count; every rank acts on rank 0's decision.

    Before a step: the time budget is spent (`time_limit`), or the caller asks to stop (`cancelled`). After a
    step: `early_stopping`, once `patience` validations in a row found no better MRR. Only rank 0 validates, so
    with several ranks its count is shared on the validation cadence.
    """

    time_limit_s: float = 0.0  # 0: no limit
    cancel: Callable[[], bool] | None = None
    patience: int = 0
    eval_every: int = 0  # the validation cadence in steps; 0: never validated, so never stopped early
    ranks: Ranks = field(default_factory=Ranks)

    @classmethod
    def for_run(cls, cfg: TrainConfig, ranks: Ranks, cancel: Callable[[], bool] | None, *, has_valid: bool) -> StopRules:
        return cls(cfg.time_limit_minutes * 60, cancel, cfg.patience, cfg.eval_every if has_valid else 0, ranks)

    def before_step(self, elapsed: float) -> str | None:
        reason = None
        if self.time_limit_s and elapsed > self.time_limit_s:
            reason = "time_limit"
        elif self.cancel is not None and self.cancel():
            reason = "cancelled"
        return self.ranks.agree(reason)

    def after_step(self, step: int, bad_evals: int) -> str | None:
        early = bool(self.eval_every) and bad_evals >= self.patience
        if self.ranks.world > 1 and _due(step, self.eval_every):
            early = self.ranks.agree("early_stopping" if early else None) is not None
        return "early_stopping" if early else None


def _due(step: int, every: int) -> bool:
    """Whether `step` is on a cadence of `every` steps (0: never)."""
    return bool(every) and step % every == 0


@dataclass
class Learner:
    """What every training step works on, built once per run."""

    run: Run
    net: torch.nn.Module  # run.model, DDP-wrapped when there are several ranks
    optimizer: torch.optim.Optimizer
    sampler: NegativeSampler
    triples: torch.Tensor  # (T, 3) the training triples, on the run's device (batches are gathered there)
    cfg: TrainConfig
    ranks: Ranks
    device: torch.device
    autocast: bool  # bfloat16 autocast of the encoder's dense maps (TrainConfig.compute)
    fanout: list[int | None]  # sampled training: edges drawn per entity at each layer
    graphed: GraphedStep | None = None  # the step as a CUDA graph (train() sets it for --cuda-graphs)
    rows: bool = False  # each step updates only the entity rows it touches (train/rows.py)
    chunk: int = 0  # full-graph steps: positives sharing their corruptions (rows.negative_chunk; 0: none)

    @classmethod
    def build(
        cls, run: Run, optimizer: torch.optim.Optimizer, cfg: TrainConfig, *, ranks: Ranks, device: torch.device,
    ) -> Learner:
        """Wraps the model in DDP over several ranks (it broadcasts rank 0's weights once): after a resume."""
        ds = run.dataset

        def sampler_here() -> NegativeSampler:
            return NegativeSampler(ds.train, ds.num_train_entities, ds.num_relations, device)

        sampler = sampler_here() if run.graphs is None else run.graphs.shared(("sampler", device), sampler_here)
        triples = torch.as_tensor(ds.train, dtype=torch.long).to(device)
        return cls(run, wrap(run.model, ranks, device), optimizer, sampler, triples, cfg, ranks, device,
                   bf16_autocast(cfg, device), cfg.fanout_for(run.model_config.gnn_layers),
                   rows=isinstance(optimizer, RowAdam) and ranks.world == 1 and not cfg.sampled,
                   chunk=negative_chunk(run.model, cfg))


def train_step(learner: Learner, state: TrainState) -> torch.Tensor:
    """One optimisation step on the next global batch; returns this rank's share of the batch's mean loss, a 0-dim
    tensor left on the device: reading it here would be a host sync per step on CUDA (LossReadout reads a few
    steps' losses at once and sums the ranks' shares). Replayed from a CUDA graph where the learner has one.

    The full-graph path draws its batch and negatives where the run lives, from state.rng on that device, so a
    CUDA step queues its work without waiting on the card; the sampled path samples neighbourhoods on the CPU."""
    if learner.graphed is not None:
        return learner.graphed.step(learner, state)
    return eager_step(learner, state)


def eager_step(learner: Learner, state: TrainState) -> torch.Tensor:
    """train_step without a graph: the batch from the epoch's order, then step_on_batch."""
    ids = state.next_rows(len(learner.triples), learner.cfg.batch_size)
    loss = step_on_batch(learner, state, learner.triples[ids])  # the global batch: the same rows on every rank
    state.step += 1
    return loss


def step_on_batch(learner: Learner, state: TrainState, batch: torch.Tensor) -> torch.Tensor:
    """The forward, backward and optimizer step on `batch` (B, 3); leaves state.step to the caller."""
    cfg, ranks, run = learner.cfg, learner.ranks, learner.run
    rows, share = ranks.shard(len(batch))
    # A graphed step must not cache its casts: the capture would keep the warm-up's cast weights (torch's rule).
    with torch.autocast(learner.device.type, dtype=torch.bfloat16, enabled=learner.autocast,
                        cache_enabled=learner.graphed is None):
        if cfg.sampled:
            rng = np.random.default_rng([cfg.seed, state.step, ranks.rank])
            loss, encoded = sampled_loss(learner.net, run, learner.sampler, batch, rows, cfg, learner.fanout,
                                          state.rng, rng)
            state.history.encoded.append(encoded)
        else:
            neg = learner.sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], cfg.negatives, state.rng,
                                         chunk=learner.chunk)
            ignore = None if neg.known is None else (neg.known[0][rows], neg.known[1][rows])
            if learner.rows:  # one rank: the batch's own rows, renumbered
                entities, relations, batch, neg_heads, neg_tails = gather_rows(run.model, batch, neg.heads, neg.tails,
                                                                               shared=neg.shared)
            else:
                (entities, relations), neg_heads, neg_tails = learner.net(run.graph), neg.heads, neg.tails
            loss = loss_fn(run.scorer, entities.float(), relations.float(), batch[rows], neg_heads[rows],
                           neg_tails[rows], cfg.adversarial_temperature, ignore=ignore)
    # DDP averages gradients over ranks: weigh each rank's mean by its share of the global batch.
    scaled = loss if ranks.world == 1 else loss * (share * ranks.world)
    learner.optimizer.zero_grad(set_to_none=True)
    scaled.backward()
    learner.optimizer.step()
    return loss.detach() if ranks.world == 1 else loss.detach() * share


def validate(learner: Learner, state: TrainState, checkpoints: Checkpointer, *, start: float) -> bool:
    """Validate the current weights and log their MRR; keep them in best.pt if they are the best so far."""
    cfg = learner.cfg
    mrr = learner.run.evaluate("valid", batch_size=cfg.eval_batch_size, limit=cfg.eval_max_triples)["mrr"]
    best = state.record_validation(mrr, time.perf_counter() - start)
    if best:
        checkpoints.save_best()
    return best


class Progress:
    """Rank 0's report of each step: the progress bar (TrainConfig.progress) and the caller's callback.

    Steps are reported when their losses are read (every step on a CPU, every few on a GPU), in step order."""

    def __init__(self, cfg: TrainConfig, initial: int, callback: ProgressCallback | None, *, enabled: bool) -> None:
        self.total = cfg.steps
        self.bar = _progress_bar(cfg, initial) if enabled else None
        self.callback = callback if enabled else None

    def update(self, state: TrainState, records: Sequence[StepRecord]) -> None:
        """Report `records`, just read; the last is the current step (its elapsed time counts its validation)."""
        if not records:
            return
        mrr = state.history.last_mrr
        if self.bar is not None:
            self.bar.update(len(records))
            self.bar.set_postfix(loss=f"{records[-1].loss:.4f}", mrr="-" if mrr is None else f"{mrr:.4f}")
        if self.callback is None:
            return
        for record in records:
            last = record is records[-1]
            self.callback({"step": record.step, "total": self.total, "loss": record.loss,
                           "elapsed": state.elapsed if last else record.since_start,
                           "valid_mrr": mrr if last else _mrr_at(state, record.step)})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(
    dataset: Dataset, model_config: ModelConfig, train_config: TrainConfig, out_dir: str | os.PathLike, *,
    resume: bool = False, final_eval: bool = True, protocol: str = "seen", on_progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None, write_bundle: bool = True, command: Sequence[str] | None = None,
    recipe: str | None = None, graphs: GraphCache | None = None, curves: bool = True,
) -> dict[str, Any]:
    """Train, keep the best checkpoint by valid MRR, evaluate it, write metrics.json; returns the metrics.

    metrics.json (and the bundle's copy) records the run's provenance: versions, git commit, each split's sha256
    and `command` (default: this process's command line), and `recipe`: the name of the recipe the caller
    resolved the configs with (earl_service/config/recipes.py; None: the configs as given).

    Under an initialised torch.distributed process group of several ranks (`earl train --nproc-per-node`),
    every rank calls this: each takes its slice of every global batch, DDP all-reduces the gradients, and rank 0
    alone validates, decides when to stop and writes the run directory (the other ranks return a short dict).

    `graphs`: a cache of this dataset's built graphs to take the training graph from, so that callers training
    many models of one graph (compress's candidates and rungs) build it once; `curves=False` skips curves.png.
    """
    out, cfg = Path(out_dir), train_config
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    ranks = Ranks.current(device)
    check_sampled(cfg, model_config)
    run, memory = _build(dataset, model_config, cfg, device, graphs)
    cfg = table_config(run.model, cfg)  # fewer negatives on a big RotatE table, as the recipe asks
    optimizer = build_optimizer(run.model, cfg)
    state = TrainState.start(cfg.seed, device)
    checkpoints = Checkpointer(out, run.model, optimizer, state, writes=ranks.is_main,
                               configs={"model_config": model_config.to_dict(), "train_config": cfg.to_dict(),
                                        "vocab": dataset.vocab_signature()})
    if resume and checkpoints.can_resume():
        checkpoints.restore()
        log.info("resumed from step %d", state.step)
    learner = Learner.build(run, optimizer, cfg, ranks=ranks, device=device)
    learner.graphed = GraphedStep.build(learner, eager_step, step_on_batch)
    if state.best_mrr < 0 and not checkpoints.has_best():
        checkpoints.save_best()  # best.pt exists however the run ends
    available, memory.kernel_load_seconds = kernels.load_timed()  # before the clock starts; the steps' distance path
    peak_reset = memory.restart_peak()  # from here on the peak is the training steps' own
    stop = StopRules.for_run(cfg, ranks, should_stop, has_valid=dataset.valid is not None and len(dataset.valid) > 0)
    start, began = time.perf_counter() - state.elapsed, time.time()
    _loop(learner, state, stop, checkpoints, Progress(cfg, state.step, on_progress, enabled=ranks.is_main), start)
    steps_wall = (began, time.time())  # the loop ends on a loss read: on a GPU, after the card's last step
    memory.train_peak_rss_mb = peak_rss_mb() if peak_reset else None
    # A run that ends between validations (a time limit, a step count off the cadence) would otherwise lose
    # every step since the last one. Validated outside the budget; off the cadence, so it counts for no patience.
    if ranks.is_main and stop.eval_every and state.unvalidated and state.stopped != "cancelled":
        validate(learner, state, checkpoints, start=start)
    checkpoints.save()
    if not ranks.is_main:
        return {"rank": ranks.rank, "world_size": ranks.world, "steps": state.step, "stopped": state.stopped}
    metrics = _final_metrics(learner, state, checkpoints, memory=memory, extension="cpp" if available else "torch",
                             protocol=protocol, final_eval=final_eval, command=command)
    metrics["recipe"], metrics["steps_wall_clock"] = recipe, steps_wall  # Unix seconds (bench/cuda_check.py)
    bundle = run_bundle(run, metrics) if write_bundle else None
    write_run_outputs(out, metrics, state.history, bundle=bundle, curves=curves)
    return metrics


def _build(dataset: Dataset, model_config: ModelConfig, cfg: TrainConfig, device: torch.device,
           graphs: GraphCache | None = None) -> tuple[Run, MemoryUse]:
    """The run (graph or neighbour index, and the model) and the time and memory its build took."""
    torch.manual_seed(cfg.seed)  # the model's initial weights
    build_start = time.perf_counter()
    run = Run.build(dataset, model_config, device, sampled=cfg.sampled, graphs=graphs)
    return run, MemoryUse.after_build(time.perf_counter() - build_start, run.index.nbytes() if run.index else None)


def _loop(
    learner: Learner, state: TrainState, stop: StopRules, checkpoints: Checkpointer, progress: Progress, start: float,
) -> None:
    """Step until the step count or a stop rule ends the run; validate and checkpoint on their cadences.

    The losses stay on the device until a read (LossReadout): on its cadence, and before a validation or a
    checkpoint, so that neither runs on weights a non-finite loss spoiled and every checkpoint's history is
    whole. Reads fall on step counts alone, the same on every rank (a read is collective)."""
    cfg = learner.cfg
    losses = LossReadout(read_every(learner.device), learner.ranks)
    learner.run.model.train()
    while state.step < cfg.steps:
        clock = time.perf_counter() - start
        if (reason := stop.before_step(clock)) is not None:
            state.stopped = reason
            if reason == "time_limit":  # the clock ran on since the last step (a checkpoint's write, a validation):
                state.elapsed = clock  # a resume goes on from the reading that stopped it, past the limit
            break
        # A time-based schedule reads the clock: rank 0's reading, so that DDP ranks keep identical weights.
        timed = cfg.time_limit_minutes and cfg.lr_schedule != "constant"
        clock = learner.ranks.main_value(time.perf_counter() - start) if timed else 0.0
        factor = set_lr(learner.optimizer, cfg, state.step, clock)
        t0 = time.perf_counter()
        loss = train_step(learner, state)
        now = time.perf_counter()
        losses.add(state.step, loss, seconds=now - t0, since_start=now - start, lr_factor=factor)
        evaluates, saves = _due(state.step, stop.eval_every), _due(state.step, cfg.checkpoint_every)
        records = losses.read() if losses.due or evaluates or saves else []
        state.record_steps(records)
        if learner.ranks.is_main and evaluates and not validate(learner, state, checkpoints, start=start):
            state.bad_evals += 1
        state.elapsed = time.perf_counter() - start
        progress.update(state, records)
        if saves:
            checkpoints.save()
        if (reason := stop.after_step(state.step, state.bad_evals)) is not None:
            state.stopped = reason
            break
    records = losses.read()
    state.record_steps(records)
    progress.update(state, records)
    progress.close()


def _mrr_at(state: TrainState, step: int) -> float | None:
    """The last valid MRR known at `step`."""
    history = state.history
    known = [mrr for at, mrr in zip(history.eval_steps, history.eval_mrr, strict=True) if at <= step]
    return known[-1] if known else None


def _final_metrics(
    learner: Learner, state: TrainState, checkpoints: Checkpointer, *, memory: MemoryUse, extension: str,
    protocol: str, final_eval: bool, command: Sequence[str] | None,
) -> dict[str, Any]:
    """metrics.json's content: the run's facts, then (with `final_eval`) the best weights' valid and test ranks."""
    run, cfg, history = learner.run, learner.cfg, state.history
    if not history.eval_mrr:  # never validated: the final weights are the best we know
        checkpoints.save_best()
    metrics: dict[str, Any] = {
        "version": __version__,
        "provenance": provenance(run.dataset.stats, command=command),
        "trainable_parameters": trainable_parameters(run.model),
        "entities": run.dataset.num_train_entities,
        "relations": run.dataset.num_relations,
        "train_triples": len(run.dataset.train),
        "steps": state.step,
        "stopped": state.stopped,
        "best_step": state.best_step,
        "median_step_seconds": (statistics.median(history.step_times[WARMUP_STEPS:])
                                if len(history.step_times) > WARMUP_STEPS else None),
        "train_seconds": state.elapsed,
        "median_encoded_entities": statistics.median(history.encoded) if history.encoded else None,
        "device": str(learner.device),
        "compute_used": "bf16" if learner.autocast else "fp32",  # what --compute auto chose on this machine
        "world_size": learner.ranks.world,
        "threads": torch.get_num_threads(),
        "extension": extension,
        "memory": asdict(memory),
        "config": {"model": run.model_config.to_dict(), "train": cfg.to_dict()},
    }
    checkpoints.load_best()
    if final_eval:
        for split in ("valid", "test"):
            if getattr(run.dataset, split) is not None and len(getattr(run.dataset, split)):
                metrics[split] = run.evaluate(split, protocol, batch_size=cfg.eval_batch_size)
    metrics["peak_rss_mb"] = max(peak_rss_mb(), memory.build_peak_rss_mb)
    return metrics


def run_bundle(run: Run, metrics: dict[str, Any] | None = None) -> Bundle:
    """The deployable bundle of the current (best) weights over the training entities, with the dataset's labels."""
    ds = run.dataset
    return bundle_from_model(run.model, run.model_config, ds.train_entities(), ds.relations, ds.train,
                             metrics=metrics, labels=ds.labels)


def _progress_bar(cfg: TrainConfig, initial: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=initial, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)


__all__ = ["BUNDLE", "CHECKPOINT", "WARMUP_STEPS", "Learner", "StopRules", "run_bundle", "train", "train_step"]
