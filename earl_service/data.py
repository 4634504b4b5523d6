"""Reading triple files and datasets into integer-id arrays with entity/relation vocabularies."""

from __future__ import annotations

import bisect
import codecs
import csv
import difflib
import gc
import gzip
import io
import logging
import os
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path

import numpy as np

from earl_service.errors import (
    DatasetError,
    TripleFileError,
    UnknownEntityError,
    UnknownRelationError,
)

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
Triple = tuple[str, str, str]

DEFAULT_MAX_BYTES = 2 * 1024**3
SPLITS = ("train", "valid", "test")
SPLIT_SUFFIXES = (".txt", ".tsv", ".csv", ".txt.gz", ".tsv.gz", ".csv.gz")
_FIELDS = ("head", "relation", "tail")
_CHUNK = 1 << 20


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    exp = min(3, (n.bit_length() - 1) // 10)
    return f"{n / 1024**exp:.4g} {('KiB', 'MiB', 'GiB')[exp - 1]}"


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    """Return the file's bytes, decompressing ``.gz`` with a guard against gzip bombs."""
    try:
        if not path.name.lower().endswith(".gz"):
            return path.read_bytes()
        chunks, total = [], 0
        with path.open("rb") as raw, gzip.GzipFile(fileobj=raw) as f:
            while chunk := f.read(_CHUNK):
                total += len(chunk)
                if total > max_bytes:
                    raise TripleFileError(
                        path, None, f"decompresses to more than {_size(max_bytes)} (max_bytes={max_bytes}); "
                        "refusing to read it (possible gzip bomb)")
                chunks.append(chunk)
        return b"".join(chunks)
    except (OSError, EOFError, zlib.error) as e:
        if isinstance(e, OSError) and e.strerror:  # the OS failed to open or read it
            raise TripleFileError(path, None, f"cannot read file: {e.strerror}") from e
        raise TripleFileError(path, None, f"not a valid gzip file: {e}") from e


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _decode(path: Path, data: bytes) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise TripleFileError(path, None, "is encoded as UTF-16; save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise TripleFileError(path, _line_of(data, nul), "contains a NUL byte; looks like a binary file, "
                              "not a text file of triples")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        column = e.start - data.rfind(b"\n", 0, e.start)
        raise TripleFileError(path, _line_of(data, e.start), f"not valid UTF-8 (byte 0x{data[e.start]:02x} "
                              f"at byte column {column}); save the file as UTF-8") from None


def _raw_rows(path: Path, text: str, is_csv: bool) -> Iterator[tuple[int, list[str]]]:
    if not is_csv:
        yield from enumerate((line.split("\t") for line in text.split("\n")), 1)
        return
    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True)
    try:
        for row in reader:
            yield reader.line_num, row
    except csv.Error as e:
        raise TripleFileError(path, reader.line_num, f"malformed CSV: {e}") from None


def _load_text(path: Path, max_bytes: int) -> tuple[str, bool]:
    is_csv = path.name.lower().removesuffix(".gz").endswith(".csv")
    return _decode(path, _read_bytes(path, max_bytes)), is_csv


def _parse(path: Path, text: str, is_csv: bool) -> Iterator[tuple[int, Triple]]:
    """Yield ``(line_number, (head, relation, tail))`` for every non-blank line, validating as it goes."""
    found = False
    for lineno, parts in _raw_rows(path, text, is_csv):
        if len(parts) == 3:
            h, r, t = parts[0].strip(), parts[1].strip(), parts[2].strip()
            if h and r and t:
                found = True
                yield lineno, (h, r, t)
                continue
            if h or r or t:
                missing = next(f for f, v in zip(_FIELDS, (h, r, t), strict=True) if not v)
                raise TripleFileError(path, lineno, f"empty {missing} field")
        elif any(p.strip() for p in parts):
            sep = "commas" if is_csv else "tabs"
            spaces = len(parts) == 1 and len(parts[0].split()) == 3
            hint = " (the fields seem to be separated by spaces)" if spaces else ""
            expected = f"expected 3 columns (head, relation, tail) separated by {sep}"
            raise TripleFileError(path, lineno, f"{expected}, found {len(parts)}{hint}")
    if not found:
        what = "is empty" if not text.strip() else "has no triples"
        raise TripleFileError(path, None, f"{what}; expected lines of head, relation, tail")


