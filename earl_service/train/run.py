"""A model with its dataset and graph, built once per run: `Run` (embed, evaluate), `load_run`, the device."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from earl_service.config import ModelConfig, TrainConfig
from earl_service.core.known import KnownAnswers
from earl_service.data.dataset import Dataset
from earl_service.errors import ConfigError, DatasetError, RunError
from earl_service.model.graph import Graph, build_graph, choose_reserved
from earl_service.model.modules import EARL, RotatE, build_model
from earl_service.train.checkpoint import CHECKPOINT, check_vocab, load_best
from earl_service.train.evaluate import rank_triples, standard_errors, summarize, summarize_per_relation
from earl_service.train.sampling import NeighborIndex, embed_all

log = logging.getLogger(__name__)
T = TypeVar("T")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


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


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 natively: AVX512-BF16 or AMX on a CPU, a bf16-capable CUDA GPU."""
    if device.type == "cuda":
        with torch.cuda.device(device):  # the chosen GPU, not the current one
            return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and cpu_has_native_bf16()


def bf16_autocast(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the steps autocast to bfloat16 (`--compute`); says why in the log when it is not plain fp32."""
    native = native_bf16(device)
    if cfg.compute == "auto":
        log.info("--compute auto: %s on this %s", "bf16 (native)" if native else "fp32 (no native bf16)", device.type)
        return native
    if cfg.compute == "bf16" and not native:
        log.warning("--compute bf16: this %s has no native bfloat16 matmul (CPU: no AVX512-BF16 / AMX); autocast "
                    "emulates it and is several times slower than float32 here (bench/results/speed.md)", device.type)
    return cfg.compute == "bf16"



class GraphCache:
    """Graphs built once and reused by every run over the same dataset: a graph (relational features, kNN,
    normalised adjacency) depends on the training triples, the entity count, the reserved ids and the model's
    graph options, never on the dim or the weights. A compress search holds one, so its EARL candidates and
    every rung share one build instead of one per candidate per slice and per evaluation. CPU graphs; a run
    moves its copy to its device."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._graphs: dict[tuple, Graph] = {}
        self.builds = 0  # graphs built (the rest were reused)
        # Seconds spent building what the cache holds (graphs, known answers, shared parts): paid once, so a
        # caller timing its own overhead to plan the next (compress's slices) leaves them out.
        self.build_seconds = 0.0
        self._known: KnownAnswers | None = None
        self._shared: dict[Any, Any] = {}

    def known(self) -> KnownAnswers:
        """The dataset's known answers, sorted once: at 1M entities and 10M triples every compress slice's run
        sorted them again for its validation."""
        if self._known is None:
            self._known = self._timed(lambda: KnownAnswers(_all_triples(self.dataset), self.dataset.num_relations))
        return self._known

    def shared(self, key: Any, build: Callable[[], Any]) -> Any:
        """What `build()` returns, built once per `key` for every run over this dataset (the training negative
        sampler's sorted true pairs: two sorts of 10M keys per slice at 1M entities)."""
        if key not in self._shared:
            self._shared[key] = self._timed(build)
        return self._shared[key]

    def get(self, num_entities: int, reserved: torch.Tensor, options: dict[str, Any]) -> Graph:
        key = (num_entities, hashlib.sha256(reserved.cpu().numpy().tobytes()).hexdigest(),
               tuple(sorted(options.items())))
        if key not in self._graphs:
            self._graphs[key] = self._timed(lambda: build_graph(self.dataset.train, num_entities,
                                                                self.dataset.num_relations, reserved, **options))
            self.builds += 1
        return self._graphs[key]

    def _timed(self, build: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return build()
        finally:
            self.build_seconds += time.perf_counter() - started


def cache_seconds(graphs: GraphCache | None) -> float:
    """Seconds `graphs` has spent building what it holds (0 without a cache): a caller timing its own overhead
    subtracts what filled the cache meanwhile, which is paid once."""
    return 0.0 if graphs is None else graphs.build_seconds


# RotatE's model reads only the graph's entity count: building its edges' features (CSR message and ConRel
# matrices) cost a 1M-entity, 10M-triple graph minutes and gigabytes that nothing read.
_NO_EDGES = np.zeros((0, 3), dtype=np.int64)


@dataclass
class Run:
    """Everything built once for a dataset and model config.

    Full-graph training holds the training `graph`; sampled training holds a `NeighborIndex` instead (and
    evaluates with exact layer-wise inference over it, never materialising the full-graph encoder).

    Where tensors live: `device`, chosen once when the run is built. Whatever works on the run (a step, its
    negatives, evaluation, pq fine-tuning) creates its tensors there and returns numpy through `.cpu()`; nothing
    infers the device from a parameter, which a parametrized table (pq fine-tuning) would get wrong.
    """

    dataset: Dataset
    model_config: ModelConfig
    graph: Graph | None  # training graph over the training entities (None for sampled training)
    model: torch.nn.Module
    scorer: RotatE
    known: KnownAnswers | None = None  # every true triple, for filtered ranking; built on first evaluation
    index: NeighborIndex | None = None  # sampled training: neighbourhoods and encoder inputs of every entity
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    graphs: GraphCache | None = None  # the cache the run was built from, for what other runs can share

    @classmethod
    def build(cls, dataset: Dataset, model_config: ModelConfig, device: torch.device, *, sampled: bool = False,
              graphs: GraphCache | None = None) -> Run:
        """The run's graph (or neighbour index) and model; the graph from `graphs` when given (it must be a cache
        of this dataset), else built here."""
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
            return cls(dataset, model_config, None, model, RotatE(model_config), index=index, device=device)
        if graphs is not None:
            assert graphs.dataset is dataset, "a GraphCache serves the dataset it was made for"
        if model_config.model == "rotate":  # RotatE reads the entity count alone (4 s a build at 5M entities)
            graph = (build_graph(_NO_EDGES, n, num_rel, reserved) if graphs is None
                     else graphs.shared(("no_edges", n), lambda: build_graph(_NO_EDGES, n, num_rel, reserved)))
        elif graphs is not None:
            graph = graphs.get(n, reserved, cfg.graph_options)
        else:
            graph = build_graph(dataset.train, n, num_rel, reserved, **cfg.graph_options)
        return cls(dataset, model_config, graph.to(device), model, RotatE(model_config), device=device,
                   known=graphs.known() if graphs is not None else None, graphs=graphs)

    def _reserved(self) -> torch.Tensor:
        graph_or_index = self.graph if self.graph is not None else self.index
        assert graph_or_index is not None
        return graph_or_index.reserved.cpu()

    def graph_for(self, protocol: str) -> Graph:
        """`seen`: the training graph. `all`: the same graph plus valid/test-only entities as isolated nodes."""
        if self.graph is not None and (protocol == "seen" or self.dataset.num_entities == self.dataset.num_train_entities):
            return self.graph
        n = self.dataset.num_train_entities if protocol == "seen" else self.dataset.num_entities
        triples = _NO_EDGES if self.model_config.model == "rotate" else self.dataset.train
        g = build_graph(triples, n, self.dataset.num_relations, self._reserved(), **self.model_config.graph_options)
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
        out = {**result["both"], "protocol": protocol, "split": split, "tail": result["tail"], "head": result["head"],
               "standard_error": standard_errors(ranks)}
        if per_relation:
            out["per_relation"] = summarize_per_relation(ranks, triples[:, 1], self.dataset.relations.names)
        return out


def _all_triples(dataset: Dataset) -> np.ndarray:
    parts = [dataset.train] + [x for x in (dataset.valid, dataset.test) if x is not None]
    return np.concatenate(parts)


def load_run(run_dir: str | os.PathLike, dataset: Dataset, *, device: str = "auto",
             graphs: GraphCache | None = None) -> Run:
    """Rebuild a trained run (config from its checkpoint, weights from best.pt) over `dataset`."""
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT).exists():
        raise RunError(f"{run_dir} holds no {CHECKPOINT}: is it a run directory written by `earl train`?")
    dev = resolve_device(device)
    ckpt = torch.load(run_dir / CHECKPOINT, map_location="cpu", weights_only=True)
    check_vocab(run_dir, ckpt.get("vocab"), dataset.vocab_signature())
    sampled = bool(ckpt.get("train_config", {}).get("sampled", False))  # evaluate a big graph layer by layer too
    run = Run.build(dataset, ModelConfig.from_dict(ckpt["model_config"]), dev, sampled=sampled, graphs=graphs)
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


__all__ = ["GraphCache", "Run", "cache_seconds", "bf16_autocast", "cpu_has_native_bf16", "load_run", "native_bf16", "resolve_device"]
