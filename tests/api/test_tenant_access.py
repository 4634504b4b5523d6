"""Tenants over HTTP: models and jobs belong to the tenant whose key made them, another tenant gets 404 on every
operation (not 403: existence is not told), an admin sees all; scopes; reads need a key once one exists."""

import pytest
from fastapi.testclient import TestClient
from tenants import ADMIN, TOKEN, TRAIN, make_key

from api.main import create_app
from api.settings import Settings


@pytest.fixture(scope="module")
def service(tmp_path_factory, codex_bundle):
    """A server with acme's model and job, and keys of acme and of globex."""
    settings = Settings(home=tmp_path_factory.mktemp("home"), api_token=TOKEN)
    with TestClient(create_app(settings)) as client:
        acme, globex = make_key(client, "acme"), make_key(client, "globex")
        model = client.post("/models", files={"bundle": ("b.safetensors", codex_bundle.read_bytes())}, headers=acme)
        job = client.post("/jobs", files=TRAIN, headers=acme)
        assert (model.status_code, job.status_code) == (201, 202)
        yield client, acme, globex, model.json(), job.json()["id"]


def another_tenants_operations(model: dict, job_id: str) -> list[tuple[str, str, dict]]:
    """Every operation on one model or job, as (method, url, request kwargs)."""
    m, relation, entity = model["id"], "P27", "Q1"
    return [("GET", f"/models/{m}", {}), ("GET", f"/models/{m}/versions", {}), ("GET", f"/models/{m}/bundle", {}),
            ("GET", f"/models/{m}/entities?q=a", {}), ("GET", f"/models/{m}/relations", {}),
            ("GET", f"/models/{m}/report", {}), ("GET", f"/models/{m}/frontier.png", {}),
            ("GET", f"/predict?model={m}&relation={relation}&head={entity}", {}),
            ("GET", f"/score?model={m}&head={entity}&relation={relation}&tail={entity}", {}),
            ("POST", "/predict", {"json": {"model": m, "queries": [{"relation": relation, "head": entity}]}}),
            ("POST", f"/models/{m}/triples", {"files": {"triples": ("t.txt", b"a\tP27\tb\n")}}),
            ("POST", "/jobs", {"data": {"source_model": m, "max_bytes": "1MB"}}),
            ("DELETE", f"/models/{m}", {}), ("GET", f"/jobs/{job_id}", {}), ("GET", f"/jobs/{job_id}/events", {}),
            ("POST", f"/jobs/{job_id}/cancel", {})]


def test_another_tenant_gets_404_for_everything(service):
    client, acme, globex, model, job_id = service
    for method, url, kwargs in another_tenants_operations(model, job_id):
        r = client.request(method, url, headers=globex, **kwargs)
        assert r.status_code == 404, (method, url, r.text)
        assert model["id"] not in str(r.json()["detail"].get("suggestions", [])), "a 404 suggested the other's id"
    assert client.get("/models", headers=globex).json() == [] and client.get("/jobs", headers=globex).json() == []
    assert client.get(f"/models/{model['id']}", headers=acme).status_code == 200  # nothing was deleted
    assert client.get(f"/jobs/{job_id}", headers=acme).json()["state"] == "queued"  # nor cancelled


def test_the_owner_and_the_admin_see_it(service):
    client, acme, globex, model, job_id = service
    for headers in (acme, ADMIN):
        assert [m["id"] for m in client.get("/models", headers=headers).json()] == [model["id"]]
        assert [j["id"] for j in client.get("/jobs", headers=headers).json()] == [job_id]
    shown = client.get(f"/models/{model['id']}", headers=ADMIN).json()
    assert shown["owner"] == "acme" and shown["stored"] > 0
    assert client.get(f"/jobs/{job_id}", headers=acme).json()["params"]["tenant"] == "acme"


def test_scopes(service):
    client, *_ = service
    reader = make_key(client, "acme", "read", name="reader")
    assert client.get("/models", headers=reader).status_code == 200
    refused = client.post("/jobs", files=TRAIN, headers=reader)
    assert refused.status_code == 403 and "lacks the 'write' scope" in refused.json()["detail"]
    for path in ("/keys", "/audit"):
        assert client.get(path, headers=reader).status_code == 403
        assert client.get(path, headers=make_key(client, "acme", "write", name="writer")).status_code == 403
    admin = make_key(client, "ops", "admin", name="root")
    assert client.get("/keys", headers=admin).status_code == 200 and len(client.get("/models", headers=admin).json()) == 1


def test_reads_need_a_key_once_one_exists(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path))) as client:  # no token: open, as before keys
        assert client.get("/models").status_code == 200
        made = client.post("/keys", json={"name": "a", "tenant": "t", "scopes": ["admin"]})
        assert made.status_code == 201
        assert client.get("/models").status_code == 401 and client.post("/jobs", files=TRAIN).status_code == 401
        assert client.get("/healthz").status_code == 200 and client.get("/").status_code == 200
        admin = {"Authorization": f"Bearer {made.json()['key']}"}
        assert client.delete(f"/keys/{made.json()['id']}", headers=admin).status_code == 200
        # every key revoked: the server stays closed, it never falls back to its open mode
        assert client.get("/models").status_code == 401 and client.post("/jobs", files=TRAIN).status_code == 401


def test_open_reads_show_anonymous_readers_the_default_tenant_only(tmp_path, codex_bundle):
    with TestClient(create_app(Settings(home=tmp_path, api_token=TOKEN, open_reads=True))) as client:
        acme = make_key(client, "acme")
        mine = client.post("/models", files={"bundle": ("b.safetensors", codex_bundle.read_bytes())}, headers=acme)
        assert client.get("/models").json() == [] and client.get(f"/models/{mine.json()['id']}").status_code == 404
        assert client.post("/jobs", files=TRAIN).status_code == 401
        shared = client.post("/models", files={"bundle": ("b.safetensors", codex_bundle.read_bytes())}, headers=ADMIN)
        assert [m["id"] for m in client.get("/models").json()] == [shared.json()["id"]]


def test_a_revoked_key_stops_at_once(service):
    client, *_ = service
    made = client.post("/keys", json={"name": "temp", "tenant": "acme", "scopes": ["read"]}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {made['key']}"}
    assert client.get("/models", headers=headers).status_code == 200
    assert client.delete(f"/keys/{made['id']}", headers=ADMIN).json()["revoked"] is not None
    assert client.get("/models", headers=headers).status_code == 401
    listed = client.get("/keys", headers=ADMIN).json()
    assert made["key"] not in str(listed) and all(set(k) == {"id", "name", "tenant", "scopes", "created", "revoked"}
                                                  for k in listed)
    assert client.delete("/keys/" + "0" * 12, headers=ADMIN).status_code == 404


@pytest.mark.parametrize("body", [{"name": "a b", "tenant": "t", "scopes": ["read"]},
                                  {"name": "a", "tenant": "../t", "scopes": ["read"]},
                                  {"name": "a", "tenant": "t", "scopes": []},
                                  {"name": "a", "tenant": "t", "scopes": ["root"]}, {"name": "a"}])
def test_bad_keys_are_422(service, body):
    client, *_ = service
    assert client.post("/keys", json=body, headers=ADMIN).status_code == 422
