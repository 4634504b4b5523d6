"""JobStore contract, run against SQLite and Redis: lifecycle, ownership, cancel, takeover, registry, races."""

import json
import subprocess
import sys
import time

import pytest

from earl_service.errors import QuotaError, StoreError
from earl_service.service.records import STATES, ModelRecord
from earl_service.service.store import open_store


def test_create_get_list_count(store):
    a = store.create_job({"dim": 8, "lr": 0.001, "no_knn": True}, {"train": "uploads/x/train.txt"})
    b = store.create_job({}, {}, job_id="fixed-id")
    got = store.get_job(a.id)
    assert got.state == "queued" and got.params == {"dim": 8, "lr": 0.001, "no_knn": True}
    assert got.files == {"train": "uploads/x/train.txt"} and got.attempts == 0 and got.progress == {}
    assert store.get_job("nope") is None
    assert [j.id for j in store.list_jobs()] == [b.id, a.id]  # newest first
    assert store.list_jobs(state="running") == []
    assert store.count_jobs() == {s: (2 if s == "queued" else 0) for s in STATES}


def test_count_unfinished_counts_a_clients_queued_and_running_jobs(store):
    mine = [store.create_job({"client": "me", "dim": 8}, {}) for _ in range(4)]
    store.create_job({"client": "other"}, {})
    store.create_job({}, {})  # a job without a client (submitted before quotas)
    assert store.count_unfinished("me") == 4 and store.count_unfinished("nobody") == 0
    assert store.claim_job("w").id == mine[0].id  # running: still unfinished
    store.claim_job("w")
    store.finish_job(mine[1].id, "w", "succeeded")
    store.request_cancel(mine[2].id)
    assert store.count_unfinished("me") == 2 and store.count_unfinished("other") == 1
    assert store.count_jobs() == {"queued": 3, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 1}


def test_empty_params_files_and_progress_stay_objects_through_every_step(store):
    job = store.create_job({}, {})
    steps = [store.claim_job("w"), store.heartbeat(job.id, "w"), store.request_cancel(job.id),
             store.finish_job(job.id, "w", "cancelled"), store.get_job(job.id), *store.list_jobs()]
    assert all((s.params, s.files, s.progress) == ({}, {}, {}) for s in steps)


def test_the_redis_reader_takes_cjsons_empty_array_for_an_empty_object():
    from earl_service.service.redis_store import RedisStore

    job = RedisStore._decode(json.dumps({"id": "j", "params": [], "files": [], "progress": [], "cancel_requested": 1}))
    assert (job.params, job.files, job.progress, job.cancel_requested) == ({}, {}, {}, True)


def test_claim_is_fifo_and_owned(store):
    first = store.create_job({"n": 1}, {})
    second = store.create_job({"n": 2}, {})
    job = store.claim_job("w1")
    assert (job.id, job.state, job.worker, job.attempts) == (first.id, "running", "w1", 1)
    assert job.started is not None and job.heartbeat is not None
    assert store.claim_job("w2").id == second.id
    assert store.claim_job("w3") is None
    # Only the owner may report progress or finish.
    assert store.heartbeat(first.id, "w2", {"step": 1}) is None
    beat = store.heartbeat(first.id, "w1", {"step": 3, "total": 10, "loss": 0.5, "valid_mrr": None})
    assert beat.progress == {"step": 3, "total": 10, "loss": 0.5, "valid_mrr": None}
    assert store.finish_job(first.id, "w2", "succeeded") is None
    done = store.finish_job(first.id, "w1", "succeeded", model_id="m1")
    assert (done.state, done.model_id, done.error) == ("succeeded", "m1", None) and done.finished >= done.started
    assert store.heartbeat(first.id, "w1") is None  # finished: no longer running
    with pytest.raises(ValueError):
        store.finish_job(second.id, "w2", "running")
    failed = store.finish_job(second.id, "w2", "failed", error="train.txt, line 2: bad")
    assert failed.error == "train.txt, line 2: bad"


