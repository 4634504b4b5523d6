"""Triple files and datasets into integer-id arrays with entity/relation vocabularies (readers/ parses the files)."""

from __future__ import annotations

import bisect
import difflib
import hashlib
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.config import DataConfig
from earl_service.data import readers as readers
from earl_service.data.labels import Labels, read_labels
from earl_service.data.readers import Batch, ReadReport, Triple
from earl_service.data.readers.report import row_error
from earl_service.errors import (
    DatasetError,
    TripleFileError,
    TripleLimitError,
    UnknownEntityError,
    UnknownRelationError,
)
from earl_service.provenance import file_sha256

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

DEFAULT_MAX_BYTES = 2 * 1024**3
SPLITS = ("train", "valid", "test")
SPLIT_SUFFIXES = readers.SPLIT_SUFFIXES
_ENTITY_BITS = 24  # id width in the first packed keys (16M entities); past it, and past 2**15 relations, re-key


class _KeySet:
    """Distinct int64 keys, 8 bytes each, in sorted runs of decreasing size (merged like a binary counter)."""

    def __init__(self, keys: np.ndarray | None = None) -> None:
        self._runs = [] if keys is None or not len(keys) else [np.sort(keys)]
        self.size = sum(map(len, self._runs))

    def add(self, keys: np.ndarray) -> np.ndarray:
        """Remember ``keys``; return the mask of those not seen before (the first of each, if repeated)."""
        unique, first = np.unique(keys, return_index=True)
        fresh = np.ones(len(unique), dtype=bool)
        for run in self._runs:
            at = np.searchsorted(run, unique).clip(max=len(run) - 1)
            fresh &= run[at] != unique
        self._push(unique[fresh])
        new = np.zeros(len(keys), dtype=bool)
        new[first[fresh]] = True
        return new

    def _push(self, run: np.ndarray) -> None:
        if not len(run):
            return
        runs = self._runs
        runs.append(run)
        self.size += len(run)
        while len(runs) > 1 and len(runs[-2]) <= 2 * len(runs[-1]):
            smaller = runs.pop()
            _append(runs[-1], len(runs[-1]), smaller, spare=False)
            runs[-1].sort()


