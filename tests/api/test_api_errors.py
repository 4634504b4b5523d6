"""Library errors become statuses in one place (api/errors.py): every 404 has the documented NotFound body."""

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.schemas import NotFoundResponse
from api.settings import Settings

MISSING = "0" * 32


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(Settings(home=tmp_path_factory.mktemp("home")))) as c:
        yield c


def test_the_openapi_schema_documents_each_404(client):
    paths = client.get("/openapi.json").json()["paths"]
    documented = {(method.upper(), path) for path, ops in paths.items() for method, op in ops.items()
                  if op["responses"].get("404", {}).get("content", {}).get("application/json", {}).get("schema")
                  == {"$ref": "#/components/schemas/NotFoundResponse"}}
    assert documented == {("GET", "/jobs/{job_id}"), ("POST", "/jobs/{job_id}/cancel"), ("GET", "/models/{model_id}"),
                          ("DELETE", "/models/{model_id}"), ("GET", "/models/{model_id}/bundle"),
                          ("GET", "/models/{model_id}/versions"), ("POST", "/models/{model_id}/triples"),
                          ("GET", "/models/{model_id}/report"), ("GET", "/models/{model_id}/frontier.png"),
                          ("GET", "/models/{model_id}/relations"), ("GET", "/models/{model_id}/entities"),
                          ("GET", "/predict"), ("POST", "/predict"), ("GET", "/score"), ("DELETE", "/keys/{key_id}")}


@pytest.mark.parametrize(("method", "path", "kind"), [
    ("GET", f"/jobs/{MISSING}", "job"),
    ("POST", f"/jobs/{MISSING}/cancel", "job"),
    ("GET", f"/models/{MISSING}", "model"),
    ("GET", f"/models/{MISSING}/bundle", "model"),
    ("GET", f"/models/{MISSING}/versions", "model"),
    ("DELETE", f"/models/{MISSING}", "model"),
    ("GET", f"/predict?model={MISSING}&head=h&relation=r", "model"),
    ("GET", f"/score?model={MISSING}&head=h&relation=r&tail=t", "model"),
])
def test_not_found_bodies_follow_the_schema(client, method, path, kind):
    r = client.request(method, path)
    assert r.status_code == 404
    body = NotFoundResponse.model_validate(r.json())
    assert body.detail.kind == kind and body.detail.name == MISSING
    assert body.detail.message == f"{kind} {MISSING!r} not found" and body.detail.suggestions == []
