"""An imported bundle (`earl import`) over HTTP: POST /models takes it like a trained one, and GET /predict and
/score answer through its scorer, as the library does and as a numpy scan of its tables ranks (exact scan: the
FAISS proxy is RotatE's only), for every imported scorer at fp32, int8 and pq through real uvicorn."""

import httpx
import numpy as np
import pytest
from conftest import write_arrays
from fastapi.testclient import TestClient
from live import live

from api.main import create_app
from api.settings import Settings
from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.core import scorers
from earl_service.core.known import KnownAnswers
from earl_service.core.rotate import realistic_rank, top_k
from earl_service.device import load

AUTH = {"Authorization": "Bearer t"}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A ComplEx model of 300 entities as plain arrays, imported at int8 with a small graph."""
    root = tmp_path_factory.mktemp("imported")
    write_arrays(root / "src", entities=300, relations=3, width=16)
    (root / "graph.txt").write_text("e0\tr0\te1\ne0\tr0\te2\ne3\tr1\te0\n")
    assert main(["import", str(root / "src"), "--scorer", "complex", "--graph", str(root / "graph.txt"),
                 "--precision", "int8", "--out", str(root / "complex.safetensors")]) == 0
    return root / "complex.safetensors"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(Settings(home=tmp_path_factory.mktemp("home"), api_token="t"))) as c:
        yield c


def test_post_models_takes_an_imported_bundle_and_answers_through_its_scorer(client, imported):
    r = client.post("/models", files={"bundle": ("complex.safetensors", imported.read_bytes())}, headers=AUTH)
    assert r.status_code == 201, r.text
    detail = r.json()
    assert detail["config"]["model"] == "complex" and detail["precision"] == "int8" and detail["entities"] == 300
    assert detail["metrics"]["imported"]["format"] == "arrays"
    library = load(imported)
    for params, side in (({"head": "e0", "relation": "r0"}, "tail"), ({"tail": "e0", "relation": "r1"}, "head")):
        got = client.get("/predict", params={"model": detail["id"], "k": 5, **params}).json()
        anchor = params.get("head") or params["tail"]
        want = (library.predict_tails if side == "tail" else library.predict_heads)(anchor, params["relation"], 5)
        assert [(p["entity"], p["score"]) for p in got["predictions"]] == [(e, pytest.approx(s)) for e, s in want]
    assert "e1" not in [p["entity"] for p in client.get("/predict", params={"model": detail["id"], "head": "e0",
                                                                             "relation": "r0"}).json()["predictions"]]
    scored = client.get("/score", params={"model": detail["id"], "head": "e0", "relation": "r0", "tail": "e7"}).json()
    want = library.score("e0", "r0", "e7")
    assert scored["score"] == pytest.approx(want["score"]) and scored["tail_rank"] == want["tail_rank"]
    assert scored["score"] == pytest.approx(-scored["distance"])  # ComplEx's score is minus the distance


def test_an_imported_bundle_cannot_be_extended(client, imported, tmp_path):
    r = client.post("/models", files={"bundle": ("c.safetensors", imported.read_bytes())}, headers=AUTH)
    model_id = r.json()["id"]
    r = client.post(f"/models/{model_id}/triples", files={"triples": ("t.txt", b"e0\tr0\tnew\n")}, headers=AUTH)
    assert r.status_code == 422 and "complex bundle has one row per entity" in r.text


@pytest.mark.parametrize("precision", ["fp32", "int8", "pq:4"])
@pytest.mark.parametrize("kind", scorers.IMPORTED)
def test_every_imported_scorer_ranks_exactly_through_real_uvicorn(tmp_path, kind, precision):
    """GET /predict (both directions) and GET /score over real HTTP equal a numpy scan of the bundle's own decoded
    tables by the scorer's formula: the exact ranking, known answers left out (pq:4 codes the 2,000-row table)."""
    ranks_exactly_over_http(tmp_path, kind, precision)


@pytest.mark.parametrize("precision", ["fp32", "pq:4"])
@pytest.mark.parametrize("kind", ["complex", "transe-l1"])
def test_a_model_with_reciprocal_relations_ranks_heads_through_them_over_http(tmp_path, kind, precision):
    ranks_exactly_over_http(tmp_path, kind, precision, reciprocal=True)


def ranks_exactly_over_http(tmp_path, kind, precision, *, reciprocal=False):
    write_arrays(tmp_path / "src", entities=2000, relations=3, width=16, phases=kind == "rotate-l2",
                 reciprocal=reciprocal)
    (tmp_path / "graph.txt").write_text("e0\tr0\te1\ne0\tr0\te2\ne3\tr1\te0\n")
    path = tmp_path / "model.safetensors"
    assert main(["import", str(tmp_path / "src"), "--scorer", kind, "--graph", str(tmp_path / "graph.txt"),
                 "--precision", precision, "--out", str(path)]) == 0
    bundle = load_bundle(path)
    assert bundle.precision == precision
    entities, relations = bundle.params["entities"], bundle.params["relations"]
    assert bundle.config.reciprocal == reciprocal
    known = KnownAnswers(bundle.triples, len(bundle.relations))
    scorer = scorers.scorer(kind, gamma=0.0, epsilon=0.0, dim=8, reciprocal=reciprocal)
    with live(create_app(Settings(home=tmp_path / "home", api_token="t"))) as base, \
            httpx.Client(base_url=base, timeout=60, headers=AUTH) as http:
        model = http.post("/models", files={"bundle": ("m.safetensors", path.read_bytes())}).json()["id"]
        for side, anchor, r in (("tail", 0, 0), ("head", 0, 1), ("tail", 1234, 2)):
            given = "head" if side == "tail" else "tail"
            got = http.get("/predict", params={"model": model, given: f"e{anchor}", "relation": f"r{r}", "k": 10})
            query = scorer.side_query(entities[anchor], relations, r, side)
            ids, dist = top_k(np.arange(len(entities)), scorer.distances(query, entities), 10,
                              excluded=known.answers(side, anchor, r))
            assert [p["entity"] for p in got.json()["predictions"]] == [f"e{i}" for i in ids], (side, anchor)
            assert [p["score"] for p in got.json()["predictions"]] == pytest.approx([-float(d) for d in dist],
                                                                                     rel=1e-5, abs=1e-5)
        scored = http.get("/score", params={"model": model, "head": "e0", "relation": "r0", "tail": "e9"}).json()
        tails = scorer.distances(scorer.query(entities[0], relations[0]), entities)
        assert scored["score"] == pytest.approx(-float(tails[9]), rel=1e-5, abs=1e-5)
        assert scored["tail_rank"] == realistic_rank(tails, 9, excluded=known.answers("tail", 0, 0))
