"""A LibKGE checkpoint as an Imported model: `checkpoint_best.pt` (or any checkpoint file) and the dataset's
`entity_ids.del` / `relation_ids.del` beside it (or the ids a packaged checkpoint holds).

Conventions, read in uma-pi1/kge (commit 9bca31f):
- file (kge/job/train.py:TrainingJob.save_to, kge/config.py:Config.save_to, kge/model/kge_model.py:KgeBase.save):
  torch.save of a dict {"model": (state_dict, meta), "config": a kge.config.Config, "dataset": {num_entities,
  num_relations[, meta: {entity_ids, relation_ids}]}, ...}; the tables are `_entity_embedder._embeddings.weight`
  and `_relation_embedder._embeddings.weight`; the Config's `options` hold `model` and, under the model's key,
  `l_norm` (transe, rotate; default 1). Read with torch.load(weights_only=True) and a stand-in for the Config (its
  options only): nothing in the file is run;
- embeddings are stored as scored: a lookup embedder with normalize.p > 0 normalises the weights after every
  batch (kge/model/embedder/lookup_embedder.py:_normalize_embeddings), and dropout is off in evaluation;
- scores (kge/model/<name>.py, `score_emb`): transe -||s + p - o||_{l_norm}; distmult sum s p o; complex
  Re(sum s p conj(o)) over chunk(2) halves [re | im] (s_all * r_all * o_all); rotate -||(|s o p - o|_i)_i||_{l_norm}
  with p the phases in radians (cos p, sin p) and entity halves [re | im]: l_norm 1 is the sum of complex moduli
  (our `rotate`), 2 PyKEEN's (`rotate-l2`);
- ids (kge/dataset.py:Dataset._load_map): `index<TAB>id` lines;
- a reciprocal_relations_model (kge/model/reciprocal_relations_model.py) wraps one of those as `base_model` over 2R
  relations, R..2R-1 the "_reciprocal" ones: score_sp(s, p) is the base's, score_po(p, o) the base's score_sp(o,
  p + R), so a head query goes through the inverse relation's row (core/scorers.py's `reciprocal`). Its base's
  options are `reciprocal_relations_model.base_model`'s, else the base model's own (kge/config.py:get_default),
  and its tables are registered under `_base_model.` too.
Other models are refused, naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from earl_service.errors import ModelImportError
from earl_service.imports.from_arrays import read_names
from earl_service.imports.imported import Imported

CHECKPOINTS = ("checkpoint_best.pt",)
TABLES = {"entities": "_entity_embedder._embeddings.weight", "relations": "_relation_embedder._embeddings.weight"}
NAME_FILES = {"entity": "entity_ids.del", "relation": "relation_ids.del"}


class Config:
    """A stand-in for kge.config.Config: unpickled with its attributes (`options`, `folder`, ...) and no code."""

    options: dict[str, Any]


Config.__module__, Config.__qualname__ = "kge.config", "Config"


def is_libkge_source(path: Path) -> bool:
    return (path.is_file() and path.suffix == ".pt") or (path.is_dir() and any(
        (path / name).is_file() for name in CHECKPOINTS))


def read_libkge(source: str | Path) -> Imported:
    """The tables, ids and scorer of a LibKGE checkpoint (a .pt file, or a folder holding checkpoint_best.pt)."""
    path = Path(source)
    if path.is_dir():
        path = path / CHECKPOINTS[0]
    checkpoint = _load(path)
    options = _options(checkpoint, path)
    kind, reciprocal = _scorer(options, path)
    state = _state(checkpoint, path)
    entities, relations = (_table(state, TABLES[p], path) for p in ("entities", "relations"))
    names = {part: _ids(checkpoint, path, part) for part in NAME_FILES}
    where = {"entities": f"{path} [{TABLES['entities']}]", "relations": f"{path} [{TABLES['relations']}]",
             "entity_names": names["entity"][1], "relation_names": names["relation"][1]}
    source_info = {"format": "libkge", "library": "libkge", "class": options["model"], "scorer": kind,
                   "source": path.name, **({"reciprocal": True} if reciprocal else {})}
    return Imported(kind, entities, relations, names["entity"][0], names["relation"][0], where, None, source_info,
                    reciprocal=reciprocal)


def _load(path: Path) -> dict[str, Any]:
    import torch

    try:
        with torch.serialization.safe_globals([(Config, "kge.config.Config")]):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelImportError(f"{path}: missing; a LibKGE job folder holds checkpoint_best.pt") from None
    except Exception as exc:  # noqa: BLE001 - torch's weights-only loader refuses in many ways
        raise ModelImportError(f"{path}: not a LibKGE checkpoint torch reads with weights_only=True "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        raise ModelImportError(f"{path}: not a LibKGE checkpoint (a dict with `model` and `config`)")
    return checkpoint


def _options(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    config = checkpoint.get("config")
    options = getattr(config, "options", None)
    if not isinstance(options, dict) or not isinstance(options.get("model"), str):
        raise ModelImportError(f"{path}: its `config` holds no options naming the model")
    return options


def _scorer(options: dict[str, Any], path: Path) -> tuple[str, bool]:
    """(our scorer, whether head queries go through reciprocal relations) of the checkpoint's model."""
    model = options["model"]
    if model != "reciprocal_relations_model":
        return _base_scorer(model, options.get(model) or {}, path), False
    base = (options.get(model) or {}).get("base_model") or {}
    kind = base.get("type")
    if not isinstance(kind, str):
        raise ModelImportError(f"{path}: a reciprocal_relations_model without base_model.type")
    return _base_scorer(kind, {**(options.get(kind) or {}), **base}, path, wrapped=True), True


