"""Vocabularies: ordered distinct names with name <-> id lookups and suggestions for a misspelt name."""

from __future__ import annotations

import bisect
import difflib
import logging
from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np

from earl_service.errors import (
    UnknownEntityError,
    UnknownRelationError,
)

log = logging.getLogger(__name__)

class Vocab:
    """An ordered list of distinct names, with ``name <-> id`` lookups (ids are positions)."""

    _SMALL = 2000  # below this many names, suggest() compares against all of them
    _WINDOW = 400  # otherwise: this many neighbours on each side by sorted prefix and by sorted suffix

    def __init__(self, names: Iterable[str], *, kind: str = "entity") -> None:
        self._names = list(names)
        self._index = {n: i for i, n in enumerate(self._names)}
        self.kind = kind
        self._sorted: tuple[list[tuple[str, str]], list[tuple[str, str]]] | None = None  # for suggest()
        if len(self._index) != len(self._names):
            dup = next(n for n, count in Counter(self._names).items() if count > 1)
            raise ValueError(f"duplicate {kind} name {dup!r}")

    @classmethod
    def _from_index(cls, index: dict[str, int], kind: str) -> Vocab:
        """Wrap an already-built ``name -> position`` dict (insertion-ordered) without copying it."""
        vocab = cls.__new__(cls)
        vocab._names, vocab._index, vocab.kind, vocab._sorted = list(index), index, kind, None
        return vocab

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __repr__(self) -> str:
        return f"Vocab({len(self)} {self.kind} names)"

    @property
    def names(self) -> list[str]:
        """The names in id order (the vocabulary's own list: do not modify it)."""
        return self._names

    def _unknown(self, name: str) -> KeyError:
        cls = UnknownRelationError if self.kind == "relation" else UnknownEntityError
        return cls(name, self.suggest(name))

    def id(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise self._unknown(name) from None

    def ids(self, names: Iterable[str]) -> np.ndarray:
        index = self._index
        try:
            return np.array([index[n] for n in names], dtype=np.int64)
        except KeyError as e:
            raise self._unknown(e.args[0]) from None

    def name(self, i: int) -> str:
        if not 0 <= i < len(self._names):
            raise IndexError(f"{self.kind} id {i} out of range (0..{len(self._names) - 1})")
        return self._names[i]

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """Up to ``n`` known names close to ``name`` (difflib, cutoff 0.6); a case-insensitive match first."""
        pool = self._names if len(self._names) <= self._SMALL else self._candidates(name)
        matches = difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
        folded = [c for c in pool if c.casefold() == name.casefold() and c != name]
        return list(dict.fromkeys(folded + matches))[:n]

    def _candidates(self, name: str) -> list[str]:
        # Names sharing a long prefix or suffix are neighbours in sorted order: a bounded, typo-tolerant pool.
        if self._sorted is None:
            folded = [s.casefold() for s in self._names]
            self._sorted = (sorted(zip(folded, self._names, strict=True)),
                            sorted(zip([f[::-1] for f in folded], self._names, strict=True)))
        key, w = name.casefold(), self._WINDOW
        pool: dict[str, None] = {}
        for pairs, k in zip(self._sorted, (key, key[::-1]), strict=True):
            i = bisect.bisect_left(pairs, (k,))
            pool.update((n, None) for _, n in pairs[max(0, i - w):i + w])
        return list(pool)
