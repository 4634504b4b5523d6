"""Compress jobs over HTTP: POST /jobs with max_bytes, checks before queueing, the report endpoints, and a tiny
job through real uvicorn and a worker process."""

import time

import httpx
import numpy as np
import pytest
from conftest import random_triples
from fastapi.testclient import TestClient
from test_api_e2e import TOKEN, service  # noqa: F401  # the live API + worker fixture

from api.main import create_app
from api.settings import Settings
from earl_service.bundle.format import PAD_KEY
from earl_service.bundle.sizes import BundleSizes
from earl_service.config.options import recipe_options
from earl_service.config.recipes import DEFAULT, RECIPES
from earl_service.data.dataset import load_dataset

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def tiny_splits(folder=None) -> dict[str, bytes]:
    """40 entities, 3 relations: train, valid and test files of a random multigraph (written to `folder` too)."""
    triples = np.unique(random_triples(40, 3, 300, seed=3), axis=0)
    np.random.default_rng(0).shuffle(triples)
    parts = {"train": triples[:250], "valid": triples[250:270], "test": triples[270:]}
    texts = {k: "".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in v).encode() for k, v in parts.items()}
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (folder / f"{name}.txt").write_bytes(text)
    return texts


@pytest.fixture(scope="module")
def sizes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_splits(folder)
    return BundleSizes(load_dataset(folder))


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path, api_token=TOKEN))) as c:
        yield c


def post(client, data, splits=("train", "valid")):
    files = {name: (f"{name}.txt", text) for name, text in tiny_splits().items() if name in splits}
    return client.post("/jobs", files=files, data=data, headers=AUTH)


def test_a_compress_job_is_queued_with_its_budget_in_bytes(client):
    r = post(client, {"max_bytes": "1.5 MiB", "time_limit": "2", "models": "rotate", "metric": "hits@10"})
    assert r.status_code == 202, r.text
    params = client.get(f"/jobs/{r.json()['id']}").json()["params"]
    assert params["max_bytes"] == 1_572_864 and params["models"] == "rotate" and params["metric"] == "hits@10"
    shares = post(client, {"max_bytes": "2MB", "time_limit": "2", "reserved_ratios": "0.1, 0.4"})
    assert client.get(f"/jobs/{shares.json()['id']}").json()["params"]["reserved_ratios"] == "0.1, 0.4"
    plain = client.get(f"/jobs/{post(client, {'steps': '3'}).json()['id']}").json()["params"]
    assert not {"max_bytes", "models", "precisions", "metric"} & set(plain)  # training jobs are as before


@pytest.mark.parametrize(("data", "message"), [
    ({"max_bytes": "2 parsecs", "time_limit": "1"}, "cannot read '2 parsecs' as a size"),
    ({"max_bytes": "-3MB", "time_limit": "1"}, "must be positive"),
    ({"max_bytes": "0", "time_limit": "1"}, "at least 1 byte"),
    ({"max_bytes": "2MB"}, "needs time_limit"),
    ({"max_bytes": "2MB", "time_limit": "0"}, "needs time_limit"),
    ({"max_bytes": "2MB", "time_limit": "1", "models": "earl,transe"}, "unknown model 'transe'"),
    ({"max_bytes": "2MB", "time_limit": "1", "precisions": "fp32,bf16"}, "unknown precision 'bf16'"),
    ({"max_bytes": "2MB", "time_limit": "1", "metric": "hits@3"}, "metric"),
    ({"precisions": "int8"}, "give max_bytes too"),
    ({"max_bytes": "2MB", "time_limit": "1", "reserved_ratios": "0.1,2"}, "reserved_ratios must each be above 0"),
    ({"max_bytes": "2MB", "time_limit": "1", "reserved_ratios": "ten"}, "cannot read 'ten' as reserved ratios"),
])
def test_bad_compress_settings_are_422_before_queueing(client, tmp_path, data, message):
    r = post(client, data)
    assert r.status_code == 422 and message in r.text
    assert client.get("/jobs").json() == [] and not any((tmp_path / "uploads").iterdir())


def test_a_budget_under_the_graphs_own_bytes_is_422_with_the_minimum(client, tmp_path, sizes):
    floor = sizes.fixed_bytes()  # what the API computes from the upload, without torch
    r = post(client, {"max_bytes": str(floor), "time_limit": "1"})
    assert r.status_code == 422 and f"alone take {floor} bytes" in r.json()["detail"]
    assert "or known_answers none: rotate bundles then leave the graph out" in r.json()["detail"]  # the way out
    assert client.get("/jobs").json() == [] and not any((tmp_path / "uploads").iterdir())
    assert post(client, {"max_bytes": str(floor + 1), "time_limit": "1"}).status_code == 202  # the worker decides
    # Where RotatE leaves the graph out, the floor is the names': the worker plans RotatE alone then.
    assert post(client, {"max_bytes": str(floor), "time_limit": "1", "known_answers": "none"}).status_code == 202
    r = post(client, {"max_bytes": str(floor), "time_limit": "1", "models": "earl"})
    assert r.status_code == 422 and "known_answers" not in r.json()["detail"]  # EARL reads its graph


