"""Labels end to end over real HTTP: uploaded with a job, trained into the bundle by a worker, shown by GET /predict,
searched by GET /models/{id}/entities, and the same in the edge reader from the downloaded bundle."""

import json

import httpx
import pytest
from conftest import codex_s_path
from live import live

from api.main import create_app
from api.schemas import BatchPredictionOut, EntityPage, PredictionOut, ScoreOut
from api.settings import Settings
from earl_service.device import reader as edge
from earl_service.worker.loop import Worker, WorkerConfig

AUTH = {"Authorization": "Bearer t"}
TRIPLES = 3000  # the first lines of CoDEx-S: a graph that trains in seconds


def _labels(train: bytes) -> dict[str, str]:
    """A label per entity, "Q7604" -> "Entity 7604", except two entities that share "Twin"."""
    names = dict.fromkeys(name for line in train.decode().splitlines() for name in line.split("\t")[::2])
    labels = {name: f"Entity {name[1:]}" for name in names}
    first, second = list(names)[1:3]
    labels[first] = labels[second] = "Twin"
    return labels


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A model trained by a worker from a job with entity (TSV, with descriptions) and relation (CoDEx JSON)
    labels, served by uvicorn: (base URL, model id, the entity labels)."""
    home = tmp_path_factory.mktemp("home")
    train = b"".join((codex_s_path() / "train.txt").read_bytes().splitlines(keepends=True)[:TRIPLES])
    labels = _labels(train)
    tsv = "".join(f"{name}\t{label}\ta description that stays out of the bundle\n" for name, label in labels.items())
    files = {"train": ("train.txt", train), "entity_labels": ("names.tsv", (tsv + "Q999999999\tNot here\n").encode()),
             "relation_labels": ("relations.en.json", (codex_s_path() / "relations.en.json").read_bytes())}
    form = {"dim": "8", "steps": "5", "batch_size": "256", "negatives": "8", "eval_every": "0"}
    with live(create_app(Settings(home=home, api_token="t"))) as base, httpx.Client(base_url=base, timeout=60) as http:
        r = http.post("/jobs", files=files, data=form, headers=AUTH)
        assert r.status_code == 202, r.text
        assert r.json()["labels"] == {"entity_labels": len(labels) + 1, "relation_labels": 71}
        Worker(WorkerConfig(home=home, worker_id="w", threads=1, device="cpu", max_jobs=1, poll_seconds=0.05)).run()
        job = http.get(f"/jobs/{r.json()['id']}").json()
        assert job["state"] == "succeeded", job["error"]
        yield http, job["model_id"], labels


def test_predictions_carry_labels_and_the_edge_reader_shows_the_same(served, tmp_path):
    http, model, labels = served
    r = http.get("/predict", params={"model": model, "head": "Entity 7604", "relation": "languages spoken, written, "
                                     "or signed", "k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert PredictionOut.model_validate(body).model_dump() == body
    assert (body["head"], body["head_label"], body["relation"]) == ("Q7604", "Entity 7604", "P1412")
    assert body["relation_label"] == "languages spoken, written, or signed" and body["tail_label"] is None
    assert all(p["label"] == labels[p["entity"]] for p in body["predictions"]) and len(body["predictions"]) == 5

    path = tmp_path / "model.safetensors"
    path.write_bytes(http.get(f"/models/{model}/bundle").content)
    device = edge.load(path)
    assert device.entity_labels == labels  # labels only: no description, and "Q999999999" was left out
    on_device = device.labelled(device.predict_tails("Entity 7604", "P1412", 5))
    assert [(p["entity"], p["label"]) for p in on_device] == [(p["entity"], p["label"]) for p in body["predictions"]]
    assert [p["score"] for p in on_device] == pytest.approx([p["score"] for p in body["predictions"]], abs=1e-4)


def test_batch_and_score_take_labels_and_carry_them(served):
    """POST /predict and GET /score resolve labels and label their answers as GET /predict does (one place:
    LinkPredictor.answer / score)."""
    http, model, labels = served
    query = {"model": model, "head": "Entity 7604", "relation": "languages spoken, written, or signed", "k": 3}
    single = http.get("/predict", params=query).json()
    r = http.post("/predict", json={"model": model, "queries": [{k: v for k, v in query.items() if k != "model"},
                                                                {"tail": "Q7604", "relation": "P1412"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert BatchPredictionOut.model_validate(body).model_dump() == body
    assert body["results"][0] == {k: v for k, v in single.items() if k != "model"}
    assert body["results"][1]["tail_label"] == "Entity 7604"
    assert all(p["label"] == labels[p["entity"]] for p in body["results"][1]["predictions"])
    tail = next(p["entity"] for p in single["predictions"] if labels[p["entity"]] != "Twin")
    r = http.get("/score", params={"model": model, "head": "entity 7604", "relation": "P1412", "tail": labels[tail]})
    assert r.status_code == 200, r.text
    scored = r.json()
    assert ScoreOut.model_validate(scored).model_dump() == scored
    assert (scored["head"], scored["head_label"], scored["tail"], scored["tail_label"]) == (
        "Q7604", "Entity 7604", tail, labels[tail])
    assert scored["relation_label"] == "languages spoken, written, or signed"
    twins = http.post("/predict", json={"model": model, "queries": [{"head": "Q7604", "relation": "P1412"},
                                                                    {"head": "Twin", "relation": "P1412"}]})
    assert twins.status_code == 422 and twins.json()["detail"].startswith("queries[1]: "), twins.text


def test_a_label_of_several_entities_is_422_listing_them(served):
    http, model, labels = served
    twins = sorted(name for name, label in labels.items() if label == "Twin")
    r = http.get("/predict", params={"model": model, "head": "Twin", "relation": "P1412"})
    assert r.status_code == 422 and all(repr(t) in r.json()["detail"] for t in twins), r.text


def test_unknown_names_suggest_labels(served):
    http, model, _ = served
    r = http.get("/predict", params={"model": model, "head": "Entity 76044", "relation": "P1412"})
    assert r.status_code == 404 and "Entity 7604" in r.json()["detail"]["suggestions"]
    r = http.get("/predict", params={"model": model, "head": "Q7604", "relation": "languages spoken"})
    assert r.status_code == 404 and r.json()["detail"]["kind"] == "relation"
    assert "languages spoken, written, or signed" in r.json()["detail"]["suggestions"]


def test_entity_search_exact_prefix_fuzzy_and_pages(served):
    http, model, labels = served
    r = http.get(f"/models/{model}/entities", params={"q": "entity 7604", "limit": 3})
    assert r.status_code == 200, r.text
    page = r.json()
    assert EntityPage.model_validate(page).model_dump() == page and set(page) == {"total", "items", "limit", "offset"}
    assert page["items"][0] == {"id": "Q7604", "label": "Entity 7604", "score": 1.0}
    assert page["items"][1]["label"].startswith("Entity 7604") or page["items"][1]["score"] < 0.5
    assert http.get(f"/models/{model}/entities", params={"q": "Q7604"}).json()["items"][0]["id"] == "Q7604"
    assert http.get(f"/models/{model}/entities", params={"q": "Entty 7604"}).json()["items"][0]["id"] == "Q7604"
    whole = http.get(f"/models/{model}/entities", params={"q": "Entity 1", "limit": 100}).json()
    halves = [http.get(f"/models/{model}/entities", params={"q": "Entity 1", "limit": 50, "offset": o}).json()
              for o in (0, 50)]
    assert [i["id"] for h in halves for i in h["items"]] == [i["id"] for i in whole["items"]]
    assert whole["total"] == halves[1]["total"] > 100 and halves[1]["offset"] == 50


@pytest.mark.parametrize("params", [{"q": "x" * 201}, {"q": ""}, {"q": "  "}, {"q": "a", "limit": 0},
                                    {"q": "a", "limit": 101}, {"q": "a", "offset": -1}, {"limit": 5}])
def test_entity_search_bounds_are_422(served, params):
    http, model, _ = served
    assert http.get(f"/models/{model}/entities", params=params).status_code == 422


def test_entity_search_of_an_unknown_model_is_404(served):
    http, _, _ = served
    r = http.get("/models/nope/entities", params={"q": "a"})
    assert r.status_code == 404 and json.loads(r.text)["detail"]["kind"] == "model"
