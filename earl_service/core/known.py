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
        self._pairs: dict[Side, tuple[np.ndarray, np.ndarray]] = {
            "tail": _sorted_pairs(h * self.num_relations + r, t), "head": _sorted_pairs(t * self.num_relations + r, h)}

    @classmethod
    def from_pairs(cls, num_relations: int, pairs: dict[Side, tuple[np.ndarray, np.ndarray]]) -> KnownAnswers:
        """The index `pairs` (as `pairs()` gave them: per side (keys, answers), sorted, distinct) describe, without
        sorting again: what a cache maps back from disk (sorting FB15k-237's 272k triples takes ~0.4 s)."""
        known = cls.__new__(cls)
        known.num_relations = int(num_relations)
        known._pairs = {"tail": pairs["tail"], "head": pairs["head"]}
        return known

    def pairs(self) -> dict[Side, tuple[np.ndarray, np.ndarray]]:
        """Per side, the sorted distinct (keys (P,), answers (P,)) int64 that answer queries; do not modify them."""
        return dict(self._pairs)

    def triples(self) -> np.ndarray:
        """(E, 3) int64: the distinct triples, sorted by head, relation and tail (the tail side's pairs)."""
        keys, tails = self._pairs["tail"]
        return np.stack([keys // self.num_relations, keys % self.num_relations, tails], 1)

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
