"""A PyTorch-BigGraph checkpoint as an Imported model: `config.json`, `model.v<N>.h5` (the relation operators),
`embeddings_<type>_<part>.v<N>.h5` and `entity_names_<type>_<part>.json` (and `dynamic_rel_names.json`).

Conventions, read in facebookresearch/PyTorch-BigGraph (torchbiggraph, commit 6fccd3f):
- files (checkpoint_storage.py:FileCheckpointStorage): `embeddings_<entity>_<part>.v<version>.h5` holds dataset
  `embeddings` (rows, dim); `model.v<version>.h5` group `model` holds one dataset per parameter under its public name
  (checkpoint_manager.py:MODEL_STATE_DICT_MAPPINGS): `relations/<idx>/operator/<side>/<param>` and
  `entities/<type>/global_embedding`; `checkpoint_version.txt` the latest version; config.json the ConfigSchema;
  names (graph_storages.py) `entity_names_<type>_<part>.json` and `dynamic_rel_names.json`, JSON lists by offset;
- scores (model.py:MultiRelationEmbedder.forward): with static relations an edge (u, r, v) scores c(u, f_r(v)),
  the operator on the right-hand side only, for head and tail candidates alike; with dynamic relations every
  relation has a left-hand operator g_r and a right-hand one h_r, head candidates u' score c(u', h_r(v)) and tail
  candidates v' c(g_r(u), v') (forward's "forward" and "reverse" edges): read as a model with reciprocal relations
  (core/scorers.py), rows 0..R-1 the tail queries' g_r, rows R..2R-1 the head queries' h_r. Before the operator each
  row gets the type's global embedding added (adjust_embs) and is renormalised to max_norm by F.embedding
  (SimpleEmbedding): both are folded into the table.
- operators (operators.py): translation v + t, diagonal d o v, complex_diagonal c o v over [re | im] halves
  (params `real`, `imag`), none v; dynamic ones hold (R, ..) `translations`, `diagonals`, `real`, `imag`;
- comparators (model.py): dot <u, w>, l2 -||u - w||_2; cos and squared_l2 have no scorer here.
So translation + l2 is TransE-L2 with h = u and r = -t (-||u - (v + t)|| = -||u + (-t) - v||); diagonal (or none)
+ dot is DistMult; complex_diagonal + dot is ComplEx with r = conj(c) (Re(<u, c v>) = Re(sum u conj(c) conj(v)));
none + l2 is TransE-L2 with r = 0. A dynamic operator applied to the query's own side maps as it is: its query
g_r(u) (or h_r(v)) is the scorer's u + r, u o r or complex u o r with r = t, d or c. Other combinations, bias, featurized entities, several entity types and
linear or affine operators are refused, naming them. Reading h5 needs h5py (`pip install 'earl-service[pbg]'`);
embeddings are read in blocks of READ_ROWS rows into one float32 table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.errors import ModelImportError
from earl_service.imports.imported import Imported

CONFIG = "config.json"
READ_ROWS = 65_536
MODEL_FILE = re.compile(r"^model\.v(\d+)\.h5$")
COMBINATIONS = {("translation", "l2"): "transe-l2", ("none", "l2"): "transe-l2", ("diagonal", "dot"): "distmult",
                ("none", "dot"): "distmult", ("complex_diagonal", "dot"): "complex"}


def open_h5(path: Path) -> Any:
    """h5py.File(path, "r"); tests replace it with an in-memory stand-in where h5py is not installed."""
    try:
        import h5py
    except ImportError:
        raise ModelImportError(f"{path}: reading PyTorch-BigGraph's HDF5 files needs h5py: "
                               "pip install 'earl-service[pbg]'") from None
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise ModelImportError(f"{path}: not an HDF5 file h5py can read ({exc})") from None


def is_pbg_folder(path: Path) -> bool:
    return path.is_dir() and any(MODEL_FILE.match(p.name) for p in path.glob("model.v*.h5"))


def read_pbg(folder: str | Path) -> Imported:
    """The entity table, relation rows and scorer of a PBG checkpoint folder (module doc)."""
    folder = Path(folder)
    config = _config(folder / CONFIG)
    entity_type = _entity_type(config, folder / CONFIG)
    version = _version(folder)
    operators = {r.get("operator", "none") for r in config["relations"]}
    comparator = config.get("comparator", "cos")
    kind = _scorer(operators, comparator, config, folder / CONFIG)
    params = _model_params(folder / f"model.v{version}.h5")
    names, parts = _entity_names(folder, config, entity_type)
    entities = _entities(folder, entity_type, parts, version, len(names), config)
    global_emb = params.get(f"entities/{entity_type}/global_embedding")
    if global_emb is not None:  # adjust_embs adds it to every row of the type, on both sides
        entities += np.asarray(global_emb, dtype=np.float32)[None, :]
    relation_names = _relation_names(folder, config)
    relations, reciprocal = _relations(config, params, kind, len(relation_names), entities.shape[1],
                                       folder / f"model.v{version}.h5")
    where = {"entities": str(folder / f"embeddings_{entity_type}_*.v{version}.h5"),
             "relations": str(folder / f"model.v{version}.h5"), "entity_names": str(folder / "entity_names_*.json"),
             "relation_names": str(folder / (CONFIG if not config.get("dynamic_relations") else
                                             "dynamic_rel_names.json"))}
    source = {"format": "pbg", "library": "pytorch-biggraph", "class": f"{'+'.join(sorted(operators))} {comparator}",
              "scorer": kind, "version": version, "source": folder.name, **({"reciprocal": True} if reciprocal else {})}
    return Imported(kind, entities, relations, names, relation_names, where, None, source, reciprocal=reciprocal)


def _config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelImportError(f"{path}: not PBG's config.json ({exc}); the checkpoint folder holds the config "
                               "training saved") from None
    if not isinstance(config, dict) or not isinstance(config.get("entities"), dict) or not isinstance(
            config.get("relations"), list) or not config["relations"]:
        raise ModelImportError(f"{path}: PBG's config holds `entities` (an object) and `relations` (a list)")
    return config


def _entity_type(config: dict[str, Any], path: Path) -> str:
    types = config["entities"]
    if len(types) != 1:
        raise ModelImportError(f"{path}: {len(types)} entity types ({', '.join(sorted(types))}); one type, every "
                               "relation from it to itself, is read (one table ranks every candidate)")
    (name, schema), = types.items()
    if schema.get("featurized"):
        raise ModelImportError(f"{path}: entity type {name!r} is featurized (rows are bags of features)")
    return str(name)


def _scorer(operators: set[str], comparator: str, config: dict[str, Any], path: Path) -> str:
    kinds = {COMBINATIONS.get((op, comparator)) for op in operators}
    if config.get("bias"):
        raise ModelImportError(f"{path}: bias is on (the first coordinate is a bias added to the score): no scorer "
                               "here adds one")
    if None in kinds or len(kinds) != 1:
        found = ", ".join(f"{op} + {comparator}" for op in sorted(operators))
        raise ModelImportError(f"{path}: operator and comparator {found} have no scorer here; read are "
                               "translation or none + l2 (TransE-L2), diagonal or none + dot (DistMult), "
                               "complex_diagonal + dot (ComplEx)")
    return str(kinds.pop())


def _version(folder: Path) -> int:
    marker = folder / "checkpoint_version.txt"
    found = sorted(int(m.group(1)) for p in folder.iterdir() if (m := MODEL_FILE.match(p.name)))
    if marker.is_file():
        text = marker.read_text().strip()
        if not text.isdigit() or int(text) not in found:
            raise ModelImportError(f"{marker}: version {text!r}, but the folder holds model.v{found}.h5")
        return int(text)
    if not found:
        raise ModelImportError(f"{folder}: no model.v<N>.h5")
    return found[-1]


def _model_params(path: Path) -> dict[str, np.ndarray]:
    """Every dataset under the file's `model` group by public name (small: the operators and global rows)."""
    out: dict[str, np.ndarray] = {}
    with open_h5(path) as hf:
        if "model" not in hf:
            raise ModelImportError(f"{path}: no `model` group (PBG's model state)")

        def take(name: str, item: Any) -> None:
            if hasattr(item, "shape"):
                out[name] = np.asarray(item[...], dtype=np.float32)

        hf["model"].visititems(take)
    return out


