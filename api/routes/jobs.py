"""POST /jobs (upload + enqueue), GET /jobs, GET /jobs/{id}, POST /jobs/{id}/cancel."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request, UploadFile

from earl_service.errors import UnknownJobError
from earl_service.worker.records import STATES, TERMINAL, Job, new_id

from ..compress_jobs import check_uploads, job_params
from ..deps import HomeDep, JobId, SettingsDep, StoreDep
from ..errors import NOT_FOUND
from ..schemas import JobCreated, JobOut, TrainForm
from ..uploads import save_job_files

router = APIRouter(prefix="/jobs", tags=["jobs"])
FILES = ("train", "valid", "test", "relation_labels")


async def reject_unknown_fields(request: Request) -> None:
    """422 for a form field that is neither a training option nor a file: a typo must not pass silently."""
    unknown = sorted(set((await request.form()).keys()) - set(TrainForm.model_fields) - set(FILES))
    if unknown:
        raise HTTPException(422, f"unknown form field(s): {', '.join(unknown)}; expected the files "
                                 f"{', '.join(FILES)} and options {', '.join(TrainForm.model_fields)}")


def found(job: Job | None, job_id: str) -> Job:
    """The store's answer, or UnknownJobError (404) when it holds no job `job_id`."""
    if job is None:
        raise UnknownJobError(job_id)
    return job


@router.post("", status_code=202, response_model=JobCreated,
             dependencies=[Depends(reject_unknown_fields)])
def create_job(settings: SettingsDep, home: HomeDep, store: StoreDep, params: Annotated[TrainForm, Form()],
               train: UploadFile, valid: UploadFile | None = None, test: UploadFile | None = None,
               relation_labels: UploadFile | None = None) -> JobCreated:
    """Queue a training job, or with `max_bytes` a compress job; the files are checked (format, encoding,
    columns) before anything is queued, and a compress job's settings, valid file and budget too.

    `relation_labels` (optional) is a JSON object mapping relation names to readable labels
    ({"P27": "country of citizenship"} or CoDEx's {"P27": {"label": ...}}); predictions then carry them.
    """
    stored, compress = job_params(params.model_dump())
    job_id = new_id()
    files, counts = save_job_files(home, job_id, {"train": train, "valid": valid, "test": test},
                                   labels=relation_labels, max_bytes=settings.max_unpacked_bytes)
    if compress is not None:
        check_uploads(home, job_id, files, compress, max_unpacked=settings.max_unpacked_bytes)
    job = store.create_job(stored, files, job_id=job_id)
    return JobCreated(id=job.id, state=job.state, triples=counts)


@router.get("", response_model=list[JobOut])
def list_jobs(store: StoreDep, state: Annotated[Literal[STATES] | None, Query()] = None,  # type: ignore[valid-type]
              limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[JobOut]:
    return [JobOut(**j.to_dict()) for j in store.list_jobs(state=state, limit=limit)]


@router.get("/{job_id}", response_model=JobOut, responses=NOT_FOUND)
def get_job(job_id: JobId, store: StoreDep) -> JobOut:
    return JobOut(**found(store.get_job(job_id), job_id).to_dict())


@router.post("/{job_id}/cancel", response_model=JobOut, responses=NOT_FOUND)
def cancel_job(job_id: JobId, store: StoreDep) -> JobOut:
    """Cancel a queued job at once; a running one stops at its next step (state becomes cancelled)."""
    job = found(store.request_cancel(job_id), job_id)
    if job.state in TERMINAL and job.state != "cancelled":
        raise HTTPException(409, f"job {job_id} already {job.state}; nothing to cancel")
    return JobOut(**job.to_dict())