def test_cancel(store):
    store.create_job({}, {})
    running = store.create_job({}, {})
    store.claim_job("w")  # the first job (FIFO)
    store.claim_job("w")
    assert store.request_cancel("missing") is None
    job = store.request_cancel(running.id)
    assert job.state == "running" and job.cancel_requested
    assert store.heartbeat(running.id, "w").cancel_requested  # the worker learns of it with its heartbeat
    later = store.create_job({}, {})
    cancelled = store.request_cancel(later.id)
    assert cancelled.state == "cancelled" and cancelled.finished is not None
    assert store.claim_job("w") is None  # a cancelled job is never claimed
    assert store.finish_job(running.id, "w", "cancelled").state == "cancelled"
    assert store.request_cancel(running.id).state == "cancelled"  # idempotent on finished jobs


def test_stale_job_is_taken_over_then_given_up(store):
    job = store.create_job({}, {})
    assert store.claim_job("dead", stale_after=60).attempts == 1
    assert store.claim_job("w2", stale_after=60) is None  # heartbeat is fresh
    time.sleep(0.05)
    taken = store.claim_job("w2", stale_after=0.01, max_attempts=3)
    assert (taken.id, taken.worker, taken.attempts) == (job.id, "w2", 2)
    assert store.heartbeat(job.id, "dead") is None  # the old worker has lost it
    time.sleep(0.05)
    assert store.claim_job("w3", stale_after=0.01, max_attempts=3).attempts == 3
    time.sleep(0.05)
    assert store.claim_job("w4", stale_after=0.01, max_attempts=3) is None
    gone = store.get_job(job.id)
    assert gone.state == "failed" and "stopped responding" in gone.error


def test_stale_cancelled_job_ends_cancelled(store):
    job = store.create_job({}, {})
    store.claim_job("dead")
    store.request_cancel(job.id)
    time.sleep(0.05)
    assert store.claim_job("w2", stale_after=0.01) is None
    assert store.get_job(job.id).state == "cancelled"


def test_release_requeues_for_resume(store):
    job = store.create_job({}, {})
    store.claim_job("w1")
    assert store.release_job(job.id, "other") is None
    released = store.release_job(job.id, "w1")
    assert released.state == "queued" and released.worker is None
    again = store.claim_job("w2")
    assert again.id == job.id and again.attempts == 2


def test_model_registry(store):
    record = ModelRecord(id="m1", path="models/m1.safetensors", sha256="ab" * 32, bytes=123,
                         config={"dim": 8}, metrics={"test": {"mrr": 0.3}}, created=time.time(), parameters=99)
    store.add_model(record)
    store.add_model(ModelRecord(id="m2", path="models/m2.safetensors", sha256="cd" * 32, bytes=1,
                                created=time.time() + 1))
    assert store.get_model("m1") == record
    assert [m.id for m in store.list_models()] == ["m2", "m1"]
    assert store.delete_model("m1") and not store.delete_model("m1")
    assert store.get_model("m1") is None


def test_deleting_a_model_clears_its_jobs_model_id(store):
    """The job that produced a model stays, but no longer names it; other jobs are untouched."""
    made, other = store.create_job({"dim": 8}, {}), store.create_job({}, {})
    for job in (made, other):
        store.claim_job("w")
        store.finish_job(job.id, "w", "succeeded", model_id=job.id)
        store.add_model(ModelRecord(id=job.id, path=f"models/{job.id}/v1.safetensors", sha256="ab" * 32, bytes=1,
                                    job_id=job.id))
    assert store.delete_model(made.id) and not store.delete_model(made.id)
    after = store.get_job(made.id)
    assert (after.state, after.model_id, after.params) == ("succeeded", None, {"dim": 8})
    assert store.get_job(other.id).model_id == other.id and store.get_model(other.id) is not None


def test_open_store_rejects_unknown_urls(tmp_path):
    with pytest.raises(StoreError):
        open_store("postgres://x")
    with pytest.raises(StoreError):
        open_store("sqlite://relative.db")
    with pytest.raises(StoreError, match="unreachable"):
        open_store("redis://127.0.0.1:1/0").ping()


