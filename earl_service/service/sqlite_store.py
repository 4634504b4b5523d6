"""The job store on one SQLite file (the default): for an API and workers on one machine."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from earl_service.errors import QuotaError, StoreError, TenantQuotaError
from earl_service.service.audit import AuditEntry
from earl_service.service.keys import ApiKey
from earl_service.service.records import STATES, TERMINAL, Job, ModelRecord, new_id
from earl_service.service.tenants import Quota, Usage

_JOB_COLUMNS = [f.name for f in fields(Job)]
_JSON_COLUMNS = ("params", "files", "progress", "config", "metrics")
_LISTED_COLUMNS = "id, path, sha256, bytes, created, parameters, precision, entities, relations, job_id, owner, stored"
# Columns added after the first release, with their definitions: a store made before them gains them at open.
_ADDED_COLUMNS = {"models": {"owner": "TEXT NOT NULL DEFAULT 'default'", "stored": "INTEGER NOT NULL DEFAULT 0"}}
_AUDIT_COLUMNS = [f.name for f in fields(AuditEntry)]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, params TEXT NOT NULL, files TEXT NOT NULL,
    created REAL NOT NULL, started REAL, finished REAL, progress TEXT NOT NULL, error TEXT, model_id TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, worker TEXT, heartbeat REAL, cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state_created ON jobs (state, created);
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY, path TEXT NOT NULL, sha256 TEXT NOT NULL, bytes INTEGER NOT NULL, config TEXT NOT NULL,
    metrics TEXT NOT NULL, created REAL NOT NULL, parameters INTEGER NOT NULL, precision TEXT NOT NULL,
    entities INTEGER NOT NULL, relations INTEGER NOT NULL, job_id TEXT
);
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, tenant TEXT NOT NULL, scopes TEXT NOT NULL, salt TEXT NOT NULL,
    digest TEXT NOT NULL, created REAL NOT NULL, revoked REAL
);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, tenant TEXT NOT NULL, key TEXT NOT NULL,
    method TEXT NOT NULL, path TEXT NOT NULL, status INTEGER NOT NULL, target TEXT, key_id TEXT
);
"""


def _encode_row(values: dict[str, Any]) -> dict[str, Any]:
    """A record's fields as the row's values: the dict-valued ones as JSON text (str() for what JSON lacks)."""
    return {key: json.dumps(value, default=str) if key in _JSON_COLUMNS else value for key, value in values.items()}


def _decode_row(row: sqlite3.Row) -> dict[str, Any]:
    values = dict(row)
    for key in _JSON_COLUMNS:
        if key in values and isinstance(values[key], str):
            values[key] = json.loads(values[key])
    return values


