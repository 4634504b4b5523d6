"""Compress jobs: a job with max_bytes runs compress() in its run folder instead of train(), a job naming a
registered model (source_model) the search over that model's sizes (imports/compress.py), and its model keeps
the report. The settings are read here (by the option table of compress/options.py) for the API too (before
queueing) and for the worker (when it runs)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from earl_service.compress.config import CompressConfig, split_models, split_names
from earl_service.compress.options import FORM_COMPRESS_OPTIONS, compress_config_from_options
from earl_service.compress.state import PICK, STATE
from earl_service.config import ModelKind, TrainConfig
from earl_service.errors import ConfigError
from earl_service.service.home import ServiceHome
from earl_service.service.records import Job, tenant_of
from earl_service.service.registry import ModelRegistry

log = logging.getLogger(__name__)

def compress_settings(params: Mapping[str, Any]) -> CompressConfig | None:
    """The search a job's params ask for (compress_config_from_options: max_bytes, time_limit, models,
    precisions, metric, seed); None for a training job (no max_bytes). ConfigError for a bad size, a missing time
    limit, an unknown name, or a compress-only field in a training job."""
    if params.get("max_bytes") is None:
        given = [o.name for o in FORM_COMPRESS_OPTIONS if params.get(o.name) is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: only a compress job takes them; give max_bytes too")
        return None
    if not params.get("time_limit"):
        raise ConfigError("a compress job (max_bytes) needs time_limit: the minutes the search may take")
    if params.get("nproc_per_node"):
        raise ConfigError("a compress job trains in the worker's own process: leave nproc_per_node at 0")
    return compress_config_from_options(params)


def job_progress(event: dict[str, Any], *, resumed: bool) -> dict[str, Any]:
    """A compress progress event as the job's progress: the stage, which candidate, which rung (from 0) of how
    many, the seconds left, and whether this attempt continued a search an earlier one saved."""
    return {"job": "compress", **event, "time_left": round(event["time_left"], 1), "resumed": resumed}


def run_compress(home: ServiceHome, job: Job, *, search: CompressConfig,
                 train_configs: Mapping[ModelKind, TrainConfig],
                 on_progress: Callable[[dict[str, Any]], None], should_stop: Callable[[], bool]) -> Path | None:
    """compress() as `search` (compress_settings of the job's params) asks, on the job's uploads in runs/<job>/;
    the pick's path, or None when stopped. A rerun (the job requeued after a worker stopped or died) continues
    from the last rung the folder's saved state holds."""
    from earl_service.compress.search import compress
    from earl_service.config.options import data_config_from_options
    from earl_service.data.dataset import load_dataset

    uploads, run_dir = home.upload_dir(job.id), home.run_dir(job.id)
    resumed = (run_dir / STATE).exists()
    if resumed:
        log.info("job %s: continuing the compress search saved in %s", job.id, home.relative(run_dir))
    dataset = load_dataset(uploads, data=data_config_from_options(job.params))
    report = compress(dataset, run_dir, search, train_configs=train_configs, should_stop=should_stop,
                      on_progress=lambda event: on_progress(job_progress(event, resumed=resumed)))
    return None if report is None else run_dir / PICK


def compress_model(registry: ModelRegistry, job: Job, *, on_progress: Callable[[dict[str, Any]], None],
                   should_stop: Callable[[], bool],
                   train_configs: Mapping[ModelKind, TrainConfig] | None = None) -> Path | None:
    """compress_imported over the version of model params["source_model"] the job was queued for, scored on and
    fine-tuned against the job's uploads when it has them (train and valid); the pick's path, or None when
    stopped. ConfigError when no size fits, naming the smallest; UnknownModelError when the model is gone. The
    API checked who may read the model when it queued the job, so the registry is read here without a tenant.
    params["retrain_minutes"] (with the uploads): models trained at the budget too (compress/retrained.py), their
    candidates trained as `train_configs` say."""
    from earl_service.compress.retrained import compress_from
    from earl_service.imports.compress import PICK as IMPORTED_PICK
    from earl_service.imports.compress import ImportedSearch

    params = job.params
    source = registry.version(params["source_model"], params.get("source_version"))
    search = ImportedSearch(max_bytes=int(params["max_bytes"]), time_limit_minutes=float(params["time_limit"]),
                            seed=int(params.get("seed") or 0), precisions=split_names(params.get("precisions") or ""))
    graph = registry.home.upload_dir(job.id) if job.files else None
    shown = (f"model {params['source_model']} version {source.number}", "the job's uploads" if graph else None)

    def forward(event: dict[str, Any]) -> None:
        on_progress({"job": "compress", **event, "time_left": round(event["time_left"], 1)})

    report = compress_from(source.path, registry.home.run_dir(job.id), search, graph, shown=shown,
                           retrain_minutes=float(params.get("retrain_minutes") or 0) if graph else 0.0,
                           retrain_models=split_models(params["models"]) if params.get("models") else None,
                           train_configs=train_configs, on_progress=forward, should_stop=should_stop)
    if report is None:
        return None
    if report["pick"] is None:
        smallest = min(report["candidates"], key=lambda r: r.get("bytes", r["estimate"]))
        raise ConfigError(f"no size of model {params['source_model']} fits in max_bytes {search.max_bytes}: the "
                          f"smallest, {smallest['precision']}, takes {smallest.get('bytes', smallest['estimate'])} "
                          "bytes; give more")
    return registry.home.run_dir(job.id) / IMPORTED_PICK


def publish_pick(registry: ModelRegistry, job: Job, pick: Path, *, worker_id: str) -> None:
    """Publish the pick as model `job.id` (a copy: the run folder keeps its own), then keep the report with the
    model, where a delete removes it. After the publish: a failure there never leaves files without a model."""
    from earl_service.compress.report import FRONTIER_PNG, REPORT_JSON, REPORT_MD

    staged = pick.parent / f".pick.{worker_id}.tmp"  # hidden .tmp: swept if a crash leaves it
    try:
        shutil.copyfile(pick, staged)
        registry.publish(job.id, staged, job_id=job.id, owner=tenant_of(job))
    finally:
        staged.unlink(missing_ok=True)
    for kind, name in (("json", REPORT_JSON), ("md", REPORT_MD), ("png", FRONTIER_PNG)):
        if (pick.parent / name).is_file():  # a registered model's search draws no frontier
            keep(pick.parent / name, registry.home.report_path(job.id, kind))


def keep(source: Path, dest: Path) -> None:
    """Copy `source` to `dest` in one os.replace (a reader never sees half a report)."""
    from earl_service.atomic import replacing

    with replacing(dest) as tmp:
        shutil.copyfile(source, tmp)


__all__ = ["compress_model", "compress_settings", "job_progress", "publish_pick", "run_compress"]
