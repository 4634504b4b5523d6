"""The job queue and model registry shared by the API and the workers: SQLite (default) or Redis.

Every state change that two processes could race on is one atomic step in the backend: a claim is a
single `UPDATE ... RETURNING` inside `BEGIN IMMEDIATE` (SQLite) or one Lua script (Redis), and updates
from a worker apply only while that worker still owns the job (`worker` matches, state is running).
A job whose worker stopped heart-beating for `stale_after` seconds is claimed again (its `attempts`
grows), so a new worker can resume it from the run directory's checkpoint.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from ..errors import StoreError

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Job:
    """One training request. `files` maps split names to paths relative to the service home."""

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
        names = {f.name for f in fields(cls)}
        job = cls(**{k: v for k, v in values.items() if k in names})
        job.cancel_requested = bool(job.cancel_requested)
        for key in ("params", "files", "progress"):  # cjson turns an empty object into an empty array
            if not isinstance(getattr(job, key), dict):
                setattr(job, key, {})
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
    precision: str = "fp32"
    entities: int = 0
    relations: int = 0
    job_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelRecord:
        names = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in values.items() if k in names})
        for key in ("config", "metrics"):
            if not isinstance(getattr(record, key), dict):
                setattr(record, key, {})
        return record


class JobStore(Protocol):
    """What the API and the workers need from a store; `tests/earl_service/test_store.py` is its contract."""

    def create_job(self, params: dict[str, Any], files: dict[str, str], *, job_id: str | None = None) -> Job: ...

    def get_job(self, job_id: str) -> Job | None: ...

    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> list[Job]: ...

    def count_jobs(self) -> dict[str, int]: ...

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

    def add_model(self, record: ModelRecord) -> None: ...

    def get_model(self, model_id: str) -> ModelRecord | None: ...

    def list_models(self) -> list[ModelRecord]: ...

    def delete_model(self, model_id: str) -> bool: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


def store_target(home: str | os.PathLike[str], store: str) -> str:
    """The EARL_STORE setting as open_store's argument: 'sqlite' means HOME/earl.sqlite3."""
    return str(Path(home) / "earl.sqlite3") if store in ("", "sqlite") else store


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


# ---------------------------------------------------------------- SQLite

