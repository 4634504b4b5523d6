"""Plain arrays as an Imported model: an entity and a relation table (.npy, or one .safetensors), two name files and
a named scorer. The npy layout is what `earl export --format npy` writes, so an exported bundle imports back.

In the folder (the first name found of each part), either entities.parquet and relations.parquet (what `earl export
--format parquet` writes: an `id` column of names and one float list column, `embedding` or `phase`, or else every
other numeric column in order; needs pyarrow), or:
- entity table: entity_embeddings.npy, or tensor `entity_embeddings` of embeddings.safetensors: (N, w) floats;
- relation table: relation_embeddings.npy or relation_phases.npy, or tensor `relation_embeddings` of
  embeddings.safetensors: (R, w) floats, or (R, w / 2) phases in radians for rotate and rotate-l2;
- names: entities.tsv or entity_ids.txt, relations.tsv or relation_ids.txt: one name a line in row order, or
  `row<TAB>name` lines (DGL-KE's, PyKEEN's) after an optional header whose first field is not a number.
Complex tables (complex, rotate, rotate-l2) hold [re | im] halves: re_0..re_{d-1}, then im_0..im_{d-1}.
A meta.json with `"reciprocal": true` (what `earl export` writes for a model with reciprocal relations) marks 2R
relation rows named r..., then r_reciprocal...: the model's head queries go through the second R (core/scorers.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from earl_service.core.scorers import RECIPROCAL_SUFFIX
from earl_service.errors import ModelImportError
from earl_service.imports.imported import Imported

TABLES = {"entities": ("entity_embeddings.npy",), "relations": ("relation_embeddings.npy", "relation_phases.npy")}
SAFETENSORS = "embeddings.safetensors"
SAFETENSORS_NAMES = {"entities": "entity_embeddings", "relations": "relation_embeddings"}
PARQUET = {"entities": "entities.parquet", "relations": "relations.parquet"}
PARQUET_BATCH = 65_536  # rows read from a Parquet file at a time
NAMES = {"entity_names": ("entities.tsv", "entity_ids.txt"), "relation_names": ("relations.tsv", "relation_ids.txt")}


def read_arrays(folder: str | Path, scorer: str) -> Imported:
    """The tables and names in `folder` for `scorer` (core.scorers' names, or rotate)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelImportError(f"{folder}: not a folder; --format arrays reads a folder of tables and name files")
    source = {"format": "arrays", "scorer": scorer, "source": folder.name}
    if all((folder / name).is_file() for name in PARQUET.values()):
        (entities, entity_names), (relations, relation_names) = (read_parquet(folder / PARQUET[part])
                                                                 for part in ("entities", "relations"))
        where = {part: str(folder / name) for part, name in PARQUET.items()}
        where |= {"entity_names": where["entities"], "relation_names": where["relations"]}
        return _reciprocal(folder, Imported(scorer, entities, relations, entity_names, relation_names, where, None,
                                            source))
    files = {part: _first(folder, names, part) for part, names in NAMES.items()}
    tables = _tables(folder)
    where = {part: str(path) for part, path in files.items()} | {part: file for part, (_, file) in tables.items()}
    return _reciprocal(folder, Imported(scorer, tables["entities"][0], tables["relations"][0],
                                        read_names(files["entity_names"]), read_names(files["relation_names"]),
                                        where, None, source))


def _reciprocal(folder: Path, imported: Imported) -> Imported:
    """`imported` as a model with reciprocal relations where the folder's meta.json says it is one: its names
    r..., r_reciprocal... become the R relations, every row kept."""
    meta = folder / "meta.json"
    try:
        marked = meta.is_file() and json.loads(meta.read_text(encoding="utf-8")).get("reciprocal") is True
    except (ValueError, AttributeError, UnicodeDecodeError):
        raise ModelImportError(f"{meta}: not a JSON object") from None
    if not marked:
        return imported
    names, half = imported.relation_names, len(imported.relation_names) // 2
    if len(names) % 2 or names[half:] != [n + RECIPROCAL_SUFFIX for n in names[:half]]:
        raise ModelImportError(f"{imported.files['relation_names']}: meta.json marks reciprocal relations, so the "
                               f"names are R relations, then each again with {RECIPROCAL_SUFFIX!r} in the same order")
    return replace(imported, relation_names=names[:half], source={**imported.source, "reciprocal": True},
                   reciprocal=True)


def _first(folder: Path, names: tuple[str, ...], part: str) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ModelImportError(f"{folder}: no {' or '.join(names)} (the {part.replace('_', ' ')})")


def _tables(folder: Path) -> dict[str, tuple[np.ndarray, str]]:
    """Each table and the file (with its tensor) it came from: .npy files, else embeddings.safetensors."""
    found = {}
    for part, names in TABLES.items():
        path = next((folder / n for n in names if (folder / n).is_file()), None)
        if path is not None:
            found[part] = (npy(path), str(path))
    if len(found) == len(TABLES):
        return found
    path = folder / SAFETENSORS
    if not path.is_file():
        missing = [" or ".join(TABLES[part]) for part in TABLES if part not in found]
        raise ModelImportError(f"{folder}: no {', '.join(missing)}, and no {SAFETENSORS} in their place")
    tensors = _safetensors(path)
    for part, name in SAFETENSORS_NAMES.items():
        if part not in found:
            if name not in tensors:
                raise ModelImportError(f"{path}: no tensor {name!r} (it holds {sorted(tensors)})")
            found[part] = (tensors[name], f"{path} [{name}]")
    return found


def npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ModelImportError(f"{path}: not a .npy array numpy can read ({exc})") from None


def _safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for malformed files
        raise ModelImportError(f"{path}: not a safetensors file ({exc})") from None


def read_parquet(path: Path) -> tuple[np.ndarray, list[str]]:
    """(table (N, w) float32, names) of a Parquet file: names from its `id` column, rows from its one list column
    (every row as long) or else from its other columns, in order; read PARQUET_BATCH rows at a time into one array."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ModelImportError(f"{path}: reading Parquet needs pyarrow: pip install 'earl-service[parquet]'") from None
    try:
        file = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise ModelImportError(f"{path}: not a Parquet file pyarrow can read ({exc})") from None
    schema = file.schema_arrow
    if "id" not in schema.names:
        raise ModelImportError(f"{path}: no `id` column of names (it has {schema.names})")
    lists = [f.name for f in schema if f.name != "id" and (pa.types.is_list(f.type) or pa.types.is_fixed_size_list(f.type)
                                                            or pa.types.is_large_list(f.type))]
    numbers = [f.name for f in schema if f.name != "id" and (pa.types.is_floating(f.type) or pa.types.is_integer(f.type))]
    if len(lists) > 1 or not (lists or numbers):
        raise ModelImportError(f"{path}: expected one list column of floats (or float columns) beside `id`, found "
                               f"{[f'{f.name}: {f.type}' for f in schema]}")
    rows, names, done = None, [], 0
    try:
        for batch in file.iter_batches(batch_size=PARQUET_BATCH, columns=["id", *(lists or numbers)]):
            block = _parquet_rows(batch, lists[0] if lists else None, numbers, path, done)
            if rows is None:
                rows = np.empty((file.metadata.num_rows, block.shape[1]), np.float32)
            if block.shape[1] != rows.shape[1]:
                raise ModelImportError(f"{path}, row {done + 1}: {block.shape[1]} values, where row 1 has "
                                       f"{rows.shape[1]}")
            rows[done : done + len(block)] = block
            names += [str(n) for n in batch.column("id").to_pylist()]
            done += len(block)
    except pa.ArrowException as exc:
        raise ModelImportError(f"{path}: cannot read its rows ({exc})") from None
    if rows is None:
        raise ModelImportError(f"{path}: no rows")
    return rows, names


def _parquet_rows(batch, column: str | None, numbers: list[str], path: Path, done: int) -> np.ndarray:
    """One batch's (n, w) values: a list column's rows (each the same length), or the numeric columns side by side."""
    if column is None:
        return np.stack([batch.column(c).to_numpy(zero_copy_only=False).astype(np.float32) for c in numbers], 1)
    values = batch.column(column)
    if values.null_count:
        raise ModelImportError(f"{path}: column {column!r} has an empty row")
    import pyarrow.compute as pc

    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    width = int(lengths[0]) if len(lengths) else 0
    if (lengths != width).any():
        bad = int(np.flatnonzero(lengths != width)[0])
        raise ModelImportError(f"{path}, row {done + bad + 1}: {lengths[bad]} values in {column!r}, where the rows "
                               f"before have {width}")
    return values.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(values), width)


def read_names(path: Path) -> list[str]:
    """Names in row order: one a line, or `row<TAB>name` lines after an optional header (see the module doc)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelImportError(f"{path}: cannot read UTF-8 names ({exc})") from None
    if not any("\t" in line for line in lines):
        return lines
    rows = [line.split("\t", 1) for line in lines]
    first = 1 if rows and not rows[0][0].strip().isdigit() else 0  # a header row
    names: dict[int, str] = {}
    for line, row in enumerate(rows[first:], first + 1):
        if len(row) != 2 or not row[0].strip().isdigit():
            raise ModelImportError(f"{path}, line {line}: expected `row<TAB>name` as the other lines, got {row!r}")
        names[int(row[0])] = row[1]
    if sorted(names) != list(range(len(names))):
        raise ModelImportError(f"{path}: rows must be numbered 0..{len(names) - 1}, each once")
    return [names[i] for i in range(len(names))]


__all__ = ["NAMES", "PARQUET", "npy", "SAFETENSORS", "TABLES", "read_arrays", "read_names", "read_parquet"]
