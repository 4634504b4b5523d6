"""The training loop: negative sampling, self-adversarial loss, the steps, validation, early stopping, outputs."""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from earl_service.bundle.model_io import Bundle, bundle_from_model
from earl_service.config import ModelConfig, TrainConfig
from earl_service.core.known import KnownAnswers
from earl_service.data.dataset import Dataset, Vocab
from earl_service.errors import ConfigError, DatasetError, RunError
from earl_service.model.graph import Graph, build_graph, choose_reserved
from earl_service.model.kernels import extension_available, rotate_distance
from earl_service.model.modules import EARL, RotatE, build_model, trainable_parameters
from earl_service.provenance import provenance
from earl_service.train.checkpoint import CHECKPOINT, Checkpointer, load_best
from earl_service.train.distributed import Ranks, wrap
from earl_service.train.evaluate import rank_triples, summarize, summarize_per_relation
from earl_service.train.memory import MemoryUse, peak_rss_mb, reset_peak_rss
from earl_service.train.outputs import BUNDLE, write_run_outputs
from earl_service.train.sampling import NeighborIndex, embed_all
from earl_service.train.schedule import build_optimizer, set_lr
from earl_service.train.state import TrainState
from earl_service.version import __version__

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # first steps left out of median_step_seconds (allocator, caches and kernels warming up)

ProgressCallback = Callable[[dict[str, Any]], None]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