_JOB_COLUMNS = [f.name for f in fields(Job)]
_JSON_COLUMNS = ("params", "files", "progress", "config", "metrics")
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
"""


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
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the job store {self.path}: {exc}") from exc

    def _tx(self):
        return _Transaction(self._db)

    def _one(self, sql: str, args: tuple = ()) -> dict[str, Any] | None:
        row = self._db.execute(sql, args).fetchone()
        return None if row is None else _decode_row(row)

    def create_job(self, params: dict[str, Any], files: dict[str, str], *, job_id: str | None = None) -> Job:
        job = Job(id=job_id or new_id(), params=dict(params), files=dict(files), created=time.time())
        values = job.to_dict()
        for key in ("params", "files", "progress"):
            values[key] = json.dumps(values[key])
        with self._lock:
            self._db.execute(f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}) VALUES "
                             f"({', '.join(':' + c for c in _JOB_COLUMNS)})", values)
        return job

    def get_job(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return None if row is None else Job.from_dict(row)

    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> list[Job]:
        with self._lock:
            if state is None:
                rows = self._db.execute("SELECT * FROM jobs ORDER BY created DESC LIMIT ?", (limit,)).fetchall()
            else:
                rows = self._db.execute("SELECT * FROM jobs WHERE state = ? ORDER BY created DESC LIMIT ?",
                                        (state, limit)).fetchall()
        return [Job.from_dict(_decode_row(r)) for r in rows]

    def count_jobs(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {state: 0 for state in STATES} | {r[0]: r[1] for r in rows}

    def claim_job(self, worker: str, *, stale_after: float = 60.0, max_attempts: int = 3) -> Job | None:
        now = time.time()
        stale = now - stale_after
        with self._lock, self._tx():
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
        with self._lock:
            if progress is None:
                row = self._one("UPDATE jobs SET heartbeat = ? WHERE id = ? AND worker = ? AND state = 'running' "
                                "RETURNING *", (time.time(), job_id, worker))
            else:
                row = self._one("UPDATE jobs SET heartbeat = ?, progress = ? WHERE id = ? AND worker = ? "
                                "AND state = 'running' RETURNING *", (time.time(), json.dumps(progress), job_id, worker))
        return None if row is None else Job.from_dict(row)

    def finish_job(self, job_id: str, worker: str, state: str, *, error: str | None = None,
                   model_id: str | None = None) -> Job | None:
        if state not in TERMINAL:
            raise ValueError(f"a finished job is one of {TERMINAL}, not {state!r}")
        with self._lock:
            row = self._one("UPDATE jobs SET state = ?, finished = ?, error = ?, model_id = ? WHERE id = ? "
                            "AND worker = ? AND state = 'running' RETURNING *",
                            (state, time.time(), error, model_id, job_id, worker))
        return None if row is None else Job.from_dict(row)

    def release_job(self, job_id: str, worker: str) -> Job | None:
        with self._lock:
            row = self._one("UPDATE jobs SET state = 'queued', worker = NULL, heartbeat = NULL WHERE id = ? "
                            "AND worker = ? AND state = 'running' RETURNING *", (job_id, worker))
        return None if row is None else Job.from_dict(row)

    def request_cancel(self, job_id: str) -> Job | None:
        with self._lock, self._tx():
            self._db.execute("UPDATE jobs SET state = 'cancelled', finished = ?, cancel_requested = 1 "
                             "WHERE id = ? AND state = 'queued'", (time.time(), job_id))
            self._db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND state = 'running'", (job_id,))
            row = self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return None if row is None else Job.from_dict(row)

    def add_model(self, record: ModelRecord) -> None:
        values = record.to_dict()
        for key in ("config", "metrics"):
            values[key] = json.dumps(values[key], default=str)
        columns = list(values)
        with self._lock:
            self._db.execute(f"INSERT OR REPLACE INTO models ({', '.join(columns)}) VALUES "
                             f"({', '.join(':' + c for c in columns)})", values)

    def get_model(self, model_id: str) -> ModelRecord | None:
        with self._lock:
            row = self._one("SELECT * FROM models WHERE id = ?", (model_id,))
        return None if row is None else ModelRecord.from_dict(row)

    def list_models(self) -> list[ModelRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM models ORDER BY created DESC").fetchall()
        return [ModelRecord.from_dict(_decode_row(r)) for r in rows]

    def delete_model(self, model_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM models WHERE id = ?", (model_id,)).rowcount > 0

    def ping(self) -> None:
        try:
            with self._lock:
                self._db.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"job store {self.path} unusable: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


# ---------------------------------------------------------------- Redis

# Jobs are JSON documents in one hash; queued ids wait in a list; running ids sit in a sorted set scored by
# heartbeat. Each script below is one atomic step.
_CLAIM = """
local jobs, queue, running = KEYS[1], KEYS[2], KEYS[3]
local worker, now, stale, max_attempts = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function take(id, doc)
  doc.state = 'running'; doc.worker = worker; doc.heartbeat = now
  if doc.started == nil or doc.started == cjson.null then doc.started = now end
  doc.attempts = (tonumber(doc.attempts) or 0) + 1
  local text = cjson.encode(doc)
  redis.call('HSET', jobs, id, text)
  redis.call('ZADD', running, now, id)
  return text
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', running, '-inf', '(' .. stale)) do
  local raw = redis.call('HGET', jobs, id)
  if not raw then
    redis.call('ZREM', running, id)
  else
    local doc = cjson.decode(raw)
    if doc.state ~= 'running' then
      redis.call('ZREM', running, id)
    elseif doc.cancel_requested == true then
      doc.state = 'cancelled'; doc.finished = now; doc.worker = cjson.null
      redis.call('HSET', jobs, id, cjson.encode(doc)); redis.call('ZREM', running, id)
    elseif (tonumber(doc.attempts) or 0) >= max_attempts then
      doc.state = 'failed'; doc.finished = now; doc.worker = cjson.null
      doc.error = 'the worker stopped responding ' .. doc.attempts .. ' time(s); giving up'
      redis.call('HSET', jobs, id, cjson.encode(doc)); redis.call('ZREM', running, id)
    else
      return take(id, doc)
    end
  end
end
while true do
  local id = redis.call('LPOP', queue)
  if not id then return nil end
  local raw = redis.call('HGET', jobs, id)
  if raw then
    local doc = cjson.decode(raw)
    if doc.state == 'queued' then return take(id, doc) end
  end
end
"""

# Apply a JSON patch to a job owned by ARGV[2] (state running); ARGV[4]: 'beat' | 'finish' | 'release'.
_UPDATE_OWNED = """
local jobs, queue, running = KEYS[1], KEYS[2], KEYS[3]
local id, worker, now, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local raw = redis.call('HGET', jobs, id)
if not raw then return nil end
local doc = cjson.decode(raw)
if doc.state ~= 'running' or doc.worker ~= worker then return nil end
for k, v in pairs(cjson.decode(ARGV[5])) do doc[k] = v end
if mode == 'beat' then
  doc.heartbeat = now
  redis.call('ZADD', running, now, id)
elseif mode == 'finish' then
  doc.finished = now
  redis.call('ZREM', running, id)
else
  doc.state = 'queued'; doc.worker = cjson.null; doc.heartbeat = cjson.null
  redis.call('ZREM', running, id)
  redis.call('LPUSH', queue, id)
end
local text = cjson.encode(doc)
redis.call('HSET', jobs, id, text)
return text
"""

_CANCEL = """
local jobs, queue = KEYS[1], KEYS[2]
local id, now = ARGV[1], tonumber(ARGV[2])
local raw = redis.call('HGET', jobs, id)
if not raw then return nil end
local doc = cjson.decode(raw)
if doc.state == 'queued' then
  doc.state = 'cancelled'; doc.finished = now; doc.cancel_requested = true
  redis.call('LREM', queue, 0, id)
elseif doc.state == 'running' then
  doc.cancel_requested = true
else
  return raw
end
local text = cjson.encode(doc)
redis.call('HSET', jobs, id, text)
return text
"""


class RedisStore:
    """The same contract on Redis: for several machines sharing one queue (docker-compose)."""

    def __init__(self, url: str, *, prefix: str = "earl") -> None:
        try:
            import redis
        except ImportError as exc:  # the `serve` extra brings it
            raise StoreError("the redis package is needed for redis:// stores: pip install 'earl-service[serve]'") from exc
        self.url = url
        self._redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5)
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self._keys = [f"{prefix}:jobs", f"{prefix}:queue", f"{prefix}:running"]
        self._models = f"{prefix}:models"
        self._claim = self._redis.register_script(_CLAIM)
        self._update = self._redis.register_script(_UPDATE_OWNED)
        self._cancel = self._redis.register_script(_CANCEL)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            raise StoreError(f"job store {self._safe_url()} unreachable: {exc}") from exc

    def _safe_url(self) -> str:
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"  # without credentials

    @staticmethod
    def _job(text: str | None) -> Job | None:
        return None if text is None else Job.from_dict(json.loads(text))

    def create_job(self, params: dict[str, Any], files: dict[str, str], *, job_id: str | None = None) -> Job:
        job = Job(id=job_id or new_id(), params=dict(params), files=dict(files), created=time.time())
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self._keys[0], job.id, json.dumps(job.to_dict()))
        pipe.rpush(self._keys[1], job.id)
        self._call(pipe.execute)
        return job

    def get_job(self, job_id: str) -> Job | None:
        return self._job(self._call(self._redis.hget, self._keys[0], job_id))

    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> list[Job]:
        jobs = [Job.from_dict(json.loads(v)) for v in self._call(self._redis.hvals, self._keys[0])]
        jobs = [j for j in jobs if state is None or j.state == state]
        return sorted(jobs, key=lambda j: j.created, reverse=True)[:limit]

    def count_jobs(self) -> dict[str, int]:
        counts = {state: 0 for state in STATES}
        for job in self.list_jobs(limit=1 << 62):
            counts[job.state] = counts.get(job.state, 0) + 1
        return counts

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

    def add_model(self, record: ModelRecord) -> None:
        self._call(self._redis.hset, self._models, record.id, json.dumps(record.to_dict(), default=str))

    def get_model(self, model_id: str) -> ModelRecord | None:
        text = self._call(self._redis.hget, self._models, model_id)
        return None if text is None else ModelRecord.from_dict(json.loads(text))

    def list_models(self) -> list[ModelRecord]:
        records = [ModelRecord.from_dict(json.loads(v)) for v in self._call(self._redis.hvals, self._models)]
        return sorted(records, key=lambda r: r.created, reverse=True)

    def delete_model(self, model_id: str) -> bool:
        return bool(self._call(self._redis.hdel, self._models, model_id))

    def ping(self) -> None:
        self._call(self._redis.ping)

    def close(self) -> None:
        self._redis.close()


__all__ = ["STATES", "TERMINAL", "Job", "JobStore", "ModelRecord", "RedisStore", "SqliteStore", "StoreError",
           "new_id", "open_store", "store_target"]
