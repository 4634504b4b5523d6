"""An imported model's tables in this library's layout, checked, and the bundle that holds them.

Layout (core/scorers.py): entity rows of 2d floats, complex numbers as [re | im] halves; relation rows 2d floats,
or d phases in radians for a rotation (rotate, rotate-l2). A real model (TransE, DistMult) of odd width gets one
zero column on both tables, which changes no score: a bundle's rows are 2 * dim floats.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from earl_service.config import IMPORTED, ModelConfig, ModelKind
from earl_service.core import scorers
from earl_service.data.dataset import SPLIT_SUFFIXES, load_triples_file
from earl_service.data.vocab import Vocab
from earl_service.errors import ModelImportError

if TYPE_CHECKING:  # torch comes with it: reading a model stays numpy only, so `earl --help` loads no torch
    from earl_service.bundle.model_io import Bundle


KINDS = (*IMPORTED, "rotate")
CHECK_ROWS = 65_536  # rows a check or a layout change reads at a time from a (memory-mapped) table  # what an import may hold: an imported scorer, or RotatE as trained here


@dataclass(frozen=True)
class Imported:
    """A model read from another library's files, before it becomes a bundle.

    entities (N, w) and relations (R, w') float32 in the layout above; `model` one of KINDS; `triples` (E, 3) int64
    ids of the known triples the source holds (None: it holds none); `files` names the file each part came from, for
    messages ("entities", "relations", "entity_names", "relation_names"); `source` what the bundle records;
    `reciprocal`: 2R relation rows, the second R the inverse relations head queries go through (core/scorers.py)."""

    model: str
    entities: np.ndarray
    relations: np.ndarray
    entity_names: list[str]
    relation_names: list[str]
    files: dict[str, str]
    triples: np.ndarray | None = None
    source: dict[str, Any] = field(default_factory=dict)
    reciprocal: bool = False

    def checked(self) -> Imported:
        """This model with float32 tables of the widths its scorer reads (odd real widths padded), or a
        ModelImportError naming the file at fault."""
        if self.model not in KINDS:
            raise ModelImportError(f"unknown scorer {self.model!r}: choose one of {', '.join(KINDS)}")
        entities = _table(self.entities, self.files["entities"])
        relations = _table(self.relations, self.files["relations"])
        _check_rows(entities, self.entity_names, self.files["entities"], self.files["entity_names"], "entity")
        _check_rows(relations, self.relation_names, self.files["relations"], self.files["relation_names"], "relation",
                    per_name=2 if self.reciprocal else 1)
        entities, relations = self._widths(entities, relations)
        return replace(self, entities=entities, relations=relations)

    def _widths(self, entities: np.ndarray, relations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        width, columns = entities.shape[1], relations.shape[1]
        scorer = _scorer(self.model)
        if not scorer.complex_entities and width % 2 and columns == width:  # a real model: pad one zero column
            entities, relations = _pad(entities), _pad(relations)
            width, columns = width + 1, columns + 1
        if width % 2:
            raise ModelImportError(f"{self.files['entities']}: {self.model} entity rows hold d complex numbers as "
                                   f"2d floats [re | im]; {width} is odd")
        if columns != scorer.relation_width(width // 2):
            want = "d phases in radians" if scorer.phases else "as many floats as an entity row"
            raise ModelImportError(f"{self.files['relations']}: {columns} floats a relation; {self.model} relations "
                                   f"beside entity rows of {width} floats are {want} "
                                   f"({scorer.relation_width(width // 2)})")
        return entities, relations


def _scorer(model: str) -> scorers.Scorer:
    """The scorer's layout (complex rows, phases); RotatE's phase scale does not matter to it."""
    return scorers.SCORERS.get(model) or scorers.RotatE()


def _table(value: Any, path: str) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 2 or not array.size:
        raise ModelImportError(f"{path}: expected a 2-D table (rows, floats), got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ModelImportError(f"{path}: expected floats, got {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float32)  # a float32 memory map stays one: no copy
    for start in range(0, len(array), CHECK_ROWS):  # in blocks: a whole-table mask would take N * w bytes more
        if not np.isfinite(array[start : start + CHECK_ROWS]).all():
            raise ModelImportError(f"{path}: holds NaN or infinite values")
    return array


def halves(interleaved: np.ndarray) -> np.ndarray:
    """(rows, 2d) complex numbers stored re_0, im_0, re_1, im_1, ... as [re | im] halves (rows, 2d) float32."""
    table = np.asarray(interleaved)
    out = np.empty(table.shape, dtype=np.float32)
    dim = table.shape[-1] // 2
    for start in range(0, len(table), CHECK_ROWS):
        block = np.asarray(table[start : start + CHECK_ROWS], dtype=np.float32)
        out[start : start + CHECK_ROWS, :dim], out[start : start + CHECK_ROWS, dim:] = block[:, 0::2], block[:, 1::2]
    return out


def _check_rows(table: np.ndarray, names: list[str], table_path: str, names_path: str, kind: str, *,
                per_name: int = 1) -> None:
    if len(table) != per_name * len(names):
        each = "one row per" if per_name == 1 else "two rows per reciprocal"
        raise ModelImportError(f"{table_path} has {len(table):,} rows but {names_path} holds {len(names):,} {kind} "
                               f"names: {each} {kind}, in the names' order")
    bad = next((i for i, name in enumerate(names) if not name or "\0" in name), None)
    if bad is not None:
        raise ModelImportError(f"{names_path}: {kind} {bad} has an empty name or one holding NUL")
    try:
        Vocab(names, kind=kind)
    except ValueError as exc:
        raise ModelImportError(f"{names_path}: {exc}") from None


def _pad(table: np.ndarray) -> np.ndarray:
    return np.concatenate([table, np.zeros((len(table), 1), dtype=np.float32)], axis=1)


def to_bundle(imported: Imported, *, graph: str | os.PathLike | None = None, known: bool = True) -> Bundle:
    """A bundle of a checked import. Its graph (the known answers predictions leave out) is the triples of `graph`
    (a triple file, or a dataset folder's train file) when given, else the source's own triples when `known`."""
    from earl_service.bundle.model_io import Bundle

    entities, relations = Vocab(imported.entity_names), Vocab(imported.relation_names, kind="relation")
    kind = cast("ModelKind", imported.model)  # one of KINDS: checked() takes no other
    config = ModelConfig(model=kind, dim=imported.entities.shape[1] // 2, reciprocal=imported.reciprocal)
    relation_values = imported.relations
    if imported.model == "rotate":  # RotatE here stores value = phase / scale (core.rotate.phase_scale)
        relation_values = (imported.relations / np.float32(config.phase_scale)).astype(np.float32)
    if graph is not None:
        triples = graph_triples(graph, entities, relations)
    elif known and imported.triples is not None:
        triples = _source_triples(imported)
    else:
        triples = np.zeros((0, 3), dtype=np.int64)
    return Bundle(config, {"entities": imported.entities, "relations": relation_values},
                  np.zeros(0, dtype=np.int64), entities, relations, triples, {"imported": imported.source})


def _source_triples(imported: Imported) -> np.ndarray:
    triples = np.asarray(imported.triples, dtype=np.int64).reshape(-1, 3)
    limits = np.array([len(imported.entity_names), len(imported.relation_names), len(imported.entity_names)])
    if len(triples) and ((triples < 0).any() or (triples >= limits).any()):
        raise ModelImportError(f"{imported.files.get('triples', 'the source triples')}: ids outside the "
                               f"{limits[0]:,} entities and {limits[1]:,} relations")
    return triples


def graph_triples(path: str | os.PathLike, entities: Vocab, relations: Vocab) -> np.ndarray:
    """(E, 3) ids of the triples in `path` (a triple file, or a dataset folder's train file) over the imported
    names; a TripleFileError names the line of a name the model does not hold."""
    path = Path(path)
    if path.is_dir():
        found = [p for p in (path / f"train{s}" for s in SPLIT_SUFFIXES) if p.is_file()]
        if not found:
            raise ModelImportError(f"--graph {path}: a folder needs a train file (train.txt, train.tsv, ...)")
        path = found[0]
    if not path.is_file():
        raise ModelImportError(f"--graph {path}: no such file or folder")
    triples, _ = load_triples_file(path, entities, relations, allow_new_entities=False)
    return triples


__all__ = ["KINDS", "Imported", "graph_triples", "halves", "to_bundle"]
