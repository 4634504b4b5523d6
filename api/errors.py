"""Errors that reach the client from below the routes: library errors (404, 422), storage failures (507/503) and
a busy or unreachable job store (503). `add_error_handlers` registers them on the app; the 401 and 413 that the
headers decide come from api/gate.py."""

from __future__ import annotations

import errno
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from earl_service.errors import (
    AmbiguousNameError,
    BundleError,
    ConfigError,
    DatasetError,
    StoreError,
    TripleFileError,
    UnknownEntityError,
    UnknownJobError,
    UnknownModelError,
    UnknownRelationError,
    UnknownReportError,
)

from .schemas import NotFound, NotFoundResponse

log = logging.getLogger(__name__)

NOT_FOUND_ERRORS = (UnknownModelError, UnknownJobError, UnknownEntityError, UnknownRelationError, UnknownReportError)
# The client's file or option, or a label that names several entities.
UNPROCESSABLE_ERRORS = (BundleError, TripleFileError, ConfigError, DatasetError, AmbiguousNameError)
# For a route's `responses=`, so the OpenAPI schema shows the 404 body.
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": NotFoundResponse, "description": "unknown model, job, entity or relation, or no report"}}


def add_error_handlers(app: FastAPI) -> None:
    for missing in NOT_FOUND_ERRORS:
        app.add_exception_handler(missing, not_found)
    for refused in UNPROCESSABLE_ERRORS:
        app.add_exception_handler(refused, unprocessable)
    app.add_exception_handler(OSError, storage_error)
    app.add_exception_handler(StoreError, store_unavailable)


async def not_found(request: Request, exc: Exception) -> JSONResponse:
    """404 with a NotFound body: what was not found, and close names to try instead."""
    assert isinstance(exc, NOT_FOUND_ERRORS)
    body = NotFound.model_validate({"message": str(exc), "kind": exc.kind, "name": exc.name,
                                    "suggestions": exc.suggestions})
    return JSONResponse({"detail": body.model_dump()}, status_code=404)


async def unprocessable(request: Request, exc: Exception) -> JSONResponse:
    """422 with the library's message, which names the client's file and line (never a server path)."""
    return JSONResponse({"detail": str(exc)}, status_code=422)


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
