"""A compress job's checks before it is queued: its settings, a valid split, a budget above the graph's own bytes;
for a job over a registered model (source_model), a model whose sizes can be searched and a budget above the
smallest of them (from the bundle's header and shapes: no weight is read; 0.14 ms on a 205 MB imported bundle of
200,000 x 256 floats, where load_bundle takes 2.3 s).

Torch-free, on the train table the upload check read: the exact smallest bundle (weights at the smallest dim)
needs the models' shapes, so a budget between the graph's bytes and that fails in the worker, with the minimum in
the job's error; so does a budget under the bytes of a graph too big to pack in the request (budget_floor).
"""

from __future__ import annotations

import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from earl_service.bundle.precision import Precision
from earl_service.compress.config import CompressConfig, budget_floor, checked_models, parse_size, split_names
from earl_service.compress.job import compress_settings
from earl_service.config.options import recipe_options
from earl_service.core import scorers
from earl_service.data.triples import TripleTable
from earl_service.errors import ConfigError, DatasetError
from earl_service.imports import sizes
from earl_service.service.home import ServiceHome
from earl_service.service.records import ModelRecord
from earl_service.service.registry import version_number

from .schemas import CompressForm


def job_params(form: dict[str, Any], *, given: Collection[str]) -> tuple[dict[str, Any], CompressConfig | None]:
    """The params to store and the compress settings (None for a training job, whose params keep no compress
    field); ConfigError (422) for bad ones. max_bytes is stored in bytes, so the job shows what '2MB' meant.

    The options the request left out (not in `given`) that its recipe sets take the recipe's values: a training
    job stores them, so that it shows what it trains with; a compress job stores None ("the recipe's"), since
    they differ by the model kind of each candidate (the worker fills them in)."""
    config = compress_settings(form)
    left = {k: v for k, v in recipe_options(form["recipe"], form["model"]).items() if k not in given}
    if config is None:
        params = {k: v for k, v in {**form, **left}.items() if k not in CompressForm.model_fields}
        _check_precision(params)
        return params, None
    return {**form, **dict.fromkeys(left, None), "max_bytes": config.max_bytes}, config


def _check_precision(params: dict[str, Any]) -> None:
    """A training job's precision must fit its dim (pq:M: M dividing 2 * dim), known before training, not after."""
    try:
        Precision.parse(params["precision"]).resolve(params["dim"])
    except ValueError as exc:
        raise ConfigError(f"precision {params['precision']} cannot export a model of dim {params['dim']}: "
                          f"{exc}") from exc


def trained_params(params: dict[str, Any], config: CompressConfig | None) -> list[dict[str, Any]]:
    """The settings each model kind a job trains gets: its params for a training job; for a compress job, its
    params with each searched model's recipe values where they hold None (the server's caps apply to each)."""
    if config is None:
        return [params]
    return [{**params, **{k: v for k, v in recipe_options(params["recipe"], model).items() if params.get(k) is None}}
            for model in config.models]


def check_uploads(home: ServiceHome, job_id: str, files: dict[str, str], config: CompressConfig, *,
                  train: TripleTable) -> None:
    """Refuse a compress job whose uploads cannot give a pick (`train`: its train file, as the upload check read
    it); the job's upload folder is removed then."""
    try:
        if "valid" not in files:
            raise DatasetError("a compress job picks on validation metrics: upload a valid file too")
        graph = not config.graphless  # the smallest bundle of any model searched: one without the graph if any
        floor = budget_floor(config.max_bytes, train.ids, train.entities, train.relations, graph=graph)
        if floor is not None:
            kept = "the graph and vocabularies" if graph else "the vocabularies"
            raise ConfigError(f"max_bytes {config.max_bytes} is below the smallest bundle for this graph: {kept} "
                              f"alone take {floor} bytes, the weights come on top; give more than {floor} bytes"
                              + _graphless_way_out(config, train))
    except BaseException:
        shutil.rmtree(home.upload_dir(job_id), ignore_errors=True)
        raise


def _graphless_way_out(config: CompressConfig, train: TripleTable) -> str:
    """The way out where the graph fills the budget but a searched model could leave it out."""
    optional = config.could_leave_graph
    if not optional or budget_floor(config.max_bytes, train.ids, train.entities, train.relations, graph=False):
        return ""
    return (f", or known_answers none: {', '.join(optional)} bundles then leave the graph out (answers may include "
            "facts the graph holds)")


# What a job over a registered model may set; anything else (dim, steps, models, ...) has nothing to act on.
MODEL_JOB_FIELDS = ("source_model", "max_bytes", "time_limit", "precisions", "seed", "retrain_minutes", "models")


