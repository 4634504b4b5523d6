"""The worker: trains a claimed job into a registered bundle, fails bad input cleanly, cancels, stops, resumes."""

import threading
import time

import numpy as np
import pytest
from conftest import random_triples

from earl_service.bundle.model_io import load_bundle
from earl_service.service.records import new_id
from earl_service.train.loop import CHECKPOINT
from earl_service.worker.loop import Worker, WorkerConfig

TINY = {"dim": 4, "k": 3, "reserved_ratio": 0.2, "steps": 6, "batch_size": 32, "negatives": 4, "eval_every": 3}


def write_split(folder, name, triples):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.txt").write_text("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in triples))


def submit(worker, params, *, bad=False):
    """Queue a job the way the API does: files under HOME/uploads/<id>/, paths relative to HOME."""
    job_id = new_id()
    folder = worker.home.upload_dir(job_id)
    triples = np.unique(random_triples(40, 3, 300, seed=3), axis=0)
    write_split(folder, "train", triples[:250])
    write_split(folder, "valid", triples[250:])
    if bad:
        (folder / "train.txt").write_text("e1\tr0\te2\ne3\tr1\n")
    return worker.store.create_job(params, {"train": f"uploads/{job_id}/train.txt"}, job_id=job_id)


@pytest.fixture
def worker(tmp_path):
    w = Worker(WorkerConfig(home=tmp_path, heartbeat_seconds=0.05, poll_seconds=0.05, threads=1))
    yield w
    w.store.close()


def test_job_becomes_a_registered_bundle(worker):
    job = submit(worker, {**TINY, "precision": "fp16"})
    done = worker.run_once()
    assert (done.id, done.state, done.error) == (job.id, "succeeded", None)
    assert done.model_id == job.id and done.progress["step"] == done.progress["total"] == 6
    path = worker.home.version_path(job.id, 1)
    bundle = load_bundle(path)
    record = worker.store.get_model(job.id)
    assert (record.sha256, record.bytes, record.precision) == (bundle.sha256, bundle.num_bytes, "fp16")
    assert record.entities == len(bundle.entities) and record.config["dim"] == 4
    assert not list(path.parent.glob(".*tmp*"))  # the temporary export was renamed into place
    assert worker.run_once() is None


def test_bad_triple_file_fails_the_job_not_the_worker(worker):
    job = submit(worker, TINY, bad=True)
    done = worker.run_once()
    assert done.state == "failed" and "line 2" in done.error and "expected 3 columns" in done.error
    assert worker.store.get_model(job.id) is None
    bad_config = submit(worker, {**TINY, "reserved_ratio": 2.0})
    assert "reserved_ratio" in worker.run_once().error
    assert worker.store.get_job(bad_config.id).state == "failed"


def _run_in_thread(worker):
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def _wait(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _progressed(worker, job_id):
    return lambda: worker.store.get_job(job_id).progress.get("step", 0) >= 2


def test_cancel_stops_a_running_job(worker):
    job = submit(worker, {**TINY, "steps": 1_000_000, "eval_every": 0})
    thread = _run_in_thread(worker)
    _wait(_progressed(worker, job.id))
    worker.store.request_cancel(job.id)
    _wait(lambda: worker.store.get_job(job.id).state == "cancelled")
    worker.stop()
    thread.join(timeout=30)
    assert worker.store.get_model(job.id) is None and not worker.home.model_dir(job.id).exists()


def test_stopping_worker_requeues_and_next_worker_resumes(worker, tmp_path):
    job = submit(worker, {**TINY, "steps": 400, "eval_every": 0})
    thread = _run_in_thread(worker)
    _wait(_progressed(worker, job.id))
    worker.stop()
    thread.join(timeout=60)
    requeued = worker.store.get_job(job.id)
    assert requeued.state == "queued" and requeued.attempts == 1
    assert (tmp_path / "runs" / job.id / CHECKPOINT).exists()
    stopped_at = requeued.progress["step"]
    assert 0 < stopped_at < 400
    successor = Worker(WorkerConfig(home=tmp_path, worker_id="successor", threads=1, heartbeat_seconds=0.05))
    done = successor.run_once()
    assert (done.state, done.attempts, done.worker) == ("succeeded", 2, "successor")
    import json

    history = json.loads((tmp_path / "runs" / job.id / "history.json").read_text())
    assert history["steps"] == list(range(1, 401))  # one continuous run: resumed, not restarted


def test_dead_workers_job_is_taken_over(worker):
    job = submit(worker, TINY)
    worker.store.claim_job("dead-worker")
    time.sleep(0.05)
    taker = Worker(WorkerConfig(home=worker.home.root, worker_id="taker", stale_after=0.01, threads=1))
    done = taker.run_once()
    assert (done.id, done.state, done.attempts) == (job.id, "succeeded", 2)


@pytest.mark.parametrize("text,params", [
    ("a\tr\tb\n", {}),  # two entities, one relation: int(0.1 * 2) = 0 reserved, rounded up to 1
    ("a\tr\ta\n", {}),  # one entity, a self-loop: every negative is the positive
    ("a\tr\tb\nb\tr\tc\nc\ts\ta\n", {"k": 100, "reserved_ratio": 0.5}),  # k larger than N_res
    ("a\tr\tb\nb\tr\tc\n", {"reserved_ratio": 0.0}),  # no reserved entities at all
], ids=["two-entities", "one-entity", "k-above-reserved", "no-reserved"])
def test_tiny_graphs_train_into_a_bundle(worker, text, params):
    from earl_service.serve.predictor import LinkPredictor

    job_id = new_id()
    folder = worker.home.upload_dir(job_id)
    folder.mkdir(parents=True)
    (folder / "train.txt").write_text(text)
    worker.store.create_job({**TINY, "eval_every": 0, **params}, {"train": f"uploads/{job_id}/train.txt"},
                            job_id=job_id)
    done = worker.run_once()
    assert done.state == "succeeded", done.error
    predictor = LinkPredictor.from_bundle(load_bundle(worker.home.version_path(job_id, 1)))
    assert len(predictor.predict_tails("a", "r", 5, exclude_known=False)) == len(predictor.entities)