def _base_scorer(model: str, options: dict[str, Any], path: Path, *, wrapped: bool = False) -> str:
    plain = {"distmult": "distmult", "complex": "complex"}
    if model in plain:
        return plain[model]
    norm = float(options.get("l_norm", 1.0))
    if model in ("transe", "rotate") and norm in (1.0, 2.0):
        return f"transe-l{int(norm)}" if model == "transe" else ("rotate" if norm == 1.0 else "rotate-l2")
    inside = " inside a reciprocal_relations_model" if wrapped else ""
    raise ModelImportError(f"{path}: LibKGE model {model!r}{f' with l_norm {norm:g}' if model in ('transe', 'rotate') else ''}"
                           f"{inside} has no scorer here; transe and rotate (l_norm 1 or 2), distmult and complex "
                           "are read, alone or as a reciprocal_relations_model's base_model")


def _state(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    model = checkpoint["model"]
    state = model[0] if isinstance(model, (tuple, list)) and model else model
    if not isinstance(state, dict):
        raise ModelImportError(f"{path}: `model` holds no state dict")
    return state


def _table(state: dict[str, Any], key: str, path: Path) -> np.ndarray:
    key = key if key in state else f"_base_model.{key}"  # a reciprocal model's own names the base's tables too
    if key not in state:
        raise ModelImportError(f"{path}: no {key} (LibKGE's lookup embedder); the state holds "
                               f"{', '.join(sorted(state)[:6])}")
    return state[key].detach().float().cpu().numpy()


def _ids(checkpoint: dict[str, Any], path: Path, part: str) -> tuple[list[str], str]:
    """The ids a packaged checkpoint holds (dataset.meta), else the .del file beside the checkpoint."""
    meta = (checkpoint.get("dataset") or {}).get("meta") or {}
    ids = meta.get(f"{part}_ids")
    if isinstance(ids, list) and all(isinstance(i, str) for i in ids):
        return ids, f"{path} [dataset.meta.{part}_ids]"
    for folder in (path.parent, path.parent.parent):
        if (folder / NAME_FILES[part]).is_file():
            return read_names(folder / NAME_FILES[part]), str(folder / NAME_FILES[part])
    raise ModelImportError(f"{path}: no {NAME_FILES[part]} beside it (nor dataset.meta.{part}_ids inside); copy "
                           "the dataset's id map (`index<TAB>id` lines) next to the checkpoint")


__all__ = ["is_libkge_source", "read_libkge"]
