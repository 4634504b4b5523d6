"""The job store on Redis, for several machines sharing one queue (docker-compose).

Jobs are JSON documents in one hash; queued ids wait in a list; running ids sit in a sorted set scored by
heartbeat. Every step two workers could race on is one Lua script (lua/*.lua), which Redis runs atomically.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from importlib import resources
from typing import Any

from earl_service.errors import QuotaError, StoreError, TenantQuotaError
from earl_service.service.audit import AuditEntry
from earl_service.service.keys import ApiKey
from earl_service.service.records import STATES, TERMINAL, UNFINISHED, Job, ModelRecord, new_id, tenant_of
from earl_service.service.tenants import Quota, Usage


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


class RedisStore:
    """The JobStore contract on Redis; `prefix` namespaces the keys, so several services can share a server."""

    def __init__(self, url: str, *, prefix: str = "earl") -> None:
        try:
            import redis
        except ImportError as exc:  # the `serve` extra brings it
            raise StoreError("the redis package is needed for redis:// stores: "
                             "pip install 'earl-service[serve]'") from exc
        self.url = url
        self._redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5)
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self._keys = [f"{prefix}:jobs", f"{prefix}:queue", f"{prefix}:running"]
        self._models = f"{prefix}:models"
        self._api_keys, self._audit = f"{prefix}:keys", f"{prefix}:audit"
        self._add_model = self._redis.register_script(_script("add_model"))
        self._create = self._redis.register_script(_script("create"))
        self._claim = self._redis.register_script(_script("claim"))
        self._update = self._redis.register_script(_script("update_owned"))
        self._cancel = self._redis.register_script(_script("cancel"))
        self._delete_model = self._redis.register_script(_script("delete_model"))

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            raise StoreError(f"job store {self._safe_url()} unreachable: {exc}") from exc

    def _safe_url(self) -> str:
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"  # without credentials

    @staticmethod
    def _decode(text: str) -> Job:
        values = json.loads(text)
        for key in ("params", "files", "progress"):  # the Lua scripts' cjson writes an empty object as []
            if not isinstance(values.get(key), dict):
                values[key] = {}
        return Job.from_dict(values)

    @classmethod
    def _job(cls, text: str | None) -> Job | None:
        return None if text is None else cls._decode(text)

    def create_job(self, params: dict[str, Any], files: dict[str, str], *, job_id: str | None = None,
                   max_unfinished: int | None = None) -> Job:
        job = Job(id=job_id or new_id(), params=dict(params), files=dict(files), created=time.time())
        client = str(params.get("client"))
        limit = -1 if max_unfinished is None else max_unfinished
        count = self._call(self._create, keys=self._keys, args=[job.id, json.dumps(job.to_dict()), client, limit])
        if count >= 0:
            raise QuotaError(client, count, limit)
        return job

    def get_job(self, job_id: str) -> Job | None:
        return self._job(self._call(self._redis.hget, self._keys[0], job_id))

    def _all_jobs(self) -> list[Job]:
        return [self._decode(v) for v in self._call(self._redis.hvals, self._keys[0])]

    def list_jobs(self, *, state: str | None = None, limit: int = 100, tenant: str | None = None) -> list[Job]:
        jobs = [j for j in self._all_jobs() if (state is None or j.state == state)
                and (tenant is None or tenant_of(j) == tenant)]
        return sorted(jobs, key=lambda j: j.created, reverse=True)[:limit]

    def count_jobs(self) -> dict[str, int]:
        return {state: 0 for state in STATES} | Counter(job.state for job in self._all_jobs())

    def count_unfinished(self, client: str) -> int:
        return sum(job.state in UNFINISHED and job.params.get("client") == client for job in self._all_jobs())

    def claim_job(self, worker: str, *, stale_after: float = 60.0, max_attempts: int = 3) -> Job | None:
        now = time.time()
        text = self._call(self._claim, keys=self._keys, args=[worker, repr(now), repr(now - stale_after), max_attempts])
        return self._job(text)

    def _owned(self, job_id: str, worker: str, mode: str, patch: dict[str, Any]) -> Job | None:
        text = self._call(self._update, keys=self._keys, args=[job_id, worker, repr(time.time()), mode,
                                                                json.dumps(patch)])
        return self._job(text)

    def heartbeat(self, job_id: str, worker: str, progress: dict[str, Any] | None = None) -> Job | None:
        return self._owned(job_id, worker, "beat", {} if progress is None else {"progress": progress})

    def finish_job(self, job_id: str, worker: str, state: str, *, error: str | None = None,
                   model_id: str | None = None) -> Job | None:
        if state not in TERMINAL:
            raise ValueError(f"a finished job is one of {TERMINAL}, not {state!r}")
        return self._owned(job_id, worker, "finish", {"state": state, "error": error, "model_id": model_id})

    def release_job(self, job_id: str, worker: str) -> Job | None:
        return self._owned(job_id, worker, "release", {})

    def request_cancel(self, job_id: str) -> Job | None:
        return self._job(self._call(self._cancel, keys=self._keys[:2], args=[job_id, repr(time.time())]))

    def add_model(self, record: ModelRecord, *, quota: Quota | None = None) -> None:
        bounds = [-1, -1] if quota is None else [-1 if q is None else q for q in (quota.max_models, quota.max_bytes)]
        code, *held = self._call(self._add_model, keys=[self._models], args=[
            record.id, json.dumps(record.to_dict(), default=str), record.owner, *bounds, record.stored])
        if code == 1:
            raise TenantQuotaError(record.owner, "models", held[0], 1, bounds[0])
        if code == 2:
            raise TenantQuotaError(record.owner, "bytes", held[0], record.stored, bounds[1])

    def tenant_usage(self, tenant: str) -> Usage:
        mine = [m for m in self.list_models() if m.owner == tenant]
        return Usage(models=len(mine), bytes=sum(m.stored for m in mine))

    def get_model(self, model_id: str) -> ModelRecord | None:
        text = self._call(self._redis.hget, self._models, model_id)
        return None if text is None else ModelRecord.from_dict(json.loads(text))

    def list_models(self, *, owner: str | None = None) -> list[ModelRecord]:
        """Every record (of `owner`), newest first, without its config and metrics (as SqliteStore.list_models)."""
        records = [ModelRecord.from_dict(json.loads(v) | {"config": {}, "metrics": {}})
                   for v in self._call(self._redis.hvals, self._models)]
        records = [r for r in records if owner is None or r.owner == owner]
        return sorted(records, key=lambda r: r.created, reverse=True)

    def delete_model(self, model_id: str) -> bool:
        return bool(self._call(self._delete_model, keys=[self._keys[0], self._models], args=[model_id]))

    def add_key(self, key: ApiKey) -> None:
        self._call(self._redis.hset, self._api_keys, key.id, json.dumps(key.to_dict()))

    def list_keys(self) -> list[ApiKey]:
        keys = [ApiKey.from_dict(json.loads(v)) for v in self._call(self._redis.hvals, self._api_keys)]
        return sorted(keys, key=lambda k: k.created)

    def revoke_key(self, key_id: str) -> ApiKey | None:
        """Revoked once: a second revoke keeps the first time (HSET of the same document is idempotent enough)."""
        text = self._call(self._redis.hget, self._api_keys, key_id)
        if text is None:
            return None
        values = json.loads(text)
        values["revoked"] = values.get("revoked") or time.time()
        self._call(self._redis.hset, self._api_keys, key_id, json.dumps(values))
        return ApiKey.from_dict(values)

    def append_audit(self, entry: AuditEntry, *, keep: int) -> None:
        pipe = self._redis.pipeline(transaction=True)  # MULTI: the append and the trim together
        pipe.rpush(self._audit, json.dumps(entry.to_dict()))
        pipe.ltrim(self._audit, -keep, -1)
        self._call(pipe.execute)

    def list_audit(self, *, limit: int = 100, tenant: str | None = None) -> list[AuditEntry]:
        entries = [AuditEntry.from_dict(json.loads(v)) for v in self._call(self._redis.lrange, self._audit, 0, -1)]
        return [e for e in reversed(entries) if tenant is None or e.tenant == tenant][:limit]

    def ping(self) -> None:
        self._call(self._redis.ping)

    def close(self) -> None:
        self._redis.close()


__all__ = ["RedisStore"]
