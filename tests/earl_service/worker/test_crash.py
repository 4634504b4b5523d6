"""Crash safety: a SIGKILLed worker's job resumes from its checkpoint elsewhere, or fails after bounded attempts;
models/ never shows a partial bundle; two workers never train the same job; a full disk or an unwritable
models/ fails the job with the reason and the worker lives on.

The SIGKILL tests run real `earl worker` processes on the bundled CoDEx-S train split (dim 16, 1 thread).
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import REPO, codex_s_path, random_triples

from earl_service.bundle.model_io import load_bundle
from earl_service.service.home import ServiceHome
from earl_service.service.records import new_id
from earl_service.service.sqlite_store import SqliteStore
from earl_service.train.loop import CHECKPOINT
from earl_service.worker.loop import Worker, WorkerConfig

# About 20 ms a step on 2 busy cores: a checkpoint every 100 steps (TrainConfig default) lands every ~2 s.
CODEX_JOB = {"dim": 16, "batch_size": 256, "negatives": 16, "eval_every": 0}
TINY = {"dim": 4, "k": 3, "reserved_ratio": 0.2, "steps": 6, "batch_size": 32, "negatives": 4, "eval_every": 0}


def submit_codex(store, home, steps):
    job_id = new_id()
    folder = home / "uploads" / job_id
    folder.mkdir(parents=True)
    shutil.copy(codex_s_path() / "train.txt", folder / "train.txt")
    return store.create_job({**CODEX_JOB, "steps": steps}, {"train": f"uploads/{job_id}/train.txt"}, job_id=job_id)


def submit_tiny(store, home, seed=0):
    job_id = new_id()
    folder = home / "uploads" / job_id
    folder.mkdir(parents=True)
    triples = np.unique(random_triples(30, 3, 200, seed=seed), axis=0)
    (folder / "train.txt").write_text("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in triples))
    return store.create_job(TINY, {"train": f"uploads/{job_id}/train.txt"}, job_id=job_id)


def start_worker(home, name, *args):
    log = (home / f"worker-{name}.log").open("w")
    cmd = [sys.executable, "-m", "earl_service.cli.main", "worker", "--home", str(home), "--threads", "1", "--poll", "0.1",
           "--id", name, *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def wait_for(predicate, what, procs=(), timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in procs:
            assert p.poll() is None, f"{p.args[-1]} exited with {p.returncode} while waiting for {what}"
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def sigkill(proc):
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def complete_bundles_only(home):
    """Every file in models/ is a complete, verified bundle (no temporary or partial name ever appears there)."""
    names = sorted(str(p.relative_to(home / "models")) for p in (home / "models").rglob("*") if p.is_file())
    for name in names:
        load_bundle(home / "models" / name)
    return names


@pytest.fixture
def home(tmp_path):
    for sub in ("uploads", "runs", "models"):
        (tmp_path / sub).mkdir()
    return tmp_path


@pytest.fixture
def store(home):
    s = SqliteStore(home / "earl.sqlite3")
    yield s
    s.close()


def test_sigkill_mid_training_resumes_from_the_last_checkpoint(home, store):
    job = submit_codex(store, home, steps=300)
    run = home / "runs" / job.id
    first = start_worker(home, "first")
    try:
        wait_for(lambda: (run / CHECKPOINT).exists(), "the first checkpoint", [first])
        sigkill(first)
    finally:
        stop(first)
    killed = store.get_job(job.id)
    saved_step = torch.load(run / CHECKPOINT, weights_only=True)["state"]["step"]
    assert killed.state == "running" and killed.worker == "first" and 100 <= saved_step < 300
    assert complete_bundles_only(home) == [] and store.get_model(job.id) is None

    second = start_worker(home, "second", "--stale-after", "2")
    try:
        wait_for(lambda: store.get_job(job.id).state not in ("queued", "running"), "the job to finish", [second])
    finally:
        stop(second)
    done = store.get_job(job.id)
    assert (done.state, done.error, done.worker, done.attempts) == ("succeeded", None, "second", 2)
    assert done.progress["resumed_from"] == saved_step and done.progress["step"] == 300
    assert f"resumed at step {saved_step} (attempt 2)" in (home / "worker-second.log").read_text()
    history = json.loads((run / "history.json").read_text())
    assert history["steps"] == list(range(1, 301))  # one continuous run: nothing lost, nothing repeated
    assert complete_bundles_only(home) == [f"{job.id}/v1.safetensors"]
    assert store.get_model(job.id).sha256 == load_bundle(ServiceHome(home).version_path(job.id, 1)).sha256


def test_a_job_that_keeps_killing_its_worker_fails_after_max_attempts(home, store):
    job = submit_codex(store, home, steps=1_000_000)
    for attempt, name in enumerate(("first", "second"), 1):
        proc = start_worker(home, name, "--stale-after", "1", "--max-attempts", "2")
        try:
            wait_for(lambda n=name: (j := store.get_job(job.id)).worker == n and j.progress.get("step", 0) > 0,
                     f"{name} to train", [proc])
            sigkill(proc)
        finally:
            stop(proc)
        assert store.get_job(job.id).attempts == attempt
    time.sleep(1.1)  # the heartbeat goes stale
    survivor = Worker(WorkerConfig(home=home, worker_id="third", stale_after=1, max_attempts=2, threads=1), store)
    assert survivor.run_once() is None  # nothing to run: the job was given up, not claimed a third time
    failed = store.get_job(job.id)
    assert failed.state == "failed" and failed.error == "the worker stopped responding 2 time(s); giving up"
    assert complete_bundles_only(home) == []


def test_two_workers_never_train_the_same_job(home, store):
    jobs = [submit_tiny(store, home, seed) for seed in range(4)]
    trained: list[tuple[str, str]] = []
    workers = [Worker(WorkerConfig(home=home, worker_id=f"w{i}", threads=1, poll_seconds=0.01,
                                   heartbeat_seconds=0.05, stale_after=60)) for i in range(2)]
    for w in workers:
        original = w._train

        def recording(job, beat, original=original, name=w.config.worker_id):
            trained.append((job.id, name))
            return original(job, beat)

        w._train = recording
    threads = [threading.Thread(target=lambda w=w: [w.run_once() for _ in range(len(jobs))]) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    ids = [job_id for job_id, _ in trained]
    assert sorted(ids) == sorted(j.id for j in jobs)  # each job trained exactly once
    assert {name for _, name in trained} == {"w0", "w1"}  # and both workers took part
    assert all(store.get_job(j.id).state == "succeeded" for j in jobs)
    for w in workers:
        w.store.close()


def _disk_full(monkeypatch, home):
    import earl_service.bundle.model_io

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(earl_service.bundle.model_io, "write_safetensors", full)
    return "No space left on device"


def _models_is_a_file(monkeypatch, home):
    shutil.rmtree(home / "models")
    (home / "models").write_text("not a directory")
    return "Not a directory"


def _models_read_only(monkeypatch, home):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions (the 'models is a file' case covers this as root)")
    (home / "models").chmod(0o555)
    return "Permission denied"


@pytest.mark.parametrize("break_storage", [_disk_full, _models_is_a_file, _models_read_only],
                         ids=["disk-full", "models-is-a-file", "models-read-only"])
def test_storage_failure_fails_the_job_cleanly(home, store, monkeypatch, break_storage):
    worker = Worker(WorkerConfig(home=home, worker_id="w", threads=1, heartbeat_seconds=0.05), store)
    job = submit_tiny(store, home)
    reason = break_storage(monkeypatch, home)
    done = worker.run_once()
    assert done.state == "failed" and done.error.startswith("storage error: ") and reason in done.error
    assert str(home) not in done.error  # paths relative to the service home
    assert store.get_model(job.id) is None
    assert not list((home / "runs" / job.id).glob("*tmp*"))
    # The worker lives on: with the storage repaired, the next job succeeds.
    monkeypatch.undo()
    if (home / "models").is_dir():
        (home / "models").chmod(0o755)
    else:
        (home / "models").unlink()
        (home / "models").mkdir()
    again = submit_tiny(store, home, seed=1)
    assert worker.run_once().state == "succeeded" and store.get_model(again.id) is not None
    assert complete_bundles_only(home) == [f"{again.id}/v1.safetensors"]


def test_bundles_reach_models_only_by_rename(home, store, monkeypatch):
    """No write ever targets models/: the bundle is written in the run directory and moved by os.replace."""
    import earl_service.bundle.model_io

    written, write = [], earl_service.bundle.model_io.write_safetensors

    def recording(path, *args, **kwargs):
        written.append(os.path.abspath(path))
        return write(path, *args, **kwargs)

    monkeypatch.setattr(earl_service.bundle.model_io, "write_safetensors", recording)
    worker = Worker(WorkerConfig(home=home, worker_id="w", threads=1, heartbeat_seconds=0.05), store)
    job = submit_tiny(store, home)
    assert worker.run_once().state == "succeeded"
    assert written and not [p for p in written if p.startswith(str(home / "models"))]
    assert complete_bundles_only(home) == [f"{job.id}/v1.safetensors"]