def _entity_names(folder: Path, config: dict[str, Any], entity_type: str) -> tuple[list[str], int]:
    """The names of every partition in order, and the partition count."""
    parts = int(config["entities"][entity_type].get("num_partitions", 1))
    names: list[str] = []
    for part in range(parts):
        path = _beside(folder, config, f"entity_names_{entity_type}_{part}.json")
        chunk = _json_list(path)
        names += chunk
    return names, parts


def _relation_names(folder: Path, config: dict[str, Any]) -> list[str]:
    if config.get("dynamic_relations"):
        return _json_list(_beside(folder, config, "dynamic_rel_names.json"))
    return [str(r.get("name", i)) for i, r in enumerate(config["relations"])]


def _beside(folder: Path, config: dict[str, Any], name: str) -> Path:
    """`name` in the checkpoint folder, else in the config's entity_path (where PBG's importers write it)."""
    for where in (folder, Path(str(config.get("entity_path", folder)))):
        if (where / name).is_file():
            return where / name
    raise ModelImportError(f"{folder}: no {name} here nor in the config's entity_path; copy PBG's name files "
                           "beside the checkpoint")


def _json_list(path: Path) -> list[str]:
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelImportError(f"{path}: not a JSON list of names ({exc})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ModelImportError(f"{path}: expected a JSON list of names, one per row")
    return names


def _entities(folder: Path, entity_type: str, parts: int, version: int, rows: int,
              config: dict[str, Any]) -> np.ndarray:
    """Every partition's `embeddings` in one float32 table, read in blocks; rows renormalised to max_norm."""
    out: np.ndarray | None = None
    start = 0
    for part in range(parts):
        path = folder / f"embeddings_{entity_type}_{part}.v{version}.h5"
        if not path.is_file():
            raise ModelImportError(f"{path}: missing (partition {part} of {parts}, version {version})")
        with open_h5(path) as hf:
            if "embeddings" not in hf or len(hf["embeddings"].shape) != 2:
                raise ModelImportError(f"{path}: no 2-D dataset `embeddings`")
            data = hf["embeddings"]
            if out is None:
                out = np.empty((rows, data.shape[1]), dtype=np.float32)
            if start + data.shape[0] > rows or data.shape[1] != out.shape[1]:
                raise ModelImportError(f"{path}: {data.shape[0]:,} rows of {data.shape[1]} floats, but the name "
                                       f"files hold {rows:,} names and earlier partitions {out.shape[1]} floats")
            for block in range(0, data.shape[0], READ_ROWS):
                stop = min(block + READ_ROWS, data.shape[0])
                out[start + block : start + stop] = data[block:stop]
            start += data.shape[0]
    assert out is not None
    if start != rows:
        raise ModelImportError(f"{folder}: the embeddings hold {start:,} rows, the name files {rows:,} names")
    max_norm = config.get("max_norm")
    if max_norm:  # F.embedding(max_norm=...): rows longer than max_norm scaled to it, as PBG looks them up
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out *= np.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0).astype(np.float32)
    return out


