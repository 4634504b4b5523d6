"""The training loop: negative sampling, self-adversarial loss, validation, early stopping, checkpoints, metrics."""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from . import __version__
from .bundle import bundle_from_model
from .config import ModelConfig, TrainConfig
from .data import Dataset, Vocab
from .distributed import Ranks, wrap
from .evaluate import KnownAnswers, rank_triples, summarize
from .graph import Graph, build_graph, choose_reserved
from .kernels import rotate_distance
from .model import RotatE, build_model, trainable_parameters
from .sampling import NeighborIndex, embed_all

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"  # last state, for --resume
BEST = "best.pt"  # best weights by valid MRR
METRICS = "metrics.json"
BUNDLE = "bundle.safetensors"  # the deployable artifact (fp32)
WARMUP_STEPS = 3  # first steps left out of median_step_seconds (allocator, caches and kernels warming up)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def current_rss_mb() -> float | None:
    """Resident memory now (Linux /proc; None elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def reset_peak_rss() -> bool:
    """Restart the peak-RSS count from the current RSS (Linux >= 4.0), so that the training steps' peak can
    be told apart from the graph build's. False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


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
    head_rot = scorer.rotate(entities[h], rel)  # h o r, (B, 2d)
    tail_rot = scorer.rotate(entities[t], rel, inverse=True)  # conj(r) o t, (B, 2d)
    pos = scorer.gamma - scorer.distance(head_rot, entities[t])  # (B,)
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
    """Whether oneDNN runs bfloat16 matmuls natively on this CPU (AVX512-BF16 or AMX); False where unknown."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # wall-clock since start at each logged step
    step_times: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_seconds: list[float] = field(default_factory=list)
    eval_mrr: list[float] = field(default_factory=list)
    encoded: list[int] = field(default_factory=list)  # sampled training: entities encoded per step (this rank)


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
        if self.index is not None and self.model_config.model == "earl":
            return embed_all(self.model, self.index_for(protocol))
        return self.model(self.graph_for(protocol))

    @torch.no_grad()
    def evaluate(self, split: str, protocol: str = "seen", *, batch_size: int = 256, limit: int = 0) -> dict:
        triples = self.dataset.split(split)
        if protocol == "seen":
            triples = triples[self.dataset.seen_mask(triples)]
        elif protocol != "all":
            raise ValueError(f"protocol must be 'seen' or 'all', not {protocol!r}")
        if limit and len(triples) > limit:
            triples = triples[np.random.default_rng(0).choice(len(triples), limit, replace=False)]
        if self.known is None:
            self.known = KnownAnswers(_all_triples(self.dataset), self.dataset.num_relations)
        self.model.eval()
        entities, relations = self.embed(protocol)
        result = summarize(rank_triples(entities.float(), relations.float(), self.scorer, triples, self.known,
                                        batch_size=batch_size))
        self.model.train()
        return {**result["both"], "protocol": protocol, "split": split, "tail": result["tail"], "head": result["head"]}


def _all_triples(dataset: Dataset) -> np.ndarray:
    parts = [dataset.train] + [x for x in (dataset.valid, dataset.test) if x is not None]
    return np.concatenate(parts)


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


ProgressCallback = Callable[[dict[str, Any]], None]


def train(
    dataset: Dataset,
    model_config: ModelConfig,
    train_config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    final_eval: bool = True,
    protocol: str = "seen",
    on_progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    relation_labels: dict[str, str] | None = None,
    write_bundle: bool = True,
) -> dict[str, Any]:
    """Train, keep the best checkpoint by valid MRR, evaluate it, write metrics.json; returns the metrics.

    Under an initialised torch.distributed process group of several ranks (`earl train --nproc-per-node`),
    every rank calls this: each takes its slice of every global batch, DDP all-reduces the gradients, and rank 0
    alone validates, decides when to stop and writes the run directory (the other ranks return a short dict).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = train_config
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    ranks = Ranks.current(device)
    _check_sampled(cfg, model_config)
    torch.manual_seed(cfg.seed)
    build_start = time.perf_counter()
    run = Run.build(dataset, model_config, device, sampled=cfg.sampled)
    model = run.model
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sampler = NegativeSampler(dataset.train, dataset.num_train_entities, dataset.num_relations, device)
    memory = {"graph_build_seconds": time.perf_counter() - build_start, "build_peak_rss_mb": peak_rss_mb(),
              "after_build_rss_mb": current_rss_mb(), "index_mb": run.index.nbytes() / 2**20 if run.index else None}
    gen = torch.Generator().manual_seed(cfg.seed)
    train_ids = torch.as_tensor(dataset.train, dtype=torch.long)
    has_valid = dataset.valid is not None and len(dataset.valid) > 0
    state: dict[str, Any] = {"step": 0, "epoch_order": None, "epoch_pos": 0, "best_mrr": -1.0, "best_step": 0,
                             "bad_evals": 0, "elapsed": 0.0, "stopped": "steps"}
    history = History()
    if resume and (out / CHECKPOINT).exists():
        ckpt = torch.load(out / CHECKPOINT, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["generator"])
        torch.set_rng_state(ckpt["torch_rng"])
        state = {**ckpt["state"], "stopped": "steps"}  # why the previous attempt stopped is not this run's
        history = History(**ckpt["history"])
        log.info("resumed from step %d", state["step"])
    net = wrap(model, ranks, device)  # DDP over several ranks; it broadcasts rank 0's weights once

    def save_checkpoint() -> None:
        if ranks.is_main:
            _atomic_torch_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "generator": gen.get_state(), "torch_rng": torch.get_rng_state(),
                                "state": state, "history": history.__dict__, "model_config": model_config.to_dict(),
                                "train_config": cfg.to_dict()}, out / CHECKPOINT)

    def next_batch() -> torch.Tensor:
        if state["epoch_order"] is None or state["epoch_pos"] >= len(train_ids):
            state["epoch_order"] = torch.randperm(len(train_ids), generator=gen)
            state["epoch_pos"] = 0
        ids = state["epoch_order"][state["epoch_pos"] : state["epoch_pos"] + cfg.batch_size]
        state["epoch_pos"] += cfg.batch_size
        return train_ids[ids].to(device)

    if ranks.is_main and state["best_mrr"] < 0 and not (out / BEST).exists():
        _atomic_torch_save(model.state_dict(), out / BEST)
    autocast = cfg.bf16 and device.type == "cpu"
    if autocast and not cpu_has_native_bf16():
        log.warning("--bf16: this CPU has no native bfloat16 matmul (no AVX512-BF16 / AMX); autocast emulates it and "
                    "is several times slower than float32 here (bench/results/speed.md)")
    fanout = cfg.fanout_for(model_config.gnn_layers)
    progress = _progress_bar(cfg, state["step"]) if ranks.is_main else None
    # Build or load the fused CPU kernel now (a first build takes ~45 s), so that a time budget is spent on steps.
    kernel_start = time.perf_counter()
    extension = _extension_state()
    memory["kernel_load_seconds"] = time.perf_counter() - kernel_start
    peak_reset = reset_peak_rss()  # from here on the peak is the training steps' own
    start = time.perf_counter() - state["elapsed"]

    def validate(step: int) -> bool:
        """Validate the current weights, log them, keep them as the best if they are; True if they were."""
        mrr = run.evaluate("valid", batch_size=cfg.eval_batch_size, limit=cfg.eval_max_triples)["mrr"]
        history.eval_steps.append(step)
        history.eval_seconds.append(time.perf_counter() - start)
        history.eval_mrr.append(mrr)
        if mrr <= state["best_mrr"]:
            return False
        state.update(best_mrr=mrr, best_step=step, bad_evals=0)
        _atomic_torch_save(model.state_dict(), out / BEST)
        return True

    model.train()
    while state["step"] < cfg.steps:
        reason = None
        if cfg.time_limit_minutes and time.perf_counter() - start > cfg.time_limit_minutes * 60:
            reason = "time_limit"
        elif should_stop is not None and should_stop():
            reason = "cancelled"
        if (reason := ranks.agree(reason)) is not None:
            state["stopped"] = reason
            break
        t0 = time.perf_counter()
        batch = next_batch()  # the global batch: the same rows on every rank
        rows, share = ranks.shard(len(batch))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if cfg.sampled:
                rng = np.random.default_rng([cfg.seed, state["step"], ranks.rank])
                loss, encoded = _sampled_loss(net, run, sampler, batch, rows, cfg, fanout, gen, rng)
                history.encoded.append(encoded)
            else:
                neg_heads, neg_tails = sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], cfg.negatives, gen)
                entities, relations = net(run.graph)
                loss = loss_fn(run.scorer, entities.float(), relations.float(), batch[rows], neg_heads[rows],
                               neg_tails[rows], cfg.adversarial_temperature)
        # DDP averages gradients over ranks: weigh each rank's mean by its share of the global batch.
        scaled = loss if ranks.world == 1 else loss * (share * ranks.world)
        optimizer.zero_grad(set_to_none=True)
        scaled.backward()
        optimizer.step()
        state["step"] += 1
        step = state["step"]
        loss_value = float(loss.detach()) if ranks.world == 1 else ranks.sum(loss.detach() * share)
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss became {loss_value} at step {step}; lower the learning rate")
        history.step_times.append(time.perf_counter() - t0)
        history.steps.append(step)
        history.losses.append(loss_value)
        history.seconds.append(time.perf_counter() - start)
        on_cadence = ranks.is_main and has_valid and cfg.eval_every and step % cfg.eval_every == 0
        if on_cadence and not validate(step):
            state["bad_evals"] += 1
        state["elapsed"] = time.perf_counter() - start
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{loss_value:.4f}", mrr=f"{history.eval_mrr[-1]:.4f}" if history.eval_mrr else "-")
        if on_progress is not None and ranks.is_main:
            on_progress({"step": step, "total": cfg.steps, "loss": loss_value, "elapsed": state["elapsed"],
                         "valid_mrr": history.eval_mrr[-1] if history.eval_mrr else None})
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoint()
        early = has_valid and bool(cfg.eval_every) and state["bad_evals"] >= cfg.patience
        if ranks.world > 1 and cfg.eval_every and step % cfg.eval_every == 0:
            early = ranks.agree("early_stopping" if early else None) is not None  # only rank 0 validated
        if early:
            state["stopped"] = "early_stopping"
            break
    if progress is not None:
        progress.close()
    memory["train_peak_rss_mb"] = peak_rss_mb() if peak_reset else None
    # A run that ends between validations (a time limit, a step count off the cadence) would otherwise lose
    # every step since the last one. Validated outside the budget; off the cadence, so it counts for no patience.
    unvalidated = state["step"] > (history.eval_steps[-1] if history.eval_steps else 0)
    if ranks.is_main and has_valid and cfg.eval_every and unvalidated and state["stopped"] != "cancelled":
        validate(state["step"])
    save_checkpoint()
    if not ranks.is_main:
        return {"rank": ranks.rank, "world_size": ranks.world, "steps": state["step"], "stopped": state["stopped"]}
    if not history.eval_mrr:  # never validated: the final weights are the best we know
        _atomic_torch_save(model.state_dict(), out / BEST)

    metrics: dict[str, Any] = {
        "version": __version__,
        "trainable_parameters": trainable_parameters(model),
        "entities": dataset.num_train_entities,
        "relations": dataset.num_relations,
        "train_triples": len(dataset.train),
        "steps": state["step"],
        "stopped": state["stopped"],
        "best_step": state["best_step"],
        "median_step_seconds": (statistics.median(history.step_times[WARMUP_STEPS:])
                                if len(history.step_times) > WARMUP_STEPS else None),
        "train_seconds": state["elapsed"],
        "median_encoded_entities": statistics.median(history.encoded) if history.encoded else None,
        "device": str(device),
        "world_size": ranks.world,
        "threads": torch.get_num_threads(),
        "extension": extension,
        "memory": memory,
        "config": {"model": model_config.to_dict(), "train": cfg.to_dict()},
    }
    model.load_state_dict(torch.load(out / BEST, map_location=device, weights_only=True))
    if final_eval:
        for split in ("valid", "test"):
            if getattr(dataset, split) is not None and len(getattr(dataset, split)):
                metrics[split] = run.evaluate(split, protocol, batch_size=cfg.eval_batch_size)
    metrics["peak_rss_mb"] = max(peak_rss_mb(), memory["build_peak_rss_mb"])
    if write_bundle:
        bundle = bundle_from_model(model, model_config, Vocab(dataset.entities.names[: dataset.num_train_entities]),
                                   dataset.relations, dataset.train, metrics=metrics, relation_labels=relation_labels)
        metrics["bundle_bytes"] = bundle.save(out / BUNDLE).stat().st_size
    write_json_atomic(out / METRICS, metrics)
    write_json_atomic(out / "history.json", history.__dict__)
    _plot_curves(history, out / "curves.png")
    return metrics


