"""Models and predictions over HTTP: upload, inspect, download with ETag, extend, predict, delete."""

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.schemas import PredictionOut
from api.settings import Settings
from earl_service.bundle.model_io import load_bundle
from earl_service.serve.predictor import LinkPredictor

AUTH = {"Authorization": "Bearer t"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with TestClient(create_app(Settings(home=home, api_token="t", cache_models=2))) as c:
        yield c


@pytest.fixture(scope="module")
def model_id(client, codex_bundle):
    r = client.post("/models", files={"bundle": ("codex.safetensors", codex_bundle.read_bytes())}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture(scope="module")
def reference(codex_bundle):
    return LinkPredictor.from_bundle(load_bundle(codex_bundle), index="exact")


def test_model_detail(client, model_id, codex_bundle):
    bundle = load_bundle(codex_bundle)
    detail = client.get(f"/models/{model_id}").json()
    assert detail["sha256"] == bundle.sha256 and detail["bytes"] == bundle.num_bytes
    assert detail["parameters"] == bundle.trainable_parameters and detail["config"]["dim"] == 16
    assert detail["entities"] == len(bundle.entities) and detail["relations"] == len(bundle.relations)
    assert model_id in [m["id"] for m in client.get("/models").json()]


def test_download_has_etag_and_304(client, model_id, codex_bundle):
    r = client.get(f"/models/{model_id}/bundle")
    assert r.status_code == 200 and r.content == codex_bundle.read_bytes()
    etag = r.headers["etag"]
    assert etag == f'"{load_bundle(codex_bundle).sha256}"'
    again = client.get(f"/models/{model_id}/bundle", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert client.get(f"/models/{model_id}/bundle", headers={"If-None-Match": '"other"'}).status_code == 200


def test_predict_tails_and_heads_match_the_library(client, model_id, codex_bundle, reference):
    bundle = load_bundle(codex_bundle)
    rng = np.random.default_rng(0)
    for h, r, t in bundle.triples[rng.choice(len(bundle.triples), 10, replace=False)]:
        head, rel, tail = bundle.entities.names[h], bundle.relations.names[r], bundle.entities.names[t]
        got = client.get("/predict", params={"model": model_id, "head": head, "relation": rel, "k": 5}).json()
        assert PredictionOut.model_validate(got).model_dump() == got  # the documented schema, field for field
        assert got["direction"] == "tail" and got["head"] == head and got["tail"] is None
        assert [(p["entity"], pytest.approx(p["score"])) for p in got["predictions"]] == \
            reference.brute_force_tails(head, rel, 5)
        got = client.get("/predict", params={"model": model_id, "tail": tail, "relation": rel, "k": 5,
                                             "exclude_known": "false"}).json()
        assert [(p["entity"], pytest.approx(p["score"])) for p in got["predictions"]] == \
            reference.brute_force_heads(tail, rel, 5, exclude_known=False)


def test_predict_errors(client, model_id, reference):
    head, rel = reference.entities.names[0], reference.relations.names[0]
    base = {"model": model_id, "relation": rel}
    r = client.get("/predict", params={**base, "head": head + "Z"})
    assert r.status_code == 404
    detail = r.json()["detail"]
    assert detail["kind"] == "entity" and detail["name"] == head + "Z" and head in detail["suggestions"]
    r = client.get("/predict", params={**base, "relation": rel + "9", "head": head})
    assert r.status_code == 404 and r.json()["detail"]["kind"] == "relation"
    r = client.get("/predict", params={**base, "model": model_id[:-1] + "x", "head": head})
    assert r.status_code == 404 and r.json()["detail"]["suggestions"] == [model_id]
    assert client.get("/predict", params={**base, "head": head, "tail": head}).status_code == 422
    assert client.get("/predict", params=base).status_code == 422
    assert client.get("/predict", params={**base, "head": head, "k": 0}).status_code == 422
    assert client.get("/predict", params={**base, "head": head, "k": 5000}).status_code == 422
    assert client.get("/predict", params={**base, "model": "../etc", "head": head}).status_code == 422


def test_upload_of_a_non_bundle_is_422(client, tmp_path):
    r = client.post("/models", files={"bundle": ("x.safetensors", b"not a bundle at all")}, headers=AUTH)
    assert r.status_code == 422 and "x.safetensors" in r.json()["detail"]
    assert client.post("/models", files={"bundle": ("x", b"")}).status_code == 401


def test_extend_then_predict_a_new_entity(client, codex_bundle):
    model_id = client.post("/models", files={"bundle": ("b.safetensors", codex_bundle.read_bytes())},
                           headers=AUTH).json()["id"]
    bundle = load_bundle(codex_bundle)
    old_sha = client.get(f"/models/{model_id}").json()["sha256"]
    h, r, t = bundle.triples[0]
    rel, tail = bundle.relations.names[r], bundle.entities.names[t]
    client.get("/predict", params={"model": model_id, "head": tail, "relation": rel})  # warm the cache
    new = f"NEW\t{rel}\t{tail}\nNEW\t{rel}\t{bundle.entities.names[h]}\n".encode()
    r = client.post(f"/models/{model_id}/triples", files={"triples": ("more.txt", new)}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["entities"] == len(bundle.entities) + 1 and r.json()["sha256"] != old_sha
    got = client.get("/predict", params={"model": model_id, "head": "NEW", "relation": rel, "k": 3})
    assert got.status_code == 200 and tail not in [p["entity"] for p in got.json()["predictions"]]
    bad = client.post(f"/models/{model_id}/triples", files={"triples": ("more.txt", b"NEW\tP_NONE\tX\n")},
                      headers=AUTH)
    assert bad.status_code == 422 and "more.txt, line 1" in bad.json()["detail"]
    assert client.get(f"/models/{model_id}").json()["entities"] == len(bundle.entities) + 1  # unchanged


def test_delete(client, codex_bundle):
    model_id = client.post("/models", files={"bundle": ("b.safetensors", codex_bundle.read_bytes())},
                           headers=AUTH).json()["id"]
    assert client.delete(f"/models/{model_id}").status_code == 401
    assert client.delete(f"/models/{model_id}", headers=AUTH).status_code == 204
    assert client.get(f"/models/{model_id}").status_code == 404
    assert client.get(f"/models/{model_id}/bundle").status_code == 404
    assert client.delete(f"/models/{model_id}", headers=AUTH).status_code == 404
