"""A PyKEEN `save_to_directory` folder as an Imported model (needs torch and pykeen: the `pykeen` extra).

Conventions, checked against PyKEEN 1.11.1's source:
- scores (pykeen/nn/modules.py): TransEInteraction -||h + r - t||_p (negative_norm_of_sum, p = scoring_fct_norm),
  DistMultInteraction sum h r t, ComplExInteraction Re(<h, r, conj(t)>), RotatEInteraction -||h o r - t||_2 over
  complex numbers (negative_norm(h - t, p=2): the square root of the summed squared moduli, not RotatE's sum of
  moduli, hence the scorer rotate-l2);
- complex embeddings (pykeen/nn/representation.py, Embedding): a float weight (N, 2d) viewed as (N, d, 2) and read
  with torch.view_as_complex, i.e. interleaved re_0, im_0, re_1, ...; here they become [re | im] halves;
- RotatE relations are complex numbers kept at modulus 1 by the complex_normalize constrainer (pykeen/utils.py); here
  they become their phases;
- the tables are what the model's representation modules return in eval mode, so a normalizer applies as in
  PyKEEN's own scoring; names come from training_triples/entity_to_id.tsv.gz and relation_to_id.tsv.gz (pandas
  to_csv: a header `id<TAB>label`, then one row per id), the known triples from numeric_triples.tsv.gz;
- a model trained with inverse triples (`create_inverse_triples`, pykeen/models/base.py, pykeen/inverse.py) holds
  2R relation rows, relation r at row 2r and its inverse at 2r + 1 (DefaultRelationInverter), and predicts heads
  (predict_h, score_h_inverse) as f(t, r_inv, *): read as a model with reciprocal relations (core/scorers.py), rows
  0..R-1 the relations and R..2R-1 their inverses.

Unpickling trained_model.pkl runs code from the file (torch.load with weights_only=False): import only your own.
"""

from __future__ import annotations

import csv
import gzip
import io
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.errors import ModelImportError
from earl_service.imports.imported import Imported

MODEL_FILE = "trained_model.pkl"
TRIPLES_DIR = "training_triples"
MODULUS_TOLERANCE = 1e-4  # |r_i| of a RotatE relation may differ from 1 by float rounding only


def is_pykeen_folder(path: Path) -> bool:
    return (path / MODEL_FILE).is_file()


def read_pykeen(folder: str | Path) -> Imported:
    """The model, names and training triples of a PyKEEN save_to_directory folder."""
    folder = Path(folder)
    files = {"model": folder / MODEL_FILE, "entity_names": folder / TRIPLES_DIR / "entity_to_id.tsv.gz",
             "relation_names": folder / TRIPLES_DIR / "relation_to_id.tsv.gz"}
    for path in files.values():
        if not path.is_file():
            raise ModelImportError(f"{path}: missing; a PyKEEN folder (pipeline result save_to_directory) holds "
                                   f"{MODEL_FILE} and {TRIPLES_DIR}/entity_to_id.tsv.gz, relation_to_id.tsv.gz")
    model = _load_model(files["model"])
    kind = _scorer_of(model, files["model"])
    entities, relations = _tables(model, kind, files["model"])
    reciprocal = bool(model.use_inverse_triples)
    if reciprocal:  # rows r, r_inv interleaved -> the relations, then their inverses
        relations = np.concatenate([relations[0::2], relations[1::2]])
    triples_file = folder / TRIPLES_DIR / "numeric_triples.tsv.gz"
    where = {"entities": str(files["model"]), "relations": str(files["model"]),
             "entity_names": str(files["entity_names"]), "relation_names": str(files["relation_names"]),
             "triples": str(triples_file)}
    source = {"format": "pykeen", "library": f"pykeen {metadata.version('pykeen')}",
              "class": type(model).__name__, "scorer": kind, "source": folder.name,
              **({"reciprocal": True} if reciprocal else {})}
    return Imported(kind, entities, relations, read_id_names(files["entity_names"]),
                    read_id_names(files["relation_names"]), where,
                    read_numeric_triples(triples_file) if triples_file.is_file() else None, source,
                    reciprocal=reciprocal)


def _load_model(path: Path) -> Any:
    try:
        import pykeen  # noqa: F401 - the pickle's classes live there
        import torch
    except ImportError as exc:
        raise ModelImportError(f"{path}: reading a PyKEEN model unpickles it, which needs pykeen ({exc.name} is not "
                               "installed): pip install 'earl-service[pykeen]'") from None
    try:
        model = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - a pickle fails in any way its classes do
        raise ModelImportError(f"{path}: not a PyKEEN model torch can load ({type(exc).__name__}: {exc})") from None
    return model.eval() if hasattr(model, "eval") else model


