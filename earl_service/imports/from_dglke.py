"""A DGL-KE save folder as an Imported model: `<dataset>_<model>_entity.npy`, `_relation.npy`, `config.json` and the
`entities.tsv` / `relations.tsv` id maps.

Conventions, read in awslabs/dgl-ke (python/dglke, commit e00bccf):
- files (utils.py:save_model, models/general_models.py:KEModel.save_emb, models/pytorch/tensor_models.py:
  ExternalEmbedding.save): np.save of `<dataset>_<model_name>_entity.npy` (N, entity_dim) and `_relation.npy`
  (R, relation_dim); config.json is vars(args): model_name, dataset, hidden_dim, gamma, double_ent, double_rel, and
  `emp_file` / `rmap_file` (sic), the names of the id maps; entity_dim = 2 * hidden_dim when double_ent;
- id maps (dataloader/KGDataset.py:KGDatasetUDDRaw writes `{id}\\t{name}` lines, KGDataset.read_entity reads
  `eid, entity = line.split(delimiter)`): `entities.tsv`, `relations.tsv` (`entities.dict` for the built-in sets);
- scores (models/pytorch/score_fun.py): TransEScore gamma - ||h + r - t||_p (TransE and TransE_l2: p = 2, TransE_l1:
  p = 1); DistMultScore sum h r t; ComplExScore sum of h_re t_re r_re + h_im t_im r_re + h_re t_im r_im - h_im t_re
  r_im = Re(sum h r conj(t)) over th.chunk(emb, 2) halves [re | im]; RotatEScore gamma - sum_i |h_i r_i - t_i| (the
  sum of complex moduli: our `rotate`) with phase = rel / (emb_init / pi), emb_init = (gamma + EMB_INIT_EPS) /
  hidden_dim and EMB_INIT_EPS = 2.0 (general_models.py); entity rows [re | im] halves;
- DGL-KE's own inference (models/infer.py:ScoreInfer.load_model) scores with gamma = 0, i.e. minus the distance, as
  here. TransR, RESCAL and SimplE have no scorer here and are refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.errors import ModelImportError
from earl_service.imports.from_arrays import npy, read_names
from earl_service.imports.imported import Imported

CONFIG = "config.json"
EMB_INIT_EPS = 2.0  # dglke/models/general_models.py
SCORERS = {"TransE": "transe-l2", "TransE_l2": "transe-l2", "TransE_l1": "transe-l1", "DistMult": "distmult",
           "ComplEx": "complex", "RotatE": "rotate"}
NAME_FILES = {"entity_names": ("emp_file", "entities.tsv", "entities.dict"),
              "relation_names": ("rmap_file", "relations.tsv", "relations.dict")}


def is_dglke_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file() and any(path.glob("*_entity.npy"))


def read_dglke(folder: str | Path) -> Imported:
    """The tables, names and scorer of a DGL-KE save folder (module doc)."""
    folder = Path(folder)
    config = _config(folder / CONFIG)
    model = config["model_name"]
    if model not in SCORERS:
        raise ModelImportError(f"{folder / CONFIG}: model_name {model!r} has no scorer here; DGL-KE's "
                               f"{', '.join(SCORERS)} are read")
    prefix = f"{config['dataset']}_{model}"
    tables = {part: folder / f"{prefix}_{part}.npy" for part in ("entity", "relation")}
    for path in tables.values():
        if not path.is_file():
            raise ModelImportError(f"{path}: missing; config.json names dataset {config['dataset']!r} and model "
                                   f"{model!r}, so DGL-KE saved {prefix}_entity.npy and {prefix}_relation.npy")
    entities, relations = npy(tables["entity"]), npy(tables["relation"])
    if SCORERS[model] == "rotate":
        relations = _phases(relations, config, tables["relation"])
    names = {part: _names_file(folder, config, keys) for part, keys in NAME_FILES.items()}
    where = {"entities": str(tables["entity"]), "relations": str(tables["relation"]),
             "entity_names": str(names["entity_names"]), "relation_names": str(names["relation_names"])}
    source = {"format": "dglke", "library": "dgl-ke", "class": model, "scorer": SCORERS[model],
              "gamma": config["gamma"], "source": folder.name}
    return Imported(SCORERS[model], entities, relations, read_names(names["entity_names"]),
                    read_names(names["relation_names"]), where, None, source)


def _config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelImportError(f"{path}: not DGL-KE's config.json ({exc})") from None
    missing = [k for k in ("model_name", "dataset", "hidden_dim", "gamma") if k not in config]
    if not isinstance(config, dict) or missing:
        raise ModelImportError(f"{path}: DGL-KE's config.json holds model_name, dataset, hidden_dim and gamma; "
                               f"{'missing ' + ', '.join(missing) if missing else 'not an object'}")
    if not isinstance(config["hidden_dim"], int) or config["hidden_dim"] < 1:
        raise ModelImportError(f"{path}: hidden_dim {config['hidden_dim']!r} is not a positive integer")
    if not isinstance(config["gamma"], (int, float)) or not math.isfinite(config["gamma"]):
        raise ModelImportError(f"{path}: gamma {config['gamma']!r} is not a number")
    return config


def _phases(relations: np.ndarray, config: dict[str, Any], path: Path) -> np.ndarray:
    """RotatE relation values as radians: rel / (emb_init / pi), emb_init = (gamma + 2) / hidden_dim."""
    emb_init = (float(config["gamma"]) + EMB_INIT_EPS) / int(config["hidden_dim"])
    if relations.ndim != 2 or relations.shape[1] != config["hidden_dim"]:
        raise ModelImportError(f"{path}: RotatE relation rows of {relations.shape[1:]} floats; DGL-KE's hold "
                               f"hidden_dim = {config['hidden_dim']} phases (train with -de, not -dr)")
    return (np.asarray(relations, dtype=np.float64) / (emb_init / math.pi)).astype(np.float32)


def _names_file(folder: Path, config: dict[str, Any], keys: tuple[str, ...]) -> Path:
    """The id map config.json names (emp_file / rmap_file), else entities.tsv or entities.dict in the folder."""
    named = config.get(keys[0])
    candidates = ([Path(str(named)).name] if named else []) + list(keys[1:])
    for name in candidates:
        if (folder / name).is_file():
            return folder / name
    raise ModelImportError(f"{folder}: no {' or '.join(dict.fromkeys(candidates))}; copy DGL-KE's id map "
                           "(`id<TAB>name` lines, from the dataset folder) beside the embeddings")


__all__ = ["is_dglke_folder", "read_dglke"]
