"""earl_client.Client against a live service on 127.0.0.1: uvicorn api.main:app and `earl worker`, as processes."""

from pathlib import Path

import httpx
import pytest
from conftest import BUNDLED_KG, api_and_worker, codex_s_path, free_port

from earl_client import Client, JobFailed, ServiceError
from earl_service.bundle.model_io import load_bundle

TOKEN = "client-token"
TINY = {"dim": 16, "steps": 30, "batch_size": 256, "negatives": 16, "eval_every": 0}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The base URL of an API and one worker sharing a throwaway EARL_HOME, with a write token."""
    env = {"EARL_STORE": "sqlite", "EARL_API_TOKEN": TOKEN}
    with api_and_worker(tmp_path_factory.mktemp("client_service"), env) as base:
        yield base


@pytest.fixture
def client(service):
    with Client(service, TOKEN) as client:
        yield client


def test_job_from_paths_to_predictions_and_a_verified_download(client, tmp_path):
    data = codex_s_path()
    entity_labels = tmp_path / "entities.tsv"
    entity_labels.write_text("Q7604\tLeonhard Euler\nQ188\tGerman\n")
    job_id = client.submit_job(data / "train.txt", valid=data / "valid.txt", entity_labels=entity_labels,
                               relation_labels=BUNDLED_KG / "relations.en.json",
                               params={**TINY, "no_mulhop": False})
    seen = []
    job = client.wait(job_id, on_progress=seen.append, poll_s=0.2, timeout=300)
    assert job["state"] == "succeeded" and job["progress"]["step"] == 30
    assert seen[-1] == job and all(j["id"] == job_id for j in seen)
    assert job["params"]["dim"] == 16 and job["params"]["no_mulhop"] is False
    assert set(job["files"]) == {"train", "valid", "entity_labels", "relation_labels"}

    model = client.model(job["model_id"])
    tails = client.predict(model["id"], "P1412", head="Q7604", k=10)  # the first line of train.txt
    heads = client.predict(model["id"], "P1412", tail="Q188", k=5)
    assert tails["direction"] == "tail" and len(tails["predictions"]) == 10
    assert heads["direction"] == "head" and len(heads["predictions"]) == 5
    assert tails["relation_label"] == "languages spoken, written, or signed"
    assert tails["head_label"] == "Leonhard Euler" and heads["tail_label"] == "German"
    many = client.predict_many(model["id"], [{"head": "Leonhard Euler", "relation": "P1412", "k": 10},
                                             {"tail": "Q188", "relation": "P1412", "k": 5}])
    assert many == [{key: v for key, v in answer.items() if key != "model"} for answer in (tails, heads)]
    best = tails["predictions"][0]["entity"]
    scored = client.score(model["id"], "Leonhard Euler", "languages spoken, written, or signed", best)
    assert (scored["head"], scored["head_label"], scored["relation"], scored["tail"]) == ("Q7604", "Leonhard Euler",
                                                                                         "P1412", best)
    assert scored["score"] == pytest.approx(tails["predictions"][0]["score"], abs=1e-4) and not scored["known"]
    assert scored["tail_rank"] >= 1 and scored["entities"] == model["entities"]

    path = tmp_path / "model.safetensors"
    assert client.download(model["id"], path) == model["sha256"] == load_bundle(path).sha256
    assert path.stat().st_size == model["bytes"]


def test_wait_times_out_then_reports_a_cancelled_job(client):
    job_id = client.submit_job(codex_s_path() / "train.txt", params={**TINY, "steps": 1_000_000})
    with pytest.raises(TimeoutError, match=job_id):
        client.wait(job_id, poll_s=0.1, timeout=0.3)
    assert client.http.post(f"/jobs/{job_id}/cancel").status_code == 200
    with pytest.raises(JobFailed, match="cancelled") as failed:
        client.wait(job_id, poll_s=0.2, timeout=120)
    assert failed.value.job["id"] == job_id and failed.value.job["state"] == "cancelled"


def test_errors_carry_the_services_reason(client, service, tmp_path):
    with pytest.raises(ServiceError, match="model 'nope' not found") as missing:
        client.predict("nope", "P1412", head="Q7604")
    assert missing.value.status_code == 404
    with pytest.raises(ServiceError, match="give exactly one of"):
        client.predict("nope", "P1412", head="Q7604", tail="Q188")
    with pytest.raises(ServiceError, match="not found"):
        client.download("nope", tmp_path / "none.safetensors")

    bad = tmp_path / "train.txt"
    bad.write_text("a\tr\tb\nonly\ttwo\n")  # 2 fields whether split by tabs or by spaces
    with pytest.raises(ServiceError, match="line 2") as malformed:
        client.submit_job(bad)
    assert malformed.value.status_code == 422
    with Client(service) as anonymous, pytest.raises(ServiceError) as refused:
        anonymous.submit_job(codex_s_path() / "train.txt", params=TINY)
    assert refused.value.status_code == 401


def test_wait_ready_gives_up_on_a_dead_server_and_on_its_deadline():
    with Client(f"http://127.0.0.1:{free_port()}") as client:
        assert not client.ready()
        with pytest.raises(RuntimeError, match="stopped before it was ready"):
            client.wait_ready(5, alive=lambda: False)
        with pytest.raises(TimeoutError, match="not ready within"):
            client.wait_ready(0.2)


def test_submit_job_streams_its_files_from_disk(tmp_path, monkeypatch):
    train, labels = tmp_path / "train.txt", tmp_path / "relations.en.json"
    train.write_text("a\tr\tb\n")
    labels.write_text('{"r": "relates to"}')
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.read())
        return httpx.Response(202, json={"id": "j1"})

    monkeypatch.setattr(Path, "read_bytes", lambda path: pytest.fail(f"{path} was read whole into memory"))
    with Client("http://earl.test") as client:
        client.http = httpx.Client(base_url="http://earl.test", transport=httpx.MockTransport(answer))
        assert client.submit_job(train, relation_labels=labels, params={"dim": 16, "no_knn": True}) == "j1"
    (body,) = sent
    assert b'name="train"; filename="train.txt"' in body and b"a\tr\tb\n" in body
    assert b'name="relation_labels"; filename="relations.en.json"' in body and b'{"r": "relates to"}' in body
    assert b'name="valid"' not in body and b'name="no_knn"\r\n\r\ntrue' in body


def test_register_extend_and_delete_a_bundle_from_open_files(client, codex_bundle, tmp_path):
    with codex_bundle.open("rb") as opened:
        model = client.register(opened)
    assert model["sha256"] == load_bundle(codex_bundle).sha256 and model["version"] == 1
    assert model["id"] in [m["id"] for m in client.models()]
    new = tmp_path / "new.tsv"
    new.write_text("Q7604\tP1412\tnew-entity\n")
    extended = client.extend(model["id"], new)
    assert extended["version"] == 2 and extended["entities"] == model["entities"] + 1
    assert client.predict(model["id"], "P1412", head="new-entity", k=3)["predictions"]
    client.delete(model["id"])
    with pytest.raises(ServiceError, match="not found") as gone:
        client.model(model["id"])
    assert gone.value.status_code == 404


def test_submit_job_takes_open_files_and_extra_fields(client, tmp_path):
    with (codex_s_path() / "train.txt").open("rb") as train:
        job_id = client.submit_job(train, params={**TINY, "steps": 1_000_000})
    job = client.cancel(job_id)
    assert job["id"] == job_id and (job["state"] == "cancelled" or job["cancel_requested"])
    assert client.job(job_id)["files"]["train"].endswith("train.txt")
    with pytest.raises(ServiceError, match="unknown form field") as unknown:
        client.submit_job(codex_s_path() / "train.txt", files={"trian": codex_s_path() / "valid.txt"})
    assert unknown.value.status_code == 422


def test_predict_many_sends_batches_of_the_services_cap_and_names_a_bad_query(client, codex_bundle):
    """250 queries go as POST /predict batches of 100, 100 and 50 (the service refuses more than 100), answered in
    order as predict answers each; an unknown entity fails with the service's reason naming the query."""
    model = client.register(codex_bundle)["id"]
    bundle = load_bundle(codex_bundle)
    queries = [{"head": bundle.entities.names[h], "relation": bundle.relations.names[r], "k": 3}
               for h, r, _ in bundle.triples[:250].tolist()]
    sent = []
    client.http.event_hooks["request"].append(lambda request: sent.append(request.method))
    answers = client.predict_many(model, queries)
    assert sent == ["POST"] * 3 and len(answers) == 250
    for i in (0, 99, 100, 249):
        single = client.predict(model, queries[i]["relation"], head=queries[i]["head"], k=3)
        assert answers[i] == {key: v for key, v in single.items() if key != "model"}
    assert client.predict_many(model, []) == []
    with pytest.raises(ServiceError, match=r"queries\[1\]: unknown entity 'nope'") as unknown:
        client.predict_many(model, [queries[0], {"head": "nope", "relation": queries[0]["relation"]}])
    assert unknown.value.status_code == 404
    with pytest.raises(ServiceError, match="unknown relation") as bad:
        client.score(model, queries[0]["head"], "nope", queries[0]["head"])
    assert bad.value.status_code == 404
    client.delete(model)
