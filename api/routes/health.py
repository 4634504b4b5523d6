"""GET /healthz (process alive), GET /readyz (store reachable, home writable), GET /metrics (Prometheus)."""

from __future__ import annotations

import tempfile

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from earl_service.errors import EarlError

from ..deps import CacheDep, MetricsDep, SettingsDep, StoreDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(settings: SettingsDep, store: StoreDep) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        store.ping()
        checks["store"] = "ok"
    except EarlError as exc:
        checks["store"] = str(exc)
    try:
        with tempfile.NamedTemporaryFile(dir=settings.home, prefix=".readyz-"):
            pass
        checks["home"] = "ok"
    except OSError as exc:
        checks["home"] = f"{settings.home} is not writable: {exc.strerror}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks}, 200 if ready else 503)


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(metrics: MetricsDep, store: StoreDep, cache: CacheDep) -> PlainTextResponse:
    try:
        jobs, registered = store.count_jobs(), len(store.list_models())
    except EarlError:
        jobs, registered = {}, 0
    return PlainTextResponse(metrics.render(jobs, len(cache), registered),
                             media_type="text/plain; version=0.0.4; charset=utf-8")
