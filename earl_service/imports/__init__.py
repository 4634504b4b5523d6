"""Models trained elsewhere, read into bundles (`earl import`): a PyKEEN folder (`from_pykeen`, needs the pykeen
extra) or plain arrays with a named scorer (`from_arrays`), checked and laid out as core/scorers.py reads them
(`imported`). May import `core`, `config`, `data` and `bundle`; docs/import.md has the formats and conventions.
"""

from __future__ import annotations

import os
from pathlib import Path

from earl_service.errors import ModelImportError
from earl_service.imports.from_arrays import read_arrays
from earl_service.imports.from_pykeen import is_pykeen_folder, read_pykeen
from earl_service.imports.imported import KINDS, Imported, to_bundle

FORMATS = ("pykeen", "arrays")


def read_model(source: str | os.PathLike, *, fmt: str | None = None, scorer: str | None = None) -> Imported:
    """The checked model in `source`, read as `fmt` (None: pykeen when the folder holds trained_model.pkl, else
    arrays); plain arrays need their `scorer` (KINDS)."""
    path = Path(source)
    if not path.exists():
        raise ModelImportError(f"{path}: no such file or folder")
    fmt = fmt or ("pykeen" if is_pykeen_folder(path) else "arrays")
    if fmt not in FORMATS:
        raise ModelImportError(f"unknown format {fmt!r}: choose {' or '.join(FORMATS)}")
    if fmt == "pykeen":
        if scorer is not None:
            raise ModelImportError("--scorer is for --format arrays: a PyKEEN model names its own")
        return read_pykeen(path).checked()
    if scorer is None:
        raise ModelImportError(f"{path}: plain arrays need --scorer, one of {', '.join(KINDS)}")
    return read_arrays(path, scorer).checked()


__all__ = ["FORMATS", "KINDS", "Imported", "read_model", "to_bundle"]
