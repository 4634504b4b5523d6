"""GET /jobs/{id}/events (Server-Sent Events) against a live uvicorn, and the console's page and assets (GET /)."""

import json
import threading
import time

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from live import live

from api.main import create_app
from api.routes import events
from api.settings import Settings
from earl_service.atomic import write_json

TOKEN = "events-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD = b"a\tr\tb\nb\tr\tc\n"


def read_events(response: httpx.Response) -> list[tuple[str, object]]:
    """The (event, data) pairs of a whole stream, in order; comments and the retry field left out."""
    found, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            found.append((name, json.loads(line.removeprefix("data: "))))
    return found


@pytest.fixture
def app(tmp_path):
    return create_app(Settings(home=tmp_path, api_token=TOKEN))


def queued_job(base: str) -> str:
    return httpx.post(f"{base}/jobs", files={"train": ("train.txt", GOOD)}, headers=AUTH).json()["id"]


def test_a_running_job_streams_each_change_then_its_curve_and_the_end(app, tmp_path):
    history = {"steps": list(range(1, 2001)), "losses": [1 / s for s in range(1, 2001)], "seconds": [],
               "step_times": [], "eval_steps": [1000, 2000], "eval_mrr": [0.2, 0.3], "encoded": []}
    with live(app) as base:
        store = app.state.store
        job_id = queued_job(base)
        store.claim_job("w1", stale_after=60, max_attempts=3)
        seen = []

        def worker():  # two heartbeats, then the run's history.json and the end, as the worker writes them
            for step in (1, 2):
                while len(seen) < step:
                    time.sleep(0.05)
                store.heartbeat(job_id, "w1", {"step": step, "total": 2000, "loss": 1.0 / step, "valid_mrr": None})
            while len(seen) < 3:
                time.sleep(0.05)
            write_json(tmp_path / "runs" / job_id / "history.json", history)
            store.finish_job(job_id, "w1", "succeeded", model_id=job_id)

        feeder = threading.Thread(target=worker)
        feeder.start()
        with httpx.stream("GET", f"{base}/jobs/{job_id}/events", timeout=30) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line.removeprefix("data: ")))
        feeder.join()
    jobs, (curve, end) = seen[:-2], seen[-2:]
    assert [j["state"] for j in jobs] == ["running", "running", "running", "succeeded"]
    assert [j["progress"].get("step") for j in jobs[:3]] == [None, 1, 2] and jobs[-1]["model_id"] == job_id
    assert end == {"state": "succeeded"}
    assert curve["eval_steps"] == [1000, 2000] and curve["eval_mrr"] == [0.2, 0.3]
    assert len(curve["steps"]) <= events.CURVE_POINTS + 1 and curve["steps"][-1] == 2000
    assert curve["losses"] == [1 / s for s in curve["steps"]]


def test_an_ended_job_without_a_run_gets_a_null_curve(app):
    with live(app) as base:
        job_id = queued_job(base)
        httpx.post(f"{base}/jobs/{job_id}/cancel", headers=AUTH)
        with httpx.stream("GET", f"{base}/jobs/{job_id}/events", timeout=30) as response:
            found = read_events(response)
    assert [name for name, _ in found] == ["job", "curve", "end"]
    assert found[1][1] is None and found[2][1] == {"state": "cancelled"}


def test_a_stream_ends_after_its_lifetime_with_heartbeats_on_the_way(app, monkeypatch):
    # Polls well inside a heartbeat's period: at the default 0.5 s, one slow poll on a loaded machine could reach
    # the stream's end before its first heartbeat.
    monkeypatch.setattr(events, "STREAM_SECONDS", 2.0)
    monkeypatch.setattr(events, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setattr(events, "POLL_SECONDS", 0.05)
    with live(app) as base:
        job_id = queued_job(base)
        with httpx.stream("GET", f"{base}/jobs/{job_id}/events", timeout=30) as response:
            lines = list(response.iter_lines())
    assert lines[0] == f"retry: {events.RETRY_MS}" and ": heartbeat" in lines
    assert [line for line in lines if line.startswith("event:")] == ["event: job"]  # no end: the client reconnects
    assert app.state.stream_slots.open == 0


def test_unknown_jobs_bad_ids_and_too_many_streams_are_refused(app, monkeypatch):
    with TestClient(app) as client:
        assert client.get("/jobs/nope/events").status_code == 404
        assert client.get("/jobs/..%2F..%2Fetc/events").status_code in (404, 422)
        job_id = client.post("/jobs", files={"train": ("train.txt", GOOD)}, headers=AUTH).json()["id"]
        monkeypatch.setattr(app.state.stream_slots, "open", app.state.stream_slots.size)
        refused = client.get(f"/jobs/{job_id}/events")
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert "EARL_MAX_EVENT_STREAMS" in refused.json()["detail"]


def test_concurrent_streams_never_pass_the_cap(tmp_path):
    """Issue 56: 300 concurrent streams opened 79 under a cap of 64 (the count grew only once a stream started).
    Here 60 clients at once against a cap of 8, each open stream held until every client has its answer (so that
    no slot is given back and taken again meanwhile): exactly 8 open, the rest 503, and every slot comes back."""
    app = create_app(Settings(home=tmp_path, api_token=TOKEN, max_event_streams=8))

    async def open_all(url: str, clients: int = 60) -> list[int]:
        statuses: list[int] = []
        everyone = anyio.Event()
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as client:
            async def one() -> None:
                async with client.stream("GET", url) as response:
                    statuses.append(response.status_code)
                    if len(statuses) == clients:
                        everyone.set()
                    if response.status_code == 200:
                        with anyio.move_on_after(30):
                            await everyone.wait()

            async with anyio.create_task_group() as group:
                for _ in range(clients):
                    group.start_soon(one)
        return statuses

    with live(app) as base:
        job_id = queued_job(base)
        statuses = anyio.run(open_all, f"{base}/jobs/{job_id}/events")
        deadline = time.monotonic() + 10
        while app.state.stream_slots.open and time.monotonic() < deadline:
            time.sleep(0.05)
    assert statuses.count(200) == 8 and statuses.count(503) == 52
    assert app.state.stream_slots.open == 0



def test_thinned_keeps_the_ends_and_about_the_asked_points():
    xs = list(range(1001))
    kept, values = events.thinned(xs, xs, points=100)
    assert kept[0] == 0 and kept[-1] == 1000 and 50 < len(kept) <= 101 and kept == values
    assert events.thinned([], []) == ([], [])


def test_the_console_is_public_even_with_protected_reads_and_the_api_is_not(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path, api_token=TOKEN, protect_reads=True))) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert 'src="/console/app.js"' in page.text and "http" not in page.text.split("<body>")[0]  # no CDN
        for asset in ("app.js", "api.js", "console.css"):
            assert client.get(f"/console/{asset}").status_code == 200
        assert client.get("/console/nothing.js").status_code == 404
        for path in ("/models", "/jobs", "/jobs/x/events", "/models/x/relations", "/openapi.json", "/console"):
            assert client.get(path).status_code == 401, path
        assert client.get("/jobs/x/events", headers=AUTH).status_code == 404
        assert client.get("/models", headers=AUTH).status_code == 200
