"""Errors that reach the client from below the routes: library errors (404, 422), the body-size limit (413) and
storage failures (507/503). `add_error_handlers` registers them on the app."""

from __future__ import annotations

import errno
import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from earl_service.errors import (
    BundleError,
    ConfigError,
    DatasetError,
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
UNPROCESSABLE_ERRORS = (BundleError, TripleFileError, ConfigError, DatasetError)  # the client's file or option
# For a route's `responses=`, so the OpenAPI schema shows the 404 body.
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": NotFoundResponse, "description": "unknown model, job, entity or relation, or no report"}}


def add_error_handlers(app: FastAPI) -> None:
    for missing in NOT_FOUND_ERRORS:
        app.add_exception_handler(missing, not_found)
    for refused in UNPROCESSABLE_ERRORS:
        app.add_exception_handler(refused, unprocessable)
    app.add_exception_handler(OSError, storage_error)


async def not_found(request: Request, exc: Exception) -> JSONResponse:
    """404 with a NotFound body: what was not found, and close names to try instead."""
    assert isinstance(exc, NOT_FOUND_ERRORS)
    body = NotFound.model_validate({"message": str(exc), "kind": exc.kind, "name": exc.name,
                                    "suggestions": exc.suggestions})
    return JSONResponse({"detail": body.model_dump()}, status_code=404)


async def unprocessable(request: Request, exc: Exception) -> JSONResponse:
    """422 with the library's message, which names the client's file and line (never a server path)."""
    return JSONResponse({"detail": str(exc)}, status_code=422)


class BodyLimitMessage:
    """Replaces Starlette's bare 'Content Too Large' (413) with the limit and the setting that raises it.

    Starlette's body limiter answers 413 in plain text, from inside the app or from its own middleware; this
    outer middleware rewrites any 413 start/body pair into JSON `{"detail": ...}` like every other error.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        mib = max_body_bytes / 2**20
        self.body = json.dumps({"detail": f"request body larger than the upload limit of {mib:g} MiB "
                                          "(EARL_MAX_UPLOAD_MB); split the file or compress it as .gz"}).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rewriting = False

        async def rewrite(message: Message) -> None:
            nonlocal rewriting
            if message["type"] == "http.response.start" and message["status"] == 413:
                rewriting = True
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() not in (b"content-length", b"content-type")]
                await send({**message, "headers": [*headers, (b"content-type", b"application/json"),
                                                   (b"content-length", str(len(self.body)).encode())]})
            elif rewriting and message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": self.body})
            else:
                await send(message)

        await self.app(scope, receive, rewrite)


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
