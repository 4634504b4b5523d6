"""The FastAPI application: `create_app(settings)` for tests and embedding, `app` for uvicorn api.main:app.

The API process answers queries with one torch/FAISS thread (set in the lifespan): requests run
concurrently in the threadpool, and one query cannot use more. Training happens only in workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp

from earl_service import __version__
from earl_service.predict import configure_threads
from earl_service.worker import housekeeping
from earl_service.worker.home import ServiceHome
from earl_service.worker.registry import ModelRegistry

from .cache import PredictorCache
from .deps import check_access
from .errors import BodyLimitMessage, add_error_handlers
from .metrics import Metrics, MetricsMiddleware
from .routes import health, jobs, models, predict, reports
from .settings import Settings

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 3600.0  # housekeeping (earl_service/worker/housekeeping.py) after the one at start


class EarlAPI(FastAPI):
    def build_middleware_stack(self) -> ASGIApp:
        # Outermost: FastAPI puts its body limiter outside every user middleware, and its 413 should say more.
        return BodyLimitMessage(super().build_middleware_stack(), self.max_body_size or 0)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_threads(1)
        app.state.home = ServiceHome(settings.home).create()
        app.state.store = app.state.home.open_store(settings.store)
        app.state.registry = ModelRegistry(app.state.home, app.state.store)
        app.state.cache = PredictorCache(settings.cache_models)
        sweep = partial(housekeeping.sweep, app.state.home, app.state.store, keep_days=settings.run_retention_days)
        await run_sweep(sweep)  # before the first request: what a crash left, runs past retention
        sweeper = asyncio.create_task(sweep_periodically(sweep))
        try:
            yield
        finally:
            sweeper.cancel()
            app.state.store.close()

    # max_body_size: FastAPI/Starlette count the bytes as they stream in and answer 413 past the limit
    # (or at once from Content-Length), so an oversized upload is never spooled to disk in full.
    # check_access: one app-wide dependency, so every route (new ones too) is behind the token rules.
    app = EarlAPI(title="EARL compression service", version=__version__, lifespan=lifespan,
                  max_body_size=settings.max_body_bytes, dependencies=[Depends(check_access)])
    app.state.settings = settings
    app.state.metrics = Metrics()
    add_error_handlers(app)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    for module in (jobs, models, reports, predict, health):
        app.include_router(module.router)
    return app


async def run_sweep(sweep: Callable[[], object]) -> None:
    """`sweep` in a thread; a failure (the store unreachable, say) is logged: housekeeping never stops the API."""
    try:
        await run_in_threadpool(sweep)
    except Exception:  # noqa: BLE001
        log.exception("housekeeping sweep failed; the next one tries again")


async def sweep_periodically(sweep: Callable[[], object], every_s: float = SWEEP_EVERY_S) -> None:
    while True:
        await asyncio.sleep(every_s)
        await run_sweep(sweep)


app = create_app()
