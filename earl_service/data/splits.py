"""Integer triples deduplicated and held out: the one rule the generated graphs (synthetic, WordNet) split by."""

from __future__ import annotations

import numpy as np


def unique_triples(triples: np.ndarray, num_entities: int, num_relations: int) -> np.ndarray:
    """The first occurrence of each ``(head, relation, tail)`` row of `triples` (E, 3), in their order."""
    key = (triples[:, 0] * num_relations + triples[:, 1]) * num_entities + triples[:, 2]  # < 2^63 for any real size
    _, first = np.unique(key, return_index=True)
    return triples[np.sort(first)]


def take_out(triples: np.ndarray, count: int, num_entities: int,
             num_relations: int) -> tuple[np.ndarray, np.ndarray]:
    """Remove up to `count` triples, scanning from the end, whose head, tail and relation each keep another triple
    (so a held-out triple never names what train lacks), and no self-loops: ``(kept, removed)``, removed in scan
    order. Fewer than `count` come out only when no more triples qualify."""
    degree = np.bincount(triples[:, 0], minlength=num_entities) + np.bincount(triples[:, 2], minlength=num_entities)
    uses = np.bincount(triples[:, 1], minlength=num_relations)
    out = np.zeros(len(triples), dtype=bool)
    chosen = 0
    for i in range(len(triples) - 1, -1, -1):
        if chosen == count:
            break
        h, r, t = triples[i]
        if h != t and degree[h] > 1 and degree[t] > 1 and uses[r] > 1:
            degree[h] -= 1
            degree[t] -= 1
            uses[r] -= 1
            out[i] = True
            chosen += 1
    return triples[~out], triples[out][::-1]


__all__ = ["take_out", "unique_triples"]
