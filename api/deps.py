"""Typed dependencies for the routes: settings, store, predictor cache, the write token, id parameters."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Path, Request

from earl_service.worker.store import JobStore

from .cache import PredictorCache
from .metrics import Metrics
from .settings import Settings

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # uuid4 hex in practice; never a path separator or '..'


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> JobStore:
    return request.app.state.store


def get_cache(request: Request) -> PredictorCache:
    return request.app.state.cache


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[JobStore, Depends(get_store)]
CacheDep = Annotated[PredictorCache, Depends(get_cache)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="job id")]
ModelId = Annotated[str, Path(pattern=ID_PATTERN, description="model id")]


def require_token(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> None:
    """With EARL_API_TOKEN set, the request must carry 'Authorization: Bearer <token>' (constant-time compare)."""
    if settings.api_token is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    expected = settings.api_token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise HTTPException(401, "missing or wrong API token: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})


WriteAccess = Depends(require_token)
