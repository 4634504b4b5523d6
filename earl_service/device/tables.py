"""A bundle's rebuilt embeddings as tables other tools read: .npy arrays, TSV or Parquet, names in row order."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from earl_service.atomic import replacing, write_json
from earl_service.core.scorers import RECIPROCAL_SUFFIX
from earl_service.errors import ConfigError

if TYPE_CHECKING:
    from earl_service.device.reader import EdgeModel

FORMATS = ("npy", "tsv", "parquet")
_TSV_ROWS = 4096  # rows formatted per write: bounds the text held in memory on big graphs


def export_tables(model: EdgeModel, out_dir: str | os.PathLike, *, fmt: str) -> list[Path]:
    """Write entity embeddings (N, 2d) [re | im] and relation phases (R, d) in radians with their ids, plus
    meta.json (layout, gamma, the score formula), into out_dir; returns the files written. An imported model's
    relations are its stored rows (R, 2d) where they are not rotations (relation_embeddings, columns v_i).

    npy: entity_embeddings.npy, relation_phases.npy, entity_ids.txt, relation_ids.txt (one id a line);
    tsv: entities.tsv, relations.tsv (a header row, then id and values); parquet: entities.parquet,
    relations.parquet (columns `id` and a fixed-size float32 list `embedding` / `phase`; needs pyarrow).
    `earl import --format arrays` reads the npy layout back.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    out = Path(out_dir)
    entities, relations = list(model.entities.names), list(model.relations.names)
    scorer = model.scorer
    if scorer.reciprocal:  # one name a row: the inverse relations' rows follow, named as LibKGE names them
        relations += [name + RECIPROCAL_SUFFIX for name in relations]
    phases = scorer.relation_table(model.relation_embeddings)  # (R, d) radians, or an imported model's (R, 2d)
    kind = "phase" if scorer.phases else "embedding"
    if fmt == "parquet":
        files = _parquet(out, entities, model.entity_embeddings, relations, phases, kind)
    else:
        _refuse_separators(entities, "entity")
        _refuse_separators(relations, "relation")
        if fmt == "npy":
            files = [_npy(out / "entity_embeddings.npy", model.entity_embeddings),
                     _npy(out / f"relation_{kind}s.npy", phases), _lines(out / "entity_ids.txt", entities),
                     _lines(out / "relation_ids.txt", relations)]
        else:
            files = [_tsv(out / "entities.tsv", entities, model.entity_embeddings,
                          _columns(model.dim, complex_=scorer.complex_entities)),
                     _tsv(out / "relations.tsv", relations, phases,
                          [f"phase_{i}" for i in range(model.dim)] if scorer.phases else
                          _columns(model.dim, complex_=scorer.complex_entities))]
    files.append(write_json(out / "meta.json", _meta(model, fmt)))
    return files


def _columns(dim: int, *, complex_: bool) -> list[str]:
    """Names of 2d columns: re_0..re_{d-1}, im_0..im_{d-1} for complex rows, else v_0..v_{2d-1}."""
    if complex_:
        return [f"re_{i}" for i in range(dim)] + [f"im_{i}" for i in range(dim)]
    return [f"v_{i}" for i in range(2 * dim)]


_HALVES = "real parts re_0..re_{d-1}, then imaginary parts im_0..im_{d-1}"


def _meta(model: EdgeModel, fmt: str) -> dict:
    scorer = model.scorer
    relation_layout = ("d float32 phases per relation, in radians: r_i = exp(i * phase_i)" if scorer.phases else
                       f"2d float32 per relation{': ' + _HALVES if scorer.complex_entities else ''}")
    meta = {"format": fmt, "model": model.config.get("model"), "dim": model.dim, "gamma": model.gamma,
            "entities": len(model.entities), "relations": len(model.relations),
            "entity_layout": f"2d float32 per entity{': ' + _HALVES if scorer.complex_entities else ''}",
            "relation_layout": relation_layout, "score": f"{scorer.formula}: higher is more plausible"}
    if scorer.reciprocal:
        meta |= {"reciprocal": True, "head_queries": f"rows R..2R-1 (ids ending {RECIPROCAL_SUFFIX}) are inverse "
                 f"relations: (?, r, t) ranks each entity e by the score of (t, r{RECIPROCAL_SUFFIX}, e)"}
    return meta


def _refuse_separators(names: list[str], kind: str) -> None:
    """One id a line (and a tab between fields) needs ids without either; Parquet takes any id."""
    bad = next((n for n in names if "\n" in n or "\t" in n or "\r" in n), None)
    if bad is not None:
        raise ConfigError(f"{kind} id {bad!r} holds a tab or line break; use --format parquet")


def _npy(path: Path, array: np.ndarray) -> Path:
    with replacing(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)
    return path


def _lines(path: Path, names: list[str]) -> Path:
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(f"{n}\n" for n in names)
    return path


def _tsv(path: Path, names: list[str], values: np.ndarray, columns: list[str]) -> Path:
    """Header `id<TAB>columns...`, then one row per name; floats as %.9g (float32 round-trips exactly)."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("\t".join(["id", *columns]) + "\n")
        for start in range(0, len(names), _TSV_ROWS):
            block = values[start : start + _TSV_ROWS]
            f.writelines(name + "\t" + "\t".join(f"{v:.9g}" for v in row) + "\n"
                         for name, row in zip(names[start : start + _TSV_ROWS], block.tolist(), strict=True))
    return path


def _parquet(out: Path, entities: list[str], entity_embeddings: np.ndarray, relations: list[str],
             phases: np.ndarray, kind: str) -> list[Path]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("--format parquet needs pyarrow: pip install 'earl-service[parquet]' (or pyarrow); "
                          "--format npy or tsv need nothing more") from None

    def table(names: list[str], values: np.ndarray, column: str):
        flat = pa.array(np.ascontiguousarray(values, dtype=np.float32).reshape(-1))
        return pa.table({"id": pa.array(names, pa.string()),
                         column: pa.FixedSizeListArray.from_arrays(flat, values.shape[1])})

    files = []
    for name, names, values, column in (("entities.parquet", entities, entity_embeddings, "embedding"),
                                        ("relations.parquet", relations, phases, kind)):
        with replacing(out / name) as tmp:
            pq.write_table(table(names, values, column), tmp)
        files.append(out / name)
    return files
