"""Typed dependencies for the routes: settings, home, store, registry, predictor cache, ids, the access check.

They are `async def` on purpose: FastAPI runs a plain `def` dependency in the threadpool, one hop per
dependency per request, and these only read app state or compare a token."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
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


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # probes answer without a token, even with EARL_PROTECT_READS
CONSOLE_PATHS = ("/", "/console/")  # the web console's page and assets (routes/console.py): no data in them
READ_POSTS = frozenset({"/predict"})  # POSTs that only read (a batch of queries): a read to the token rules
bearer = HTTPBearer(auto_error=False, description="EARL_API_TOKEN; needed for writes, and for reads with "
                                                  "EARL_PROTECT_READS=true")
UNAUTHORIZED = "missing or wrong API token: send 'Authorization: Bearer <token>'"


def needs_token(settings: Settings, method: str, path: str) -> bool:
    """The token rules, for the gate (api/gate.py, before the body is read) and `check_access` alike: with
    EARL_API_TOKEN set, every method but GET/HEAD/OPTIONS (and the READ_POSTS) needs it, and with
    EARL_PROTECT_READS every path but the health probes and the console's page and assets does (the OpenAPI
    schema and the docs pages included)."""
    if settings.api_token is None:
        return False
    return is_write(method, path) or (settings.protect_reads and path not in OPEN_PATHS and not is_console_path(path))


def is_write(method: str, path: str) -> bool:
    """Every method but GET/HEAD/OPTIONS, except the POSTs that only read (READ_POSTS)."""
    return method not in SAFE_METHODS and not (method == "POST" and path in READ_POSTS)


def is_console_path(path: str) -> bool:
    return path == CONSOLE_PATHS[0] or path.startswith(CONSOLE_PATHS[1])


def presented_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The bearer token of raw ASGI headers, as sent (b"" when there is none or the scheme is not Bearer)."""
    value = next((v for k, v in headers if k.lower() == b"authorization"), b"")
    scheme, _, token = value.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


def token_matches(settings: Settings, presented: bytes) -> bool:
    """Constant-time comparison of the presented bearer token with EARL_API_TOKEN (bytes: any characters)."""
    assert settings.api_token is not None
    return hmac.compare_digest(presented, settings.api_token.get_secret_value().encode())


async def check_access(request: Request, settings: SettingsDep,
                       _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None) -> None:
    """App-wide dependency, so a new route is covered without remembering to add it. The gate has already
    refused such requests before their body was read; this is the same rule, and `bearer` puts the scheme in
    the OpenAPI schema."""
    if needs_token(settings, request.method, get_route_path(request.scope)) and not token_matches(
            settings, presented_token(request.scope["headers"])):
        raise HTTPException(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
