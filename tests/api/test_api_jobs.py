"""POST/GET /jobs: validation before queueing, bounds, unknown fields, size limit, auth, ids, cancel."""

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.config.options import recipe_options
from earl_service.config.recipes import DEFAULT, PAPER, RECIPES

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD = b"a\tr\tb\nb\tr\tc\n"


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path, api_token=TOKEN, max_upload_mb=0.05))) as c:
        yield c


def post_job(client, train=GOOD, data=None, headers=AUTH, name="train.txt", **files):
    uploads = {"train": (name, train), **{k: (f"{k}.txt", v) for k, v in files.items()}}
    return client.post("/jobs", files=uploads, data=data or {}, headers=headers)


def test_job_is_queued_with_typed_params(client, tmp_path):
    r = post_job(client, data={"steps": "30", "dim": "16", "no_knn": "true", "precision": "int8", "lr": "0.01"},
                 valid=GOOD)
    assert r.status_code == 202, r.text
    job = client.get(f"/jobs/{r.json()['id']}").json()
    assert job["state"] == "queued"
    assert job["params"]["steps"] == 30 and job["params"]["no_knn"] is True and job["params"]["precision"] == "int8"
    assert set(job["files"]) == {"train", "valid"}
    assert (tmp_path / job["files"]["train"]).read_bytes() == GOOD
    assert [j["id"] for j in client.get("/jobs", params={"state": "queued"}).json()] == [job["id"]]
    assert client.get("/jobs", params={"state": "running"}).json() == []


@pytest.mark.parametrize("precision", ["pq:8", "pq", "fp16"])
def test_a_training_job_may_ask_for_any_registered_precision(client, precision):
    r = post_job(client, data={"dim": "16", "precision": precision})
    assert r.status_code == 202, r.text
    assert client.get(f"/jobs/{r.json()['id']}").json()["params"]["precision"] == precision


def test_a_pq_precision_that_does_not_fit_the_dim_is_422_before_training(client):
    r = post_job(client, data={"dim": "16", "precision": "pq:7"})
    assert r.status_code == 422 and "needs M dividing the row width 2 * dim = 32" in r.json()["detail"]
    r = post_job(client, data={"precision": "pq:x"})
    assert r.status_code == 422 and "write pq:M" in r.text
    assert client.get("/jobs").json() == []


@pytest.mark.parametrize("field,value", [("steps", "-1"), ("dim", "0"), ("dim", "abc"), ("lr", "0"),
                                         ("reserved_ratio", "1.5"), ("precision", "fp8"), ("model", "transe"),
                                         ("batch_size", "100000000"), ("seed", "-3")])
def test_out_of_bounds_fields_are_422(client, field, value):
    r = post_job(client, data={field: value})
    assert r.status_code == 422 and field in r.text


def test_unknown_field_is_422(client):
    r = post_job(client, data={"stepz": "3"})
    assert r.status_code == 422 and "stepz" in r.json()["detail"]


@pytest.mark.parametrize("content,message", [
    (b"a\tr\tb\nc\td\n", "train.txt, line 2: expected 3 columns"),
    (b"", "is empty"),
    (b"\x00\x01binary", "NUL byte"),
    (b"a\xff\tr\tb\n", "not valid UTF-8"),
])
def test_bad_train_file_is_422_with_its_line_and_nothing_queued(client, tmp_path, content, message):
    r = post_job(client, train=content)
    assert r.status_code == 422 and message in r.json()["detail"]
    assert str(tmp_path) not in r.json()["detail"]  # the client's file name, not the server's path
    assert client.get("/jobs").json() == [] and not any((tmp_path / "uploads").iterdir())


def test_bad_valid_file_is_422(client):
    r = post_job(client, valid=b"x\ty\n")
    assert r.status_code == 422 and "valid.txt, line 1" in r.json()["detail"]


def test_missing_train_file_is_422(client):
    assert client.post("/jobs", data={"steps": "1"}, headers=AUTH).status_code == 422


def test_upload_over_the_limit_is_413(client):
    r = post_job(client, train=b"a\tr\tb\n" * 20_000)  # 120 kB against a 50 kB limit
    assert r.status_code == 413
    assert client.get("/jobs").json() == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}])
def test_writes_need_the_token(client, headers):
    assert post_job(client, headers=headers).status_code == 401
    assert client.post("/jobs/abc/cancel", headers=headers).status_code == 401
    assert client.get("/jobs").status_code == 200  # reads stay open


