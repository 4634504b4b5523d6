"""Typed dependencies for the routes: settings, home, store, registry, predictor cache, ids, the access check.

They are `async def` on purpose: FastAPI runs a plain `def` dependency in the threadpool, one hop per
dependency per request, and these only read app state or compare a token."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from earl_service.worker.home import ServiceHome
from earl_service.worker.registry import ModelRegistry
from earl_service.worker.store import JobStore

from .cache import PredictorCache
from .metrics import Metrics
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


SettingsDep = Annotated[Settings, Depends(get_settings)]
HomeDep = Annotated[ServiceHome, Depends(get_home)]
StoreDep = Annotated[JobStore, Depends(get_store)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
CacheDep = Annotated[PredictorCache, Depends(get_cache)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="job id")]
ModelId = Annotated[str, Path(pattern=ID_PATTERN, description="model id")]


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # probes answer without a token, even with EARL_PROTECT_READS
bearer = HTTPBearer(auto_error=False, description="EARL_API_TOKEN; needed for writes, and for reads with "
                                                  "EARL_PROTECT_READS=true")


def token_matches(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> bool:
    """Constant-time comparison of the presented bearer token with EARL_API_TOKEN (bytes: any characters)."""
    assert settings.api_token is not None
    presented = credentials.credentials.strip().encode() if credentials is not None else b""
    return hmac.compare_digest(presented, settings.api_token.get_secret_value().encode())


async def check_access(request: Request, settings: SettingsDep,
                 credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None) -> None:
    """App-wide dependency, so a new route is covered without remembering to add it: with EARL_API_TOKEN set,
    every method but GET/HEAD/OPTIONS needs 'Authorization: Bearer <token>', and with EARL_PROTECT_READS every
    route but the health probes does."""
    if settings.api_token is None:
        return
    route = getattr(request.scope.get("route"), "path", request.url.path)
    if request.method in SAFE_METHODS and (not settings.protect_reads or route in OPEN_PATHS):
        return
    if not token_matches(settings, credentials):
        raise HTTPException(401, "missing or wrong API token: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
