"""Models trained elsewhere, read into bundles (`earl import`): a PyKEEN folder (`from_pykeen`, needs the pykeen
extra), DGL-KE (`from_dglke`), PyTorch-BigGraph (`from_pbg`, needs h5py), GraphVite (`from_graphvite`, through
`safe_pickle`), LibKGE (`from_libkge`) or plain arrays with a named scorer (`from_arrays`), checked and laid out as
core/scorers.py reads them (`imported`); `compress` searches an imported bundle's precisions under a byte budget.
May import `core`, `config`, `data` and `bundle`; docs/import.md has the formats and conventions.
"""

from __future__ import annotations

import os
from pathlib import Path

from earl_service.errors import ModelImportError
from earl_service.imports.from_arrays import read_arrays
from earl_service.imports.from_dglke import is_dglke_folder, read_dglke
from earl_service.imports.from_graphvite import SCORERS as GRAPHVITE_SCORERS
from earl_service.imports.from_graphvite import is_graphvite_file, read_graphvite
from earl_service.imports.from_libkge import is_libkge_source, read_libkge
from earl_service.imports.from_pbg import is_pbg_folder, read_pbg
from earl_service.imports.from_pykeen import is_pykeen_folder, read_pykeen
from earl_service.imports.imported import KINDS, Imported, to_bundle

FORMATS = ("pykeen", "dglke", "pbg", "graphvite", "libkge", "arrays")
DETECT = (("pykeen", is_pykeen_folder), ("dglke", is_dglke_folder), ("pbg", is_pbg_folder),
          ("graphvite", is_graphvite_file), ("libkge", is_libkge_source))


def detect(path: Path) -> str:
    """The format a source looks like (DETECT's first match), arrays when none."""
    return next((fmt for fmt, looks in DETECT if looks(path)), "arrays")


def read_model(source: str | os.PathLike, *, fmt: str | None = None, scorer: str | None = None) -> Imported:
    """The checked model in `source`, read as `fmt` (None: detect()); plain arrays need their `scorer` (KINDS), a
    GraphVite pickle saved without its hyperparameters may name it."""
    path = Path(source)
    if not path.exists():
        raise ModelImportError(f"{path}: no such file or folder")
    fmt = fmt or detect(path)
    if fmt not in FORMATS:
        raise ModelImportError(f"unknown format {fmt!r}: choose {', '.join(FORMATS)}")
    if fmt == "arrays":
        if scorer is None:
            raise ModelImportError(f"{path}: plain arrays need --scorer, one of {', '.join(KINDS)}")
        return read_arrays(path, scorer).checked()
    if fmt == "graphvite":
        by_scorer = {v: k for k, v in GRAPHVITE_SCORERS.items()}
        if scorer is not None and scorer not in by_scorer:
            raise ModelImportError(f"--scorer {scorer}: a GraphVite model is one of {', '.join(by_scorer)}")
        return read_graphvite(path, by_scorer.get(scorer or "")).checked()
    if scorer is not None:
        raise ModelImportError(f"--scorer is for --format arrays and graphvite: a {fmt} model names its own")
    readers = {"pykeen": read_pykeen, "dglke": read_dglke, "pbg": read_pbg, "libkge": read_libkge}
    return readers[fmt](path).checked()


__all__ = ["FORMATS", "KINDS", "Imported", "detect", "read_model", "to_bundle"]
