"""Distillation: a trained model (the teacher: any bundle, imported or trained here) tells the model being trained
which wrong answers are near, beyond the one true answer each training triple gives (TrainConfig.distill_from).

Once per run (once per compress search: train.run.GraphCache), every query of the training triples, (head,
relation) for tails and (tail, relation) for heads, is ranked by the teacher against every entity of the dataset
that it knows by name (exactly, as core.scorers ranks), and its top `distill_candidates` kept with its scores
(Shortlists). Each step appends a positive's two shortlists to its corruptions, and the loss adds `distill_weight` x
KL(teacher's softmax || student's softmax) over each shortlist (distill_term).

Why shortlists and not the step's uniform corruptions: against random entities the teacher's softmax puts nearly all
its mass on the true answer, which the triples' loss says already; what it knows beyond the data is which other
answers it finds plausible, and those are its top candidates.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from earl_service.bundle.model_io import load_bundle
from earl_service.config import TrainConfig
from earl_service.core import scorers
from earl_service.data.dataset import Dataset
from earl_service.errors import ConfigError
from earl_service.model.kernels import rotate_distance_all

log = logging.getLogger(__name__)

CPU_PAIRS = 20_000_000_000  # (query, entity) pairs scored on a CPU at most: FB15k-237's are 2.2e9, ~30 s a core
QUERY_BLOCK = 4096  # queries scored against every entity at a time


class Distill(NamedTuple):
    """What loss_fn needs beside the student's scores of the shortlists, ordered like its queries (the tail queries
    of the batch's positives, then their head queries)."""

    logits: torch.Tensor  # (2B, k) the teacher's scores over temperature
    taught: torch.Tensor  # (2B,) bool: the teacher knows the query's anchor and relation
    weight: float


class Taught(NamedTuple):
    """A batch's shortlists: each positive's tail query's candidates and its head query's, with the teacher's logits."""

    tails: torch.Tensor  # (B, k) entity ids
    heads: torch.Tensor  # (B, k)
    tail_logits: torch.Tensor  # (B, k)
    head_logits: torch.Tensor  # (B, k)
    tail_taught: torch.Tensor  # (B,) bool
    head_taught: torch.Tensor  # (B,) bool

    def rows(self, rows: slice) -> Taught:
        return Taught(*(x[rows] for x in self))

    def distill(self, weight: float) -> Distill:
        return Distill(torch.cat([self.tail_logits, self.head_logits]),
                       torch.cat([self.tail_taught, self.head_taught]), weight)


