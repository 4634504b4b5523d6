"""A compress job's checks before it is queued: its settings, a valid split, a budget above the graph's own bytes.

Torch-free, on the train table the upload check read: the exact smallest bundle (weights at the smallest dim)
needs the models' shapes, so a budget between the graph's bytes and that fails in the worker, with the minimum in
the job's error; so does a budget under the bytes of a graph too big to pack in the request (budget_floor).
"""

from __future__ import annotations

import shutil
from collections.abc import Collection
from typing import Any

from earl_service.bundle.precision import Precision
from earl_service.compress.config import CompressConfig, budget_floor
from earl_service.compress.job import compress_settings
from earl_service.config.options import recipe_options
from earl_service.data.triples import TripleTable
from earl_service.errors import ConfigError, DatasetError
from earl_service.service.home import ServiceHome

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
        graph = len(config.graphless) < len(config.models)  # a model searched keeps its graph
        floor = budget_floor(config.max_bytes, train.ids, train.entities, train.relations, graph=graph)
        if floor is not None:
            kept = "the graph and vocabularies" if graph else "the vocabularies"
            raise ConfigError(f"max_bytes {config.max_bytes} is below the smallest bundle for this graph: {kept} "
                              f"alone take {floor} bytes, the weights come on top; give more than {floor} bytes")
    except BaseException:
        shutil.rmtree(home.upload_dir(job_id), ignore_errors=True)
        raise


__all__ = ["check_uploads", "job_params", "trained_params"]
