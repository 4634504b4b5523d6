"""GET /predict's lean path (api/routes/predict.py LeanGetRoute) answers exactly as FastAPI's handler: the same
bodies for valid queries, the same errors for every other, the same tenant and scope rules."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from tenants import ADMIN, TOKEN, make_key

from api.main import create_app
from api.routes import predict as predict_route
from api.settings import Settings
from earl_service.bundle.model_io import Bundle
from earl_service.config import ModelConfig
from earl_service.data.vocab import Vocab


@pytest.fixture(scope="module")
def bundle_bytes(tmp_path_factory):
    """A random RotatE bundle (dim 8, 60 entities, 3 relations) at int8: served from its codes."""
    rng = np.random.default_rng(0)
    triples = np.stack([rng.integers(60, size=200), rng.integers(3, size=200), rng.integers(60, size=200)], 1)
    bundle = Bundle(ModelConfig(model="rotate", dim=8), {"entities": rng.standard_normal((60, 16)).astype(np.float32),
                                                          "relations": rng.standard_normal((3, 8)).astype(np.float32)},
                    np.zeros(0, dtype=np.int64), Vocab([f"e{i}" for i in range(60)]),
                    Vocab(["r0", "r1", "r/2"], kind="relation"), triples)
    return bundle.save(tmp_path_factory.mktemp("b") / "b.safetensors", precision="int8").read_bytes()


@pytest.fixture(scope="module")
def served(tmp_path_factory, bundle_bytes):
    """An app with an admin token, two tenants' keys and a model of tenant a: (client, model id, a's, b's keys)."""
    settings = Settings(home=tmp_path_factory.mktemp("home"), api_token=TOKEN, tenant_rate=0)  # no 429s here
    with TestClient(create_app(settings)) as client:
        a, b = make_key(client, "a"), make_key(client, "b", scope="read")
        r = client.post("/models", files={"bundle": ("b.safetensors", bundle_bytes)}, headers=a)
        assert r.status_code == 201, r.text
        yield client, r.json()["id"], a, b


QUERIES = [
    "head=e1&relation=r0", "tail=e7&relation=r/2&k=3", "head=e1&relation=r0&k=60&exclude_known=false",
    "head=e1&relation=r0&exclude_known=0", "head=e1&relation=r0&exclude_known=True", "head=e1&relation=r0&k=010",
    # every other: FastAPI's own answer
    "head=e1&relation=r0&k=0", "head=e1&relation=r0&k=1001", "head=e1&relation=r0&k=x", "head=e1&relation=r0&k=-1",
    "head=e1&tail=e2&relation=r0", "relation=r0", "head=&relation=r0", "head=e1", "head=e1&relation=",
    "head=e1&head=e2&relation=r0", "head=e1&relation=r0&extra=1", "head=e999&relation=r0", "head=e1&relation=r9",
    "head=e1&relation=r0&exclude_known=maybe", "head=" + "x" * 1001 + "&relation=r0",
]


@pytest.mark.parametrize("query", QUERIES)
def test_the_lean_path_answers_as_fastapi_does(served, query, monkeypatch):
    client, model, a, _ = served
    url = f"/predict?model={model}&{query}"
    lean = client.get(url, headers=a)
    monkeypatch.setattr(predict_route, "plain_query", lambda request: None)
    full = client.get(url, headers=a)
    assert (lean.status_code, lean.json()) == (full.status_code, full.json())


def test_valid_queries_take_the_lean_path_and_others_do_not(served, monkeypatch):
    client, model, a, _ = served
    taken = []
    real = predict_route.plain_query
    monkeypatch.setattr(predict_route, "plain_query", lambda request: taken.append(real(request)) or taken[-1])
    assert client.get(f"/predict?model={model}&head=e1&relation=r0", headers=a).status_code == 200
    assert client.get(f"/predict?model={model}&head=e1&relation=r0&k=0", headers=a).status_code == 422
    assert taken[0] == {"model": model, "relation": "r0", "head": "e1", "tail": None, "k": 10, "exclude_known": True}
    assert taken[1] is None


def test_another_tenants_model_and_a_bad_model_id_are_refused_alike(served, monkeypatch):
    client, model, _, b = served
    for url in (f"/predict?model={model}&head=e1&relation=r0", "/predict?model=../x&head=e1&relation=r0",
                "/predict?model=0123456789abcdef&head=e1&relation=r0"):
        lean = client.get(url, headers=b)
        with monkeypatch.context() as m:
            m.setattr(predict_route, "plain_query", lambda request: None)
            full = client.get(url, headers=b)
        assert lean.status_code in (404, 422) and (lean.status_code, lean.json()) == (full.status_code, full.json())
    assert client.get(f"/predict?model={model}&head=e1&relation=r0", headers=ADMIN).status_code == 200
