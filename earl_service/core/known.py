"""The known answers of a graph: tails of (h, r) and heads of (t, r), as sorted pairs for searchsorted lookups."""

from __future__ import annotations

from typing import Literal

import numpy as np

Side = Literal["tail", "head"]


class KnownAnswers:
    """Every true (query, answer) pair of a graph, to filter known answers out of a ranking or a top-k.

    Per side, the pairs (key, answer) with key = anchor * R + relation are sorted without duplicates, so one
    query's answers are one contiguous slice found by two binary searches.
    """

    def __init__(self, triples: np.ndarray, num_relations: int) -> None:
        self.num_relations = int(num_relations)
        triples = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
        h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
        self._pairs = {"tail": _sorted_pairs(h * self.num_relations + r, t),
                       "head": _sorted_pairs(t * self.num_relations + r, h)}

    @property
    def num_triples(self) -> int:
        """Distinct triples known (0 for a bundle written without its graph)."""
        return len(self._pairs["tail"][0])

    @property
    def nbytes(self) -> int:
        """Bytes of the sorted pairs this holds."""
        return int(sum(keys.nbytes + answers.nbytes for keys, answers in self._pairs.values()))

    def answers(self, side: Side, anchor: int, relation: int) -> np.ndarray:
        """(A,) int64 ids, ascending: the tails of (anchor, relation, ?) or the heads of (?, relation, anchor)."""
        keys, answers = self._pairs[side]
        key = anchor * self.num_relations + relation
        return answers[np.searchsorted(keys, key, "left") : np.searchsorted(keys, key, "right")]

    def mask(self, anchors: np.ndarray, relations: np.ndarray, *, side: Side, num_candidates: int) -> np.ndarray:
        """(B, num_candidates) bool: true where the candidate is a known answer of query b (answers past the
        candidates, e.g. entities outside the evaluated range, are left out)."""
        keys, answers = self._pairs[side]
        query = np.asarray(anchors, dtype=np.int64) * self.num_relations + np.asarray(relations, dtype=np.int64)
        lo, hi = np.searchsorted(keys, query, "left"), np.searchsorted(keys, query, "right")
        counts = hi - lo
        rows = np.repeat(np.arange(len(query)), counts)
        pos = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())  # each slice's positions
        cols = answers[pos]
        keep = cols < num_candidates
        out = np.zeros((len(query), num_candidates), dtype=bool)
        out[rows[keep], cols[keep]] = True
        return out


def _sorted_pairs(keys: np.ndarray, answers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keys, answers) sorted by key then answer, duplicates dropped."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    pairs = np.unique(np.stack([keys, answers], 1), axis=0)
    return pairs[:, 0], pairs[:, 1]