class NegativeSampler:
    """Uniform corruptions with replacement, resampled where they hit a known true answer from train."""

    def __init__(self, train: np.ndarray, num_entities: int, num_relations: int, device: torch.device):
        self.n, self.r = num_entities, num_relations
        h, r, t = (torch.as_tensor(train[:, i], dtype=torch.long) for i in range(3))
        self.tail_keys = torch.unique((h * num_relations + r) * num_entities + t).to(device)  # sorted
        self.head_keys = torch.unique((t * num_relations + r) * num_entities + h).to(device)
        self.device = device

    def _known(self, keys: torch.Tensor, query: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Whether (query, candidate) is a true pair; query and candidates broadcast together."""
        probe = query * self.n + candidates
        pos = torch.searchsorted(keys, probe).clamp(max=keys.numel() - 1)
        return keys[pos] == probe

    def known_masks(
        self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor, neg_heads: torch.Tensor, neg_tails: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) positives and (B, K) candidates -> (B, K) bool each: the candidate makes a known true triple."""
        return (self._known(self.head_keys, (t * self.r + r)[:, None], neg_heads),
                self._known(self.tail_keys, (h * self.r + r)[:, None], neg_tails))

    def sample(
        self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor, k: int, gen: torch.Generator, max_rounds: int = 20
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) positives -> (neg_heads (B, K), neg_tails (B, K)) entity ids."""
        out = []
        for keys, query in ((self.head_keys, t * self.r + r), (self.tail_keys, h * self.r + r)):
            cand = torch.randint(0, self.n, (h.numel(), k), generator=gen).to(self.device)
            flat = cand.view(-1)
            bad = self._known(keys, query[:, None], cand).view(-1).nonzero().squeeze(1)  # (M,) flat positions
            # Redraw only the hits, a few rounds (queries with thousands of true answers need more than one).
            for _ in range(max_rounds):
                if bad.numel() == 0:
                    break
                flat[bad] = torch.randint(0, self.n, (bad.numel(),), generator=gen).to(self.device)
                bad = bad[self._known(keys, query[bad // k], flat[bad])]
            out.append(cand)
        return out[0], out[1]


def loss_fn(
    scorer: RotatE, entities: torch.Tensor, relations: torch.Tensor, batch: torch.Tensor,
    neg_heads: torch.Tensor, neg_tails: torch.Tensor, adversarial_temperature: float,
    *, ignore: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Self-adversarial negative-sampling loss over both corruption sides.

    loss = -(mean_b log s(g - d_pos) + mean_{b,side} sum_j w_j log s(d_neg_j - g)) / 2, w = softmax(a (g - d_neg))
    detached, taken within each side's K negatives. `ignore` (head mask, tail mask), each (B, K) bool, drops
    negatives that are true triples (sampled training shares negatives, so they cannot be redrawn per row).
    """
    h, r, t = batch[:, 0], batch[:, 1], batch[:, 2]
    rel = relations[r]  # (B, d)
    # One gather for heads and tails: its backward is one scatter into an (N, 2d) zero buffer, not one per use.
    head, tail = entities[torch.cat([h, t])].chunk(2)  # (B, 2d) each
    head_rot = scorer.rotate(head, rel)  # h o r, (B, 2d)
    tail_rot = scorer.rotate(tail, rel, inverse=True)  # conj(r) o t, (B, 2d)
    pos = scorer.gamma - scorer.distance(head_rot, tail)  # (B,)
    # Tail corruptions compare h o r with t'; head corruptions compare h' with conj(r) o t (|r_i| = 1).
    query = torch.cat([head_rot, tail_rot])  # (2B, 2d)
    neg = scorer.gamma - rotate_distance(query, entities, torch.cat([neg_tails, neg_heads]))  # (2B, K)
    if ignore is None:
        weights = torch.softmax(adversarial_temperature * neg, dim=1).detach()
    else:
        skip = torch.cat([ignore[1], ignore[0]])  # (2B, K), ordered like `query`
        logits = (adversarial_temperature * neg).masked_fill(skip, float("-inf"))
        weights = torch.softmax(logits, dim=1).nan_to_num(0.0).detach()  # a row with nothing left adds 0
    neg_term = (weights * F.logsigmoid(-neg)).sum(1).mean()
    return -(F.logsigmoid(pos).mean() + neg_term) / 2


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); False where unknown.

    Not torch.ops.mkldnn._is_mkldnn_bf16_supported(): that holds on any AVX-512 CPU (Skylake-X, Cascade Lake,
    Ice Lake), where oneDNN emulates bfloat16 several times slower than float32.
    """
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    try:
        return any(bool(check()) for check in checks if check is not None)
    except RuntimeError:
        return False


@dataclass
class Run:
    """Everything built once for a dataset and model config.

    Full-graph training holds the training `graph`; sampled training holds a `NeighborIndex` instead (and
    evaluates with exact layer-wise inference over it, never materialising the full-graph encoder).
    """

    dataset: Dataset
    model_config: ModelConfig
    graph: Graph | None  # training graph over the training entities (None for sampled training)
    model: torch.nn.Module
    scorer: RotatE
    known: KnownAnswers | None = None  # every true triple, for filtered ranking; built on first evaluation
    index: NeighborIndex | None = None  # sampled training: neighbourhoods and encoder inputs of every entity

    @classmethod
    def build(cls, dataset: Dataset, model_config: ModelConfig, device: torch.device, *, sampled: bool = False) -> Run:
        n, num_rel = dataset.num_train_entities, dataset.num_relations
        reserved = (
            choose_reserved(n, model_config.reserved_ratio, model_config.seed)
            if model_config.model == "earl" and model_config.uses_reserved
            else torch.zeros(0, dtype=torch.long)
        )
        model = build_model(model_config, n, num_rel, reserved).to(device)
        cfg = model_config
        if sampled:
            index = NeighborIndex(dataset.train, n, num_rel, reserved, k=cfg.k, temperature=cfg.knn_temperature)
            return cls(dataset, model_config, None, model, RotatE(model_config), index=index)
        graph = build_graph(dataset.train, n, num_rel, reserved, **cfg.graph_options)
        return cls(dataset, model_config, graph.to(device), model, RotatE(model_config))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _reserved(self) -> torch.Tensor:
        graph_or_index = self.graph if self.graph is not None else self.index
        assert graph_or_index is not None
        return graph_or_index.reserved.cpu()

    def graph_for(self, protocol: str) -> Graph:
        """`seen`: the training graph. `all`: the same graph plus valid/test-only entities as isolated nodes."""
        if self.graph is not None and (protocol == "seen" or self.dataset.num_entities == self.dataset.num_train_entities):
            return self.graph
        n = self.dataset.num_train_entities if protocol == "seen" else self.dataset.num_entities
        g = build_graph(self.dataset.train, n, self.dataset.num_relations, self._reserved(),
                        **self.model_config.graph_options)
        return g.to(self.device)

    def index_for(self, protocol: str) -> NeighborIndex:
        assert self.index is not None
        if protocol == "seen" or self.dataset.num_entities == self.dataset.num_train_entities:
            return self.index
        cfg = self.model_config
        return NeighborIndex(self.dataset.train, self.dataset.num_entities, self.dataset.num_relations,
                             self._reserved(), k=cfg.k, temperature=cfg.knn_temperature)

    @torch.no_grad()
    def embed(self, protocol: str = "seen") -> tuple[torch.Tensor, torch.Tensor]:
        """Every entity's embedding (N, 2d) and the relations' (R, d) under `protocol`."""
        if self.index is not None and isinstance(self.model, EARL):
            return embed_all(self.model, self.index_for(protocol))
        return self.model(self.graph_for(protocol))

    @torch.no_grad()
    def ranked_triples(self, split: str, protocol: str = "seen", *, limit: int = 0) -> np.ndarray:
        """The triples `evaluate` ranks: `split`'s (under "seen", those whose entities training saw), or a fixed
        random subset of `limit` of them (0: all)."""
        triples = self.dataset.split(split)
        if protocol == "seen":
            triples = triples[self.dataset.seen_mask(triples)]
        elif protocol != "all":
            raise ConfigError(f"protocol must be 'seen' or 'all', not {protocol!r}")
        if limit and len(triples) > limit:
            triples = triples[np.random.default_rng(0).choice(len(triples), limit, replace=False)]
        return triples

    def evaluate(self, split: str, protocol: str = "seen", *, batch_size: int = 256, limit: int = 0,
                 per_relation: bool = False) -> dict:
        """Filtered metrics of `split` (both directions pooled, then "tail" and "head"); with `per_relation` also
        "per_relation": {relation name: metrics of its triples}."""
        triples = self.ranked_triples(split, protocol, limit=limit)
        if self.known is None:
            self.known = KnownAnswers(_all_triples(self.dataset), self.dataset.num_relations)
        self.model.eval()
        entities, relations = self.embed(protocol)
        ranks = rank_triples(entities.float(), relations.float(), self.scorer, triples, self.known,
                             batch_size=batch_size)
        self.model.train()
        result = summarize(ranks)
        out = {**result["both"], "protocol": protocol, "split": split, "tail": result["tail"], "head": result["head"]}
        if per_relation:
            out["per_relation"] = summarize_per_relation(ranks, triples[:, 1], self.dataset.relations.names)
        return out


def _all_triples(dataset: Dataset) -> np.ndarray:
    parts = [dataset.train] + [x for x in (dataset.valid, dataset.test) if x is not None]
    return np.concatenate(parts)


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
    triples: torch.Tensor  # (T, 3) the training triples, on the CPU
    cfg: TrainConfig
    ranks: Ranks
    device: torch.device
    autocast: bool  # bfloat16 autocast of the encoder's dense maps (TrainConfig.compute)
    fanout: list[int | None]  # sampled training: edges drawn per entity at each layer

    @classmethod
    def build(
        cls, run: Run, optimizer: torch.optim.Optimizer, cfg: TrainConfig, *, ranks: Ranks, device: torch.device,
    ) -> Learner:
        """Wraps the model in DDP over several ranks (it broadcasts rank 0's weights once): after a resume."""
        ds = run.dataset
        sampler = NegativeSampler(ds.train, ds.num_train_entities, ds.num_relations, device)
        return cls(run, wrap(run.model, ranks, device), optimizer, sampler, torch.as_tensor(ds.train, dtype=torch.long),
                   cfg, ranks, device, _bf16_autocast(cfg, device), cfg.fanout_for(run.model_config.gnn_layers))


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 natively: AVX512-BF16 or AMX on a CPU, a bf16-capable CUDA GPU."""
    if device.type == "cuda":
        with torch.cuda.device(device):  # the chosen GPU, not the current one
            return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and cpu_has_native_bf16()


def _bf16_autocast(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the steps autocast to bfloat16 (`--compute`); says why in the log when it is not plain fp32."""
    native = native_bf16(device)
    if cfg.compute == "auto":
        log.info("--compute auto: %s on this %s", "bf16 (native)" if native else "fp32 (no native bf16)", device.type)
        return native
    if cfg.compute == "bf16" and not native:
        log.warning("--compute bf16: this %s has no native bfloat16 matmul (CPU: no AVX512-BF16 / AMX); autocast "
                    "emulates it and is several times slower than float32 here (bench/results/speed.md)", device.type)
    return cfg.compute == "bf16"


def train_step(learner: Learner, state: TrainState) -> float:
    """One optimisation step on the next global batch; returns the batch's mean loss over all ranks."""
    cfg, ranks, run = learner.cfg, learner.ranks, learner.run
    ids = state.next_rows(len(learner.triples), cfg.batch_size)
    batch = learner.triples[ids].to(learner.device)  # the global batch: the same rows on every rank
    rows, share = ranks.shard(len(batch))
    with torch.autocast(learner.device.type, dtype=torch.bfloat16, enabled=learner.autocast):
        if cfg.sampled:
            rng = np.random.default_rng([cfg.seed, state.step, ranks.rank])
            loss, encoded = _sampled_loss(learner.net, run, learner.sampler, batch, rows, cfg, learner.fanout,
                                          state.rng, rng)
            state.history.encoded.append(encoded)
        else:
            neg_heads, neg_tails = learner.sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], cfg.negatives,
                                                          state.rng)
            entities, relations = learner.net(run.graph)
            loss = loss_fn(run.scorer, entities.float(), relations.float(), batch[rows], neg_heads[rows],
                           neg_tails[rows], cfg.adversarial_temperature)
    # DDP averages gradients over ranks: weigh each rank's mean by its share of the global batch.
    scaled = loss if ranks.world == 1 else loss * (share * ranks.world)
    learner.optimizer.zero_grad(set_to_none=True)
    scaled.backward()
    learner.optimizer.step()
    state.step += 1
    loss_value = float(loss.detach()) if ranks.world == 1 else ranks.sum(loss.detach() * share)
    if not math.isfinite(loss_value):
        raise FloatingPointError(f"loss became {loss_value} at step {state.step}; lower the learning rate")
    return loss_value