def _append(buffer: np.ndarray, used: int, rows: np.ndarray, *, spare: bool = True) -> np.ndarray:
    """Write ``rows`` after the first ``used`` rows of ``buffer``, growing it in place (by a quarter) if needed.

    ndarray.resize reallocates, and a large buffer is remapped rather than copied, so what it holds is never there
    twice (the spare room is zero-filled, so it does count). ``buffer`` must own its data and have no views.
    """
    if used + len(rows) > len(buffer):
        size = max(len(buffer) + len(buffer) // 4, used + len(rows)) if spare else used + len(rows)
        buffer.resize((size, *buffer.shape[1:]), refcheck=False)
    buffer[used:used + len(rows)] = rows
    return buffer


def _key_bits(path: Path, entities: int, relations: int) -> tuple[int, int]:
    """Widths of entity and relation ids in a packed 63-bit ``(head, tail, relation)`` key, with room to grow."""
    need_e, need_r = (entities - 1).bit_length(), (relations - 1).bit_length()
    e_bits = max(need_e, min(_ENTITY_BITS, (63 - need_r) // 2))
    if 63 - 2 * e_bits < need_r:
        raise TripleFileError(path, None, f"has too many distinct names to index ({entities:,} entities and "
                                          f"{relations:,} relations)")
    return e_bits, 63 - 2 * e_bits


def _intern(index: dict[str, int], names: list[str]) -> np.ndarray:
    """The ids of ``names`` in ``index``, adding unseen names in order of first appearance."""
    # Look each distinct name up once in the big index; the rest are lookups in a small, cache-warm dict.
    local = dict.fromkeys(names)
    ids = np.fromiter((index.setdefault(name, len(index)) for name in local), dtype=np.int64, count=len(local))
    local.update(zip(local, range(len(local)), strict=True))
    return ids[np.fromiter(map(local.__getitem__, names), dtype=np.int64, count=len(names))]


@dataclass(frozen=True, eq=False)
class TripleTable:
    """A triple file's distinct triples in file order, as ids into the file's own name lists.

    ``ids`` is ``(n, 3)`` int64 ``(head, relation, tail)``; ``entities`` and ``relations`` hold the names by id, in
    order of first appearance (head before tail); ``duplicates`` counts the repeated triples dropped; ``report``
    says what the reader found besides (format, a skipped header, RDF literals dropped and entity labels).
    """

    entities: list[str]
    relations: list[str]
    ids: np.ndarray
    duplicates: int
    report: ReadReport = field(default_factory=ReadReport)

    def __len__(self) -> int:
        return len(self.ids)

    def longest_name(self) -> int:
        """Characters in the longest entity or relation name."""
        return max(map(len, self.entities + self.relations), default=0)

    def triples(self) -> list[Triple]:
        """The triples as names."""
        ent, rel = self.entities, self.relations
        return [(ent[h], rel[r], ent[t]) for h, r, t in self.ids.tolist()]


class _TableBuilder:
    """Interns names a chunk at a time and keeps each distinct triple once, as three ids and one packed key."""

    def __init__(self, path: Path, max_triples: int | None = None) -> None:
        self.path, self.max_triples = path, max_triples
        self.entities: dict[str, int] = {}
        self.relations: dict[str, int] = {}
        self.read = 0  # triples read, duplicates included
        self._ids = np.empty((1 << 16, 3), dtype=np.int64)  # head, relation, tail: the distinct triples, in order
        self._kept = 0  # rows of _ids in use
        self._bits = _key_bits(path, 1, 1)
        self._seen = _KeySet()

    def add(self, fields: list[str], counts: np.ndarray) -> None:
        """Count a batch of triples (``fields`` flat, ``counts[i]`` times the i-th); keep those not kept yet."""
        self.read += int(counts.sum())
        heads_tails = fields.copy()
        del heads_tails[1::3]  # head0, tail0, head1, ...: the order entities are numbered in
        ends = _intern(self.entities, heads_tails).reshape(-1, 2)
        ids = np.column_stack((ends[:, 0], _intern(self.relations, fields[1::3]), ends[:, 1]))
        new = ids[self._seen.add(self._keys(ids))]
        self._ids = _append(self._ids, self._kept, new)
        self._kept += len(new)
        if self.max_triples is not None and self._kept > self.max_triples:
            raise TripleLimitError(self.path, self.max_triples)

    def _keys(self, ids: np.ndarray) -> np.ndarray:
        e_bits, r_bits = self._bits
        if len(self.entities) > 1 << e_bits or len(self.relations) > 1 << r_bits:  # widen, and re-key what is kept
            self._bits = _key_bits(self.path, len(self.entities), len(self.relations))
            self._seen = _KeySet(self._pack(self._ids[:self._kept]))
        return self._pack(ids)

    def _pack(self, ids: np.ndarray) -> np.ndarray:
        e_bits, r_bits = self._bits
        return (ids[:, 0] << (e_bits + r_bits)) | (ids[:, 2] << r_bits) | ids[:, 1]

    def table(self, report: ReadReport) -> TripleTable:
        self._seen = _KeySet()
        ids, self._ids = self._ids, np.empty((0, 3), dtype=np.int64)
        ids.resize((self._kept, 3), refcheck=False)
        return TripleTable(list(self.entities), list(self.relations), ids, self.read - len(ids), report)


class _TripleCounter:
    """Counts distinct triples by a 64-bit fingerprint each, keeping no names: for checks that need no ids."""

    def __init__(self, path: Path, max_triples: int | None) -> None:
        self.path, self.max_triples = path, max_triples
        self.read = 0
        self.longest_name = 0
        self.seen = _KeySet()

    def add(self, fields: list[str], counts: np.ndarray) -> None:
        self.read += int(counts.sum())
        self.longest_name = max(self.longest_name, max(map(len, fields), default=0))
        fingerprints = map(hash, zip(fields[0::3], fields[1::3], fields[2::3], strict=True))
        self.seen.add(np.fromiter(fingerprints, dtype=np.int64, count=len(counts)))
        if self.max_triples is not None and self.seen.size > self.max_triples:
            raise TripleLimitError(self.path, self.max_triples)


def _read_into(path: Path, sink: _TableBuilder | _TripleCounter, max_bytes: int, data: DataConfig | None,
               ) -> ReadReport:
    """Stream the file's triples into ``sink``; a file without any is refused. Returns the reader's report."""
    report = ReadReport()
    _fill(sink, readers.batches(path, max_bytes=max_bytes, data=data or DataConfig(), report=report))
    if not sink.read:
        what = "is empty" if readers.is_blank(path, max_bytes) else "has no triples"
        raise TripleFileError(path, None, f"{what}; expected lines of head, relation, tail")
    return report


def _fill(sink: _TableBuilder | _TripleCounter, batches: Iterable[Batch]) -> None:
    for fields, counts in batches:
        sink.add(fields, counts)


def read_table(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES, max_triples: int | None = None,
               data: DataConfig | None = None) -> TripleTable:
    """Read a triple file into a :class:`TripleTable`, streaming: memory grows with the distinct triples, not the text.

    The format comes from the content (readers.detect): gzip by its magic bytes, Parquet, N-Triples, N-Quads,
    Turtle, or delimited text (tab, comma, semicolon, pipe or whitespace, guessed from the first lines, with a
    header row skipped) in UTF-8 with or without BOM, LF or CRLF; ``data`` forces the header and the column
    order. Gzip is decompressed up to ``max_bytes``. Blank lines are skipped and fields are stripped. Any
    problem raises :class:`TripleFileError` with the line (or row); more than ``max_triples`` distinct triples
    raise :class:`TripleLimitError` (as :func:`count_triples`).
    """
    path = Path(path)
    builder = _TableBuilder(path, max_triples)
    report = _read_into(path, builder, max_bytes, data)
    table = builder.table(report)
    log.debug("%s: %d triples, %d duplicates dropped", path, len(table), table.duplicates)
    return table


@dataclass(frozen=True)
class TripleCounts:
    """What :func:`count_triples` finds: distinct triples, duplicates dropped, the longest name's length."""

    triples: int
    duplicates: int
    longest_name: int


def count_triples(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES, max_triples: int | None = None,
                  data: DataConfig | None = None) -> TripleCounts:
    """Check a triple file as :func:`read_table` would read it (same formats, same errors) and count it.

    No names or ids are kept: a distinct triple costs one 64-bit fingerprint (Python's keyed string hash), so
    memory stays small whatever the names. Two distinct triples share a fingerprint with probability about
    n**2 / 2**65 (1e-6 at 10 million), which would count one as a duplicate. More than ``max_triples``
    distinct triples raise :class:`TripleLimitError` as soon as they are seen.
    """
    path = Path(path)
    counter = _TripleCounter(path, max_triples)
    _read_into(path, counter, max_bytes, data)
    return TripleCounts(counter.seen.size, counter.read - counter.seen.size, counter.longest_name)


def read_triples(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 data: DataConfig | None = None) -> tuple[list[Triple], int]:
    """Read a triple file; return its distinct triples in file order and the number of duplicates dropped.

    The names of :func:`read_table`'s ids (same formats, same errors).
    """
    table = read_table(path, max_bytes=max_bytes, data=data)
    return table.triples(), table.duplicates


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
    ``stats[split]`` holds ``file``, ``format``, ``triples_read``, ``duplicates_dropped``,
    ``unknown_relation_dropped``, ``triples`` (kept) and ``new_entities`` (entities first seen in that split), and
    where they apply ``header_line`` (a header row skipped) and ``literals_dropped`` (RDF). ``labels`` holds the
    label files beside the triples (earl_service/data/labels.py) over the labels the data itself gave (RDF rdfs:label /
    skos:prefLabel, train's first), which the trained bundle carries; ``stats["labels"]`` counts them.
    """

    entities: Vocab
    relations: Vocab
    num_train_entities: int
    train: np.ndarray
    valid: np.ndarray | None = None
    test: np.ndarray | None = None
    stats: dict = field(default_factory=dict)
    labels: Labels = field(default_factory=Labels)

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

    def vocab_signature(self) -> dict[str, Any]:
        """What a trained model depends on: the training entities and the relations, counted and hashed in order
        (a checkpoint keeps it, so a run is never evaluated against other data)."""
        digest = hashlib.sha256("\n".join(self.entities.names[: self.num_train_entities]).encode())
        digest.update(b"\0" + "\n".join(self.relations.names).encode())
        return {"entities": self.num_train_entities, "relations": self.num_relations, "sha256": digest.hexdigest()}

    @classmethod
    def from_triples(cls, train: Any, valid: Any = None, test: Any = None, *,
                     columns: tuple[str, str, str] | None = None, data: DataConfig | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Dataset:
        """A dataset from triples in memory or in files, split by split: a pandas DataFrame or a pyarrow Table
        (columns named head/relation/tail, subject/predicate/object, ... or ``columns``, else the first three in
        ``data.columns``' order; needs the `parquet` extra), an iterable of ``(head, relation, tail)`` tuples, or a
        path to a triple file of any format read_table reads. Errors name the split and the row."""
        tables = {split: _table_of(source, split, columns=columns, data=data or DataConfig(), max_bytes=max_bytes)
                  for split, source in zip(SPLITS, (train, valid, test), strict=True) if source is not None}
        return _assemble(tables, where="in-memory triples")


def _table_of(source: Any, split: str, *, columns: tuple[str, str, str] | None, data: DataConfig,
              max_bytes: int) -> tuple[str, TripleTable]:
    """``(where it came from, table)`` for one of from_triples' sources."""
    if isinstance(source, str | os.PathLike):
        return str(source), read_table(source, max_bytes=max_bytes, data=data)
    where = f"<{split} {type(source).__name__}>"
    builder = _TableBuilder(Path(where))
    report = ReadReport(format=type(source).__name__)
    try:
        if hasattr(source, "schema") or hasattr(source, "iloc"):  # a pyarrow Table / RecordBatch, a pandas DataFrame
            from earl_service.data.readers import columnar

            _fill(builder, columnar.table_batches(source, data, columns))
        else:
            _fill(builder, _tuple_batches(source))
    except ValueError as exc:
        raise row_error(where, exc) from None
    if not builder.read:
        raise TripleFileError(where, None, "has no triples")
    table = builder.table(report)
    report.sha256 = _table_sha256(table)
    return where, table


def _table_sha256(table: TripleTable) -> str:
    """A digest of in-memory triples (their names and id rows): what provenance records where there is no file."""
    digest = hashlib.sha256("\n".join(table.entities).encode())
    digest.update("\n".join(table.relations).encode())
    digest.update(np.ascontiguousarray(table.ids, dtype="<i8").tobytes())
    return digest.hexdigest()


def _tuple_batches(triples: Iterable[Any]) -> Iterator[Batch]:
    """``(head, relation, tail)`` tuples as batches; a row that is not three non-empty names is a ValueError."""
    it = iter(triples)
    row = 1
    while batch := list(islice(it, 1 << 16)):
        flat: list[str] = []
        for i, triple in enumerate(batch, row):
            names = [str(x).strip() for x in triple] if isinstance(triple, list | tuple) else []
            if len(names) != 3 or not all(names):
                got = repr(triple)[:200]
                raise ValueError(f"row {i}: expected (head, relation, tail), three non-empty names; got {got}")
            flat.extend(names)
        row += len(batch)
        yield flat, np.ones(len(batch), dtype=np.int64)


def _split_file(folder: Path, split: str) -> Path | None:
    found = [p for p in (folder / f"{split}{s}" for s in SPLIT_SUFFIXES) if p.is_file()]
    if len(found) > 1:
        log.warning("%s: several %s files; using %s", folder, split, found[0].name)
    return found[0] if found else None


def _to_ids(table: TripleTable, entities: dict[str, int], relations: dict[str, int]) -> np.ndarray:
    """Map the table's triples whose relation is in ``relations`` to an ``(n, 3)`` id array, appending unseen
    entities to ``entities`` in order of first appearance (head, tail, next head, ...)."""
    relation_ids = np.array([relations.get(r, -1) for r in table.relations], dtype=np.int64)[table.ids[:, 1]]
    kept = relation_ids >= 0
    heads_tails = table.ids[kept][:, ::2]  # (n, 2) ids into table.entities
    local, first = np.unique(heads_tails, return_index=True)  # flattened row-major: head0, tail0, head1, ...
    entity_ids = np.full(len(table.entities), -1, dtype=np.int64)
    for i in local[np.argsort(first)].tolist():
        entity_ids[i] = entities.setdefault(table.entities[i], len(entities))
    out = np.empty((len(heads_tails), 3), dtype=np.int64)
    out[:, ::2] = entity_ids[heads_tails]
    out[:, 1] = relation_ids[kept]
    return out


def _split_stats(file: str, table: TripleTable, kept: int, new_entities: int) -> dict:
    report = table.report
    stats = {"file": file, "format": report.format, "sha256": report.sha256,
             "triples_read": len(table) + table.duplicates, "duplicates_dropped": table.duplicates,
             "unknown_relation_dropped": len(table) - kept, "triples": kept,
             "new_entities": new_entities}
    if report.header_line:
        stats["header_line"] = report.header_line
    if report.literals_dropped:
        stats["literals_dropped"] = report.literals_dropped
    return stats


def load_dataset(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES, data: DataConfig | None = None,
                 labels: bool = True) -> Dataset:
    """Load a dataset folder holding ``train`` and optional ``valid``/``test`` triple files.

    Each split may be named ``<split>.txt``, ``.tsv``, ``.csv``, ``.nt``, ``.nq``, ``.ttl`` or ``.parquet``,
    optionally ``.gz``; the first found in that order is used, and read as its content says (read_table).
    Valid/test triples whose relation is not in train are dropped (counted in ``stats``); entities that occur
    only in valid/test are appended after the train entities. With `labels`, the label files beside the triples
    (earl_service.data.labels.read_labels) and the labels in the data (RDF) are kept; without, none are.
    """
    folder = Path(path)
    accepted = ", ".join(f"train{s}" for s in SPLIT_SUFFIXES)
    if not folder.is_dir():
        raise DatasetError(f"dataset folder not found: {folder} (expected a folder with one of {accepted})")
    files = {split: file for split in SPLITS if (file := _split_file(folder, split)) is not None}
    if "train" not in files:
        raise DatasetError(f"no train file in {folder}; expected one of {accepted}")
    tables = {split: (str(file), read_table(file, max_bytes=max_bytes, data=data)) for split, file in files.items()}
    for name, table in tables.values():
        table.report.sha256 = file_sha256(name)
    return _assemble(tables, where=str(folder), labels_beside=folder, labels=labels)


def _assemble(tables: dict[str, tuple[str, TripleTable]], *, where: str, labels_beside: Path | None = None,
              labels: bool = True) -> Dataset:
    """The dataset of per-split tables (train first): shared vocabularies, train's entities numbered first."""
    file, table = tables["train"]
    entities: dict[str, int] = {}
    relations = {r: i for i, r in enumerate(table.relations)}
    arrays = {"train": _to_ids(table, entities, relations)}
    num_train_entities = len(entities)
    stats = {"train": _split_stats(file, table, len(table), num_train_entities)}
    given = dict(table.report.labels)  # the data's own labels (RDF), train's first
    for split in SPLITS[1:]:
        if split not in tables:
            continue
        file, table = tables[split]
        known = len(entities)
        arrays[split] = _to_ids(table, entities, relations)
        if dropped := len(table) - len(arrays[split]):
            unknown = [r for r in table.relations if r not in relations]
            log.warning("%s: dropped %d triples whose relation is not in train (%d relations, e.g. %s)",
                        file, dropped, len(unknown), ", ".join(repr(r) for r in unknown[:5]))
        stats[split] = _split_stats(file, table, len(arrays[split]), len(entities) - known)
        given.update((e, label) for e, label in table.report.labels.items() if e not in given)
    log.info("loaded %s: %d entities (%d in train), %d relations, %s", where, len(entities),
             num_train_entities, len(relations), ", ".join(f"{s} {len(a)}" for s, a in arrays.items()))
    found = _labels(labels_beside, given, entities=entities, relations=relations) if labels else Labels()
    stats["labels"] = found.stats()
    return Dataset(entities=Vocab._from_index(entities, "entity"),
                   relations=Vocab._from_index(relations, "relation"),
                   num_train_entities=num_train_entities, train=arrays["train"],
                   valid=arrays.get("valid"), test=arrays.get("test"), stats=stats, labels=found)


def _labels(folder: Path | None, given: dict[str, str], *, entities: dict[str, int],
            relations: dict[str, int]) -> Labels:
    """The label files in `folder` (read_labels), and for ids they leave unlabelled the labels the data gave
    (`given`: RDF rdfs:label of entities or predicates); labels of ids outside the graph are left out."""
    files = read_labels(folder, entities=entities, relations=relations) if folder else Labels()
    kept = [{name: label for name, label in given.items() if name in known and name not in from_files}
            for known, from_files in ((entities, files.entities), (relations, files.relations))]
    return Labels({**kept[0], **files.entities}, {**kept[1], **files.relations}, files.ignored)


def load_triples_file(path: PathLike, entities: Vocab, relations: Vocab, *, allow_new_entities: bool,
                      max_bytes: int = DEFAULT_MAX_BYTES, data: DataConfig | None = None,
                      ) -> tuple[np.ndarray, list[str]]:
    """Map a triple file onto existing vocabularies, e.g. to extend a trained graph.

    Returns the ``(n, 3)`` int64 id array and the names of new entities, which get ids
    ``len(entities) + i`` in order of first appearance. An unknown relation, or an unknown entity when
    ``allow_new_entities`` is false, raises :class:`TripleFileError` naming the (first) offending line.
    """
    table = read_table(path, max_bytes=max_bytes, data=data)
    if table.duplicates:
        log.info("%s: dropped %d duplicate triples", path, table.duplicates)
    _refuse_unknown(Path(path), table, entities, relations, allow_new_entities=allow_new_entities,
                    max_bytes=max_bytes, data=data)
    index = dict(entities._index)
    ids = _to_ids(table, index, relations._index)
    return ids, list(islice(index, len(entities), None))


def _refuse_unknown(path: Path, table: TripleTable, entities: Vocab, relations: Vocab, *,
                    allow_new_entities: bool, max_bytes: int, data: DataConfig | None) -> None:
    """Raise at the first triple with an unknown relation (or, if new ones are not allowed, an unknown entity)."""
    known_relation = np.array([r in relations for r in table.relations], dtype=bool)
    known_entity = np.array([allow_new_entities or e in entities for e in table.entities], dtype=bool)
    h, r, t = table.ids[:, 0], table.ids[:, 1], table.ids[:, 2]
    bad = ~known_relation[r] | ~known_entity[h] | ~known_entity[t]
    if not bad.any():
        return
    h, r, t = table.ids[int(np.argmax(bad))].tolist()
    triple = (table.entities[h], table.relations[r], table.entities[t])
    if not known_relation[r]:
        raise _at_line(path, triple, max_bytes, data, relations._unknown(triple[1]))
    name = triple[0] if not known_entity[h] else triple[2]
    raise _at_line(path, triple, max_bytes, data, entities._unknown(name), " (new entities are not allowed here)")


def _at_line(path: Path, triple: Triple, max_bytes: int, data: DataConfig | None, error: KeyError,
             note: str = "") -> TripleFileError:
    """Turn an unknown-name error about ``triple`` into a TripleFileError at the line it first occurs on."""
    records = readers.records(path, max_bytes=max_bytes, data=data or DataConfig())
    line = next((n for n, t in records if t == triple), None)
    return TripleFileError(path, line, f"{error}{note}")
