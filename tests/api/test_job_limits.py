"""The server's caps on one job and a client's quota of unfinished jobs, over real HTTP (issue 34, item 13)."""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from live import live

from api.main import create_app
from api.settings import Settings

TOKEN = "limits-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRAIN = {"train": ("train.txt", b"a\tr\tb\nb\tr\tc\n")}
ABSURD = {"batch_size": "65536", "negatives": "4096", "dim": "1024", "nproc_per_node": "64", "steps": "10000000"}


def submit(base: str, data: dict | None = None, **kwargs) -> httpx.Response:
    return httpx.post(f"{base}/jobs", files=TRAIN, data=data or {}, headers=AUTH, timeout=30, **kwargs)


def test_an_absurd_job_is_refused_with_the_caps_and_their_settings(tmp_path):
    """batch 65,536 x negatives 4,096 x dim 1,024 on 64 processes for 10M steps without a time limit was queued."""
    with live(create_app(Settings(home=tmp_path, api_token=TOKEN))) as base:
        r = submit(base, ABSURD)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    for said in ("dim 1,024 is over 512 (EARL_MAX_JOB_DIM)",
                 "batch_size x negatives 268,435,456 is over 1,048,576 (EARL_MAX_BATCH_X_NEGATIVES)",
                 "nproc_per_node 64 is over 8 (EARL_MAX_NPROC)"):
        assert said in detail
    assert not list((tmp_path / "uploads").iterdir())  # refused before any file was stored


def test_a_job_gets_at_most_the_time_cap(tmp_path):
    with live(create_app(Settings(home=tmp_path, api_token=TOKEN, max_job_minutes=30))) as base:
        unlimited = submit(base)
        short = submit(base, {"time_limit": "5"})
        long = submit(base, {"time_limit": "45"})
        params = [httpx.get(f"{base}/jobs/{r.json()['id']}").json()["params"] for r in (unlimited, short)]
    assert [p["time_limit"] for p in params] == [30, 5]
    assert long.status_code == 422 and "time_limit (minutes) 45.0 is over 30.0 (EARL_MAX_JOB_MINUTES)" in long.text


def test_the_caps_are_settings(tmp_path):
    settings = Settings(home=tmp_path, api_token=TOKEN, max_job_dim=1024, max_batch_x_negatives=2**28, max_nproc=64)
    with live(create_app(settings)) as base:
        assert submit(base, ABSURD).status_code == 202


def test_a_client_may_have_so_many_unfinished_jobs(tmp_path):
    with live(create_app(Settings(home=tmp_path, api_token=TOKEN, max_queued_jobs=2))) as base:
        first, second = submit(base), submit(base)
        assert (first.status_code, second.status_code) == (202, 202)
        refused = submit(base)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "60"
        assert "2 unfinished (queued or running) jobs" in refused.json()["detail"]
        assert "EARL_MAX_QUEUED_JOBS=2" in refused.json()["detail"]
        httpx.post(f"{base}/jobs/{first.json()['id']}/cancel", headers=AUTH)
        assert submit(base).status_code == 202  # a finished (here: cancelled) job frees its place


def test_without_a_token_a_client_is_its_address(tmp_path):
    with live(create_app(Settings(home=tmp_path, max_queued_jobs=1))) as base:
        assert submit(base).status_code == 202
        assert submit(base).status_code == 429
        other = httpx.HTTPTransport(local_address="127.0.0.2")  # the whole of 127/8 is this machine
        with httpx.Client(transport=other) as neighbour:
            assert neighbour.post(f"{base}/jobs", files=TRAIN, timeout=30).status_code == 202


@pytest.mark.parametrize("token", [None, TOKEN])
def test_client_keys_never_show_the_token_or_the_address(tmp_path, token):
    from api.limits import client_key

    settings = Settings(home=tmp_path, api_token=token)
    key = client_key(b"s" * 32, settings, token=TOKEN.encode(), address="10.1.2.3")
    assert len(key) == 16 and TOKEN not in key and "10.1.2.3" not in key
    assert (key == client_key(b"s" * 32, settings, token=TOKEN.encode(), address="10.9.9.9")) == (token is not None)


@pytest.mark.parametrize("token", [None, TOKEN])
def test_a_jobs_client_cannot_be_guessed_offline(tmp_path, token):
    """Issue 56: GET /jobs showed sha256("token:" + token)[:16] (or of "addr:" + the IP), so anyone could test
    token guesses offline. Now an HMAC keyed by each install's secret: another install names the client apart."""
    shown = []
    for home in (tmp_path / "a", tmp_path / "b"):
        with live(create_app(Settings(home=home, api_token=token))) as base:
            assert submit(base).status_code == 202
            shown.append(httpx.get(f"{base}/jobs", headers=AUTH).json()[0]["params"]["client"])
    guesses = {hashlib.sha256(who).hexdigest()[:16] for who in (b"token:" + TOKEN.encode(), b"addr:127.0.0.1")}
    assert len(shown[0]) == 16 and shown[0] not in guesses and shown[0] != shown[1]


def test_concurrent_submits_never_pass_the_quota(tmp_path, monkeypatch):
    """Issue 56: 30 concurrent POST /jobs with one token queued 12 under a quota of 10; the count and the insert
    were two steps. The upload check is slowed here so that every request passes the early count first."""
    from api.routes import jobs

    def slow_save(*args, **kwargs):
        time.sleep(0.5)
        return save(*args, **kwargs)

    save = jobs.save_job_files
    monkeypatch.setattr(jobs, "save_job_files", slow_save)
    with live(create_app(Settings(home=tmp_path, api_token=TOKEN, max_queued_jobs=10))) as base, \
            ThreadPoolExecutor(30) as pool:
        statuses = [r.status_code for r in pool.map(lambda _: submit(base), range(30))]
        listed = httpx.get(f"{base}/jobs", headers=AUTH).json()
    assert statuses.count(202) == 10 and statuses.count(429) == 20 and len(listed) == 10
    kept = {p.name for p in (tmp_path / "uploads").iterdir() if not p.name.startswith(".")}
    assert kept == {job["id"] for job in listed}  # a refused request's files went with it


def test_uploads_are_checked_a_few_at_a_time(tmp_path, monkeypatch):
    """Issue 56: 60 concurrent POST /jobs of 0.8 MB grew the server by 109 MiB and held /healthz for 1 s, every
    upload checked at once in its own thread (up to 40), all contending for the GIL with the event loop. At most
    EARL_MAX_CONCURRENT_UPLOADS are checked at once; the others wait on the event loop, holding no thread."""
    from api.routes import jobs

    lock, active, peak = threading.Lock(), [0], [0]

    def tracked_save(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.2)  # long enough that, unbounded, the requests' checks overlap
            return save(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    save = jobs.save_job_files
    monkeypatch.setattr(jobs, "save_job_files", tracked_save)
    settings = Settings(home=tmp_path, api_token=TOKEN, max_queued_jobs=100, max_concurrent_uploads=2)
    with live(create_app(settings)) as base, ThreadPoolExecutor(12) as pool:
        statuses = [r.status_code for r in pool.map(lambda _: submit(base), range(12))]
        assert httpx.get(f"{base}/healthz").status_code == 200
    assert statuses == [202] * 12 and 1 <= peak[0] <= 2