def model_job_params(form: dict[str, Any], *, given: Collection[str], record: ModelRecord, bundle: Path,
                     max_minutes: float) -> dict[str, Any]:
    """The params to store for a compress job over model `record` (its file `bundle`): ConfigError (422) for a
    field that does not apply, a model with an encoder (EARL), a bad precision, or a budget below its smallest
    size; the version compressed is the latest now, whatever comes after. time_limit 0: the search's
    default (imports/sizes.DEFAULT_MINUTES), within the server's EARL_MAX_JOB_MINUTES."""
    extra = sorted(set(given) - set(MODEL_JOB_FIELDS))
    if extra:
        raise ConfigError(f"{', '.join(extra)}: a job over a registered model (source_model) searches its sizes and "
                          f"takes only {', '.join(MODEL_JOB_FIELDS)} (and train + valid files to score them)")
    if form.get("max_bytes") is None:
        raise ConfigError("a job over a registered model (source_model) compresses it: give max_bytes")
    config = record.config
    if config.get("model") == "earl":
        raise ConfigError(f"model {record.id} is an EARL model: its encoder is compressed by training (POST /jobs "
                          "with its triples and max_bytes); source_model takes one with a row per entity (a RotatE "
                          f"trained here, or imported: {', '.join(scorers.IMPORTED)})")
    max_bytes, minutes = parse_size(form["max_bytes"]), float(form.get("time_limit") or 0)
    if minutes > max_minutes:
        raise ConfigError(f"time_limit (minutes) {minutes:,} is over {max_minutes:,} (EARL_MAX_JOB_MINUTES)")
    minutes = minutes or min(sizes.DEFAULT_MINUTES, max_minutes)
    retrain = float(form.get("retrain_minutes") or 0)
    if minutes + retrain > max_minutes:
        raise ConfigError(f"time_limit {minutes:,} + retrain_minutes {retrain:,} is over {max_minutes:,} minutes "
                          "(EARL_MAX_JOB_MINUTES)")
    models = checked_models(form["models"]) if form.get("models") else ()
    if models and not retrain:
        raise ConfigError("models names the models retrain_minutes trains at the budget; a registered model's sizes "
                          "are its own")
    precisions = split_names(form.get("precisions") or "")
    floor, precision = _smallest(record, bundle, precisions)
    if max_bytes < floor:
        raise ConfigError(f"max_bytes {max_bytes} is below the smallest size of model {record.id}: {precision} "
                          f"takes {floor} bytes before its header; give at least that, with room for the header")
    return {"source_model": record.id, "source_version": version_number(record), "max_bytes": max_bytes,
            "time_limit": minutes, "precisions": ",".join(precisions) or None, "seed": form.get("seed") or 0,
            "retrain_minutes": retrain, "models": ",".join(models) or None}


def check_model_job_files(given: Collection[str]) -> None:
    """A job over a registered model takes train and valid (and test) together or no file: they are the graph
    that scores each size (valid) and fine-tunes pq codebooks (train); label files have nothing to label."""
    if given and not {"train", "valid"} <= set(given):
        raise DatasetError("a job over a registered model takes train and valid files together (valid scores each "
                           "size, train fine-tunes pq codebooks), or no file")
    labels = sorted(set(given) - {"train", "valid", "test"})
    if labels:
        raise DatasetError(f"{', '.join(labels)}: a job over a registered model keeps the model's own labels")


def _smallest(record: ModelRecord, bundle: Path, precisions: tuple[str, ...]) -> tuple[int, str]:
    """(bytes, precision) of the model's smallest size searched, its header left out: its fixed parts as the file
    stores them (from its header), its tables (entities (N, 2d), relations (R, d or 2d)) as each precision would."""
    config, dim = record.config, int(record.config["dim"])
    scorer = scorers.scorer(config["model"], gamma=config["gamma"], epsilon=config["epsilon"], dim=dim,
                            reciprocal=bool(config.get("reciprocal", False)))
    shapes: sizes.Shapes = {"entities": (record.entities, 2 * dim),
                            "relations": (scorer.relation_rows(record.relations), scorer.relation_width(dim))}
    try:
        return sizes.smallest(config["model"], dim, shapes, fixed_bytes=sizes.fixed_bytes(bundle),
                              precisions=precisions)
    except ValueError as exc:  # an unknown precision, or pq:M with M not dividing the row width
        raise ConfigError(f"precisions: {exc}") from exc


__all__ = ["check_model_job_files", "check_uploads", "job_params", "model_job_params", "trained_params"]
