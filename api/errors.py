"""Errors that reach the client from below the routes: library errors (404, 422), request validation (422, its
inputs shortened), storage failures (507/503) and a busy or unreachable job store (503). `add_error_handlers` registers them on the app; the 401 and 413 that the
headers decide come from api/gate.py."""

from __future__ import annotations

import errno
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from earl_service.errors import (
    AmbiguousNameError,
    BundleError,
    ConfigError,
    DatasetError,
    StoreError,
    TenantQuotaError,
    TripleFileError,
    UnknownEntityError,
    UnknownJobError,
    UnknownKeyError,
    UnknownModelError,
    UnknownRelationError,
    UnknownReportError,
)

from .schemas import NotFound, NotFoundResponse

log = logging.getLogger(__name__)

NOT_FOUND_ERRORS = (UnknownModelError, UnknownJobError, UnknownEntityError, UnknownRelationError, UnknownReportError,
                    UnknownKeyError)
# The client's file or option, or a label that names several entities.
UNPROCESSABLE_ERRORS = (BundleError, TripleFileError, ConfigError, DatasetError, AmbiguousNameError)
# For a route's `responses=`, so the OpenAPI schema shows the 404 body.
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": NotFoundResponse, "description": "unknown model, job, entity or relation, or no report"}}


SHOWN_INPUT_CHARS = 200  # a 422 shows an input whole up to about this size, else a short description of it


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, invalid_request)
    for missing in NOT_FOUND_ERRORS:
        app.add_exception_handler(missing, not_found)
    for refused in UNPROCESSABLE_ERRORS:
        app.add_exception_handler(refused, unprocessable)
    app.add_exception_handler(TenantQuotaError, over_quota)
    app.add_exception_handler(OSError, storage_error)
    app.add_exception_handler(StoreError, store_unavailable)


async def not_found(request: Request, exc: Exception) -> JSONResponse:
    """404 with a NotFound body: what was not found, and close names to try instead."""
    assert isinstance(exc, NOT_FOUND_ERRORS)
    body = NotFound.model_validate({"message": str(exc), "kind": exc.kind, "name": exc.name,
                                    "suggestions": exc.suggestions})
    return JSONResponse({"detail": body.model_dump()}, status_code=404)


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 for a request that fails validation, with each error's `input` shortened (`shown`): the
    default echoed the whole input, 10 MiB of queries serialised back in 5 s and +485 MiB."""
    assert isinstance(exc, RequestValidationError)
    errors = [{**error, "input": shown(error["input"])} if "input" in error else error for error in exc.errors()]
    return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


def shown(value: Any, limit: int = SHOWN_INPUT_CHARS) -> Any:
    """`value` itself when it is small, else a short description: a string's start and length, a list's or an
    object's item count. Deciding never walks more than about `limit` items of a large input."""
    if isinstance(value, str | bytes):
        return value if len(value) <= limit else f"{value[:limit]!s}... ({len(value):,} characters)"
    if isinstance(value, list | tuple | dict) and _size(value, limit) > limit:
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value):,} items (not shown)"
    return value


def _size(value: Any, limit: int) -> int:
    """About how many characters `value` takes as JSON, counted until `limit` is passed."""
    if isinstance(value, str | bytes):
        return len(value) + 2
    if not isinstance(value, list | tuple | dict):
        return 8
    total = 2
    for item in value.items() if isinstance(value, dict) else value:
        total += _size(item, limit - total) + 2 if not isinstance(item, tuple) else sum(
            _size(part, limit - total) for part in item) + 3
        if total > limit:
            break
    return total


async def unprocessable(request: Request, exc: Exception) -> JSONResponse:
    """422 with the library's message, which names the client's file and line (never a server path)."""
    return JSONResponse({"detail": str(exc)}, status_code=422)


async def over_quota(request: Request, exc: Exception) -> JSONResponse:
    """413 past a tenant's quota of stored bytes, 429 past its quota of models; either says what is left
    (X-Quota-Models-Left, X-Quota-Bytes-Left) and which setting raises the quota."""
    assert isinstance(exc, TenantQuotaError)
    setting = "EARL_TENANT_MAX_MB" if exc.what == "bytes" else "EARL_TENANT_MAX_MODELS"
    left = max(0, exc.limit - exc.used)
    return JSONResponse({"detail": f"{exc}; delete one of its models, or ask the operator to raise {setting}"},
                        status_code=413 if exc.what == "bytes" else 429,
                        headers={f"X-Quota-{exc.what.capitalize()}-Left": str(left)})


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


async def storage_error(request: Request, exc: Exception) -> JSONResponse:
    """An OSError while storing an upload or a bundle: 507 when the disk is full, else 503; never the server path."""
    assert isinstance(exc, OSError)
    log.error("%s %s: storage error: %s", request.method, request.url.path, exc)
    reason = exc.strerror or type(exc).__name__
    if exc.errno in _NO_SPACE:
        return JSONResponse({"detail": f"the server's disk is full ({reason}); nothing was stored, try again "
                                       "later"}, status_code=507)
    return JSONResponse({"detail": f"the server cannot write to its storage ({reason}); nothing was stored"},
                        status_code=503)


async def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with Retry-After for a job store that is locked, full or unreachable; the reason is logged, not sent."""
    log.error("%s %s: job store error: %s", request.method, request.url.path, exc)
    return JSONResponse({"detail": "the job store cannot answer right now (busy or unreachable); nothing was "
                                   "changed, try again shortly"}, status_code=503, headers={"Retry-After": "5"})
