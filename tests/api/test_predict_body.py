"""POST /predict's body over real HTTP (issue 56): capped at what a batch of queries needs, refused with a reason
past that, and a 422 never echoes a large input back."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import httpx
import pytest
from live import live

from api.main import create_app
from api.schemas import MAX_BATCH_QUERIES, MAX_NAME_CHARS, MAX_PREDICT_BODY_BYTES
from api.settings import Settings

MB = 2**20
EMPTY_QUERIES = b'{"model": "m", "queries": [' + b",".join([b"{}"] * (5 * MB)) + b"]}"  # 10 MiB


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with live(create_app(Settings(home=tmp_path_factory.mktemp("home")))) as url:
        yield url


def post_raw(base: str, body: bytes, *, chunked: bool) -> tuple[int, bytes]:
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if chunked:
            conn.request("POST", "/predict", body=iter([body[i:i + MB] for i in range(0, len(body), MB)]),
                         headers=headers, encode_chunked=True)
        else:
            conn.request("POST", "/predict", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_past_what_a_batch_needs_is_413_with_the_reason(base, chunked):
    """10 MiB of empty queries was parsed whole: 422 after 5-6 s and +485 MiB. Now refused, never parsed."""
    status, body = post_raw(base, EMPTY_QUERIES, chunked=chunked)
    assert status == 413, body[:300]
    detail = json.loads(body)["detail"]
    assert "POST /predict" in detail and f"{MAX_BATCH_QUERIES} queries" in detail
    assert httpx.get(f"{base}/healthz").status_code == 200


def test_the_largest_batch_the_schema_allows_fits_under_the_cap(base):
    """100 queries whose names are 1,000 characters each, every character written as a \\u escape."""
    name = "\u00e9" * MAX_NAME_CHARS
    batch = {"model": "0" * 32, "queries": [{"head": name, "relation": name, "k": 1000, "exclude_known": False}
                                            for _ in range(MAX_BATCH_QUERIES)]}
    body = json.dumps(batch).encode()  # ensure_ascii: 6 bytes a character
    assert len(body) <= MAX_PREDICT_BODY_BYTES
    status, answer = post_raw(base, body, chunked=False)
    assert status == 404 and json.loads(answer)["detail"]["kind"] == "model"  # parsed, validated, looked up


def test_a_422_never_echoes_a_large_input(base):
    """The 422 sent the whole 10 MiB list back; now at most a short description of what was sent."""
    body = b'{"model": "m", "queries": [' + b",".join([b"{}"] * 200_000) + b"]}"
    assert len(body) < MAX_PREDICT_BODY_BYTES
    status, answer = post_raw(base, body, chunked=False)
    assert status == 422 and len(answer) < 2000, answer[:300]
    (error,) = json.loads(answer)["detail"]
    assert error["loc"] == ["body", "queries"] and "200,000" in error["input"]
    long = httpx.get(f"{base}/predict", params={"model": "m", "head": "x", "relation": "r" * 20_000})
    assert long.status_code == 422 and len(long.content) < 2000
    shown = long.json()["detail"][0]["input"]
    assert shown.startswith("rrr") and "20,000 characters" in shown


def test_a_small_input_is_still_shown_whole(base):
    r = httpx.post(f"{base}/predict", json={"model": "m", "queries": [{"relation": "r"}]})
    assert r.status_code == 422
    assert {"relation": "r"} in [e["input"] for e in r.json()["detail"]]
