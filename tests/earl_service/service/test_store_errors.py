"""A locked or full SQLite database: the store says StoreError, and the worker's loop and heartbeat live through it
(issue 34, item 14). A raw sqlite3 error used to end the worker loop and silently stop the heartbeat thread."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from earl_service.errors import StoreError
from earl_service.service.records import ModelRecord
from earl_service.service.sqlite_store import SqliteStore
from earl_service.worker.loop import Worker, WorkerConfig, _Heartbeat


class Flaky:
    """A sqlite3 connection whose statements starting with `prefix` fail `times` times ('database is locked')."""

    def __init__(self, db: sqlite3.Connection, prefix: str = "", times: int = 10**9) -> None:
        self.db, self.prefix, self.left = db, prefix, times
        self.failed = 0

    def execute(self, sql: str, *args):
        if sql.lstrip().startswith(self.prefix) and self.left > 0:
            self.left -= 1
            self.failed += 1
            raise sqlite3.OperationalError("database is locked")
        return self.db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.db, name)


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "earl.sqlite3")
    yield s
    s._db = getattr(s._db, "db", s._db)
    s.close()


CALLS = {
    "create_job": lambda s: s.create_job({}, {}),
    "get_job": lambda s: s.get_job("x"),
    "list_jobs": lambda s: s.list_jobs(),
    "count_jobs": lambda s: s.count_jobs(),
    "count_unfinished": lambda s: s.count_unfinished("c"),
    "claim_job": lambda s: s.claim_job("w"),
    "heartbeat": lambda s: s.heartbeat("x", "w"),
    "finish_job": lambda s: s.finish_job("x", "w", "failed"),
    "release_job": lambda s: s.release_job("x", "w"),
    "request_cancel": lambda s: s.request_cancel("x"),
    "add_model": lambda s: s.add_model(ModelRecord(id="m", path="p", sha256="0", bytes=1)),
    "get_model": lambda s: s.get_model("m"),
    "list_models": lambda s: s.list_models(),
    "delete_model": lambda s: s.delete_model("m"),
    "ping": lambda s: s.ping(),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=list(CALLS))
def test_every_sqlite_error_is_a_store_error(store, call):
    store._db = Flaky(store._db)
    with pytest.raises(StoreError, match="earl.sqlite3: database is locked"):
        call(store)


def test_the_worker_loop_outlives_a_locked_database(tmp_path):
    worker = Worker(WorkerConfig(home=tmp_path, poll_seconds=0.01, max_jobs=1, threads=1))
    job = worker.store.create_job({}, {}, job_id="nofiles")  # fails at once (no train file): quick to handle
    flaky = worker.store._db = Flaky(worker.store._db, prefix="UPDATE jobs SET state = 'cancelled'", times=3)
    try:
        assert worker.run() == 1  # three failed claims, then the job
    finally:
        worker.store._db = flaky.db
    assert flaky.failed == 3
    assert worker.store.get_job(job.id).state == "failed"
    worker.store.close()


def test_the_heartbeat_outlives_a_locked_database(store):
    job = store.create_job({}, {})
    claimed = store.claim_job("w")
    store._db = Flaky(store._db, prefix="UPDATE jobs SET heartbeat", times=3)
    beat = _Heartbeat(store, claimed, "w", interval=0.01)
    beat.start()
    try:
        deadline = time.monotonic() + 60
        while store.get_job(job.id).heartbeat <= claimed.heartbeat:
            assert beat.is_alive(), "the heartbeat thread died"
            assert time.monotonic() < deadline, "no heartbeat after the failures"
            time.sleep(0.01)
    finally:
        beat.stop()
    assert store._db.failed == 3 and not beat.lost


def test_an_unexpected_store_error_does_not_end_the_loop(tmp_path):
    """A store that raises something other than StoreError (a bug, a raw driver error) is logged and retried."""
    worker = Worker(WorkerConfig(home=tmp_path, poll_seconds=0.01, max_jobs=1, threads=1))
    real, failures = worker.store.claim_job, iter([sqlite3.OperationalError("disk I/O error")] * 2)

    def claim(*args, **kwargs):
        error = next(failures, None)
        if error is not None:
            raise error
        return real(*args, **kwargs)

    worker.store.claim_job = claim
    worker.store.create_job({}, {}, job_id="nofiles")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (worker.run(), done.set()), daemon=True)
    thread.start()
    assert done.wait(60), "the worker loop did not handle the job"
    worker.store.close()
