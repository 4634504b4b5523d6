"""A compress job over a registered model: POST /jobs with source_model and max_bytes searches that model's sizes
(imports/compress.py) instead of training, and publishes the pick as a new model with its report. Checked before
queueing (unknown or another tenant's model 404, an EARL model, a budget below the smallest size, fields that do
not apply 422), run by the worker in process and, end to end, by real uvicorn and a worker process."""

import time

import httpx
import numpy as np
import pytest
from conftest import TINY_TRAIN, random_triples
from fastapi.testclient import TestClient
from tenants import ADMIN, TOKEN, make_key
from test_api_e2e import TOKEN as E2E_TOKEN
from test_api_e2e import service  # noqa: F401  # the live API + worker fixture

from api.main import create_app
from api.settings import Settings
from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.core import scorers
from earl_service.core.known import KnownAnswers
from earl_service.core.rotate import top_k
from earl_service.imports import sizes
from earl_service.worker.loop import Worker, WorkerConfig

N, R, D = 300, 3, 16  # 300 rows: pq's codebooks outweigh an int8 table, so the sizes are fp32, fp16 and int8


def imported_model(root, kind="distmult"):
    """An imported `kind` model from arrays, and a dataset folder of each sampled (h, r)'s best tail by its scorer
    (the model ranks its own graph high, so each size's MRR says something)."""
    rng = np.random.default_rng(0)
    entities = rng.normal(size=(N, 2 * D)).astype(np.float32)
    relations = rng.normal(size=(R, 2 * D)).astype(np.float32)
    (root / "src").mkdir(parents=True)
    np.save(root / "src" / "entity_embeddings.npy", entities)
    np.save(root / "src" / "relation_embeddings.npy", relations)
    (root / "src" / "entities.tsv").write_text("".join(f"e{i}\n" for i in range(N)))
    (root / "src" / "relations.tsv").write_text("".join(f"r{i}\n" for i in range(R)))
    scorer, rows = scorers.SCORERS[kind], []
    for h in rng.choice(N, 120, replace=False):
        r = int(rng.integers(R))
        dist = scorer.distances(scorer.query(entities[h], relations[r]), entities)
        dist[h] = np.inf
        rows.append((h, r, int(np.argmin(dist))))
    (root / "data").mkdir()
    for split, part in (("train", rows[:90]), ("valid", rows[90:])):
        (root / "data" / f"{split}.txt").write_text("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in part))
    assert main(["import", str(root / "src"), "--scorer", kind, "--graph", str(root / "data"),
                 "--out", str(root / "model.safetensors")]) == 0
    return root / "model.safetensors"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return imported_model(tmp_path_factory.mktemp("imported"))


def floor_of(path) -> int:
    """The smallest size's bytes before its header, as the API computes it."""
    bundle = load_bundle(path)
    shapes = {name: tuple(v.shape) for name, v in bundle.params.items()}
    return sizes.smallest(bundle.config.model, bundle.config.dim, shapes, fixed_bytes=sizes.fixed_bytes(path))[0]


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


@pytest.fixture
def client(home):
    with TestClient(create_app(Settings(home=home, api_token=TOKEN))) as c:
        yield c


def register(client, path, headers=ADMIN) -> str:
    r = client.post("/models", files={"bundle": ("m.safetensors", path.read_bytes())}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def graph_files(model_file) -> dict:
    data = model_file.parent / "data"
    return {split: (f"{split}.txt", (data / f"{split}.txt").read_bytes()) for split in ("train", "valid")}


def test_a_job_is_queued_with_the_model_version_and_its_budget(client, model_file):
    model_id = register(client, model_file)
    r = client.post("/jobs", data={"source_model": model_id, "max_bytes": "20kB"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    job = client.get(f"/jobs/{r.json()['id']}", headers=ADMIN).json()
    assert {k: job["params"][k] for k in ("source_model", "source_version", "max_bytes", "time_limit")} == {
        "source_model": model_id, "source_version": 1, "max_bytes": 20_000, "time_limit": sizes.DEFAULT_MINUTES}
    assert job["files"] == {} and "dim" not in job["params"]  # no training option is stored


@pytest.mark.parametrize(("data", "files", "status", "message"), [
    ({"max_bytes": "20kB", "dim": "32"}, (), 422, "dim: a job over a registered model"),
    ({"max_bytes": "20kB", "models": "rotate"}, (), 422, "models names the models retrain_minutes trains"),
    ({"max_bytes": "20kB", "retrain_minutes": "1", "models": "rotatE"}, ("train", "valid"), 422,
     "unknown model 'rotatE'"),
    ({}, (), 422, "give max_bytes"),
    ({"max_bytes": "20kB", "precisions": "pq:5"}, (), 422, "precisions: "),
    ({"max_bytes": "20kB", "time_limit": "2000"}, (), 422, "EARL_MAX_JOB_MINUTES"),
    ({"max_bytes": "20kB"}, ("train",), 422, "train and valid files together"),
    ({"max_bytes": "20kB"}, ("train", "valid", "entity_labels"), 422, "entity_labels: a job over a registered"),
    ({"max_bytes": "20kB", "retrain_minutes": "1"}, (), 422, "retrain_minutes needs train and valid files"),
    ({"max_bytes": "20kB", "time_limit": "1000", "retrain_minutes": "500"}, ("train", "valid"), 422,
     "+ retrain_minutes 500"),
    ({"max_bytes": "20kB", "retrain_minutes": "-1"}, ("train", "valid"), 422, "retrain_minutes"),
])
def test_bad_jobs_over_a_model_are_4xx_before_queueing(client, home, model_file, data, files, status, message):
    model_id = register(client, model_file)
    sent = {**graph_files(model_file), "entity_labels": ("e.tsv", b"e0\tzero\n")}
    r = client.post("/jobs", data={"source_model": model_id, **data}, headers=ADMIN,
                    files={name: sent[name] for name in files} or None)
    assert r.status_code == status and message in str(r.json()["detail"]), r.text
    assert client.get("/jobs", headers=ADMIN).json() == [] and not any((home / "uploads").glob("*/*"))


def test_a_budget_below_the_smallest_size_is_422_with_it(client, model_file):
    model_id, floor = register(client, model_file), floor_of(model_file)
    r = client.post("/jobs", data={"source_model": model_id, "max_bytes": str(floor - 1)}, headers=ADMIN)
    assert r.status_code == 422 and f"int8 takes {floor} bytes" in r.json()["detail"]
    assert client.post("/jobs", data={"source_model": model_id, "max_bytes": str(floor)},
                       headers=ADMIN).status_code == 202  # the header's bytes: the worker's check


def test_unknown_other_tenants_and_earl_models_are_refused(client, model_file, codex_bundle):
    acme, globex = make_key(client, "acme"), make_key(client, "globex")
    model_id = register(client, model_file, headers=acme)
    for source, headers in (("nosuchmodel", acme), (model_id, globex)):
        r = client.post("/jobs", data={"source_model": source, "max_bytes": "1MB"}, headers=headers)
        assert r.status_code == 404 and r.json()["detail"]["kind"] == "model", r.text
        assert model_id not in str(r.json()["detail"]["suggestions"])
    earl = register(client, codex_bundle)
    r = client.post("/jobs", data={"source_model": earl, "max_bytes": "1MB"}, headers=ADMIN)
    assert r.status_code == 422 and "is an EARL model" in r.json()["detail"]
    r = client.post("/jobs", data={"max_bytes": "1MB", "time_limit": "1"}, headers=ADMIN)
    assert r.status_code == 422 and "a job needs a train file" in r.json()["detail"]
    assert client.post("/jobs", data={"source_model": model_id, "max_bytes": "1MB"}, headers=acme).status_code == 202


def run_job(client, home, data, files=None) -> dict:
    """Queue a job over the API, run it with an in-process worker, return the job as the API shows it."""
    r = client.post("/jobs", data=data, files=files, headers=ADMIN)
    assert r.status_code == 202, r.text
    assert Worker(WorkerConfig(home=home, threads=1), store=client.app.state.store).run_once() is not None
    return client.get(f"/jobs/{r.json()['id']}", headers=ADMIN).json()


def test_the_worker_publishes_the_most_accurate_size_with_its_report(client, home, model_file):
    model_id = register(client, model_file)
    original = load_bundle(model_file)
    budget = original.num_bytes // 3  # fp32 and fp16 do not fit, int8 does
    job = run_job(client, home, {"source_model": model_id, "max_bytes": str(budget), "time_limit": "0.5"},
                  graph_files(model_file))
    assert job["state"] == "succeeded", job["error"]
    assert job["progress"]["step"] == job["progress"]["total"] == 3 and job["progress"]["job"] == "compress"
    made = client.get(f"/models/{job['model_id']}", headers=ADMIN).json()
    assert made["precision"] == "int8" and made["bytes"] <= budget and made["config"]["model"] == "distmult"
    report = client.get(f"/models/{job['model_id']}/report", headers=ADMIN)
    # The new model says what it was coded from and what it scored (the console's model view shows it).
    summary = made["metrics"]["compress"]
    assert summary["from"] == f"model {model_id} version 1" and summary["precision"] == "int8"
    assert summary["valid"]["mrr"] == next(r["mrr"] for r in report.json()["candidates"] if r["precision"] == "int8")
    assert report.json()["pick"] == "int8" and report.json()["source"] == f"model {model_id} version 1"
    assert report.json()["original"]["mrr"] > 0.5 and str(home) not in report.text  # no server path
    assert "**pick**" in client.get(f"/models/{job['model_id']}/report?format=md", headers=ADMIN).text
    plot = client.get(f"/models/{job['model_id']}/frontier.png", headers=ADMIN)
    assert plot.status_code == 200 and plot.content[:4] == b"\x89PNG"  # sizes scored on the job's graph
    assert client.get(f"/models/{model_id}", headers=ADMIN).json()["precision"] == "fp32"  # the source stays


def test_a_job_can_also_train_a_model_at_the_budget_on_its_files(client, home, model_file):
    """retrain_minutes: the regular search on the job's files at max_bytes is one more row of the report, scored on
    the same valid triples; the published model is the best row. Only with source_model and files."""
    r = client.post("/jobs", data={"max_bytes": "1MB", "time_limit": "1", "retrain_minutes": "1"}, headers=ADMIN,
                    files={"train": ("train.txt", b"a\tr\tb\nb\tr\tc\n")})
    assert r.status_code == 422 and "retrain_minutes goes with source_model" in r.json()["detail"], r.text
    model_id = register(client, model_file)
    budget = load_bundle(model_file).num_bytes // 3
    job = run_job(client, home, {"source_model": model_id, "max_bytes": str(budget), "time_limit": "0.2",
                                 "retrain_minutes": "0.2", "models": "earl, rotate"}, graph_files(model_file))
    assert job["state"] == "succeeded", job["error"]
    assert job["params"]["retrain_minutes"] == 0.2 and job["params"]["models"] == "earl,rotate"
    report = client.get(f"/models/{job['model_id']}/report", headers=ADMIN).json()
    rows = {row["precision"]: row for row in report["candidates"]}
    assert rows["retrained"]["fits"] and rows["retrained"]["bytes"] <= budget
    assert rows["retrained"]["retrained"]["eval_triples"] > 0 and isinstance(rows["retrained"]["mrr"], float)
    best = max((row for row in rows.values() if row.get("fits")), key=lambda row: (row["mrr"], -row["bytes"]))
    assert report["pick"] == best["precision"]
    made = client.get(f"/models/{job['model_id']}", headers=ADMIN).json()
    assert made["bytes"] == report["pick_bytes"] <= budget and str(home) not in str(report)
    assert report["pick_bytes"] >= best["bytes"]  # the scored file, and a summary of the search where it fits


def test_the_compressed_model_answers_exactly_as_its_tables_rank(client, home, model_file):
    """Exact ranking through GET /predict: the top 10 of a numpy scan over the published bundle's own tables."""
    model_id = register(client, model_file)
    job = run_job(client, home, {"source_model": model_id, "max_bytes": str(load_bundle(model_file).num_bytes // 3)})
    assert job["state"] == "succeeded", job["error"]
    path = home / "pick.safetensors"
    path.write_bytes(client.get(f"/models/{job['model_id']}/bundle", headers=ADMIN).content)
    bundle = load_bundle(path)
    entities, relations = bundle.params["entities"], bundle.params["relations"]
    known = KnownAnswers(bundle.triples, len(bundle.relations))
    scorer = scorers.SCORERS["distmult"]
    for h, r in ((0, 0), (7, 2), (42, 1)):
        got = client.get("/predict", params={"model": job["model_id"], "head": f"e{h}", "relation": f"r{r}"},
                         headers=ADMIN).json()["predictions"]
        ids, dist = top_k(np.arange(N), scorer.distances(scorer.query(entities[h], relations[r]), entities), 10,
                          excluded=known.answers("tail", h, r))
        assert [p["entity"] for p in got] == [f"e{i}" for i in ids]
        assert [p["score"] for p in got] == pytest.approx([-float(d) for d in dist], rel=1e-5)


def test_a_budget_only_the_header_breaks_fails_the_job_with_the_smallest_size(client, home, model_file):
    model_id = register(client, model_file)
    job = run_job(client, home, {"source_model": model_id, "max_bytes": str(floor_of(model_file))})
    assert job["state"] == "failed" and f"no size of model {model_id} fits" in job["error"]
    assert "the smallest, int8, takes" in job["error"]


def test_a_rotate_model_trained_here_is_compressed_too(client, home, tmp_path):
    from earl_service.bundle.model_io import export_bundle
    from earl_service.config import ModelConfig, TrainConfig
    from earl_service.data.dataset import load_dataset
    from earl_service.train.loop import train

    (tmp_path / "kg").mkdir()
    (tmp_path / "kg" / "train.txt").write_text("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in random_triples(400, 3, 2000)))
    train(load_dataset(tmp_path / "kg"), ModelConfig(model="rotate", dim=16), TrainConfig(**{**TINY_TRAIN, "steps": 3}),
          tmp_path / "run", final_eval=False)
    trained = export_bundle(tmp_path / "run", tmp_path / "rotate.safetensors")
    model_id = register(client, trained)
    job = run_job(client, home, {"source_model": model_id, "max_bytes": str(load_bundle(trained).num_bytes // 2)})
    assert job["state"] == "succeeded", job["error"]
    made = client.get(f"/models/{job['model_id']}", headers=ADMIN).json()
    assert made["config"]["model"] == "rotate" and made["precision"] in ("int8", "pq:8", "pq:4", "pq:2")
    answers = client.get("/predict", params={"model": job["model_id"], "head": "e1", "relation": "r0", "k": 3},
                         headers=ADMIN)
    assert answers.status_code == 200 and len(answers.json()["predictions"]) == 3


def test_a_job_over_an_imported_model_through_real_uvicorn_and_a_worker_process(service, model_file):  # noqa: F811
    base, home = service
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {E2E_TOKEN}"}) as http:
        r = http.post("/models", files={"bundle": ("m.safetensors", model_file.read_bytes())})
        assert r.status_code == 201, r.text
        model_id, budget = r.json()["id"], load_bundle(model_file).num_bytes // 3
        r = http.post("/jobs", data={"source_model": model_id, "max_bytes": str(budget), "time_limit": "0.5"},
                      files=graph_files(model_file))
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 300  # generous: a loaded 2-core machine
        while (job := http.get(f"/jobs/{r.json()['id']}").json())["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["state"] == "succeeded", job["error"]
        bundle = http.get(f"/models/{job['model_id']}/bundle")
        assert bundle.status_code == 200 and len(bundle.content) <= budget
        assert http.get(f"/models/{job['model_id']}/report").json()["pick"] == "int8"
        answer = http.get("/predict", params={"model": job["model_id"], "head": "e0", "relation": "r1", "k": 5})
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 5