def test_a_compress_job_without_valid_file_is_422(client, tmp_path):
    r = post(client, {"max_bytes": "2MB", "time_limit": "1"}, splits=("train",))
    assert r.status_code == 422 and "valid file" in r.json()["detail"]
    assert client.get("/jobs").json() == [] and not any((tmp_path / "uploads").iterdir())


def test_a_model_without_report_is_404(client, codex_bundle):
    with codex_bundle.open("rb") as fh:
        model_id = client.post("/models", files={"bundle": ("b.safetensors", fh)}, headers=AUTH).json()["id"]
    for path in (f"/models/{model_id}/report", f"/models/{model_id}/report?format=md",
                 f"/models/{model_id}/frontier.png"):
        r = client.get(path)
        assert r.status_code == 404 and r.json()["detail"]["kind"] == "report", path
        assert "no compress report" in r.json()["detail"]["message"]
    r = client.get("/models/nosuchmodel/report")
    assert r.status_code == 404 and r.json()["detail"]["kind"] == "model"


def test_a_tiny_compress_job_over_http(service, sizes):  # noqa: F811
    base, _ = service
    budget = sizes.bytes("rotate", 32, "fp32")
    form = {"max_bytes": str(budget), "time_limit": "0.1", "precisions": "fp32,int8", "batch_size": "64",
            "negatives": "8"}
    with httpx.Client(base_url=base, timeout=30, headers=AUTH) as http:
        files = {name: (f"{name}.txt", text) for name, text in tiny_splits().items()}
        r = http.post("/jobs", files=files, data=form)
        assert r.status_code == 202, r.text
        job_id, seen = r.json()["id"], []
        deadline = time.monotonic() + 300  # generous: CI machines can be much slower than this one
        while (job := http.get(f"/jobs/{job_id}").json())["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, f"job still {job['state']}: {job['progress']}"
            seen.append(job["progress"])
            time.sleep(0.2)
        assert job["state"] == "succeeded", job["error"]
        seen.append(job["progress"])
        progress = [p for p in seen if p.get("candidate")]
        assert progress and all({"stage", "rung", "rungs", "time_left"} <= set(p) for p in progress)
        assert progress[-1]["stage"] == "done"

        model_id = job["model_id"]
        download = http.get(f"/models/{model_id}/bundle")
        assert download.status_code == 200 and len(download.content) <= budget
        metrics = http.get(f"/models/{model_id}").json()["metrics"]
        assert PAD_KEY not in metrics and metrics["compress"]["max_bytes"] == budget
        report = http.get(f"/models/{model_id}/report").json()
        assert report["pick"]["bytes"] == len(download.content) and report["max_bytes"] == budget
        assert metrics["compress"]["candidate"] == report["pick"]["candidate"]
        markdown = http.get(f"/models/{model_id}/report", params={"format": "md"})
        assert markdown.headers["content-type"].startswith("text/markdown")
        assert report["pick"]["candidate"] in markdown.text
        png = http.get(f"/models/{model_id}/frontier.png")
        assert png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG")


def test_a_compress_jobs_train_file_gets_the_upload_checks(client, tmp_path):
    long_name = "e" * 1001
    files = {"train": ("train.txt", f"{long_name}\tr\tb\n".encode()), "valid": ("valid.txt", b"a\tr\tb\n")}
    for form in ({"steps": "3"}, {"max_bytes": "2MB", "time_limit": "1"}):  # read whole (compress) or counted
        r = client.post("/jobs", files=files, data=form, headers=AUTH)
        assert r.status_code == 422 and "a name is 1,001 characters long" in r.text, form
    assert client.get("/jobs").json() == [] and not any((tmp_path / "uploads").iterdir())


def test_a_compress_job_leaves_the_recipe_values_to_each_candidates_model(client):
    params = client.get(f"/jobs/{post(client, {'max_bytes': '1MB', 'time_limit': '2'}).json()['id']}").json()["params"]
    left = set(recipe_options(DEFAULT, "earl")) | set(recipe_options(DEFAULT, "rotate"))
    assert params["recipe"] == DEFAULT and all(params[k] is None for k in left)  # the worker fills them per model
    given = post(client, {"max_bytes": "1MB", "time_limit": "2", "lr": "0.0123"}).json()["id"]
    assert client.get(f"/jobs/{given}").json()["params"]["lr"] == 0.0123


def test_the_servers_caps_apply_to_the_values_a_recipe_gives_each_model(client, monkeypatch):
    monkeypatch.setitem(RECIPES[DEFAULT], "rotate", {"batch_size": 4096, "negatives": 4096})
    r = post(client, {"max_bytes": "1MB", "time_limit": "2", "models": "earl,rotate"})
    assert r.status_code == 422 and "EARL_MAX_BATCH_X_NEGATIVES" in r.text
    assert post(client, {"max_bytes": "1MB", "time_limit": "2", "models": "earl"}).status_code == 202
