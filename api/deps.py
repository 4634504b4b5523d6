"""Typed dependencies for the routes: settings, home, store, registry, predictor cache, ids, who is asking and the
access check.

They are `async def` on purpose: FastAPI runs a plain `def` dependency in the threadpool, one hop per
dependency per request, and these only read app state or compare a token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import get_route_path

from earl_service.service.home import ServiceHome
from earl_service.service.registry import ModelRegistry
from earl_service.service.store import JobStore

from .cache import PredictorCache
from .limits import PredictSlots, StreamSlots
from .metrics import Metrics
from .principal import Principal, needed_scope, refusal
from .settings import Settings

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # uuid4 hex in practice; never a path separator or '..'


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_home(request: Request) -> ServiceHome:
    return request.app.state.home


async def get_store(request: Request) -> JobStore:
    return request.app.state.store


async def get_registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


async def get_cache(request: Request) -> PredictorCache:
    return request.app.state.cache


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_predict_slots(request: Request) -> PredictSlots:
    return request.app.state.predict_slots


async def get_stream_slots(request: Request) -> StreamSlots:
    return request.app.state.stream_slots


async def upload_slot(request: Request) -> AsyncIterator[None]:
    """Holds one of EARL_MAX_CONCURRENT_UPLOADS slots around a route that checks and stores an upload: the others
    wait here, on the event loop, holding no thread. Its form is parsed already (to disk past 1 MiB a file);
    the check that reads it, in a thread, takes the GIL and memory, and 60 at once held /healthz for 1 s."""
    async with request.app.state.upload_slots:
        yield


UPLOAD_SLOT = Depends(upload_slot, scope="function")  # released when the route returns, before the answer is sent
SettingsDep = Annotated[Settings, Depends(get_settings)]
HomeDep = Annotated[ServiceHome, Depends(get_home)]
StoreDep = Annotated[JobStore, Depends(get_store)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
CacheDep = Annotated[PredictorCache, Depends(get_cache)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
PredictSlotsDep = Annotated[PredictSlots, Depends(get_predict_slots)]
StreamSlotsDep = Annotated[StreamSlots, Depends(get_stream_slots)]
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="job id")]
ModelId = Annotated[str, Path(pattern=ID_PATTERN, description="model id")]


bearer = HTTPBearer(auto_error=False, description="an API key (`earl keys create`) or EARL_API_TOKEN; needed for "
                                                  "writes, and for reads once a key exists (EARL_PROTECT_READS, "
                                                  "EARL_OPEN_READS)")


async def get_principal(request: Request) -> Principal:
    """Who sent the request, as the gate (api/gate.py) found from its headers."""
    return request.state.principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def check_access(request: Request, principal: PrincipalDep,
                       _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None) -> None:
    """App-wide dependency, so a new route is covered without remembering to add it. The gate has already
    refused such requests before their body was read; this is the same rule, and `bearer` puts the scheme in
    the OpenAPI schema."""
    if (refused := refusal(principal, needed_scope(request.method, get_route_path(request.scope)))) is not None:
        raise HTTPException(refused[0], refused[1], headers={"WWW-Authenticate": "Bearer"})
