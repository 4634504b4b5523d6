"""POST /jobs (upload + enqueue), GET /jobs, GET /jobs/{id}, POST /jobs/{id}/cancel."""

from __future__ import annotations

import shutil
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request, Response, UploadFile

from earl_service.compress.config import CompressConfig
from earl_service.config.options import data_config_from_options
from earl_service.errors import ConfigError, DatasetError, QuotaError, UnknownJobError
from earl_service.service.housekeeping import remove
from earl_service.service.records import STATES, TERMINAL, Job, new_id, tenant_of
from earl_service.service.registry import ModelRegistry
from earl_service.service.store import JobStore

from ..audit import TARGET
from ..compress_jobs import check_model_job_files, check_uploads, job_params, model_job_params, trained_params
from ..deps import UPLOAD_SLOT, HomeDep, JobId, PrincipalDep, RegistryDep, SettingsDep, StoreDep
from ..errors import NOT_FOUND
from ..limits import bounded_job_params, client_key, unfinished_jobs
from ..principal import Principal, presented_token
from ..schemas import JobCreated, JobForm, JobOut
from ..settings import Settings
from ..uploads import LABEL_FIELDS, save_job_files

router = APIRouter(prefix="/jobs", tags=["jobs"])
FILES = ("train", "valid", "test", "entity_labels", "relation_labels")


async def reject_unknown_fields(request: Request) -> None:
    """422 for a form field that is neither a training option nor a file: a typo must not pass silently."""
    unknown = sorted(set((await request.form()).keys()) - set(JobForm.model_fields) - set(FILES))
    if unknown:
        raise HTTPException(422, f"unknown form field(s): {', '.join(unknown)}; expected the files "
                                 f"{', '.join(FILES)} and options {', '.join(JobForm.model_fields)}")


def found(job: Job | None, job_id: str, who: Principal) -> Job:
    """The store's answer, or UnknownJobError (404) when it holds no job `job_id` or the job is another tenant's
    (404, not 403: whether another tenant's job exists is not said)."""
    if job is None or (who.owner is not None and tenant_of(job) != who.owner):
        raise UnknownJobError(job_id)
    return job


def visible_job(store: JobStore, job_id: str, who: Principal) -> Job:
    """Job `job_id` if `who` may see it, else UnknownJobError (404)."""
    return found(store.get_job(job_id), job_id, who)


@router.post("", status_code=202, response_model=JobCreated,
             dependencies=[Depends(reject_unknown_fields), UPLOAD_SLOT])
def create_job(request: Request, response: Response, settings: SettingsDep, home: HomeDep, store: StoreDep,
               registry: RegistryDep, who: PrincipalDep, form: Annotated[JobForm, Form()],
               train: UploadFile | None = None, valid: UploadFile | None = None,
               test: UploadFile | None = None, entity_labels: UploadFile | None = None,
               relation_labels: UploadFile | None = None) -> JobCreated:
    """Queue a training job, with `max_bytes` a compress job, or with `source_model` and `max_bytes` a compress
    job over a registered model of the sender's tenant (its sizes searched, no training; train + valid, when
    given, score them). The files are checked (format, encoding, columns) before anything is queued, and a
    compress job's settings, valid file and budget too.

    `entity_labels` and `relation_labels` (optional) give readable labels: TSV lines `id<TAB>label[<TAB>description]`
    or a JSON object ({"P27": "country of citizenship"} or CoDEx's {"P27": {"label": ...}}); the bundle stores
    the labels (not the descriptions), predictions carry them and GET /models/{id}/entities searches them.
    The server's caps (EARL_MAX_JOB_*, 422) and the client's quota of unfinished jobs (EARL_MAX_QUEUED_JOBS,
    429; a key's client is its tenant) are checked before any file is stored; X-Quota-Jobs-Left says how many
    more it may queue. The job is the sender's tenant's.
    """
    client = client_key(request.app.state.secret, settings, token=presented_token(request.scope["headers"]),
                        address=request.client.host if request.client else None,
                        tenant=who.tenant if who.key_id is not None else None)
    uploads = {"train": train, "valid": valid, "test": test}
    labels = {"entity_labels": entity_labels, "relation_labels": relation_labels}
    params, compress = _job_params(form, registry, who, settings, given_files=[
        name for name, upload in {**uploads, **labels}.items() if upload is not None])
    params |= {"client": client, "tenant": who.tenant}
    if (unfinished := unfinished_jobs(store, client)) >= settings.max_queued_jobs:  # early: before any file
        raise queue_full(unfinished, settings)
    job_id = new_id()
    files, counts, tables = save_job_files(home, job_id, uploads, labels=labels,
                                           max_unpacked_bytes=settings.max_unpacked_bytes,
                                           max_triples=settings.max_upload_triples,
                                           whole=("train",) if compress is not None else (),
                                           data=data_config_from_options(params))
    if compress is not None:
        check_uploads(home, job_id, files, compress, train=tables["train"])
    try:  # the quota again, counted with the insert in one step: concurrent requests all passed the early check
        job = store.create_job(params, files, job_id=job_id, max_unfinished=settings.max_queued_jobs)
    except QuotaError as exc:
        shutil.rmtree(home.upload_dir(job_id), ignore_errors=True)
        raise queue_full(exc.count, settings) from None
    setattr(request.state, TARGET, job.id)
    response.headers["X-Quota-Jobs-Left"] = str(max(0, settings.max_queued_jobs - store.count_unfinished(client)))
    read_labels = {name: counts.pop(name)["labels"] for name in LABEL_FIELDS if name in counts}
    return JobCreated(id=job.id, state=job.state, triples=counts, labels=read_labels)


