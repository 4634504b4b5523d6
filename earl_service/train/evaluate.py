"""Filtered link-prediction ranking (tail and head), realistic ranks for ties, MRR / MR / Hits@k."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

from earl_service.core.known import KnownAnswers, Side
from earl_service.memory import GrowthGuard
from earl_service.model.kernels import rotate_distance_all
from earl_service.model.modules import RotatE

HITS_AT = (1, 3, 10)
# Most (query, candidate) scores one ranking batch holds: its distances, the filter mask and the comparisons are
# each (batch, N). At 256 queries a 1M-entity graph held 1 GB of distances per batch and peaked past 6 GB; capped,
# a batch keeps about 64 MB of distances whatever N is (256 queries up to 65,536 entities).
MAX_BATCH_SCORES = 1 << 24


@dataclass(frozen=True)
class Metrics:
    mrr: float
    mr: float
    hits_at_1: float
    hits_at_3: float
    hits_at_10: float
    count: int  # number of rankings

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


SUMMARY_KEYS = tuple(f.name for f in fields(Metrics) if f.name != "count")  # the metrics a summary shows


class RankingEvaluator:
    """Accumulate ranks batch by batch (`update_`), then `finalize()` into Metrics."""

    def __init__(self) -> None:
        self._ranks: list[np.ndarray] = []

    def update_(self, ranks: torch.Tensor | np.ndarray) -> None:
        self._ranks.append(np.asarray(ranks.cpu() if isinstance(ranks, torch.Tensor) else ranks, dtype=np.float64))

    def finalize(self) -> Metrics:
        ranks = np.concatenate(self._ranks) if self._ranks else np.zeros(0)
        if ranks.size == 0:
            return Metrics(0.0, 0.0, 0.0, 0.0, 0.0, 0)
        hits = {k: float(np.mean(ranks <= k)) for k in HITS_AT}
        return Metrics(float(np.mean(1.0 / ranks)), float(ranks.mean()), hits[1], hits[3], hits[10], int(ranks.size))


def realistic_ranks(dist: torch.Tensor, target: torch.Tensor, filtered: torch.Tensor) -> torch.Tensor:
    """Ranks by ascending distance, ties counted half (mean of optimistic and pessimistic rank).

    dist (B, N) distances to every candidate; target (B,) the true answer's column; filtered (B, N) bool,
    true for other known answers, which are removed from the ranking. The target itself never competes.
    """
    rows = torch.arange(dist.shape[0], device=dist.device)
    true_dist = dist[rows, target][:, None]  # (B, 1)
    competing = ~filtered
    competing[rows, target] = False
    better = ((dist < true_dist) & competing).sum(1)
    ties = ((dist == true_dist) & competing).sum(1)
    return 1.0 + better.double() + ties.double() / 2.0


def ranking_batch(batch_size: int, candidates: int) -> int:
    """Triples a ranking batch holds: at most `batch_size`, and at most MAX_BATCH_SCORES scores over `candidates`."""
    return max(1, min(batch_size, MAX_BATCH_SCORES // max(candidates, 1)))


@torch.no_grad()
def rank_triples(
    entities: torch.Tensor,
    relations: torch.Tensor,
    scorer: RotatE,
    triples: np.ndarray,
    known: KnownAnswers,
    *,
    batch_size: int = 256,
) -> dict[str, np.ndarray]:
    """Filtered realistic ranks of every triple for tail prediction and head prediction.

    entities (N, 2d) and relations (R, d) are the final embeddings; every entity is a candidate. Batches hold at
    most `batch_size` triples and MAX_BATCH_SCORES scores.
    """
    n = entities.shape[0]
    batch_size = ranking_batch(batch_size, n)
    # Ranks are written in place and the allocator's free memory handed back as the process grows: a small ranks
    # tensor kept from every batch sat in the heap above that batch's freed (batch, N) temporaries, glibc could not
    # reuse them, and the heap grew by about one of them a batch: ranking 3,143 triples of a 1M-entity graph took
    # the compress process from 3.3 to 8.3 GB.
    ranks = {side: np.empty(len(triples), dtype=np.float64) for side in ("tail", "head")}
    guard = GrowthGuard(slack_mb=8 * batch_size * n / 2**20)
    device = entities.device
    for start in range(0, len(triples), batch_size):
        batch = triples[start : start + batch_size]
        h, r, t = (torch.as_tensor(batch[:, i], dtype=torch.long, device=device) for i in range(3))
        directions: tuple[tuple[Side, torch.Tensor, torch.Tensor, bool], ...] = (("tail", h, t, False),
                                                                                 ("head", t, h, True))
        for predict, anchor, target, inverse in directions:
            # Head prediction uses |h o r - t| = |h - conj(r) o t|, since every |r_i| = 1.
            query = scorer.rotate(entities[anchor], relations[r], inverse=inverse)  # (B, 2d)
            dist = rotate_distance_all(query, entities)  # (B, N)
            anchors = batch[:, 0] if predict == "tail" else batch[:, 2]
            filtered = torch.from_numpy(known.mask(anchors, batch[:, 1], side=predict, num_candidates=n)).to(device)
            ranks[predict][start : start + len(batch)] = realistic_ranks(dist, target, filtered).cpu().numpy()
            del query, dist, filtered
        guard.check()
    return ranks


def summarize(ranks: dict[str, np.ndarray]) -> dict[str, dict]:
    """Metrics overall (both directions pooled) and per direction."""
    out = {}
    for name, parts in (("both", [ranks["tail"], ranks["head"]]), ("tail", [ranks["tail"]]), ("head", [ranks["head"]])):
        evaluator = RankingEvaluator()
        for part in parts:
            evaluator.update_(part)
        out[name] = evaluator.finalize().to_dict()
    return out


def standard_errors(ranks: dict[str, np.ndarray]) -> dict[str, float]:
    """The standard error of MRR and of Hits@10 (both directions pooled): the sample standard deviation of the
    per-query value over the square root of the query count. On 1,000 queries of a trained CoDEx-S model the
    MRR's is about 0.012; two models closer than a few of these are a tie on this sample."""
    pooled = np.concatenate([ranks["tail"], ranks["head"]])
    if pooled.size < 2:
        return {"mrr": 0.0, "hits_at_10": 0.0}
    root = np.sqrt(pooled.size)
    return {"mrr": float(np.std(1.0 / pooled, ddof=1) / root),
            "hits_at_10": float(np.std((pooled <= 10).astype(np.float64), ddof=1) / root)}


def summarize_per_relation(ranks: dict[str, np.ndarray], relations: np.ndarray, names: list[str]) -> dict[str, dict]:
    """summarize() of each relation's triples: `relations` (E,) is the relation id of each ranked triple, in the
    order of ranks["tail"] and ranks["head"]; relations without a ranked triple are left out."""
    out = {}
    for r in np.unique(relations):
        mine = relations == r
        result = summarize({side: ranks[side][mine] for side in ("tail", "head")})
        out[names[int(r)]] = {**result["both"], "tail": result["tail"], "head": result["head"]}
    return out