def _check_sampled(cfg: TrainConfig, model_config: ModelConfig) -> None:
    if not cfg.sampled:
        return
    if model_config.model != "earl":
        raise ValueError("sampled training is for the EARL encoder; RotatE has no graph encoding to sample")
    if model_config.no_conrel_knn:
        raise ValueError("sampled training needs ConRel or kNResEnt inputs; --no-conrel-knn draws one random "
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


def _extension_state() -> str:
    from .kernels import extension_available

    return "cpp" if extension_available() else "torch"


def _progress_bar(cfg: TrainConfig, initial: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=initial, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)


def _plot_curves(history: History, path: Path) -> None:
    """Loss and valid MRR against step and wall-clock (2 x 2 panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, (xs, xe, label) in enumerate(((history.steps, history.eval_steps, "step"),
                                            (history.seconds, history.eval_seconds, "wall-clock (s)"))):
        axes[0, col].plot(xs, history.losses, lw=0.8)
        axes[0, col].set(xlabel=label, ylabel="loss")
        axes[1, col].plot(xe, history.eval_mrr, marker="o", ms=3)
        axes[1, col].set(xlabel=label, ylabel="valid MRR (filtered)")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def load_run(run_dir: str | os.PathLike, dataset: Dataset, *, device: str = "auto") -> Run:
    """Rebuild a trained run (config from its checkpoint, weights from best.pt) over `dataset`."""
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT).exists():
        raise FileNotFoundError(f"{run_dir} holds no {CHECKPOINT}: is it a run directory written by `earl train`?")
    dev = resolve_device(device)
    ckpt = torch.load(run_dir / CHECKPOINT, map_location="cpu", weights_only=True)
    sampled = bool(ckpt.get("train_config", {}).get("sampled", False))  # evaluate a big graph layer by layer too
    run = Run.build(dataset, ModelConfig.from_dict(ckpt["model_config"]), dev, sampled=sampled)
    run.model.load_state_dict(torch.load(run_dir / BEST, map_location=dev, weights_only=True))
    return run
