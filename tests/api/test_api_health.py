"""Liveness, readiness (store and home checked) and the Prometheus metrics text."""

from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.errors import StoreError


def test_health_ready_and_metrics(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path))) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["checks"] == {"store": "ok", "home": "ok"}
        c.post("/jobs", files={"train": ("t.txt", b"a\tr\tb\n")})
        c.get("/jobs/bad.id")
        text = c.get("/metrics").text
    assert 'earl_http_requests_total{method="POST",route="/jobs",status="202"} 1' in text
    assert 'earl_http_requests_total{method="GET",route="/jobs/{job_id}",status="422"} 1' in text
    assert 'earl_http_request_duration_seconds_bucket{method="POST",route="/jobs",le="+Inf"} 1' in text
    assert 'earl_jobs{state="queued"} 1' in text and "earl_models_cached 0" in text


def test_not_ready_when_the_store_is_down(tmp_path):
    class DownStore:
        def ping(self):
            raise StoreError("job store redis://x unreachable")

        def close(self):
            pass

    with TestClient(create_app(Settings(home=tmp_path))) as c:
        c.app.state.store.close()
        c.app.state.store = DownStore()
        r = c.get("/readyz")
    assert r.status_code == 503 and "unreachable" in r.json()["checks"]["store"]


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EARL_HOME", str(tmp_path))
    monkeypatch.setenv("EARL_API_TOKEN", "")
    monkeypatch.setenv("EARL_MAX_UPLOAD_MB", "2")
    monkeypatch.setenv("EARL_CACHE_MODELS", "7")
    s = Settings()
    assert (s.home, s.api_token, s.max_body_bytes, s.cache_models) == (tmp_path, None, 2 * 1024 * 1024, 7)
