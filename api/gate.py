"""The outermost ASGI layer: refuses what the headers decide (the front's rules in api/front.py, 401, 413) before a
body byte is read, and lets the client finish sending so that it can read the refusal."""

from __future__ import annotations

import json
from collections.abc import Sequence

import anyio
from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match, Route, get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import front
from .deps import UNAUTHORIZED, needs_token, presented_token, token_matches
from .settings import Settings

MIB = 2**20
# A refused body is read and discarded (never stored) for at most this long and at least LINGER_MIN_BYTES, twice
# the upload limit beyond: a client that sends its whole body before reading (urllib, any Connection: close
# client) then reads the 413 instead of a connection reset. Past that the connection is closed.
LINGER_SECONDS = 30.0
LINGER_MIN_BYTES = 64 * MIB
BODY_LIMIT_KEY = "x-body-limit"  # a route's openapi_extra: why its max_body_size is what it is (the 413 says it)


class RequestGate:
    """401 for a request without the token it needs (`deps.needs_token`) and 413 for a Content-Length over
    EARL_MAX_UPLOAD_MB (or the route's own max_body_size, with its reason), both from the headers alone; Starlette's own 413 for a streamed body that grows past the
    limit is rewritten to the same JSON. Each refusal drains the rest of the body (bounded) before it ends.
    """

    def __init__(self, app: ASGIApp, settings: Settings, routes: Sequence[BaseRoute] = ()) -> None:
        self.app, self.settings, self.routes = app, settings, routes
        self.too_large = (f"request body larger than the upload limit of {settings.max_body_bytes / MIB:g} MiB "
                          "(EARL_MAX_UPLOAD_MB); split the file or compress it as .gz")
        self.linger_bytes = max(2 * settings.max_body_bytes, LINGER_MIN_BYTES)
        # Routes with a body limit of their own (max_body_size: POST /predict), below the upload limit.
        self.route_limits = {id(r): limit for r in routes if (limit := getattr(r, "max_body_size", None)) is not None}
        self.smallest_route_limit = min(self.route_limits.values(), default=settings.max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = declared_length(scope) or 0
        if (refusal := front.refusal(scope, self.settings)) is not None:
            await self.refuse(scope, receive, send, *refusal)
        elif needs_token(self.settings, scope["method"], get_route_path(scope)) and not token_matches(
                self.settings, presented_token(scope["headers"])):
            await self.refuse(scope, receive, send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
        elif length > self.smallest_route_limit and length > self.body_limit(scope)[0]:
            await self.refuse(scope, receive, send, 413, self.body_limit(scope)[1])
        else:
            await self.pass_on(scope, receive, send)

    def body_limit(self, scope: Scope) -> tuple[int, str]:
        """The most body bytes the request's route takes, and the 413's reason past it."""
        route = self.matching_route(scope) if self.route_limits else None
        if route is None or id(route) not in self.route_limits:
            return self.settings.max_body_bytes, self.too_large
        assert isinstance(route, Route)
        limit = self.route_limits[id(route)]
        reason = (getattr(route, "openapi_extra", None) or {}).get(BODY_LIMIT_KEY, "what its largest request needs")
        return limit, f"request body larger than the {limit:,} bytes that {scope['method']} {route.path} takes: {reason}"

    async def refuse(self, scope: Scope, receive: Receive, send: Send, status: int, detail: str,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer `status` without reading the body; the route template is left in the scope for the metrics."""
        scope.setdefault("route", self.matching_route(scope))
        await send({"type": "http.response.start", "status": status, "headers": json_headers(
            scope, len(body := json.dumps({"detail": detail}).encode()), headers or [])})
        await self.finish(receive, send, body, drain=body_follows(scope))

    async def finish(self, receive: Receive, send: Send, body: bytes, *, drain: bool) -> None:
        """Send the whole answer, then drain the rest of the request body, then end the response. uvicorn closes
        the connection after it (Connection: close); unread bytes at that moment would reset the connection, and
        a client that was still sending would lose the answer."""
        await send({"type": "http.response.body", "body": body, "more_body": True})
        if drain:
            await discard_body(receive, max_bytes=self.linger_bytes, seconds=LINGER_SECONDS)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def pass_on(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app, with Starlette's plain-text 413 (a streamed body that grew past the limit) made ours."""
        rewriting: bytes | None = None  # our 413's body, once Starlette's 413 has started
        ended = False

        async def tracked() -> Message:  # whether the body has ended: receive() past its end waits forever
            nonlocal ended
            message = await receive()
            ended = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def rewrite(message: Message) -> None:
            nonlocal rewriting
            if message["type"] == "http.response.start" and message["status"] == 413:
                rewriting = json.dumps({"detail": self.body_limit(scope)[1]}).encode()
                kept = [(k, v) for k, v in message.get("headers", [])
                        if k.lower() not in (b"content-length", b"content-type", b"connection")]
                await send({**message, "headers": json_headers(scope, len(rewriting), kept)})
            elif rewriting and message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await self.finish(receive, send, rewriting, drain=body_follows(scope) and not ended)
            else:
                await send(message)

        await self.app(scope, tracked, rewrite)

    def matching_route(self, scope: Scope) -> BaseRoute | None:
        """The route the router would pick (routes only: an included router's routes are listed on their own)."""
        return next((r for r in self.routes if isinstance(r, Route) and r.matches(scope)[0] is Match.FULL), None)


def declared_length(scope: Scope) -> int | None:
    try:
        return int(Headers(scope=scope)["content-length"])
    except (KeyError, ValueError):
        return None


def expects_continue(scope: Scope) -> bool:
    """Expect: 100-continue: the client sends its body only after '100 Continue', which a refusal never sends."""
    return Headers(scope=scope).get("expect", "").lower() == "100-continue"


def body_follows(scope: Scope) -> bool:
    headers = Headers(scope=scope)
    has_body = (declared_length(scope) or 0) > 0 or "transfer-encoding" in headers
    return has_body and not expects_continue(scope)


def json_headers(scope: Scope, length: int, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A JSON answer's headers; Connection: close when a body was (or may still be) coming, so that the server
    never has to read more of it than `discard_body` did."""
    closing = [(b"connection", b"close")] if body_follows(scope) or expects_continue(scope) else []
    return [*extra, (b"content-type", b"application/json"), (b"content-length", str(length).encode()), *closing]


async def discard_body(receive: Receive, *, max_bytes: int, seconds: float) -> None:
    """Read and drop the request body until it ends, the client leaves, `max_bytes` were read or `seconds` passed."""
    read = 0
    with anyio.move_on_after(seconds):
        while read <= max_bytes:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            read += len(message.get("body", b""))
