"""POST /predict (a bounded batch) and GET /score over a real uvicorn: the same answers as GET /predict and the
library, bad queries refused with a 4xx that says why."""

import httpx
import pytest
from live import live

from api.main import create_app
from api.schemas import MAX_BATCH_QUERIES, BatchPredictionOut, ScoreOut
from api.settings import Settings
from earl_service.bundle.model_io import load_bundle

TOKEN = "answers-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory, codex_bundle):
    """(base URL, model id) of a live API holding the CoDEx-S bundle; writes need TOKEN."""
    app = create_app(Settings(home=tmp_path_factory.mktemp("home"), api_token=TOKEN))
    with live(app) as base:
        r = httpx.post(f"{base}/models", files={"bundle": ("codex.safetensors", codex_bundle.read_bytes())},
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
        assert r.status_code == 201, r.text
        yield base, r.json()["id"]


@pytest.fixture(scope="module")
def picked(codex_bundle):
    """Four (head, relation, tail) names of the graph's triples."""
    bundle = load_bundle(codex_bundle)
    names, rels = bundle.entities.names, bundle.relations.names
    return [(names[h], rels[r], names[t]) for h, r, t in bundle.triples[::97][:4]]


def test_batch_answers_equal_get_predict_in_order(server, reference, picked):
    """No token needed: a batch of queries is a read, as GET /predict is."""
    base, model = server
    queries = []
    for head, rel, tail in picked:
        queries += [{"head": head, "relation": rel, "k": 5}, {"tail": tail, "relation": rel, "exclude_known": False}]
    r = httpx.post(f"{base}/predict", json={"model": model, "queries": queries}, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert BatchPredictionOut.model_validate(got).model_dump() == got
    assert len(got["results"]) == len(queries)
    for query, result in zip(queries, got["results"], strict=True):
        params = {"model": model, **query}
        single = httpx.get(f"{base}/predict", params=params, timeout=60).json()
        assert {"model": model, **result} == single
    head, rel, _ = picked[0]
    assert [(p["entity"], pytest.approx(p["score"])) for p in got["results"][0]["predictions"]] == \
        reference.brute_force_tails(head, rel, 5)


def test_batch_bounds_and_bad_queries_are_4xx(server, picked):
    base, model = server
    head, rel, tail = picked[0]
    one = {"head": head, "relation": rel}

    def post(queries, **extra):
        return httpx.post(f"{base}/predict", json={"model": model, "queries": queries, **extra}, timeout=60)

    too_many = post([one] * (MAX_BATCH_QUERIES + 1))
    assert too_many.status_code == 422 and f"at most {MAX_BATCH_QUERIES}" in too_many.text
    assert post([one] * MAX_BATCH_QUERIES).status_code == 200
    assert post([]).status_code == 422
    assert post([{**one, "k": 1001}]).status_code == 422
    both = post([{**one, "tail": tail}])
    assert both.status_code == 422 and "exactly one of 'head'" in both.text
    unknown = post([one, {"tail": tail + "Z", "relation": rel}])
    assert unknown.status_code == 404
    detail = unknown.json()["detail"]
    assert detail["kind"] == "entity" and detail["message"].startswith("queries[1]: unknown entity")
    assert tail in detail["suggestions"]
    assert post([{"head": head, "relation": rel + "9"}]).json()["detail"]["kind"] == "relation"
    assert httpx.post(f"{base}/predict", json={"model": model[:-1] + "x", "queries": [one]}).status_code == 404
    assert httpx.post(f"{base}/predict", content=b"{", headers={"Content-Type": "application/json"}).status_code == 422


def test_score_equals_the_library(server, reference, picked):
    base, model = server
    for head, rel, tail in picked[:3]:
        r = httpx.get(f"{base}/score", params={"model": model, "head": head, "relation": rel, "tail": tail})
        assert r.status_code == 200, r.text
        got = r.json()
        assert ScoreOut.model_validate(got).model_dump() == got
        want = reference.score(head, rel, tail)
        assert got["known"] is True and got["tail_rank"] == want["tail_rank"] and got["head_rank"] == want["head_rank"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-5)


def test_score_errors(server, picked):
    base, model = server
    head, rel, tail = picked[0]
    r = httpx.get(f"{base}/score", params={"model": model, "head": head, "relation": rel, "tail": "nope"})
    assert r.status_code == 404 and r.json()["detail"]["name"] == "nope"
    assert httpx.get(f"{base}/score", params={"model": model, "head": head, "relation": rel}).status_code == 422