def _job_params(form: JobForm, registry: ModelRegistry, who: Principal, settings: Settings, *,
                given_files: list[str]) -> tuple[dict[str, Any], CompressConfig | None]:
    """The params to store and, for a compress job over uploads, its search: a job over a registered model
    (source_model; 404 when the sender's tenant has none of that id) is checked against the model's shapes."""
    if form.source_model is None and form.retrain_minutes:
        raise ConfigError("retrain_minutes goes with source_model: a compress job over uploads trains anyway")
    if form.source_model is not None:
        record = registry.get(form.source_model, tenant=who.owner)
        check_model_job_files(given_files)
        if form.retrain_minutes and not given_files:
            raise ConfigError("retrain_minutes needs train and valid files: the graph to train models on")
        return model_job_params(form.model_dump(), given=form.model_fields_set, record=record,
                                bundle=registry.bundle_path(record), max_minutes=settings.max_job_minutes), None
    if "train" not in given_files:
        raise DatasetError("a job needs a train file (or source_model: a registered model to compress)")
    stored, compress = job_params(form.model_dump(), given=form.model_fields_set)
    return bounded_job_params(stored, settings, trained=trained_params(stored, compress)), compress


def queue_full(unfinished: int, settings: Settings) -> HTTPException:
    return HTTPException(429, f"this client already has {unfinished} unfinished (queued or running) jobs, the most "
                              f"this server allows (EARL_MAX_QUEUED_JOBS={settings.max_queued_jobs}); wait for one "
                              "to finish or cancel one", headers={"Retry-After": "60", "X-Quota-Jobs-Left": "0"})


@router.get("", response_model=list[JobOut])
def list_jobs(store: StoreDep, who: PrincipalDep,
              state: Annotated[Literal[STATES] | None, Query()] = None,  # type: ignore[valid-type]
              limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[JobOut]:
    """The newest jobs of the sender's tenant (an admin's: every tenant's)."""
    return [JobOut(**j.to_dict()) for j in store.list_jobs(state=state, limit=limit, tenant=who.owner)]


@router.get("/{job_id}", response_model=JobOut, responses=NOT_FOUND)
def get_job(job_id: JobId, store: StoreDep, who: PrincipalDep) -> JobOut:
    return JobOut(**visible_job(store, job_id, who).to_dict())


@router.post("/{job_id}/cancel", response_model=JobOut, responses=NOT_FOUND)
def cancel_job(job_id: JobId, store: StoreDep, home: HomeDep, who: PrincipalDep) -> JobOut:
    """Cancel a queued job at once (its uploads go with it); a running one stops at its next step (state becomes
    cancelled, and its worker removes the uploads)."""
    visible_job(store, job_id, who)  # another tenant's job is unknown: nothing is cancelled
    job = found(store.request_cancel(job_id), job_id, who)
    if job.state in TERMINAL and job.state != "cancelled":
        raise HTTPException(409, f"job {job_id} already {job.state}; nothing to cancel")
    if job.state == "cancelled":
        remove(home.upload_dir(job_id))
    return JobOut(**job.to_dict())
