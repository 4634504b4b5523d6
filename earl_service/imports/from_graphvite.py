"""A GraphVite knowledge-graph pickle as an Imported model, read without GraphVite (or easydict) installed.

Conventions, read in DeepGraphLearning/graphvite (commit 5aad6dc):
- file (python/graphvite/application/application.py:ApplicationMixin.save_model, and the pretrained models of
  doc/source/pretrained_model.rst): a pickle of an EasyDict {graph: {entity2id, relation2id, id2entity, ...},
  solver: {entity_embeddings (N, dim), relation_embeddings (R, dim)}}; `solver.model` ("TransE", ...) only when
  saved with save_hyperparameter=True, else the model is named here (--scorer, or the file name's first word as
  the pretrained files are called: transe_wikidata5m.pkl);
- scores (include/instance/model/knowledge_graph.h, `forward`): TransE margin - ||h + r - t||_1; DistMult
  sum h r t; ComplEx Re(sum h r conj(t)) with h_re = head[2i], h_im = head[2i + 1], i.e. **interleaved**
  (re_0, im_0, re_1, ...), made [re | im] halves here for all three tables; RotatE margin - sum_i |h_i r_i - t_i|
  (the sum of complex moduli: our `rotate`) with entities interleaved and the phase of r_i = relation[i] for
  i < dim / 2 (the rest of the relation row is unused). SimplE and QuatE have no scorer here.
The pickle is read by safe_pickle: numpy arrays, builtin containers and a stand-in for easydict.EasyDict only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from earl_service.errors import ModelImportError
from earl_service.imports import safe_pickle
from earl_service.imports.imported import Imported, halves

SCORERS = {"TransE": "transe-l1", "DistMult": "distmult", "ComplEx": "complex", "RotatE": "rotate"}
STAND_INS = {("easydict", "EasyDict"): safe_pickle.Record}


def is_graphvite_file(path: Path) -> bool:
    return path.is_file() and path.suffix == ".pkl"


def read_graphvite(path: str | Path, model: str | None = None) -> Imported:
    """The tables and names of a GraphVite pickle; `model` one of SCORERS' keys when the pickle does not say."""
    path = Path(path)
    saved = safe_pickle.load(path, STAND_INS)
    graph, solver = _part(saved, "graph", path), _part(saved, "solver", path)
    model = _model(solver.get("model") or model or path.name.split("_")[0], path)
    entities = _array(solver, "entity_embeddings", path)
    relations = _array(solver, "relation_embeddings", path)
    if model in ("ComplEx", "RotatE"):
        if entities.shape[1] % 2:
            raise ModelImportError(f"{path}: {model} entity rows of odd width {entities.shape[1]}; GraphVite "
                                   "stores d complex numbers as 2d interleaved floats")
        entities = halves(entities)
        relations = halves(relations) if model == "ComplEx" else np.asarray(relations[:, : entities.shape[1] // 2])
    names = {part: _names(graph, f"{part}2id", path) for part in ("entity", "relation")}
    where = {"entities": f"{path} [solver.entity_embeddings]", "relations": f"{path} [solver.relation_embeddings]",
             "entity_names": f"{path} [graph.entity2id]", "relation_names": f"{path} [graph.relation2id]"}
    source = {"format": "graphvite", "library": "graphvite", "class": model, "scorer": SCORERS[model],
              "source": path.name}
    return Imported(SCORERS[model], entities, relations, names["entity"], names["relation"], where, None, source)


def _part(saved: Any, name: str, path: Path) -> dict[str, Any]:
    value = saved.field(name) if isinstance(saved, safe_pickle.Record) else (
        saved.get(name) if isinstance(saved, dict) else None)
    if not isinstance(value, dict):
        raise ModelImportError(f"{path}: no `{name}` record; GraphVite's save_model pickles {{graph: ..., "
                               "solver: ...}")
    return {**value, **getattr(value, "__dict__", {})}


def _model(name: str, path: Path) -> str:
    by_lower = {k.lower(): k for k in SCORERS}
    if str(name).lower() not in by_lower:
        raise ModelImportError(f"{path}: GraphVite model {name!r} has no scorer here; name the model with "
                               f"--scorer ({', '.join(SCORERS)}: {', '.join(SCORERS.values())})")
    return by_lower[str(name).lower()]


def _array(solver: dict[str, Any], name: str, path: Path) -> np.ndarray:
    value = solver.get(name)
    if not isinstance(value, np.ndarray) or value.ndim != 2:
        raise ModelImportError(f"{path}: solver.{name} is not a 2-D array")
    return value


def _names(graph: dict[str, Any], key: str, path: Path) -> list[str]:
    mapping = graph.get(key)
    if not isinstance(mapping, dict) or not mapping:
        raise ModelImportError(f"{path}: graph.{key} is not a dict of names to rows")
    ids = sorted(mapping.values())
    if ids != list(range(len(ids))):
        raise ModelImportError(f"{path}: graph.{key} must map its {len(ids):,} names to rows 0..{len(ids) - 1}")
    names = [""] * len(ids)
    for name, row in mapping.items():
        names[row] = str(name)
    return names


__all__ = ["SCORERS", "is_graphvite_file", "read_graphvite"]
