"""Compress jobs in the worker: settings from the job's params, progress, cancel, resume after a stop, the pick
published with its report (a fake compress() where the search itself does not matter)."""

import json
import time

import numpy as np
import pytest
from conftest import random_triples, tiny_dataset

from earl_service.bundle.format import PAD_KEY
from earl_service.bundle.sizes import MIN_DIM, BundleSizes, padded_metrics
from earl_service.compress import search as compress_module
from earl_service.compress.config import CompressConfig
from earl_service.compress.job import compress_settings
from earl_service.compress.state import PICK, STATE
from earl_service.data.dataset import load_dataset
from earl_service.errors import ConfigError
from earl_service.service.records import new_id
from earl_service.worker.loop import Worker, WorkerConfig

PRECISIONS = ("fp32", "fp16", "int8")  # the uniform ones (bundle/precision.py): one encoding per weight


def write_splits(folder):
    folder.mkdir(parents=True)
    triples = np.unique(random_triples(40, 3, 300, seed=3), axis=0)
    for name, part in (("train", triples[:250]), ("valid", triples[250:])):
        (folder / f"{name}.txt").write_text("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in part))
    return folder


def submit(worker, params):
    """A compress job queued the way the API does (train and valid files under HOME/uploads/<id>/)."""
    job_id = new_id()
    write_splits(worker.home.upload_dir(job_id))
    files = {split: f"uploads/{job_id}/{split}.txt" for split in ("train", "valid")}
    return worker.store.create_job({"seed": 0, "time_limit": 1.0, **params}, files, job_id=job_id)


def new_worker(home):
    return Worker(WorkerConfig(home=home, heartbeat_seconds=0.05, poll_seconds=0.05, threads=1))


@pytest.fixture
def worker(tmp_path):
    w = new_worker(tmp_path)
    yield w
    w.store.close()


EVENT = {"stage": "train", "candidate": "rotate-d8", "rung": 0, "rungs": 2, "time_left": 41.234}


def finish_like_compress(out, dataset):
    """What a finished search leaves in `out`: the pick (padded metrics, as compress writes them) and the report."""
    sizes = BundleSizes(dataset)
    pick = sizes.untrained(sizes.config("rotate", 8))
    pick.metrics = padded_metrics({"compress": {"candidate": "rotate-d8", "max_bytes": 10**6}})
    pick.save(out / PICK, precision="int8", coding="plain")
    (out / "report.json").write_text(json.dumps({"pick": {"candidate": "rotate-d8"}}))
    (out / "report.md").write_text("# Compress report\n")
    (out / "frontier.png").write_bytes(b"\x89PNG fake")
    return {"pick": {"candidate": "rotate-d8"}}


def test_a_stopped_job_is_requeued_and_continues_in_the_same_folder(worker, tmp_path, monkeypatch):
    calls = []

    def fake_compress(dataset, out, config, *, on_progress, should_stop, **kwargs):
        calls.append((out, config, (out / STATE).exists()))
        out.mkdir(parents=True, exist_ok=True)
        on_progress(EVENT)
        if len(calls) == 1:  # the first worker is asked to stop mid-search: the state so far is saved
            (out / STATE).write_text("{}")
            worker.stop()
            assert should_stop()
            return None
        return finish_like_compress(out, dataset)

    monkeypatch.setattr(compress_module, "compress", fake_compress)
    job = submit(worker, {"max_bytes": 123456, "models": "rotate", "precisions": "fp32,int8", "metric": "hits@10"})
    requeued = worker.run_once()
    assert requeued.state == "queued" and requeued.model_id is None
    assert requeued.progress == {"job": "compress", **EVENT, "time_left": 41.2, "resumed": False}

    again = new_worker(tmp_path)  # a restarted worker
    done = again.run_once()
    assert (done.state, done.error, done.model_id) == ("succeeded", None, job.id)
    assert done.progress["resumed"] is True and done.progress["candidate"] == "rotate-d8"
    (first_out, config, had_state), (second_out, _, has_state) = calls
    assert first_out == second_out == again.home.run_dir(job.id) and (had_state, has_state) == (False, True)
    assert config == CompressConfig(max_bytes=123456, time_limit_minutes=1.0, models=("rotate",),
                                    precisions=("fp32", "int8"), metric="hits@10")

    record = again.store.get_model(job.id)
    assert PAD_KEY not in record.metrics and record.metrics["compress"]["candidate"] == "rotate-d8"
    assert record.precision == "int8" and (second_out / PICK).is_file()  # the run folder keeps its pick
    for kind in ("json", "md", "png"):
        assert again.home.report_path(job.id, kind).read_bytes() == (second_out / again.home.report_path(
            job.id, kind).name).read_bytes()
    again.registry.delete(job.id)
    assert not again.home.model_dir(job.id).exists()  # the report went with the model
    again.store.close()


def test_a_cancelled_compress_job_ends_cancelled(worker, monkeypatch):
    def fake_compress(dataset, out, config, *, on_progress, should_stop, **kwargs):
        worker.store.request_cancel(job.id)
        for _ in range(200):  # the heartbeat brings the flag within a few beats
            if should_stop():
                return None
            time.sleep(0.05)
        raise AssertionError("the cancel never reached should_stop")

    monkeypatch.setattr(compress_module, "compress", fake_compress)
    job = submit(worker, {"max_bytes": "2MB"})
    done = worker.run_once()
    assert (done.state, done.model_id) == ("cancelled", None)
    assert worker.store.get_model(job.id) is None


def test_the_workers_compress_parallel_is_the_searchs(tmp_path, monkeypatch):
    """How many candidates train at once is the worker's setting (`earl worker --compress-parallel`), not the
    job's: the search runs with it."""
    seen = []

    def fake_compress(dataset, out, config, **kwargs):
        seen.append(config.parallel)
        out.mkdir(parents=True, exist_ok=True)
        return finish_like_compress(out, dataset)

    monkeypatch.setattr(compress_module, "compress", fake_compress)
    w = Worker(WorkerConfig(home=tmp_path, heartbeat_seconds=0.05, poll_seconds=0.05, threads=1, compress_parallel=3))
    submit(w, {"max_bytes": "2MB", "parallel": 9})  # not a job field: ignored
    assert w.run_once().state == "succeeded" and seen == [3]
    w.store.close()


def test_a_budget_under_the_smallest_bundle_fails_the_job_with_the_minimum(worker, tmp_path):
    """The API refuses budgets under the graph's own bytes; between those and the smallest bundle (weights
    included) the worker's search refuses, before training, and the job's error says the minimum."""
    sizes = BundleSizes(load_dataset(write_splits(tmp_path / "same-graph")))
    smallest = min(sizes.bytes(m, MIN_DIM, p) for m in ("earl", "rotate") for p in PRECISIONS)
    assert sizes.fixed_bytes() < smallest - 1
    job = submit(worker, {"max_bytes": smallest - 1})
    done = worker.run_once()
    assert done.state == "failed" and f"{smallest} bytes" in done.error
    assert not worker.home.run_dir(job.id).exists()


@pytest.mark.parametrize(("params", "message"), [
    ({"max_bytes": "2 parsecs", "time_limit": 1}, "cannot read '2 parsecs' as a size"),
    ({"max_bytes": "-3MB", "time_limit": 1}, "must be positive"),
    ({"max_bytes": "2MB", "time_limit": 0}, "needs time_limit"),
    ({"max_bytes": "2MB"}, "needs time_limit"),
    ({"max_bytes": "2MB", "time_limit": 1, "models": "earl,transe"}, "unknown model 'transe'"),
    ({"max_bytes": "2MB", "time_limit": 1, "precisions": ""}, "unknown precision"),
    ({"max_bytes": "2MB", "time_limit": 1, "nproc_per_node": 2}, "nproc_per_node"),
    ({"models": "earl"}, "give max_bytes too"),
])
def test_bad_compress_settings_are_refused(params, message):
    with pytest.raises(ConfigError, match=message):
        compress_settings(params)


def test_settings_default_to_every_model_and_precision():
    assert compress_settings({"dim": 16}) is None
    assert compress_settings({"max_bytes": "1.5 MiB", "time_limit": 2, "seed": 3, "models": None}) == CompressConfig(
        max_bytes=1_572_864, time_limit_minutes=2.0, seed=3)


def test_the_api_floor_is_the_graph_bytes_of_every_bundle():
    from earl_service.bundle.format import graph_bytes

    dataset = tiny_dataset()
    names = dataset.entities.names[: dataset.num_train_entities]
    assert graph_bytes(dataset.train, names, dataset.relations.names) == BundleSizes(dataset).fixed_bytes() > 0