def _relations(config: dict[str, Any], params: dict[str, np.ndarray], kind: str, count: int, width: int,
               model: Path) -> tuple[np.ndarray, bool]:
    """Relation rows in the scorer's layout, and whether they are reciprocal (module doc): static relations' (R,
    width) from the rhs operators applied to the candidate; dynamic ones' (2R, width), the lhs operators', then the
    rhs ones', each applied to the query's anchor."""
    dynamic = bool(config.get("dynamic_relations"))
    sides = ("lhs", "rhs") if dynamic else ("rhs",)
    rows = np.empty((len(sides) * count, width), dtype=np.float32)
    for s, side in enumerate(sides):
        for i in range(count):
            op = config["relations"][0 if dynamic else i].get("operator", "none")
            names = {"translation": ("translation",), "diagonal": ("diagonal",),
                     "complex_diagonal": ("real", "imag"), "none": ()}[op]
            found = {name: _param(params, i, name, dynamic, model, side) for name in names}
            rows[s * count + i] = _relation_row(op, kind, width, found, on_anchor=dynamic)
    return rows, dynamic


def _param(params: dict[str, np.ndarray], i: int, name: str, dynamic: bool, model: Path, side: str) -> np.ndarray:
    """Relation i's `side` operator parameter `name` (a dynamic operator's row i of its plural-named table)."""
    plural = dynamic and name in ("translation", "diagonal")
    key = f"relations/{0 if dynamic else i}/operator/{side}/{name}{'s' if plural else ''}"
    if key not in params:
        raise ModelImportError(f"{model}: no parameter {key} for relation {i}")
    value = params[key]
    return value[i] if dynamic else value


def _relation_row(op: str, kind: str, width: int, found: dict[str, np.ndarray], *, on_anchor: bool) -> np.ndarray:
    """The scorer's row for an operator applied to the candidate (c(u, f(v)): minus t, conj(c)) or, `on_anchor`,
    to the query's own entity (c(f(u), v): t, c as they are)."""
    size = width // 2 if kind == "complex" else width
    if any(value.shape != (size,) for value in found.values()):
        raise ModelImportError(f"operator {op}: parameters of shapes {[v.shape for v in found.values()]} beside "
                               f"entity rows of {width} floats, expected ({size},)")
    if kind == "transe-l2":
        t = found["translation"] if op == "translation" else np.zeros(width, np.float32)
        return t if on_anchor else -t
    if kind == "distmult":
        return found["diagonal"] if op == "diagonal" else np.ones(width, np.float32)
    return np.concatenate([found["real"], found["imag"] if on_anchor else -found["imag"]])  # c or conj(c)


__all__ = ["COMBINATIONS", "is_pbg_folder", "open_h5", "read_pbg"]
