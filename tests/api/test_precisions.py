"""GET /precisions: the registered precisions, as the job form and the console take them."""

from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.bundle import precision as precisions
from earl_service.bundle.precision import Fp16


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path, api_token="t0ken"))) as c:
        yield c


def test_precisions_lists_every_registered_one(client):
    r = client.get("/precisions")
    assert r.status_code == 200
    assert [p["name"] for p in r.json()] == ["fp32", "fp16", "int8", "pq"]
    pq = r.json()[-1]
    assert pq["syntax"] == "pq[:M]" and pq["codes_tables"] is True and "codes" in pq["summary"]


def test_a_newly_registered_precision_is_listed_and_accepted_by_the_form(client):
    @dataclass(frozen=True)
    class Fp16Too(Fp16):  # a stand-in with a new name: the registry, not the class, is under test
        family = "fp16b"
        syntax = "fp16b"
        summary = "fp16 again"

    precisions.register(Fp16Too)
    try:
        assert "fp16b" in [p["name"] for p in client.get("/precisions").json()]
        r = client.post("/jobs", files={"train": ("train.txt", b"a\tr\tb\nb\tr\tc\n")}, data={"precision": "fp16b"},
                        headers={"Authorization": "Bearer t0ken"})
        assert r.status_code == 202, r.text
    finally:
        precisions.unregister("fp16b")
    assert [p["name"] for p in client.get("/precisions").json()] == ["fp32", "fp16", "int8", "pq"]
