"""The FastAPI application: `create_app(settings)` for tests and embedding, `app` for uvicorn api.main:app.

The API process answers queries with one torch/FAISS thread (set in the lifespan): requests run
concurrently in the threadpool, and one query cannot use more. Training happens only in workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from functools import partial

import anyio
from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp

from earl_service import __version__
from earl_service.serve.predictor import configure_threads
from earl_service.service import housekeeping
from earl_service.service.home import ServiceHome
from earl_service.service.registry import ModelRegistry

from .audit import AuditLog
from .cache import PredictorCache
from .deps import check_access
from .errors import add_error_handlers
from .front import SecurityHeaders
from .gate import RequestGate
from .limits import PredictSlots, StreamSlots, TenantRates
from .metrics import Metrics, MetricsMiddleware
from .principal import KeyRing
from .routes import (
    audit,
    console,
    docs,
    entities,
    events,
    health,
    jobs,
    keys,
    models,
    precisions,
    predict,
    relations,
    reports,
)
from .settings import Settings

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 3600.0  # housekeeping (earl_service/service/housekeeping.py) after the one at start-up
ROUTERS = (jobs, events, models, relations, reports, predict, entities, precisions, keys, audit, health, console, docs)


class EarlAPI(FastAPI):
    def build_middleware_stack(self) -> ASGIApp:
        # The gate outermost: it refuses (400, 401, 403, 413, 429, 431) before FastAPI reads a body, and FastAPI's
        # own body limiter sits outside every user middleware. The metrics wrap it, so that refusals are counted
        # too, the audit log wraps those (refused writes are logged), and the security headers wrap everything, so
        # that every response carries them.
        routes = [*self.router.routes, *(route for module in ROUTERS for route in module.router.routes)]
        settings = self.state.settings
        rates = TenantRates(settings.tenant_rate, settings.tenant_burst) if settings.tenant_rate > 0 else None
        gate = RequestGate(super().build_middleware_stack(), settings, routes, keyring=self.state.keyring,
                           rates=rates)
        return SecurityHeaders(AuditLog(MetricsMiddleware(gate, metrics=self.state.metrics),
                                        keep=settings.audit_keep))


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_threads(1)
        app.state.home = ServiceHome(settings.home).create()
        app.state.secret = app.state.home.secret()  # keys the client names of jobs (limits.client_key)
        app.state.store = app.state.home.open_store(settings.store)
        app.state.registry = ModelRegistry(app.state.home, app.state.store, limits=settings.bundle_limits)
        app.state.cache = PredictorCache(settings.cache_models, int(settings.cache_mb * 2**20))
        sweep = partial(housekeeping.sweep, app.state.home, app.state.store, keep_days=settings.run_retention_days)
        stopping = asyncio.Event()
        sweeper = asyncio.create_task(sweep_periodically(sweep, stopping))
        try:
            yield
        finally:
            stopping.set()
            await sweeper  # a sweep under way ends first (a thread cannot be cancelled): it uses the store
            app.state.store.close()

    # max_body_size: FastAPI/Starlette count the bytes as they stream in and answer 413 past the limit, so an
    # oversized upload is never spooled to disk in full (a too-large Content-Length never gets past the gate).
    # check_access: one app-wide dependency, so every route (new ones too) is behind the token rules; the gate
    # applies the same rules (deps.needs_token) before any body is read.
    # docs_url, redoc_url: FastAPI's pages load their scripts from a CDN; routes/docs.py serves local ones.
    app = EarlAPI(title="EARL compression service", version=__version__, lifespan=lifespan,
                  max_body_size=settings.max_body_bytes, dependencies=[Depends(check_access)], docs_url=None,
                  redoc_url=None)
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.keyring = KeyRing(lambda: app.state.store.list_keys())  # the store opens in the lifespan
    # Bounds on work in flight: predictions computed and uploads checked at once, and threads of their own for the readiness checks.
    app.state.predict_slots = PredictSlots(settings.max_concurrent_predicts, wait=settings.predict_queue_seconds)
    app.state.stream_slots = StreamSlots(settings.max_event_streams)
    app.state.upload_slots = anyio.Semaphore(settings.max_concurrent_uploads)
    app.state.probe_threads = anyio.CapacityLimiter(health.PROBE_THREADS)
    add_error_handlers(app)
    for module in ROUTERS:
        app.include_router(module.router)
    app.state.swagger = (swagger := docs.swagger_assets()) is not None
    if swagger is not None:  # before the console's mount, which would otherwise take its paths
        app.mount(docs.SWAGGER_ASSETS, swagger, name="swagger")
    app.mount(console.ASSETS, console.assets(), name="console")
    return app


async def run_sweep(sweep: Callable[[], object]) -> None:
    """`sweep` in a thread; a failure (the store unreachable, say) is logged: housekeeping never stops the API."""
    try:
        await run_in_threadpool(sweep)
    except Exception:  # noqa: BLE001
        log.exception("housekeeping sweep failed; the next one tries again")


async def sweep_periodically(sweep: Callable[[], object], stopping: asyncio.Event, *,
                             every_s: float = SWEEP_EVERY_S) -> None:
    """`sweep` at once, then every `every_s` seconds until `stopping` is set. In the background from the start
    too: it removes only staging files old enough to have no live writer, so start-up need not wait for it."""
    while not stopping.is_set():
        await run_sweep(sweep)
        with suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), every_s)


app = create_app()