def _scorer_of(model: Any, path: Path) -> str:
    """The scorer of a PyKEEN ERModel with one plain embedding per entity and relation; ModelImportError else."""
    from pykeen.models import ERModel
    from pykeen.nn.modules import ComplExInteraction, DistMultInteraction, RotatEInteraction, TransEInteraction

    if not isinstance(model, ERModel):
        raise ModelImportError(f"{path}: a {type(model).__name__}, not a PyKEEN ERModel")
    from pykeen.inverse import DefaultRelationInverter

    if model.use_inverse_triples and type(model.relation_inverter) is not DefaultRelationInverter:
        raise ModelImportError(f"{path}: inverse relations laid out by {type(model.relation_inverter).__name__}; "
                               "PyKEEN's DefaultRelationInverter (r at 2r, its inverse at 2r + 1) is read")
    if len(model.entity_representations) != 1 or len(model.relation_representations) != 1:
        raise ModelImportError(f"{path}: {type(model).__name__} has several representations per entity or relation")
    interaction = model.interaction
    kinds = {DistMultInteraction: "distmult", ComplExInteraction: "complex", RotatEInteraction: "rotate-l2"}
    if type(interaction) is TransEInteraction:
        if interaction.power_norm or float(interaction.p) not in (1.0, 2.0):
            raise ModelImportError(f"{path}: TransE with p={interaction.p}, power_norm={interaction.power_norm}; "
                                   "p 1 or 2 without power_norm is read")
        return f"transe-l{int(interaction.p)}"
    if type(interaction) not in kinds:
        raise ModelImportError(f"{path}: {type(model).__name__} ({type(interaction).__name__}) has no scorer here; "
                               "TransE, DistMult, ComplEx and RotatE are read")
    return kinds[type(interaction)]


def _tables(model: Any, kind: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Entity (N, 2d) and relation rows in the scorers' layout from the model's representations (eval mode)."""
    import torch

    with torch.no_grad():
        entities = model.entity_representations[0](indices=None).detach().cpu()  # (N, d) complex or (N, w) real
        relations = model.relation_representations[0](indices=None).detach().cpu()
    if entities.ndim != 2 or relations.ndim != 2:
        raise ModelImportError(f"{path}: representations of shape {tuple(entities.shape[1:])}, not vectors")
    if kind == "rotate-l2":
        moduli = relations.abs()
        if float((moduli - 1).abs().max()) > MODULUS_TOLERANCE:
            raise ModelImportError(f"{path}: RotatE relations of modulus {float(moduli.min()):.4g} to "
                                   f"{float(moduli.max()):.4g}; a rotation has modulus 1 (complex_normalize)")
        relations = torch.angle(relations)  # (R, d) radians
    return _halves(entities), _halves(relations)


def _halves(x: Any) -> np.ndarray:
    """A complex (rows, d) tensor as [re | im] halves (rows, 2d) float32; a real one as it is."""
    import torch

    if torch.is_complex(x):
        x = torch.cat([x.real, x.imag], dim=-1)
    return x.float().numpy()


def read_id_names(path: Path) -> list[str]:
    """Names in id order from PyKEEN's `id<TAB>label` table (a header row, then ids 0..N-1 in any order)."""
    rows = list(csv.reader(io.StringIO(_gunzip(path)), delimiter="\t"))
    if not rows or [c.lower() for c in rows[0]] != ["id", "label"]:
        raise ModelImportError(f"{path}: expected a header `id<TAB>label` (PyKEEN's entity_to_id / relation_to_id)")
    names: dict[int, str] = {}
    for line, row in enumerate(rows[1:], 2):
        if len(row) != 2 or not row[0].isdigit():
            raise ModelImportError(f"{path}, line {line}: expected an id and a label, got {row!r}")
        names[int(row[0])] = row[1]
    if sorted(names) != list(range(len(names))):
        raise ModelImportError(f"{path}: ids must be 0..{len(names) - 1}, each once")
    return [names[i] for i in range(len(names))]


def read_numeric_triples(path: Path) -> np.ndarray:
    """(E, 3) int64 ids from PyKEEN's numeric_triples.tsv.gz (a header `head relation tail`)."""
    try:
        triples = np.loadtxt(io.StringIO(_gunzip(path)), dtype=np.int64, delimiter="\t", skiprows=1, ndmin=2)
    except ValueError as exc:
        raise ModelImportError(f"{path}: expected a header and rows of three integer ids ({exc})") from None
    if triples.size and triples.shape[1] != 3:
        raise ModelImportError(f"{path}: {triples.shape[1]} columns, expected head, relation, tail ids")
    return triples.reshape(-1, 3)


def _gunzip(path: Path) -> str:
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ModelImportError(f"{path}: not a gzip file of UTF-8 text ({exc})") from None


__all__ = ["is_pykeen_folder", "read_id_names", "read_numeric_triples", "read_pykeen"]
