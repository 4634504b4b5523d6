"""The token: every write operation needs it, reads need it only with EARL_PROTECT_READS; compared in constant time.
POST /predict (a batch of queries) is a read. Keys and the audit log (admin operations) always need it.

Operations are enumerated from the OpenAPI schema, so a route added later is checked without editing this file.
"""

import pytest
from conftest import api_operations
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.main import create_app
from api.settings import Settings

TOKEN = "auth-test-token"
READ_METHODS = {"GET", "HEAD", "OPTIONS"}
OPEN = {"/healthz", "/readyz"}
OPERATIONS = api_operations()
READ_POSTS = {("POST", "/predict")}
ADMIN = [(m, p) for m, p in OPERATIONS if p.startswith(("/keys", "/audit"))]
WRITES = [(m, p) for m, p in OPERATIONS if m not in READ_METHODS and (m, p) not in READ_POSTS and (m, p) not in ADMIN]
READS = [(m, p) for m, p in OPERATIONS if (m in READ_METHODS or (m, p) in READ_POSTS) and (m, p) not in ADMIN]
BAD_HEADERS = {
    "missing": {},
    "wrong": {"Authorization": "Bearer not-the-token"},
    "prefix": {"Authorization": f"Bearer {TOKEN[:-1]}"},
    "longer": {"Authorization": f"Bearer {TOKEN}x"},
    "no scheme": {"Authorization": TOKEN},
    "basic": {"Authorization": f"Basic {TOKEN}"},
    "empty bearer": {"Authorization": "Bearer "},
    "non-ASCII": {"Authorization": "Bearer t\u00f6ken".encode()},
}


def url(path: str) -> str:
    return path.replace("{job_id}", "0" * 32).replace("{model_id}", "0" * 32).replace("{key_id}", "0" * 12)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(Settings(home=tmp_path_factory.mktemp("home"), api_token=TOKEN))) as c:
        yield c


@pytest.fixture(scope="module")
def protected(tmp_path_factory):
    settings = Settings(home=tmp_path_factory.mktemp("home"), api_token=TOKEN, protect_reads=True)
    with TestClient(create_app(settings)) as c:
        yield c


def test_there_are_writes_and_reads():
    assert {("POST", "/jobs"), ("POST", "/models"), ("DELETE", "/models/{model_id}")} <= set(WRITES)
    assert {("GET", "/predict"), ("POST", "/predict"), ("GET", "/score")} <= set(READS)


@pytest.mark.parametrize("headers", BAD_HEADERS.values(), ids=list(BAD_HEADERS))
@pytest.mark.parametrize("method,path", WRITES)
def test_writes_refuse_missing_and_wrong_tokens(client, method, path, headers):
    r = client.request(method, url(path), headers=headers)
    assert r.status_code == 401, r.text
    assert "Authorization: Bearer <token>" in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("method,path", WRITES)
def test_writes_pass_with_the_token(client, method, path):
    # Past the token check: 404 (unknown id) or 422 (no body), never 401.
    r = client.request(method, url(path), headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code in (404, 422), r.text


@pytest.mark.parametrize("method,path", ADMIN)
def test_admin_operations_always_need_the_token(client, method, path):
    assert client.request(method, url(path)).status_code == 401
    assert client.request(method, url(path), headers=BAD_HEADERS["wrong"]).status_code == 401
    assert client.request(method, url(path), headers={"Authorization": f"Bearer {TOKEN}"}).status_code in (
        200, 404, 422)


@pytest.mark.parametrize("method,path", READS)
def test_reads_are_open_by_default(client, method, path):
    assert client.request(method, url(path)).status_code != 401


@pytest.mark.parametrize("method,path", READS)
def test_protected_reads_need_the_token(protected, method, path):
    r = protected.request(method, url(path))
    if path in OPEN:  # probes stay open for the orchestrator
        assert r.status_code == 200
    else:
        assert r.status_code == 401, r.text
        assert protected.request(method, url(path), headers=BAD_HEADERS["wrong"]).status_code == 401
    good = protected.request(method, url(path), headers={"Authorization": f"Bearer {TOKEN}"})
    assert good.status_code != 401


def test_the_comparison_is_constant_time(client, monkeypatch):
    import hmac

    import api.principal

    calls, compare = [], hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b)))
        return compare(a, b)

    monkeypatch.setattr(api.principal.hmac, "compare_digest", spy)
    assert client.post("/jobs", headers=BAD_HEADERS["wrong"]).status_code == 401
    assert calls == [(bytes, bytes)]


def test_protect_reads_needs_a_token(tmp_path, monkeypatch):
    with pytest.raises(ValidationError, match="EARL_PROTECT_READS=true needs EARL_API_TOKEN"):
        Settings(home=tmp_path, protect_reads=True)
    monkeypatch.setenv("EARL_API_TOKEN", TOKEN)
    monkeypatch.setenv("EARL_PROTECT_READS", "true")
    assert Settings(home=tmp_path).protect_reads is True


def test_without_a_token_everything_is_open(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path))) as c:
        for method, path in OPERATIONS:
            assert c.request(method, url(path)).status_code != 401