def validate(learner: Learner, state: TrainState, checkpoints: Checkpointer, *, start: float) -> bool:
    """Validate the current weights and log their MRR; keep them in best.pt if they are the best so far."""
    cfg = learner.cfg
    mrr = learner.run.evaluate("valid", batch_size=cfg.eval_batch_size, limit=cfg.eval_max_triples)["mrr"]
    best = state.record_validation(mrr, time.perf_counter() - start)
    if best:
        checkpoints.save_best()
    return best


class Progress:
    """Rank 0's report of each step: the progress bar (TrainConfig.progress) and the caller's callback."""

    def __init__(self, cfg: TrainConfig, initial: int, callback: ProgressCallback | None, *, enabled: bool) -> None:
        self.total = cfg.steps
        self.bar = _progress_bar(cfg, initial) if enabled else None
        self.callback = callback if enabled else None

    def update(self, state: TrainState, loss: float) -> None:
        mrr = state.history.last_mrr
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", mrr="-" if mrr is None else f"{mrr:.4f}")
        if self.callback is not None:
            self.callback({"step": state.step, "total": self.total, "loss": loss, "elapsed": state.elapsed,
                           "valid_mrr": mrr})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(
    dataset: Dataset, model_config: ModelConfig, train_config: TrainConfig, out_dir: str | os.PathLike, *,
    resume: bool = False, final_eval: bool = True, protocol: str = "seen", on_progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None, write_bundle: bool = True, command: Sequence[str] | None = None,
    recipe: str | None = None,
) -> dict[str, Any]:
    """Train, keep the best checkpoint by valid MRR, evaluate it, write metrics.json; returns the metrics.

    metrics.json (and the bundle's copy) records the run's provenance: versions, git commit, each split's sha256
    and `command` (default: this process's command line), and `recipe`: the name of the recipe the caller
    resolved the configs with (earl_service/config/recipes.py; None: the configs as given).

    Under an initialised torch.distributed process group of several ranks (`earl train --nproc-per-node`),
    every rank calls this: each takes its slice of every global batch, DDP all-reduces the gradients, and rank 0
    alone validates, decides when to stop and writes the run directory (the other ranks return a short dict).
    """
    out, cfg = Path(out_dir), train_config
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    ranks = Ranks.current(device)
    _check_sampled(cfg, model_config)
    run, memory = _build(dataset, model_config, cfg, device)
    optimizer = build_optimizer(run.model, cfg)
    state = TrainState.start(cfg.seed)
    checkpoints = Checkpointer(out, run.model, optimizer, state, writes=ranks.is_main,
                               configs={"model_config": model_config.to_dict(), "train_config": cfg.to_dict(),
                                        "vocab": dataset.vocab_signature()})
    if resume and checkpoints.can_resume():
        checkpoints.restore()
        log.info("resumed from step %d", state.step)
    learner = Learner.build(run, optimizer, cfg, ranks=ranks, device=device)
    if state.best_mrr < 0 and not checkpoints.has_best():
        checkpoints.save_best()  # best.pt exists however the run ends
    extension = _load_kernel(memory)
    peak_reset = reset_peak_rss()  # from here on the peak is the training steps' own
    stop = StopRules.for_run(cfg, ranks, should_stop, has_valid=dataset.valid is not None and len(dataset.valid) > 0)
    start = time.perf_counter() - state.elapsed
    _loop(learner, state, stop, checkpoints, Progress(cfg, state.step, on_progress, enabled=ranks.is_main), start)
    memory.train_peak_rss_mb = peak_rss_mb() if peak_reset else None
    # A run that ends between validations (a time limit, a step count off the cadence) would otherwise lose
    # every step since the last one. Validated outside the budget; off the cadence, so it counts for no patience.
    if ranks.is_main and stop.eval_every and state.unvalidated and state.stopped != "cancelled":
        validate(learner, state, checkpoints, start=start)
    checkpoints.save()
    if not ranks.is_main:
        return {"rank": ranks.rank, "world_size": ranks.world, "steps": state.step, "stopped": state.stopped}
    metrics = _final_metrics(learner, state, checkpoints, memory=memory, extension=extension, protocol=protocol,
                             final_eval=final_eval, command=command)
    metrics["recipe"] = recipe
    bundle = _bundle(run, metrics) if write_bundle else None
    write_run_outputs(out, metrics, state.history, bundle=bundle)
    return metrics


