"""The job store's contract (`JobStore`) and `open_store`, which picks SQLite (default) or Redis from a URL or path.

Every state change that two processes could race on is one atomic step in the backend: a claim is a
single `UPDATE ... RETURNING` inside `BEGIN IMMEDIATE` (SQLite) or one Lua script (Redis), so is a client's
quota check with the insert it allows, and updates
from a worker apply only while that worker still owns the job (`worker` matches, state is running).
A job whose worker stopped heart-beating for `stale_after` seconds is claimed again (its `attempts`
grows), so a new worker can resume it from the run directory's checkpoint.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from earl_service.errors import StoreError
from earl_service.service.audit import AuditEntry
from earl_service.service.keys import ApiKey
from earl_service.service.records import Job, ModelRecord
from earl_service.service.redis_store import RedisStore
from earl_service.service.sqlite_store import SqliteStore
from earl_service.service.tenants import Quota, Usage


class JobStore(Protocol):
    """What the API and the workers need from a store; `tests/earl_service/worker/test_store.py` is its contract."""

    def create_job(self, params: dict[str, Any], files: dict[str, str], *, job_id: str | None = None,
                   max_unfinished: int | None = None) -> Job:
        """Queue a job. With `max_unfinished`, QuotaError instead when params["client"] already has that many
        queued or running jobs: the count and the insert are one step, so concurrent requests cannot all pass."""
        ...

    def get_job(self, job_id: str) -> Job | None: ...

    def list_jobs(self, *, state: str | None = None, limit: int = 100, tenant: str | None = None) -> list[Job]:
        """The newest `limit` jobs (in `state`, of `tenant`: records.tenant_of), newest first."""
        ...

    def count_jobs(self) -> dict[str, int]: ...

    def count_unfinished(self, client: str) -> int:
        """How many queued or running jobs have `client` as params["client"] (the API's queue quota)."""
        ...

    def claim_job(self, worker: str, *, stale_after: float = 60.0, max_attempts: int = 3) -> Job | None:
        """Atomically take the oldest queued job (or a running one whose heartbeat is stale) for `worker`."""
        ...

    def heartbeat(self, job_id: str, worker: str, progress: dict[str, Any] | None = None) -> Job | None:
        """Refresh the heartbeat (and progress); None when `worker` no longer owns the job."""
        ...

    def finish_job(self, job_id: str, worker: str, state: str, *, error: str | None = None,
                   model_id: str | None = None) -> Job | None: ...

    def release_job(self, job_id: str, worker: str) -> Job | None:
        """Put an owned running job back in the queue (a worker shutting down); it resumes from its checkpoint."""
        ...

    def request_cancel(self, job_id: str) -> Job | None:
        """Cancel a queued job now; flag a running one for its worker. None when the job does not exist."""
        ...

    def add_model(self, record: ModelRecord, *, quota: Quota | None = None) -> None:
        """Record (or replace) a model. With `quota`, TenantQuotaError instead when the record would take its owner
        past it: the owner's usage and the insert are one step, so concurrent registrations cannot all pass."""
        ...

    def get_model(self, model_id: str) -> ModelRecord | None: ...

    def list_models(self, *, owner: str | None = None) -> list[ModelRecord]: ...

    def tenant_usage(self, tenant: str) -> Usage:
        """The models `tenant` owns and the bytes their versions take (ModelRecord.stored)."""
        ...

    def delete_model(self, model_id: str) -> bool:
        """Unregister the model and clear the model_id of the job that produced it, in one step; False if unknown."""
        ...

    def add_key(self, key: ApiKey) -> None: ...

    def list_keys(self) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first."""
        ...

    def revoke_key(self, key_id: str) -> ApiKey | None:
        """Mark the key revoked (it matches nothing from then on); None when there is no such key."""
        ...

    def append_audit(self, entry: AuditEntry, *, keep: int) -> None:
        """Append `entry`, keeping the latest `keep` entries: the log's only change besides that trim."""
        ...

    def list_audit(self, *, limit: int = 100, tenant: str | None = None) -> list[AuditEntry]:
        """The latest `limit` entries (of `tenant`), newest first."""
        ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


def open_store(url_or_path: str | os.PathLike[str]) -> JobStore:
    """`redis://host:port/db` (or rediss://) -> RedisStore; `sqlite:///path`, or a file path -> SqliteStore."""
    target = os.fspath(url_or_path)
    if target.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(target)
    if target.startswith("sqlite://"):
        target = target.removeprefix("sqlite://")
        if not target.startswith("/"):
            raise StoreError(f"sqlite URLs need an absolute path (sqlite:////abs/path.db), not {url_or_path!r}")
    if "://" in target:
        raise StoreError(f"unknown store {url_or_path!r}: expected redis://..., sqlite:///path or a file path")
    return SqliteStore(target)


__all__ = ["JobStore", "open_store"]
