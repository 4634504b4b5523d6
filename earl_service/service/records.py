"""What the job store holds: a training `Job`, a served `ModelRecord`, the job states and new ids."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from earl_service.bundle.precision import DEFAULT
from earl_service.service.tenants import DEFAULT_TENANT

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")
UNFINISHED = ("queued", "running")


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Job:
    """One training request. `files` maps split names to paths relative to the service home; params["tenant"] names
    its owner (`tenant_of`) and params["client"] the holder its queue quota counts."""

    id: str
    state: str = "queued"
    params: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    created: float = 0.0
    started: float | None = None
    finished: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)  # step, total, loss, valid_mrr, elapsed
    error: str | None = None
    model_id: str | None = None
    attempts: int = 0
    worker: str | None = None
    heartbeat: float | None = None
    cancel_requested: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Job:
        job = cls(**_known_fields(cls, values))
        job.cancel_requested = bool(job.cancel_requested)  # SQLite keeps it as 0 or 1
        return job


@dataclass
class ModelRecord:
    """A bundle the service can serve: where it lies and what load_bundle said about it."""

    id: str
    path: str  # relative to the service home
    sha256: str
    bytes: int
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    parameters: int = 0
    precision: str = DEFAULT.name  # the bundle's (a bundle/precision.py Precision's name)
    entities: int = 0
    relations: int = 0
    job_id: str | None = None
    owner: str = DEFAULT_TENANT  # the tenant that made it (tenants.py); records from before tenants: the default
    stored: int = 0  # bytes of every version's file on disk, for the tenant's quota (0 in records from before)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelRecord:
        return cls(**_known_fields(cls, values))


def tenant_of(job: Job) -> str:
    """The tenant a job belongs to: params["tenant"], the default tenant for jobs from before tenants."""
    return str(job.params.get("tenant") or DEFAULT_TENANT)


def _known_fields(cls: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of `values` that name a field of the dataclass `cls`: a stored row may carry others."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}


__all__ = ["STATES", "TERMINAL", "UNFINISHED", "Job", "ModelRecord", "new_id", "tenant_of"]