CLAIMER = """
import json, os, sys, time
from earl_service.service.store import open_store
store = open_store(sys.argv[1])
store.ping()
open(sys.argv[3] + "." + sys.argv[2], "w").close()  # ready
while not os.path.exists(sys.argv[3]):  # start together
    time.sleep(0.005)
ids = []
while (job := store.claim_job(sys.argv[2])) is not None:
    ids.append(job.id)
    time.sleep(0.01)  # a little "work" per job: one claimer alone takes 2 s, so a slow start cannot miss the race
print(json.dumps(ids))
"""


def test_concurrent_workers_never_share_a_job(store, store_url, tmp_path):
    """Four processes claim from one queue at once: every job is claimed exactly once."""
    jobs = {store.create_job({"i": i}, {}).id for i in range(200)}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, store_url, f"w{i}", str(go)], stdout=subprocess.PIPE,
                              text=True) for i in range(4)]
    deadline = time.monotonic() + 60  # wait (bounded) until all have imported and opened the store
    while not all((tmp_path / f"go.w{i}").exists() for i in range(4)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    claimed = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert sum(1 for ids in claimed if ids) >= 2, "the claimers did not overlap; the race was not exercised"
    flat = [job_id for ids in claimed for job_id in ids]
    assert len(flat) == len(set(flat)) == len(jobs) and set(flat) == jobs
    owners = {j.id: j.worker for j in store.list_jobs(limit=1000)}
    for i, ids in enumerate(claimed):
        assert all(owners[job_id] == f"w{i}" for job_id in ids)


CREATOR = """
import json, os, sys, time
from earl_service.errors import QuotaError
from earl_service.service.store import open_store
store = open_store(sys.argv[1])
store.ping()
open(sys.argv[3] + "." + sys.argv[2], "w").close()  # ready
while not os.path.exists(sys.argv[3]):  # start together
    time.sleep(0.005)
made = refused = 0
for _ in range(15):
    try:
        store.create_job({"client": "me"}, {}, max_unfinished=10)
        made += 1
    except QuotaError as exc:
        assert exc.count == 10 and exc.limit == 10, exc
        refused += 1
print(json.dumps([made, refused]))
"""


def test_a_clients_quota_holds_against_concurrent_creates(store, store_url, tmp_path):
    """Issue 56: 30 concurrent POST /jobs with one token queued 12 (cap 10): the count and the insert were two
    steps. Four processes each try 15 creates for one client at once: exactly 10 are queued."""
    store.create_job({"client": "other"}, {}, max_unfinished=10)  # another client's jobs do not count
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CREATOR, store_url, f"p{i}", str(go)], stdout=subprocess.PIPE,
                              text=True) for i in range(4)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.p{i}").exists() for i in range(4)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert sum(made for made, _ in results) == 10 and sum(refused for _, refused in results) == 50
    assert store.count_unfinished("me") == 10 and store.count_unfinished("other") == 1
    store.request_cancel(next(j.id for j in store.list_jobs() if j.params["client"] == "me"))
    assert store.create_job({"client": "me"}, {}, max_unfinished=10).state == "queued"  # a freed place is taken
    with pytest.raises(QuotaError):
        store.create_job({"client": "me"}, {}, max_unfinished=10)


def test_redis_scripts_ship_as_package_data():
    """RedisStore loads its Lua scripts from files: pyproject's package-data must name them, or a wheel lacks them."""
    import fnmatch
    import tomllib
    from pathlib import Path

    import earl_service

    package = Path(earl_service.__file__).parent
    root = package.parent
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    scripts = [p.relative_to(package).as_posix() for p in (package / "service" / "lua").glob("*.lua")]
    assert sorted(scripts) == ["service/lua/add_model.lua", "service/lua/cancel.lua", "service/lua/claim.lua", "service/lua/create.lua",
                              "service/lua/delete_model.lua", "service/lua/update_owned.lua"]
    assert all(any(fnmatch.fnmatch(s, pat) for pat in patterns["earl_service"]) for s in scripts)
