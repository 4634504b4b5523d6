"""Finding entities (or relations) by id or label: exact, then prefix, then fuzzy (trigram) matches, ranked."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from earl_service.data.packed import AnyVocab
from earl_service.errors import AmbiguousNameError, UnknownEntityError, UnknownRelationError

# Scores: an exact match 1; a prefix match in (0.5, 1), higher the more of the string the query covers; a fuzzy
# match 0.5 * the Dice similarity of their trigram sets, kept from FUZZY_CUTOFF up: every tier ranks above the next.
FUZZY_CUTOFF = 0.5
MAX_QUERY_CHARS = 200  # what one search may ask about; longer queries are refused (bounded work per request)
MAX_QUERY_GRAMS = 64  # trigrams of a query that count: its first 64 distinct ones
CANDIDATES_SHOWN = 10  # ids an ambiguous label's error lists
_LAST = "\U0010ffff"  # sorts after every character: key + _LAST bounds the strings that start with key
_BASE = np.uint64(1 << 21)  # one Unicode code point in a trigram's 63-bit code


@dataclass(frozen=True)
class Match:
    """One name found: its id, its label (None without one) and how well it matched (1 = exactly)."""

    id: str
    label: str | None
    score: float


@dataclass(frozen=True)
class Page:
    """`total` names matched; `items` the ranked ones from `offset`, at most `limit`."""

    total: int
    items: list[Match]
    limit: int
    offset: int


@dataclass(frozen=True)
class _Trigrams:
    """An inverted index: the distinct trigram codes of the sorted strings, and per code the strings holding it."""

    codes: np.ndarray  # (G,) uint64, sorted
    starts: np.ndarray  # (G + 1,) int64: strings of codes[g] are postings[starts[g]:starts[g + 1]]
    postings: np.ndarray  # (P,) int32 positions in the sorted strings
    sizes: np.ndarray  # (S,) int32 distinct trigrams per string


class NameSearch:
    """Search over a vocabulary's ids and their labels, casefolded; every id and every label is one string."""

    def __init__(self, vocab: AnyVocab, labels: Mapping[str, str]) -> None:
        self.vocab, self.labels = vocab, labels
        names = vocab.names
        strings = [n.casefold() for n in names]
        owners = list(range(len(names)))
        labelled = [i for i, n in enumerate(names) if labels.get(n)]
        strings += [labels[names[i]].casefold() for i in labelled]
        owners += labelled
        order = sorted(range(len(strings)), key=strings.__getitem__)
        self._keys = [strings[i] for i in order]  # sorted, for prefix ranges by bisection
        self._owner = np.array(owners, dtype=np.int64)[order]  # (S,) vocabulary id of each sorted string
        self._is_label = np.array(order, dtype=np.int64) >= len(names)  # (S,)
        self._length = np.fromiter(map(len, self._keys), dtype=np.int64, count=len(self._keys))
        self._grams: _Trigrams | None = None  # built on the first fuzzy search

    def search(self, query: str, *, limit: int = 10, offset: int = 0) -> Page:
        """Names whose id or label matches `query` exactly, by prefix or fuzzily, best first (ties by id order)."""
        key = _key(query)
        if not key:
            return Page(0, [], limit, offset)
        (owners, scores), (fuzzy_owners, fuzzy_scores) = self._prefix(key), self._fuzzy(key)
        owners, scores = np.concatenate([owners, fuzzy_owners]), np.concatenate([scores, fuzzy_scores])
        order = np.lexsort((owners, -scores))  # best first, ties by id order: work in the matches, not the vocabulary
        owners, scores = owners[order], scores[order]
        first = np.sort(np.unique(owners, return_index=True)[1])  # each entity at its best (id and label may match)
        names = self.vocab.names
        items = [Match(names[i], self.labels.get(names[i]), round(s, 4))
                 for i, s in zip(owners[first[offset:offset + limit]].tolist(),
                                 scores[first[offset:offset + limit]].tolist(), strict=True)]
        return Page(len(first), items, limit, offset)

    def resolve(self, name: str) -> int:
        """The id of `name`: an id as is, else the one entity whose label is `name` (case-sensitive first, then
        casefolded). AmbiguousNameError when a label names several; Unknown*Error with suggestions when none."""
        if name in self.vocab:
            return self.vocab.id(name)
        key = _key(name)
        lo, hi = bisect.bisect_left(self._keys, key), bisect.bisect_right(self._keys, key)
        owners = self._owner[lo:hi][self._is_label[lo:hi]] if key else self._owner[:0]
        names = self.vocab.names
        exact = [i for i in owners.tolist() if self.labels.get(names[i]) == name]
        for candidates in (exact, sorted(owners.tolist())):
            if len(candidates) == 1:
                return candidates[0]
            if candidates:
                shown = [names[i] for i in candidates[:CANDIDATES_SHOWN]]
                raise AmbiguousNameError(self.vocab.kind, name, shown, total=len(candidates))
        raise self._unknown(name)

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """Up to `n` close ids (Vocab.suggest), then labels close to `name`: what a 404 offers to try instead."""
        ids = self.vocab.suggest(name, n)
        labels = [m.label for m in self.search(name[:MAX_QUERY_CHARS], limit=2 * n).items
                  if m.label and m.label != name and m.score < 1]
        return list(dict.fromkeys(ids + labels))[: 2 * n]

    def _unknown(self, name: str) -> KeyError:
        cls = UnknownRelationError if self.vocab.kind == "relation" else UnknownEntityError
        return cls(name, self.suggest(name))

    def _prefix(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Owners and scores of the strings that start with `key` (an exact match is its own prefix: 1)."""
        lo, hi = bisect.bisect_left(self._keys, key), bisect.bisect_left(self._keys, key + _LAST)
        length = self._length[lo:hi]
        return self._owner[lo:hi], np.where(length == len(key), 1.0, 0.5 + 0.5 * len(key) / np.maximum(length, 1))

    def _fuzzy(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Owners and scores of the strings whose trigram sets are within FUZZY_CUTOFF (Dice) of the query's."""
        grams = self._trigrams()
        query = np.unique(_codes([key])[0])[:MAX_QUERY_GRAMS]
        at = np.searchsorted(grams.codes, query)
        inside = at < len(grams.codes)
        at = at[inside][grams.codes[at[inside]] == query[inside]]  # the query's trigrams that some string has
        postings = [grams.postings[grams.starts[g]:grams.starts[g + 1]] for g in at.tolist()]
        shared = np.bincount(np.concatenate(postings), minlength=len(grams.sizes)) if postings else np.zeros(0, int)
        strings = np.flatnonzero(shared)
        dice = 2.0 * shared[strings] / (len(query) + grams.sizes[strings])
        kept = dice >= FUZZY_CUTOFF
        return self._owner[strings[kept]], 0.5 * dice[kept]

    def _trigrams(self) -> _Trigrams:
        if self._grams is None:
            self._grams = _index(self._keys)
        return self._grams


def _key(text: str) -> str:
    return " ".join(text.casefold().split())


def _codes(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The trigram codes of each string padded as "  s " (so short strings and word starts count), with the
    position of the string each comes from: (T,) uint64 codes, (T,) int64 string positions."""
    padded = ["  " + s + " " for s in strings]
    points = np.frombuffer("".join(padded).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    lengths = np.fromiter(map(len, padded), dtype=np.int64, count=len(padded))
    ends = np.cumsum(lengths)
    windows = lengths - 2  # trigrams per padded string (each is at least 3 long)
    string = np.repeat(np.arange(len(padded), dtype=np.int64), windows)
    start = np.arange(int(windows.sum()), dtype=np.int64) + np.repeat(ends - lengths - np.cumsum(windows) + windows,
                                                                       windows)
    codes = (points[start] * _BASE + points[start + 1]) * _BASE + points[start + 2]
    return codes, string


def _index(keys: list[str]) -> _Trigrams:
    """The trigram index of the sorted strings: distinct (string, trigram) pairs grouped by trigram."""
    codes, string = _codes(keys)
    order = np.argsort(codes, kind="stable")  # by code, then string (_codes lists the strings in order)
    codes, string = codes[order], string[order]
    distinct_pair = np.ones(len(codes), dtype=bool)
    distinct_pair[1:] = (codes[1:] != codes[:-1]) | (string[1:] != string[:-1])  # a trigram twice in one string
    codes, string = codes[distinct_pair], string[distinct_pair]
    distinct, starts = np.unique(codes, return_index=True)
    sizes = np.bincount(string, minlength=len(keys)).astype(np.int32)
    return _Trigrams(distinct, np.append(starts, len(codes)).astype(np.int64), string.astype(np.int32), sizes)