class Shortlists:
    """The teacher's top candidates and logits for every query of the training triples, looked up by query key
    2 x (anchor x R + relation) + side (0: a tail query, anchor the head; 1: a head query, anchor the tail)."""

    def __init__(self, keys: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, taught: torch.Tensor,
                 num_relations: int, summary: dict[str, Any]) -> None:
        self.keys, self.ids, self.logits, self.taught = keys, ids, logits, taught  # (Q,), (Q, k), (Q, k), (Q,)
        self.num_relations = num_relations
        self.summary = summary  # metrics.json's "distill": where from, how many queries, how long the build took

    @classmethod
    def build(cls, dataset: Dataset, cfg: TrainConfig, device: torch.device) -> Shortlists:
        """Every training query of `dataset` ranked by the bundle at cfg.distill_from (ids mapped by name)."""
        started = time.perf_counter()
        teacher = Teacher.load(cfg.distill_from, dataset)
        r = dataset.num_relations
        h, rel, t = (torch.as_tensor(dataset.train[:, i], dtype=torch.long) for i in range(3))
        keys = torch.unique(torch.cat([2 * (h * r + rel), 2 * (t * r + rel) + 1]))  # sorted
        pairs = len(keys) * len(teacher.candidate_ids)
        if device.type == "cpu" and pairs > CPU_PAIRS:
            raise ConfigError(f"distillation ranks every entity for each of the {len(keys):,} training queries "
                              f"({pairs:.2g} pairs, over {CPU_PAIRS:.0g} on a CPU): use a GPU (--device cuda)")
        k = min(cfg.distill_candidates, len(teacher.candidate_ids))
        ids = torch.zeros(len(keys), k, dtype=torch.long)  # an untaught query keeps entity 0: masked in the loss
        logits = torch.zeros(len(keys), k)
        taught = torch.zeros(len(keys), dtype=torch.bool)
        for start in range(0, len(keys), QUERY_BLOCK):
            block = keys[start : start + QUERY_BLOCK]
            anchor, relation, side = block // 2 // r, block // 2 % r, block % 2
            known, query = teacher.queries(anchor.numpy(), relation.numpy(), side.numpy().astype(bool))
            if not known.any():
                continue
            dist = teacher.distances(torch.from_numpy(query).to(device))  # (b, C) every candidate
            top, at = torch.topk(dist, k, dim=1, largest=False)
            rows = start + torch.from_numpy(np.flatnonzero(known))
            ids[rows], logits[rows], taught[rows] = teacher.candidate_ids[at.cpu()], -top.cpu() / cfg.distill_temperature, True
        summary = {"from": str(cfg.distill_from), "queries": len(keys), "taught": int(taught.sum()),
                   "candidates": k, "entities_known": len(teacher.candidate_ids),
                   "build_seconds": round(time.perf_counter() - started, 2)}
        log.info("distillation: %s", summary)
        return cls(keys.to(device), ids.to(device), logits.to(device), taught.to(device), r, summary)

    def lookup(self, batch: torch.Tensor) -> Taught:
        """The shortlists of a batch's (B, 3) positives' tail and head queries (on the batch's device)."""
        h, r, t = batch[:, 0], batch[:, 1], batch[:, 2]
        tail_rows, tail_found = self._rows(2 * (h * self.num_relations + r))
        head_rows, head_found = self._rows(2 * (t * self.num_relations + r) + 1)
        return Taught(self.ids[tail_rows], self.ids[head_rows], self.logits[tail_rows], self.logits[head_rows],
                      self.taught[tail_rows] & tail_found, self.taught[head_rows] & head_found)

    def _rows(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.searchsorted(self.keys, keys).clamp(max=len(self.keys) - 1)
        return rows, self.keys[rows] == keys  # a query not among train's (none in a training batch) is untaught


class Teacher:
    """A bundle's scorer and tables, with the dataset's ids mapped to its rows by name."""

    def __init__(self, scorer: scorers.Scorer, entities: np.ndarray, relations: np.ndarray, entity_rows: np.ndarray,
                 relation_rows: np.ndarray) -> None:
        self.scorer, self.entities, self.relations = scorer, entities, relations
        self.entity_rows, self.relation_rows = entity_rows, relation_rows  # (N,), (R,) teacher rows, -1: unknown
        self.candidate_ids = torch.from_numpy(np.flatnonzero(entity_rows >= 0))  # dataset ids the teacher ranks
        self.candidates = torch.from_numpy(np.ascontiguousarray(entities[entity_rows[self.candidate_ids.numpy()]]))

    @classmethod
    def load(cls, path: str | Path, dataset: Dataset) -> Teacher:
        bundle = load_bundle(path)
        config = bundle.config
        scorer = scorers.scorer(config.model, gamma=config.gamma, epsilon=config.epsilon, dim=config.dim)
        entity_rows = _rows_by_name(dataset.entities.names[: dataset.num_train_entities], bundle.entities)
        relation_rows = _rows_by_name(dataset.relations.names, bundle.relations)
        if not (entity_rows >= 0).any() or not (relation_rows >= 0).any():
            raise ConfigError(f"the teacher {path} names none of the graph's entities or none of its relations")
        return cls(scorer, bundle.entity_embeddings().float().numpy(), bundle.relation_embeddings().float().numpy(),
                   entity_rows, relation_rows)

    def queries(self, anchor: np.ndarray, relation: np.ndarray, head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(b,) dataset ids -> (b,) whether the teacher knows both, and the (b', 2d) query vectors of those."""
        a, r = self.entity_rows[anchor], self.relation_rows[relation]
        known = (a >= 0) & (r >= 0)
        a, r, head = a[known], r[known], head[known]
        query = np.empty((len(a), self.entities.shape[1]), dtype=np.float32)
        for inverse in (False, True):  # tail queries h o r, head queries their inverse (core.scorers)
            side = head == inverse
            query[side] = self.scorer.query(self.entities[a[side]], self.relations[r[side]], inverse=inverse)
        return known, query

    def distances(self, query: torch.Tensor) -> torch.Tensor:
        """(b, 2d) queries -> (b, C) the scorer's distance to every candidate (lower: more plausible)."""
        candidates = self.candidates.to(query.device)
        metric = self.scorer.metric
        if metric == "ip":
            return -(query @ candidates.T)
        if metric in ("l1", "l2"):
            return torch.cdist(query, candidates, p=1.0 if metric == "l1" else 2.0)
        return rotate_distance_all(query, candidates)  # RotatE trained here: a sum of complex moduli


def _rows_by_name(names: Any, into: Any) -> np.ndarray:
    index = {name: i for i, name in enumerate(into)}
    return np.array([index.get(name, -1) for name in names], dtype=np.int64)


def distill_term(student: torch.Tensor, distill: Distill) -> torch.Tensor:
    """Mean over taught queries of KL(softmax(teacher logits) || softmax(student logits)), each (2B, k)."""
    target = torch.log_softmax(distill.logits, dim=1)
    kl = (target.exp() * (target - torch.log_softmax(student, dim=1))).sum(1)  # (2B,)
    taught = distill.taught.to(kl.dtype)
    return (kl * taught).sum() / taught.sum().clamp(min=1.0)


__all__ = ["Distill", "Shortlists", "Taught", "Teacher", "distill_term"]