def test_without_a_token_setting_writes_are_open(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path))) as c:
        assert post_job(c, headers={}).status_code == 202


@pytest.mark.parametrize("job_id", ["..", "a.b", "x" * 65, "a%20b", "%2e%2e"])
def test_ids_are_validated(client, job_id):
    r = client.get(f"/jobs/{job_id}")
    # "/jobs/.." is sent as "/" (the client resolves dot segments): the console's page, never a job.
    assert r.status_code in (404, 422) or (r.url.path == "/" and "text/html" in r.headers["content-type"])
    assert client.post(f"/jobs/{job_id}/cancel", headers=AUTH).status_code in (404, 422)


def test_bad_id_pattern_is_422_and_unknown_is_404(client):
    assert client.get("/jobs/a.b").status_code == 422
    r = client.get("/jobs/" + "0" * 32)
    assert r.status_code == 404 and r.json()["detail"]["kind"] == "job"


def test_cancel(client):
    job_id = post_job(client).json()["id"]
    r = client.post(f"/jobs/{job_id}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert client.post("/jobs/" + "0" * 32 + "/cancel", headers=AUTH).status_code == 404


def test_list_bounds(client):
    assert client.get("/jobs", params={"limit": 0}).status_code == 422
    assert client.get("/jobs", params={"state": "done"}).status_code == 422


def test_labels_are_stored_beside_the_triples(client, tmp_path):
    files = {"train": ("train.txt", GOOD), "relation_labels": ("rel.json", b'{"r": {"label": "related to"}}'),
             "entity_labels": ("ents.txt", b"a\tAlpha\tthe first\nzzz\tNot in the graph\n")}
    r = client.post("/jobs", files=files, headers=AUTH)
    assert r.status_code == 202, r.text
    assert r.json()["labels"] == {"entity_labels": 2, "relation_labels": 1}
    job = client.get(f"/jobs/{r.json()['id']}").json()
    assert job["files"]["entity_labels"].endswith("entities.tsv")
    assert job["files"]["relation_labels"].endswith("relations.en.json")  # JSON by content, named as CoDEx's
    from earl_service.data.labels import read_labels

    labels = read_labels((tmp_path / job["files"]["train"]).parent, entities={"a", "b"}, relations={"r"})
    assert labels.entities == {"a": "Alpha"} and labels.relations == {"r": "related to"} and labels.ignored == 1


@pytest.mark.parametrize(("labels", "reason"), [(b"not json", "rel.json, line 1: expected 2 or 3"),
                                                (b'{"r": [1, 2]}', "rel.json, line 1: the label of 'r'"),
                                                (b"\xff\xfe", "rel.json: is encoded as UTF-16")])
def test_bad_relation_labels_are_422(client, labels, reason):
    r = client.post("/jobs", files={"train": ("train.txt", GOOD), "relation_labels": ("rel.json", labels)},
                    headers=AUTH)
    assert r.status_code == 422 and reason in r.json()["detail"]


@pytest.mark.parametrize(("data", "recipe"), [({}, DEFAULT), ({"recipe": PAPER}, PAPER), ({"model": "rotate"}, DEFAULT),
                                              ({"recipe": PAPER, "model": "rotate"}, PAPER)])
def test_a_job_stores_its_recipe_and_the_values_it_fills_in(client, data, recipe):
    r = post_job(client, data=data)
    assert r.status_code == 202, r.text
    params = client.get(f"/jobs/{r.json()['id']}").json()["params"]
    expected = recipe_options(recipe, params["model"])
    assert params["recipe"] == recipe and {k: params[k] for k in expected} == expected


def test_a_job_option_given_wins_over_its_recipe(client):
    r = post_job(client, data={"lr": "0.0123", "lr_schedule": "cosine"})
    params = client.get(f"/jobs/{r.json()['id']}").json()["params"]
    rest = {k: v for k, v in recipe_options(DEFAULT, "earl").items() if k not in ("lr", "lr_schedule")}
    assert (params["lr"], params["lr_schedule"]) == (0.0123, "cosine")
    assert {k: params[k] for k in rest} == rest


def test_unknown_recipe_is_422_with_the_names(client):
    r = post_job(client, data={"recipe": "fast"})
    assert r.status_code == 422 and "recipe" in r.text and all(name in r.text for name in RECIPES)
    assert client.get("/jobs").json() == []
