"""Fine-tuning an imported model's pq codebooks against its own scorer: the codes stay, the centroids train so that
each training triple's true tail and head score highest among all entities (1-N cross-entropy), the relation table
fixed at its stored (int8) values. Torch twins of core/scorers.py's queries and distances, held equal by a test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from earl_service.memory import GrowthGuard, release_free_memory

TUNABLE = ("transe-l1", "transe-l2", "distmult", "complex", "rotate-l2")  # rotate's sum of moduli has no cdist


def query(kind: str, entity: torch.Tensor, relation: torch.Tensor, *, inverse: bool) -> torch.Tensor:
    """(B, 2d) queries as core.scorers.SCORERS[kind].query forms them (entity (B, 2d), relation (B, w))."""
    if kind.startswith("transe"):
        return entity - relation if inverse else entity + relation
    if kind == "distmult":
        return entity * relation
    dim = entity.shape[-1] // 2
    re, im = entity[:, :dim], entity[:, dim:]
    if kind == "rotate-l2":
        r_re, r_im = torch.cos(relation), torch.sin(relation)  # phases in radians
    else:
        r_re, r_im = relation[:, :dim], relation[:, dim:]
    if inverse:
        r_im = -r_im
    return torch.cat([re * r_re - im * r_im, re * r_im + im * r_re], dim=-1)


def side_query(kind: str, entity: torch.Tensor, relations: torch.Tensor, r: torch.Tensor, *, inverse: bool,
               reciprocal: bool = False) -> torch.Tensor:
    """(B, 2d) tail (or, `inverse`, head) queries of relation ids `r` (B,) over the whole relation table, as
    core.scorers.Scorer.side_query forms them: a reciprocal model's head query is a tail query through row r + R."""
    if inverse and reciprocal:
        return query(kind, entity, relations[r + len(relations) // 2], inverse=False)
    return query(kind, entity, relations[r], inverse=inverse)


def logits(kind: str, queries: torch.Tensor, entities: torch.Tensor) -> torch.Tensor:
    """(B, N) minus the distances core.scorers.SCORERS[kind].distance computes, higher is better (formed without a
    negated copy where the scorer is a dot product: each (B, N) copy is another 128 MB a step at 1M entities)."""
    if kind in ("distmult", "complex"):
        return queries @ entities.T
    return -torch.cdist(queries, entities, p=1.0 if kind == "transe-l1" else 2.0)


@dataclass
class Tuning:
    """How long fine-tuning may run, and what it did."""

    seconds: float = 60.0
    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3
    seed: int = 0
    losses: list[float] = field(default_factory=list)


CANDIDATES = 32_768  # beyond this many entities a step scores a sample of them (and the batch's own), not all
LOGITS = 2**22  # logits a step holds at once (16 MB): the batch's queries are scored this many at a time


def tune(kind: str, codes: np.ndarray, books: np.ndarray, relations: np.ndarray, triples: np.ndarray,
         budget: Tuning, *, reciprocal: bool = False) -> np.ndarray:
    """Codebooks (M, 256, s) fp16 trained from `books` for the entity codes (N, M) over `triples` (E, 3), at most
    budget.steps steps and budget.seconds; `relations` (R, w) float32 as the bundle stores them (2R rows when
    `reciprocal`: a head query is a tail query through row r + R, as core.scorers.Scorer.side_query forms it).

    Each step decodes only the rows it scores: every entity while there are at most CANDIDATES (1-N cross-entropy),
    else the batch's heads and tails and CANDIDATES entities drawn at random (a sampled softmax): a 1M-row table is
    never decoded whole, nor scored against a whole batch (256 x 1M logits, 1 GB a side)."""
    if kind not in TUNABLE:
        raise ValueError(f"{kind}: codebook fine-tuning reads {', '.join(TUNABLE)}")
    # Far logits give denormal softmax weights and gradients, which x86 multiplies ~10x slower: flushed to zero
    # (this thread, from here on), a sampled 1M-entity step took 0.4 s instead of 3.3 (random codebooks).
    torch.set_flush_denormal(True)
    gen = torch.Generator().manual_seed(budget.seed)
    code_ids = torch.from_numpy(np.ascontiguousarray(codes, dtype=np.uint8))  # (N, M), widened as rows are read
    centroids = torch.nn.Parameter(torch.from_numpy(books.astype(np.float32)))  # (M, 256, s)
    rel = torch.from_numpy(np.asarray(relations, dtype=np.float32))
    train = torch.from_numpy(np.asarray(triples, dtype=np.int64))
    optimizer = torch.optim.Adam([centroids], lr=budget.lr)
    n, m = len(code_ids), centroids.shape[0]

    def decode(ids: torch.Tensor) -> torch.Tensor:
        return centroids[torch.arange(m)[None, :], code_ids[ids].long()].reshape(len(ids), -1)

    # A step's temporaries (a chunk's logits, the (C, w) rows and their gradients) are freed between small allocations
    # that stay: at 200,000 x 256 the process grew 760 MB over its steps and kept 510 MB of it, without the guard.
    guard = GrowthGuard(slack_mb=4 * LOGITS * 4 / 2**20)  # four chunks of logits
    start = time.perf_counter()
    while len(budget.losses) < budget.steps and time.perf_counter() - start < budget.seconds:
        batch = train[torch.randint(len(train), (min(budget.batch_size, len(train)),), generator=gen)]
        h, r, t = (batch[:, i].contiguous() for i in range(3))
        ids = torch.arange(n) if n <= CANDIDATES else torch.unique(
            torch.cat([h, t, torch.randint(n, (CANDIDATES,), generator=gen)]))  # sorted
        table = decode(ids)  # (C, M * s)
        h, t = torch.searchsorted(ids, h), torch.searchsorted(ids, t)  # positions in the rows scored
        optimizer.zero_grad()
        rows = table.detach().requires_grad_()  # the chunks' gradients gather here, then flow to the centroids once
        # The queries' own rows are decoded apart (a few rows, their own path to the centroids): read from `rows`, each
        # side's backward would also build a (C, w) zero-filled gradient for the B rows it picked.
        loss = 0.0
        chunk = max(1, LOGITS // len(ids))  # (chunk, C) logits and their gradients live at a time, not (B, C)
        for lo in range(0, len(h), chunk):
            part = slice(lo, lo + chunk)
            for anchor, target, inverse in ((h[part], t[part], False), (t[part], h[part], True)):
                queries = side_query(kind, decode(ids[anchor]), rel, r[part], inverse=inverse, reciprocal=reciprocal)
                scores = logits(kind, queries, rows)
                side = torch.nn.functional.cross_entropy(scores, target, reduction="sum") / len(h)
                side.backward()
                loss += float(side.detach())
        table.backward(rows.grad)
        optimizer.step()
        budget.losses.append(loss)
        guard.check()
    release_free_memory()
    return centroids.detach().numpy().astype(np.float16)


__all__ = ["CANDIDATES", "TUNABLE", "Tuning", "logits", "query", "side_query", "tune"]