def _build(dataset: Dataset, model_config: ModelConfig, cfg: TrainConfig, device: torch.device) -> tuple[Run, MemoryUse]:
    """The run (graph or neighbour index, and the model) and the time and memory its build took."""
    torch.manual_seed(cfg.seed)  # the model's initial weights
    build_start = time.perf_counter()
    run = Run.build(dataset, model_config, device, sampled=cfg.sampled)
    return run, MemoryUse.after_build(time.perf_counter() - build_start, run.index.nbytes() if run.index else None)


def _loop(
    learner: Learner, state: TrainState, stop: StopRules, checkpoints: Checkpointer, progress: Progress, start: float,
) -> None:
    """Step until the step count or a stop rule ends the run; validate and checkpoint on their cadences."""
    cfg = learner.cfg
    learner.run.model.train()
    while state.step < cfg.steps:
        if (reason := stop.before_step(time.perf_counter() - start)) is not None:
            state.stopped = reason
            break
        # A time-based schedule reads the clock: rank 0's reading, so that DDP ranks keep identical weights.
        timed = cfg.time_limit_minutes and cfg.lr_schedule != "constant"
        clock = learner.ranks.main_value(time.perf_counter() - start) if timed else 0.0
        factor = set_lr(learner.optimizer, cfg, state.step, clock)
        t0 = time.perf_counter()
        loss = train_step(learner, state)
        state.record_step(loss, time.perf_counter() - t0, time.perf_counter() - start, lr_factor=factor)
        validates = learner.ranks.is_main and _due(state.step, stop.eval_every)
        if validates and not validate(learner, state, checkpoints, start=start):
            state.bad_evals += 1
        state.elapsed = time.perf_counter() - start
        progress.update(state, loss)
        if _due(state.step, cfg.checkpoint_every):
            checkpoints.save()
        if (reason := stop.after_step(state.step, state.bad_evals)) is not None:
            state.stopped = reason
            break
    progress.close()