def _parse_tsv_fast(text: str) -> list[Triple] | None:
    """Bulk-parse well-formed TSV; None if anything is off (the line-by-line parser then reports it)."""
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    try:
        triples = [(h.strip(), r.strip(), t.strip()) for h, r, t in (line.split("\t") for line in lines)]
    except ValueError:  # a line without exactly 3 fields, e.g. a blank one
        return None
    return triples if triples and all(chain.from_iterable(triples)) else None


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many small tuples (it would rescan them over and over)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _records(path: PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[tuple[int, Triple]]:
    path = Path(path)
    yield from _parse(path, *_load_text(path, max_bytes))


def read_triples(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[list[Triple], int]:
    """Read a triple file; return its distinct triples in file order and the number of duplicates dropped.

    Lines are ``head<TAB>relation<TAB>tail`` (comma-separated CSV for ``.csv``/``.csv.gz``), UTF-8 with or
    without BOM, LF or CRLF; ``.gz`` files are decompressed up to ``max_bytes``. Blank lines are skipped
    and fields are stripped. Any problem raises :class:`TripleFileError` with the line number.
    """
    path = Path(path)
    text, is_csv = _load_text(path, max_bytes)
    with _gc_paused():
        triples = None if is_csv else _parse_tsv_fast(text)
        if triples is None:
            triples = [t for _, t in _parse(path, text, is_csv)]
        unique = list(dict.fromkeys(triples))
    dropped = len(triples) - len(unique)
    log.debug("%s: %d triples, %d duplicates dropped", path, len(unique), dropped)
    return unique, dropped


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


@dataclass(eq=False)
class Dataset:
    """A knowledge graph split into train/valid/test arrays of ``(head, relation, tail)`` ids.

    Entity ids ``0 .. num_train_entities - 1`` occur in train; higher ids were first seen in valid/test.
    ``stats[split]`` holds ``file``, ``triples_read``, ``duplicates_dropped``, ``unknown_relation_dropped``,
    ``triples`` (kept) and ``new_entities`` (entities first seen in that split).
    """

    entities: Vocab
    relations: Vocab
    num_train_entities: int
    train: np.ndarray
    valid: np.ndarray | None = None
    test: np.ndarray | None = None
    stats: dict = field(default_factory=dict)

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise DatasetError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
        triples = getattr(self, name)
        if triples is None:
            raise DatasetError(f"this dataset has no {name} split")
        return triples

    def seen_mask(self, triples: np.ndarray) -> np.ndarray:
        """True for triples whose head and tail both occur in the training split."""
        triples = np.asarray(triples)
        return (triples[:, 0] < self.num_train_entities) & (triples[:, 2] < self.num_train_entities)


def _split_file(folder: Path, split: str) -> Path | None:
    found = [p for p in (folder / f"{split}{s}" for s in SPLIT_SUFFIXES) if p.is_file()]
    if len(found) > 1:
        log.warning("%s: several %s files; using %s", folder, split, found[0].name)
    return found[0] if found else None


def _to_ids(triples: list[Triple], entities: dict[str, int], relations: dict[str, int]) -> np.ndarray:
    """Map triples to an ``(n, 3)`` id array, appending unseen entities in order of first appearance."""
    out = np.empty((len(triples), 3), dtype=np.int64)
    if not triples:
        return out
    names = list(chain.from_iterable(triples))
    rels = names[1::3]
    del names[1::3]  # now head0, tail0, head1, tail1, ...
    for e in dict.fromkeys(names):
        entities.setdefault(e, len(entities))
    out[:, 1] = np.fromiter(map(relations.__getitem__, rels), dtype=np.int64, count=len(rels))
    out[:, ::2] = np.fromiter(map(entities.__getitem__, names), dtype=np.int64, count=len(names)).reshape(-1, 2)
    return out


def load_dataset(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Dataset:
    """Load a dataset folder holding ``train`` and optional ``valid``/``test`` triple files.

    Each split may be named ``<split>.txt``, ``.tsv`` or ``.csv``, optionally ``.gz``; the first found in
    that order is used. Valid/test triples whose relation is not in train are dropped (counted in
    ``stats``); entities that occur only in valid/test are appended after the train entities.
    """
    folder = Path(path)
    accepted = ", ".join(f"train{s}" for s in SPLIT_SUFFIXES)
    if not folder.is_dir():
        raise DatasetError(f"dataset folder not found: {folder} (expected a folder with one of {accepted})")
    train_file = _split_file(folder, "train")
    if train_file is None:
        raise DatasetError(f"no train file in {folder}; expected one of {accepted}")
    triples, duplicates = read_triples(train_file, max_bytes=max_bytes)
    entities: dict[str, int] = {}
    relations = {r: i for i, r in enumerate(dict.fromkeys(r for _, r, _ in triples))}
    arrays = {"train": _to_ids(triples, entities, relations)}
    num_train_entities = len(entities)
    stats: dict = {"train": {"file": str(train_file), "triples_read": len(triples) + duplicates,
                             "duplicates_dropped": duplicates, "unknown_relation_dropped": 0,
                             "triples": len(triples), "new_entities": num_train_entities}}
    for split in SPLITS[1:]:
        file = _split_file(folder, split)
        if file is None:
            continue
        triples, duplicates = read_triples(file, max_bytes=max_bytes)
        kept = [t for t in triples if t[1] in relations]
        if dropped := len(triples) - len(kept):
            unknown = dict.fromkeys(r for _, r, _ in triples if r not in relations)
            log.warning("%s: dropped %d triples whose relation is not in train (%d relations, e.g. %s)",
                        file, dropped, len(unknown), ", ".join(repr(r) for r in list(unknown)[:5]))
        known = len(entities)
        arrays[split] = _to_ids(kept, entities, relations)
        stats[split] = {"file": str(file), "triples_read": len(triples) + duplicates,
                        "duplicates_dropped": duplicates, "unknown_relation_dropped": dropped,
                        "triples": len(kept), "new_entities": len(entities) - known}
    log.info("loaded %s: %d entities (%d in train), %d relations, %s", folder, len(entities),
             num_train_entities, len(relations), ", ".join(f"{s} {len(a)}" for s, a in arrays.items()))
    return Dataset(entities=Vocab._from_index(entities, "entity"),
                   relations=Vocab._from_index(relations, "relation"),
                   num_train_entities=num_train_entities, train=arrays["train"],
                   valid=arrays.get("valid"), test=arrays.get("test"), stats=stats)


def load_triples_file(path: PathLike, entities: Vocab, relations: Vocab, *, allow_new_entities: bool,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[np.ndarray, list[str]]:
    """Map a triple file onto existing vocabularies, e.g. to extend a trained graph.

    Returns the ``(n, 3)`` int64 id array and the names of new entities, which get ids
    ``len(entities) + i`` in order of first appearance. An unknown relation, or an unknown entity when
    ``allow_new_entities`` is false, raises :class:`TripleFileError` naming the (first) offending line.
    """
    triples, duplicates = read_triples(path, max_bytes=max_bytes)
    if duplicates:
        log.info("%s: dropped %d duplicate triples", path, duplicates)
    for triple in triples:
        if triple[1] not in relations:
            raise _at_line(path, triple, max_bytes, relations._unknown(triple[1]))
        if not allow_new_entities:
            for e in (triple[0], triple[2]):
                if e not in entities:
                    note = " (new entities are not allowed here)"
                    raise _at_line(path, triple, max_bytes, entities._unknown(e), note)
    index = dict(entities._index)
    ids = _to_ids(triples, index, relations._index)
    return ids, list(islice(index, len(entities), None))


def _at_line(path: PathLike, triple: Triple, max_bytes: int, error: KeyError, note: str = "",
             ) -> TripleFileError:
    """Turn an unknown-name error about ``triple`` into a TripleFileError at the line it first occurs on."""
    line = next(n for n, t in _records(path, max_bytes) if t == triple)
    return TripleFileError(path, line, f"{error}{note}")


def relation_labels(folder: PathLike) -> dict[str, str]:
    """Readable relation names from `relations.en.json` beside the triples (CoDEx ships one), else {}.

    Accepts {"P161": {"label": "cast member", ...}} or {"P161": "cast member"}.
    """
    path = Path(folder) / "relations.en.json"
    if not path.is_file():
        return {}
    import json

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return {}
    labels = {}
    for key, value in raw.items() if isinstance(raw, dict) else ():
        label = value.get("label") if isinstance(value, dict) else value
        if isinstance(label, str):
            labels[str(key)] = label
    return labels
