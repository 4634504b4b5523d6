"""A server busy with predictions still answers its probes, bounds the predictions in flight, and loads a missing
model once for all the requests that want it (issue 34, item 12).

Predictions are held inside their slot by a hook (no model, no timing): a test sees exactly how many run at once.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from live import live

import api.routes.predict as predict_route
from api.cache import PredictorCache
from api.main import create_app
from api.settings import Settings
from earl_service.serve.predictor import LinkPredictor
from earl_service.service.records import ModelRecord

QUERY = {"model": "m", "relation": "r", "head": "h"}
THREADPOOL = 40  # anyio's default thread limit, which every sync route and to_thread call shares


class Held:
    """Stands in for predict.answer: blocks until `release` is set, counting the predictions inside."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.active = self.peak = self.entered = 0

    def __call__(self, registry, cache, **query):
        with self.lock:
            self.entered += 1
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            assert self.release.wait(120), "never released"
            return {"held": True}
        finally:
            with self.lock:
                self.active -= 1


@pytest.fixture
def held(monkeypatch):
    hold = Held()
    monkeypatch.setattr(predict_route, "answer", hold)
    yield hold
    hold.release.set()


def counting_arrivals(app):
    """`app` behind a counter of the /predict requests that reached the server (whatever they wait for there)."""
    arrived = {"n": 0}

    async def counted(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/predict":
            arrived["n"] += 1
        await app(scope, receive, send)

    return counted, arrived


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)


def test_probes_answer_while_every_prediction_slot_and_thread_is_taken(tmp_path, held):
    """48 concurrent predictions used to hold every thread of the pool, and /healthz (a sync route) waited for
    one: 3.75 s median with two models loading. Now /healthz never needs a thread, /readyz has threads of its
    own, and no more than EARL_MAX_CONCURRENT_PREDICTS predictions hold threads at once."""
    settings = Settings(home=tmp_path, max_concurrent_predicts=2, predict_queue_seconds=120)
    app, arrived = counting_arrivals(create_app(settings))
    n = THREADPOOL + 8
    with live(app) as base, ThreadPoolExecutor(n) as clients:
        answers = [clients.submit(httpx.get, f"{base}/predict", params=QUERY, timeout=180) for _ in range(n)]
        wait_until(lambda: arrived["n"] == n, "every prediction to reach the server")
        wait_until(lambda: held.entered >= 2, "the first predictions to start")
        assert httpx.get(f"{base}/healthz", timeout=30).json() == {"status": "ok"}
        ready = httpx.get(f"{base}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert held.active == 2  # the others wait for a slot on the event loop, holding no thread
        held.release.set()
        assert [a.result().status_code for a in answers] == [200] * n
    assert held.peak == 2 and held.entered == n


def test_a_prediction_that_finds_no_slot_in_time_gets_503_with_retry_after(tmp_path, held):
    settings = Settings(home=tmp_path, max_concurrent_predicts=1, predict_queue_seconds=0.2)
    with live(create_app(settings)) as base, ThreadPoolExecutor(1) as clients:
        first = clients.submit(httpx.get, f"{base}/predict", params=QUERY, timeout=120)
        wait_until(lambda: held.entered == 1, "the first prediction to start")
        busy = httpx.get(f"{base}/predict", params=QUERY, timeout=30)
        assert busy.status_code == 503, busy.text
        assert busy.headers["retry-after"] == "1"
        assert "EARL_MAX_CONCURRENT_PREDICTS" in busy.json()["detail"]
        held.release.set()
        assert first.result().status_code == 200
    assert held.entered == 1


def test_concurrent_misses_load_a_model_once(monkeypatch, tmp_path):
    """Two models alternating under load made every request that missed load its own copy of the bundle."""
    import earl_service.bundle.model_io

    loads, release = [], threading.Event()

    def slow_load(path, **kwargs):
        loads.append(path)
        assert release.wait(60), "never released"
        return object()

    monkeypatch.setattr(earl_service.bundle.model_io, "load_bundle", slow_load)
    monkeypatch.setattr(LinkPredictor, "from_bundle", staticmethod(lambda bundle: ("predictor", bundle)))
    cache = PredictorCache(2)
    record = ModelRecord(id="m", path="models/m.safetensors", sha256="0" * 64, bytes=1)
    with ThreadPoolExecutor(8) as pool:
        got = [pool.submit(cache.get, record, Path("m.safetensors")) for _ in range(8)]
        deadline = time.monotonic() + 2  # a second load, if there is to be one, starts well within this
        while len(loads) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        results = [g.result(timeout=60) for g in got]
    assert len(loads) == 1
    assert all(r is results[0] for r in results) and len(cache) == 1


def test_a_failed_load_reaches_every_waiter_and_is_not_kept(monkeypatch):
    import earl_service.bundle.model_io
    from earl_service.errors import BundleError

    calls, release = [], threading.Event()

    def failing_load(path, **kwargs):
        calls.append(path)
        release.wait(60)
        raise BundleError(f"{path}: broken")

    monkeypatch.setattr(earl_service.bundle.model_io, "load_bundle", failing_load)
    cache = PredictorCache(2)
    record = ModelRecord(id="m", path="p", sha256="1" * 64, bytes=1)
    with ThreadPoolExecutor(4) as pool:
        got = [pool.submit(cache.get, record, Path("p")) for _ in range(4)]
        wait_until(lambda: calls, "the load to start")
        release.set()
        errors = [g.exception(timeout=60) for g in got]
    assert all(isinstance(e, BundleError) for e in errors) and len(cache) == 0
    with pytest.raises(BundleError):  # not remembered: the next request loads again
        cache.get(record, Path("p"))
    assert len(calls) >= 2


def test_the_cache_keeps_to_its_byte_budget_least_recently_used_first(monkeypatch):
    """EARL_CACHE_MB: three 40-MB predictors in a 100-MB cache keep the two used last; one over the whole
    budget alone is still kept (it is being asked for), and evicts the rest."""
    import api.cache

    class Sized:
        def __init__(self, path):
            self.path, self.resident_bytes = path, 100 if str(path) == "big" else 40

    monkeypatch.setattr(api.cache, "load_predictor", Sized)
    cache = PredictorCache(10, max_bytes=100)

    def get(name):
        return cache.get(ModelRecord(id=name, path=name, sha256="0" * 64, bytes=1), Path(name))

    a, b = get("a"), get("b")
    assert get("a") is a  # a used last: b is the least recently used now
    get("c")
    assert len(cache) == 2 and cache.resident_bytes == 80
    assert get("a") is a and get("b") is not b  # b was evicted and loads again
    get("big")
    assert len(cache) == 1 and cache.resident_bytes == 100
