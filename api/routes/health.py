"""GET /healthz (process alive), GET /readyz (store reachable, home writable), GET /metrics (Prometheus).

The probes must answer while every prediction slot and thread is busy: /healthz does no blocking work, and
/readyz runs its checks in threads of its own (`probe_threads`), not in the pool the routes share, with a deadline.
"""

from __future__ import annotations

import tempfile

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from earl_service.errors import EarlError
from earl_service.service.store import JobStore

from ..deps import CacheDep, MetricsDep, SettingsDep, StoreDep
from ..settings import Settings

router = APIRouter(tags=["health"])
PROBE_THREADS = 2  # readiness checks in flight at once (app.state.probe_threads), apart from the routes' pool
READY_DEADLINE_S = 4.0  # under the 5 s timeout of the Dockerfile's health check and of usual probes


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, settings: SettingsDep, store: StoreDep) -> JSONResponse:
    checks = {"store": f"no answer within {READY_DEADLINE_S:g} s", "home": "not checked"}
    with anyio.move_on_after(READY_DEADLINE_S):
        checks = await anyio.to_thread.run_sync(readiness, settings, store, limiter=request.app.state.probe_threads,
                                                abandon_on_cancel=True)
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks}, 200 if ready else 503)


def readiness(settings: Settings, store: JobStore) -> dict[str, str]:
    """The store answers and the home takes a new file: 'ok' for each, or what is wrong."""
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
    return checks


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(metrics: MetricsDep, store: StoreDep, cache: CacheDep) -> PlainTextResponse:
    try:
        jobs, registered = store.count_jobs(), len(store.list_models())
    except EarlError:
        jobs, registered = {}, 0
    return PlainTextResponse(metrics.render(jobs, len(cache), registered),
                             media_type="text/plain; version=0.0.4; charset=utf-8")