def _load_kernel(memory: MemoryUse) -> str:
    """Build or load the fused CPU kernel before the clock starts (a first build takes a while; see README),
    so that a time budget is spent on steps. Returns which distance path the steps use: "cpp" or "torch"."""
    kernel_start = time.perf_counter()
    extension = "cpp" if extension_available() else "torch"
    memory.kernel_load_seconds = time.perf_counter() - kernel_start
    return extension


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


def _bundle(run: Run, metrics: dict[str, Any]) -> Bundle:
    """The deployable bundle of the current (best) weights over the training entities, with the dataset's labels."""
    ds = run.dataset
    return bundle_from_model(run.model, run.model_config, Vocab(ds.entities.names[: ds.num_train_entities]),
                             ds.relations, ds.train, metrics=metrics, labels=ds.labels)


def _check_sampled(cfg: TrainConfig, model_config: ModelConfig) -> None:
    if not cfg.sampled:
        return
    if model_config.model != "earl":
        raise ConfigError("sampled training is for the EARL encoder; RotatE has no graph encoding to sample")
    if model_config.no_conrel_knn:
        raise ConfigError("sampled training needs ConRel or kNResEnt inputs; --no-conrel-knn draws one random "
                          "input row per entity of the whole graph")


def _sampled_loss(
    net: torch.nn.Module, run: Run, sampler: NegativeSampler, batch: torch.Tensor, rows: slice, cfg: TrainConfig,
    fanout: list[int | None], gen: torch.Generator, rng: np.random.Generator,
) -> tuple[torch.Tensor, int]:
    """This rank's rows of the global batch, encoded through sampled neighbourhoods: the mean loss over them
    and the number of entities encoded.

    Each chunk of `negative_chunk` consecutive positives shares K head and K tail corruptions (drawn for the
    whole global batch from `gen`, so every rank and a single process see the same ones). The entities to
    encode are then the rows' heads and tails plus 2K per chunk, whatever the size of the graph.
    """
    assert run.index is not None
    device = batch.device
    size, k = len(batch), cfg.negatives
    chunk = cfg.negative_chunk or size
    chunks = -(-size // chunk)
    negatives = torch.randint(0, run.index.num_entities, (2, chunks, k), generator=gen)  # heads, tails
    mine = batch[rows].cpu()  # (b, 3)
    b = len(mine)
    row_chunk = torch.arange(rows.start, rows.start + b) // chunk  # (b,) global chunk of each row
    first = int(row_chunk[0])
    used = negatives[:, first : int(row_chunk[-1]) + 1]  # (2, c, K) the chunks these rows touch
    seeds, local = torch.unique(torch.cat([mine[:, 0], mine[:, 2], used.reshape(-1)]), return_inverse=True)
    sub = run.index.sample(seeds.numpy(), fanout, rng).to(device)
    local_batch = torch.stack([local[:b], mine[:, 1], local[b : 2 * b]], 1).to(device)  # (b, 3) local entity ids
    local_neg = local[2 * b :].reshape(used.shape)[:, row_chunk - first].to(device)  # (2, b, K)
    global_neg = used[:, row_chunk - first].to(device)  # (2, b, K)
    h, r, t = (mine[:, i].to(device) for i in range(3))
    ignore = sampler.known_masks(h, r, t, global_neg[0], global_neg[1])  # shared negatives that are true triples
    entities, relations = net(sub.inputs, sub.layers)  # (n_seeds, 2d), (R, d)
    loss = loss_fn(run.scorer, entities.float(), relations.float(), local_batch, local_neg[0], local_neg[1],
                   cfg.adversarial_temperature, ignore=ignore)
    return loss, sub.nodes.numel()


def _progress_bar(cfg: TrainConfig, initial: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=initial, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)


def load_run(run_dir: str | os.PathLike, dataset: Dataset, *, device: str = "auto") -> Run:
    """Rebuild a trained run (config from its checkpoint, weights from best.pt) over `dataset`."""
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT).exists():
        raise RunError(f"{run_dir} holds no {CHECKPOINT}: is it a run directory written by `earl train`?")
    dev = resolve_device(device)
    ckpt = torch.load(run_dir / CHECKPOINT, map_location="cpu", weights_only=True)
    _check_vocab(run_dir, ckpt.get("vocab"), dataset)
    sampled = bool(ckpt.get("train_config", {}).get("sampled", False))  # evaluate a big graph layer by layer too
    run = Run.build(dataset, ModelConfig.from_dict(ckpt["model_config"]), dev, sampled=sampled)
    try:
        load_best(run_dir, run.model)
    except RuntimeError as exc:  # a run from before checkpoints kept the vocabulary: shapes are all it can tell
        if "size mismatch" not in str(exc):
            raise
        raise DatasetError(f"this data does not match the run in {run_dir}: its model was trained on other "
                           f"entities or relations (this data: {dataset.num_train_entities:,} training entities, "
                           f"{dataset.num_relations:,} relations); evaluate against the data it was trained on"
                           ) from None
    return run


def _check_vocab(run_dir: Path, trained: dict[str, Any] | None, dataset: Dataset) -> None:
    """DatasetError unless ``dataset``'s training entities and relations are the run's, in the same order."""
    given = dataset.vocab_signature()
    if trained is None or trained == given:
        return
    counts = (f"the run was trained on {trained['entities']:,} entities and {trained['relations']:,} relations, "
              f"this data has {given['entities']:,} training entities and {given['relations']:,} relations")
    if (trained["entities"], trained["relations"]) == (given["entities"], given["relations"]):
        counts = "the counts agree but the names (or their order) differ"
    raise DatasetError(f"this data does not match the run in {run_dir}: {counts}; evaluate against the data it "
                       "was trained on (the same train file)")


__all__ = [
    "BUNDLE", "CHECKPOINT", "WARMUP_STEPS", "NegativeSampler", "Run", "StopRules", "cpu_has_native_bf16", "load_run",
    "loss_fn", "native_bf16", "resolve_device", "train", "train_step",
]
