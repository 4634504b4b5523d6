"""Plain arrays as an Imported model: an entity and a relation table (.npy, or one .safetensors), two name files and
a named scorer. The npy layout is what `earl export --format npy` writes, so an exported bundle imports back.

In the folder (the first name found of each part):
- entity table: entity_embeddings.npy, or tensor `entity_embeddings` of embeddings.safetensors: (N, w) floats;
- relation table: relation_embeddings.npy or relation_phases.npy, or tensor `relation_embeddings` of
  embeddings.safetensors: (R, w) floats, or (R, w / 2) phases in radians for rotate and rotate-l2;
- names: entities.tsv or entity_ids.txt, relations.tsv or relation_ids.txt: one name a line in row order, or
  `row<TAB>name` lines (DGL-KE's, PyKEEN's) after an optional header whose first field is not a number.
Complex tables (complex, rotate, rotate-l2) hold [re | im] halves: re_0..re_{d-1}, then im_0..im_{d-1}.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from earl_service.errors import ModelImportError
from earl_service.imports.imported import Imported

TABLES = {"entities": ("entity_embeddings.npy",), "relations": ("relation_embeddings.npy", "relation_phases.npy")}
SAFETENSORS = "embeddings.safetensors"
SAFETENSORS_NAMES = {"entities": "entity_embeddings", "relations": "relation_embeddings"}
NAMES = {"entity_names": ("entities.tsv", "entity_ids.txt"), "relation_names": ("relations.tsv", "relation_ids.txt")}


def read_arrays(folder: str | Path, scorer: str) -> Imported:
    """The tables and names in `folder` for `scorer` (core.scorers' names, or rotate)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelImportError(f"{folder}: not a folder; --format arrays reads a folder of tables and name files")
    files = {part: _first(folder, names, part) for part, names in NAMES.items()}
    tables = _tables(folder)
    where = {part: str(path) for part, path in files.items()} | {part: file for part, (_, file) in tables.items()}
    source = {"format": "arrays", "scorer": scorer, "source": folder.name}
    return Imported(scorer, tables["entities"][0], tables["relations"][0], read_names(files["entity_names"]),
                    read_names(files["relation_names"]), where, None, source)


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


__all__ = ["NAMES", "npy", "SAFETENSORS", "TABLES", "read_arrays", "read_names"]