class SqliteStore:
    """One SQLite file in WAL mode; safe for an API and several workers in separate processes.

    A connection per store object, guarded by a lock so that the worker's heartbeat thread can share it.
    Writes that must not interleave run in `BEGIN IMMEDIATE` transactions (the write lock is taken up
    front, so the busy timeout applies instead of a snapshot conflict).
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)  # IF NOT EXISTS: safe when several processes open the store at once
            self._add_columns()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the job store {self.path}: {exc}") from exc

    def _add_columns(self) -> None:
        """The columns of _ADDED_COLUMNS a store made before them lacks; another process adding one at the same
        time is no error."""
        for table, columns in _ADDED_COLUMNS.items():
            present = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, definition in columns.items():
                if name not in present:
                    try:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
                    except sqlite3.OperationalError as exc:
                        if "duplicate column" not in str(exc):
                            raise

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The connection's lock, and every sqlite3 error (a locked or full database, a lost file) as a StoreError:
        callers (the API's 503, the worker's retry loop) handle the store's own error, never a raw sqlite3 one."""
        try:
            with self._lock:
                yield
        except sqlite3.Error as exc:
            raise StoreError(f"job store {self.path.name}: {exc}") from exc

    def _tx(self):
        return _Transaction(self._db)

    def _one(self, sql: str, args: tuple = ()) -> dict[str, Any] | None:
        row = self._db.execute(sql, args).fetchone()
        return None if row is None else _decode_row(row)

    def create_job(self, params: dict[str, Any], files: dict[str, str], *, job_id: str | None = None,
                   max_unfinished: int | None = None) -> Job:
        job = Job(id=job_id or new_id(), params=dict(params), files=dict(files), created=time.time())
        with self._locked(), self._tx():  # BEGIN IMMEDIATE: no other process inserts between count and insert
            if max_unfinished is not None:
                client = str(params.get("client"))
                if (count := self._unfinished(client)) >= max_unfinished:
                    raise QuotaError(client, count, max_unfinished)
            self._db.execute(f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}) VALUES "
                             f"({', '.join(':' + c for c in _JOB_COLUMNS)})", _encode_row(job.to_dict()))
        return job

    def get_job(self, job_id: str) -> Job | None:
        with self._locked():
            row = self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return None if row is None else Job.from_dict(row)

    def list_jobs(self, *, state: str | None = None, limit: int = 100, tenant: str | None = None) -> list[Job]:
        where, args = ["1"], list[str]()
        if state is not None:
            where, args = [*where, "state = ?"], [*args, state]
        if tenant is not None:  # jobs from before tenants have none: the default tenant's
            where, args = [*where, "COALESCE(json_extract(params, '$.tenant'), 'default') = ?"], [*args, tenant]
        with self._locked():
            rows = self._db.execute(f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY created DESC LIMIT ?",
                                    (*args, limit)).fetchall()
        return [Job.from_dict(_decode_row(r)) for r in rows]

    def count_jobs(self) -> dict[str, int]:
        with self._locked():
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {state: 0 for state in STATES} | {r[0]: r[1] for r in rows}

    def count_unfinished(self, client: str) -> int:
        with self._locked():
            return self._unfinished(client)

    def _unfinished(self, client: str) -> int:
        (count,) = self._db.execute("SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running') "
                                    "AND json_extract(params, '$.client') = ?", (client,)).fetchone()
        return count

    def claim_job(self, worker: str, *, stale_after: float = 60.0, max_attempts: int = 3) -> Job | None:
        now = time.time()
        stale = now - stale_after
        with self._locked(), self._tx():
            # A dead worker's job: cancelled if that was asked for, failed after too many attempts.
            self._db.execute("UPDATE jobs SET state = 'cancelled', finished = ?, worker = NULL WHERE state = 'running' "
                             "AND heartbeat < ? AND cancel_requested = 1", (now, stale))
            self._db.execute("UPDATE jobs SET state = 'failed', finished = ?, worker = NULL, error = "
                             "'the worker stopped responding ' || attempts || ' time(s); giving up' "
                             "WHERE state = 'running' AND heartbeat < ? AND attempts >= ?", (now, stale, max_attempts))
            row = self._one(
                "UPDATE jobs SET state = 'running', worker = ?, heartbeat = ?, started = COALESCE(started, ?), "
                "attempts = attempts + 1 WHERE id = (SELECT id FROM jobs WHERE state = 'queued' "
                "OR (state = 'running' AND heartbeat < ?) ORDER BY state = 'queued', created LIMIT 1) RETURNING *",
                (worker, now, now, stale))
        return None if row is None else Job.from_dict(row)

    def heartbeat(self, job_id: str, worker: str, progress: dict[str, Any] | None = None) -> Job | None:
        with self._locked():
            if progress is None:
                row = self._one("UPDATE jobs SET heartbeat = ? WHERE id = ? AND worker = ? AND state = 'running' "
                                "RETURNING *", (time.time(), job_id, worker))
            else:
                row = self._one("UPDATE jobs SET heartbeat = ?, progress = ? WHERE id = ? AND worker = ? "
                                "AND state = 'running' RETURNING *",
                                (time.time(), json.dumps(progress), job_id, worker))
        return None if row is None else Job.from_dict(row)

    def finish_job(self, job_id: str, worker: str, state: str, *, error: str | None = None,
                   model_id: str | None = None) -> Job | None:
        if state not in TERMINAL:
            raise ValueError(f"a finished job is one of {TERMINAL}, not {state!r}")
        with self._locked():
            row = self._one("UPDATE jobs SET state = ?, finished = ?, error = ?, model_id = ? WHERE id = ? "
                            "AND worker = ? AND state = 'running' RETURNING *",
                            (state, time.time(), error, model_id, job_id, worker))
        return None if row is None else Job.from_dict(row)

    def release_job(self, job_id: str, worker: str) -> Job | None:
        with self._locked():
            row = self._one("UPDATE jobs SET state = 'queued', worker = NULL, heartbeat = NULL WHERE id = ? "
                            "AND worker = ? AND state = 'running' RETURNING *", (job_id, worker))
        return None if row is None else Job.from_dict(row)

    def request_cancel(self, job_id: str) -> Job | None:
        with self._locked(), self._tx():
            self._db.execute("UPDATE jobs SET state = 'cancelled', finished = ?, cancel_requested = 1 "
                             "WHERE id = ? AND state = 'queued'", (time.time(), job_id))
            self._db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND state = 'running'", (job_id,))
            row = self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return None if row is None else Job.from_dict(row)

    def add_model(self, record: ModelRecord, *, quota: Quota | None = None) -> None:
        values = _encode_row(record.to_dict())
        columns = list(values)
        with self._locked(), self._tx():  # BEGIN IMMEDIATE: the tenant's usage and the insert in one step
            if quota is not None:
                self._check_quota(record, quota)
            self._db.execute(f"INSERT OR REPLACE INTO models ({', '.join(columns)}) VALUES "
                             f"({', '.join(':' + c for c in columns)})", values)

    def _check_quota(self, record: ModelRecord, quota: Quota) -> None:
        """TenantQuotaError when `record` (a new model, or a model's next version) takes its owner past `quota`."""
        others = self._usage(record.owner, besides=record.id)
        is_new = self._db.execute("SELECT 1 FROM models WHERE id = ?", (record.id,)).fetchone() is None
        if is_new and quota.max_models is not None and others.models >= quota.max_models:
            raise TenantQuotaError(record.owner, "models", others.models, 1, quota.max_models)
        if quota.max_bytes is not None and others.bytes + record.stored > quota.max_bytes:
            raise TenantQuotaError(record.owner, "bytes", others.bytes, record.stored, quota.max_bytes)

    def _usage(self, tenant: str, *, besides: str = "") -> Usage:
        models, stored = self._db.execute("SELECT COUNT(*), COALESCE(SUM(stored), 0) FROM models WHERE owner = ? "
                                          "AND id != ?", (tenant, besides)).fetchone()
        return Usage(models=models, bytes=stored)

    def tenant_usage(self, tenant: str) -> Usage:
        with self._locked():
            return self._usage(tenant)

    def get_model(self, model_id: str) -> ModelRecord | None:
        with self._locked():
            row = self._one("SELECT * FROM models WHERE id = ?", (model_id,))
        return None if row is None else ModelRecord.from_dict(row)

    def list_models(self, *, owner: str | None = None) -> list[ModelRecord]:
        """Every record (of `owner`), newest first, without its config and metrics: a listing (or a 404's
        suggestions) shows neither, and decoding them for every model made each listing cost the sum of all
        models' metadata."""
        where, args = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
        with self._locked():
            rows = self._db.execute(f"SELECT {_LISTED_COLUMNS} FROM models {where} ORDER BY created DESC",
                                    args).fetchall()
        return [ModelRecord.from_dict(dict(r)) for r in rows]

    def delete_model(self, model_id: str) -> bool:
        with self._locked(), self._tx():
            deleted = self._db.execute("DELETE FROM models WHERE id = ?", (model_id,)).rowcount > 0
            self._db.execute("UPDATE jobs SET model_id = NULL WHERE model_id = ?", (model_id,))
        return deleted

    def add_key(self, key: ApiKey) -> None:
        values = {**key.to_dict(), "scopes": json.dumps(list(key.scopes))}
        with self._locked():
            self._db.execute(f"INSERT INTO api_keys ({', '.join(values)}) VALUES ({', '.join(':' + c for c in values)})",
                             values)

    def list_keys(self) -> list[ApiKey]:
        with self._locked():
            rows = self._db.execute("SELECT * FROM api_keys ORDER BY created").fetchall()
        return [ApiKey.from_dict({**dict(r), "scopes": json.loads(r["scopes"])}) for r in rows]

    def revoke_key(self, key_id: str) -> ApiKey | None:
        with self._locked():
            rows = self._db.execute("UPDATE api_keys SET revoked = COALESCE(revoked, ?) WHERE id = ? RETURNING *",
                                    (time.time(), key_id)).fetchall()  # all: the update commits once stepped through
        row = rows[0] if rows else None
        return None if row is None else ApiKey.from_dict({**dict(row), "scopes": json.loads(row["scopes"])})

    def append_audit(self, entry: AuditEntry, *, keep: int) -> None:
        with self._locked(), self._tx():
            seq = self._db.execute(f"INSERT INTO audit ({', '.join(_AUDIT_COLUMNS)}) VALUES "
                                   f"({', '.join(':' + c for c in _AUDIT_COLUMNS)})", entry.to_dict()).lastrowid
            self._db.execute("DELETE FROM audit WHERE seq <= ?", ((seq or 0) - keep,))

    def list_audit(self, *, limit: int = 100, tenant: str | None = None) -> list[AuditEntry]:
        where, args = ("WHERE tenant = ?", (tenant,)) if tenant is not None else ("", ())
        with self._locked():
            rows = self._db.execute(f"SELECT * FROM audit {where} ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [AuditEntry.from_dict(dict(r)) for r in rows]

    def ping(self) -> None:
        with self._locked():
            self._db.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()

    def close(self) -> None:
        with self._locked():
            self._db.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


__all__ = ["SqliteStore"]
