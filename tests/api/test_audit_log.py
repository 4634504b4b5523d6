"""The audit log over HTTP: every write, refused ones too, with who (key and tenant), what (method, path, the
object's id), when and the status; only an admin reads it."""

import time

from fastapi.testclient import TestClient
from tenants import ADMIN, TOKEN, TRAIN, make_key

from api.main import create_app
from api.settings import Settings


def test_writes_are_logged_with_who_what_when_and_outcome(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path, api_token=TOKEN))) as client:
        start = time.time()
        acme = make_key(client, "acme", name="ci")
        job = client.post("/jobs", files=TRAIN, headers=acme).json()["id"]
        assert client.post(f"/jobs/{job}/cancel", headers=acme).status_code == 200
        assert client.post("/jobs", files=TRAIN).status_code == 401
        assert client.post("/jobs", files=TRAIN, headers=make_key(client, "acme", "read", "ro")).status_code == 403
        client.get("/models", headers=acme)  # a read: not logged
        log = client.get("/audit", headers=ADMIN).json()
        mine = client.get("/audit", params={"tenant": "acme"}, headers=ADMIN).json()
        refused = client.get("/audit", headers=acme)
    shown = [(e["method"], e["path"], e["key"], e["tenant"], e["status"], e["target"]) for e in reversed(log)]
    assert shown[:3] == [("POST", "/keys", "token", "default", 201, shown[0][5]), ("POST", "/jobs", "ci", "acme", 202, job),
                         ("POST", f"/jobs/{job}/cancel", "ci", "acme", 200, job)]
    assert shown[3][2:5] == ("anonymous", "default", 401) and shown[5][2:5] == ("ro", "acme", 403)
    assert len(log) == 6 and all(e["time"] >= start for e in log) and log[0]["key_id"] is not None
    assert [e["tenant"] for e in mine] == ["acme"] * 3 and refused.status_code == 403
