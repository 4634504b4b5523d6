"""A vocabulary packed for serving: every name in one UTF-8 buffer, looked up by a sorted array of hashes.

A `Vocab` of 1,000,000 names holds a CPython str per name (~57 bytes for "e123456"), a list of them and a dict
from each to its id: ~90 MiB, more than the pq codes of a 1M-entity bundle. Here the names are one bytes buffer
with an offset per name (7 + 4 bytes a name for the same ids) and the lookup index is two arrays: each name's
hash, sorted, and the id each belongs to (8 + 4 bytes a name). A lookup hashes the name (CPython's str hash,
consistent within the process that built the index: nothing here is written to disk), finds the equal hashes by
binary search and compares the names they belong to (two names may share a hash). ~23 MiB for those 1M names.

`suggest` keeps Vocab's neighbours-by-sorted-prefix-and-suffix pool, built on its first call from two int32
permutations (by the casefolded name, and by it reversed) searched by bisection over names decoded on the fly.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

from earl_service.data.vocab import Vocab
from earl_service.errors import UnknownEntityError, UnknownRelationError


class PackedNames(Sequence[str]):
    """Names in id order, decoded from one UTF-8 buffer by the item (what `PackedVocab.names` gives)."""

    def __init__(self, blob: bytes, offsets: np.ndarray) -> None:
        self._blob = blob  # every name's UTF-8 bytes, one after another
        self._offsets = offsets  # (N + 1,) name i is blob[offsets[i]:offsets[i + 1]]

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"name {i} of {len(self)}")
        return self._blob[self._offsets[i] : self._offsets[i + 1]].decode()

    def __iter__(self) -> Iterator[str]:
        blob, offsets = self._blob, self._offsets.tolist()
        return (blob[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:], strict=True))

    def __eq__(self, other: object) -> bool:
        """Equal to a list (or PackedNames) of the same names, as a Vocab's names list is."""
        if isinstance(other, PackedNames):
            return self._blob == other._blob and np.array_equal(self._offsets, other._offsets)
        return isinstance(other, list) and len(other) == len(self) and list(self) == other

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like the list it stands for

    @property
    def nbytes(self) -> int:
        return len(self._blob) + int(self._offsets.nbytes)


class PackedVocab:
    """What a served model needs of a `Vocab` (len, iteration, `in`, `id`, `ids`, `name`, `names`, `suggest`,
    `kind`), in a fraction of its memory (module doc). Names are distinct (ValueError otherwise)."""

    _SMALL = Vocab._SMALL
    _WINDOW = Vocab._WINDOW

    def __init__(self, names: Iterable[str], *, kind: str = "entity") -> None:
        names = names if isinstance(names, list) else list(names)
        encoded = [n.encode() for n in names]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        blob = b"".join(encoded)
        del encoded
        offsets = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        self.kind = kind
        self.names = PackedNames(blob, offsets.astype(np.uint32) if len(blob) < 2**32 else offsets)
        hashes = np.fromiter(map(hash, names), dtype=np.int64, count=len(names))
        self._order = np.argsort(hashes, kind="stable").astype(np.int32 if len(names) < 2**31 else np.int64)
        self._hashes = hashes[self._order]  # (N,) sorted; _order[j]: the id whose name hashes to _hashes[j]
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # for suggest()
        self._check_distinct()

    @classmethod
    def of(cls, vocab: Vocab | PackedVocab) -> PackedVocab:
        """`vocab` packed (itself when it already is)."""
        return vocab if isinstance(vocab, PackedVocab) else cls(vocab.names, kind=vocab.kind)

    def _check_distinct(self) -> None:
        """ValueError on a name given twice: names of equal hash (rare) are compared with the others of that hash."""
        for j in np.flatnonzero(self._hashes[1:] == self._hashes[:-1]).tolist():
            name = self.names[int(self._order[j + 1])]
            earlier = self._order[int(np.searchsorted(self._hashes, self._hashes[j])) : j + 1]
            if any(self.names[int(i)] == name for i in earlier.tolist()):
                raise ValueError(f"duplicate {self.kind} name {name!r}")

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._find(name) >= 0

    def __repr__(self) -> str:
        return f"PackedVocab({len(self)} {self.kind} names)"

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer, offsets and index (the suggestion permutations, once built, add 8 a name)."""
        extra = 0 if self._sorted is None else sum(int(a.nbytes) for a in self._sorted)
        return self.names.nbytes + int(self._hashes.nbytes + self._order.nbytes) + extra

    def _find(self, name: str) -> int:
        """The id of `name`, -1 when it is none of these."""
        h = hash(name)
        j = int(np.searchsorted(self._hashes, h))
        while j < len(self._hashes) and self._hashes[j] == h:
            i = int(self._order[j])
            if self.names[i] == name:
                return i
            j += 1
        return -1

    def id(self, name: str) -> int:
        i = self._find(name)
        if i < 0:
            raise self._unknown(name)
        return i

    def ids(self, names: Iterable[str]) -> np.ndarray:
        return np.array([self.id(n) for n in names], dtype=np.int64)

    def name(self, i: int) -> str:
        if not 0 <= i < len(self):
            raise IndexError(f"{self.kind} id {i} out of range (0..{len(self) - 1})")
        return self.names[i]

    def _unknown(self, name: str) -> KeyError:
        cls = UnknownRelationError if self.kind == "relation" else UnknownEntityError
        return cls(name, self.suggest(name))

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """As Vocab.suggest: up to `n` known names close to `name`, a case-insensitive match first."""
        pool = list(self.names) if len(self) <= self._SMALL else self._candidates(name)
        matches = difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
        folded = [c for c in pool if c.casefold() == name.casefold() and c != name]
        return list(dict.fromkeys(folded + matches))[:n]

    def _candidates(self, name: str) -> list[str]:
        """The names next to `name` in casefolded order and in reversed casefolded order (Vocab._candidates)."""
        if self._sorted is None:
            names = list(self.names)  # for the sort only: as Vocab orders (folded, name) pairs
            folded = [s.casefold() for s in names]
            by_name = sorted(range(len(names)), key=lambda i: (folded[i], names[i]))
            by_suffix = sorted(range(len(names)), key=lambda i: (folded[i][::-1], names[i]))
            self._sorted = (np.array(by_name, dtype=np.int32), np.array(by_suffix, dtype=np.int32))
        key, w = name.casefold(), self._WINDOW
        pool: dict[str, None] = {}
        for order, reverse in zip(self._sorted, (False, True), strict=True):
            view = _FoldedView(self.names, order, reverse=reverse)
            i = bisect.bisect_left(view, key[::-1] if reverse else key)
            pool.update((self.names[int(j)], None) for j in order[max(0, i - w) : i + w].tolist())
        return list(pool)


class _FoldedView(Sequence[str]):
    """Casefolded names (reversed when `reverse`) in the order of `order`: what bisection compares a key with."""

    def __init__(self, names: PackedNames, order: np.ndarray, *, reverse: bool) -> None:
        self.names, self.order, self.reverse = names, order, reverse

    def __len__(self) -> int:
        return len(self.order)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        folded = self.names[int(self.order[i])].casefold()
        return folded[::-1] if self.reverse else folded


AnyVocab = Vocab | PackedVocab

__all__ = ["AnyVocab", "PackedNames", "PackedVocab"]
