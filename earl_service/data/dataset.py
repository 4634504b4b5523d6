"""Datasets: train / valid / test splits as integer-id arrays over entity and relation vocabularies."""

from __future__ import annotations

import hashlib
import logging
import os
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
from earl_service.data.triples import (
    DEFAULT_MAX_BYTES,
    PathLike,
    TableBuilder,
    TripleTable,
    fill_table,
    name_order,
    read_table,
)
from earl_service.data.vocab import Vocab
from earl_service.errors import (
    DatasetError,
    TripleFileError,
)
from earl_service.provenance import file_sha256

log = logging.getLogger(__name__)


SPLITS = ("train", "valid", "test")
SPLIT_SUFFIXES = readers.SPLIT_SUFFIXES

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

    def seen_count(self, split: str) -> int:
        """How many of `split`'s triples the seen protocol ranks (both entities in training)."""
        return int(self.seen_mask(self.split(split)).sum())

    def train_entities(self) -> Vocab:
        """The training entities' vocabulary (ids 0 .. num_train_entities - 1): the entities themselves when every
        one occurs in train (rebuilding it took 2.9 s a compress slice at 5M entities)."""
        if self.num_train_entities == len(self.entities):
            return self.entities
        return Vocab(self.entities.names[: self.num_train_entities])

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
    builder = TableBuilder(Path(where))
    report = ReadReport(format=type(source).__name__)
    try:
        if hasattr(source, "schema") or hasattr(source, "iloc"):  # a pyarrow Table / RecordBatch, a pandas DataFrame
            from earl_service.data.readers import columnar

            fill_table(builder, columnar.table_batches(source, data, columns))
        else:
            fill_table(builder, _tuple_batches(source))
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
    entities to ``entities`` in name order (name_order).

    Ids are only positions, so any order serves the model; this one packs a bundle's names and graph smaller than
    file order (bench/results/vocab_order.md) and is the same for the same data in any file order."""
    relation_ids = np.array([relations.get(r, -1) for r in table.relations], dtype=np.int64)[table.ids[:, 1]]
    kept = relation_ids >= 0
    heads_tails = table.ids[kept][:, ::2]  # (n, 2) ids into table.entities
    local = np.unique(heads_tails).tolist()
    names = [table.entities[i] for i in local]
    for name in sorted((name for name in names if name not in entities), key=name_order):
        entities[name] = len(entities)
    entity_ids = np.full(len(table.entities), -1, dtype=np.int64)
    entity_ids[local] = np.fromiter((entities[name] for name in names), dtype=np.int64, count=len(names))
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
    ``len(entities) + i`` sorted by name. An unknown relation, or an unknown entity when
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
