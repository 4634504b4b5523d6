"""The outermost ASGI layer: refuses what the headers decide (the front's rules in api/front.py; 401 and 403 by
the sender's key and scopes, api/principal.py; 429 past a tenant's rate; 413) before a body byte is read, and lets
the client finish sending so that it can read the refusal."""

from __future__ import annotations

import json
from collections.abc import Sequence

import anyio
from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match, Route, get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from earl_service.errors import EarlError

from . import front
from .limits import TenantRates
from .principal import NOBODY, KeyRing, Principal, identify, needed_scope, presented_token, refusal
from .settings import Settings

MIB = 2**20
# A refused body is read and discarded (never stored) for at most this long and at least LINGER_MIN_BYTES, twice
# the upload limit beyond: a client that sends its whole body before reading (urllib, any Connection: close
# client) then reads the 413 instead of a connection reset. Past that the connection is closed.
LINGER_SECONDS = 30.0
LINGER_MIN_BYTES = 64 * MIB
STORE_DOWN = "the job store cannot answer right now (busy or unreachable), so no key can be checked; try again shortly"
BODY_LIMIT_KEY = "x-body-limit"  # a route's openapi_extra: why its max_body_size is what it is (the 413 says it)


class RequestGate:
    """401 for a request without the key or token it needs and 403 for a key without the scope
    (`principal.refusal`), 429 past the sender's tenant's rate (`rates`), and 413 for a Content-Length over
    EARL_MAX_UPLOAD_MB (or the route's own max_body_size, with its reason), all from the headers alone; Starlette's
    own 413 for a streamed body that grows past the limit is rewritten to the same JSON. Each refusal drains the
    rest of the body (bounded) before it ends. The sender (a principal.Principal) is left in the request's state.
    """

    def __init__(self, app: ASGIApp, settings: Settings, routes: Sequence[BaseRoute] = (), *,
                 keyring: KeyRing | None = None, rates: TenantRates | None = None) -> None:
        self.app, self.settings, self.routes = app, settings, routes
        self.keyring, self.rates = keyring, rates
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
        if (refused := front.refusal(scope, self.settings)) is not None:
            await self.refuse(scope, receive, send, *refused)
            return
        needed = needed_scope(scope["method"], get_route_path(scope))
        try:
            who = NOBODY if needed is None else await self.identify(scope)
        except EarlError:
            await self.refuse(scope, receive, send, 503, STORE_DOWN, [(b"retry-after", b"5")])
            return
        scope.setdefault("state", {})["principal"] = who
        if (denied := refusal(who, needed)) is not None:
            await self.refuse(scope, receive, send, *denied, [(b"www-authenticate", b"Bearer")])
            return
        await self.within_rate(scope, receive, send, who)

    async def identify(self, scope: Scope) -> Principal:
        keys = await self.keyring.keys() if self.keyring is not None else []
        return identify(self.settings, keys, presented_token(scope["headers"]))

    async def within_rate(self, scope: Scope, receive: Receive, send: Send, who: Principal) -> None:
        """429 past the tenant's rate (keys without the admin scope), else on to the body's limit; every answer
        to such a key says what is left of its rate (X-RateLimit-*)."""
        rate = self.rates.take(who.tenant) if self.rates is not None and who.bound else None
        extra = [] if rate is None or self.rates is None else rate.headers(self.rates.rate)
        length = declared_length(scope) or 0
        if rate is not None and not rate.allowed:
            assert self.rates is not None
            wait = str(max(1, int(rate.retry_after + 0.999))).encode()
            await self.refuse(scope, receive, send, 429, f"tenant {who.tenant!r} sent more than its "
                              f"{self.rates.rate:g} requests a second (EARL_TENANT_RATE; bursts of "
                              f"{self.rates.burst}, EARL_TENANT_BURST); slow down", [*extra, (b"retry-after", wait)])
        elif length > self.smallest_route_limit and length > self.body_limit(scope)[0]:
            await self.refuse(scope, receive, send, 413, self.body_limit(scope)[1], extra)
        else:
            await self.pass_on(scope, receive, send, extra)

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

    async def pass_on(self, scope: Scope, receive: Receive, send: Send,
                      extra: list[tuple[bytes, bytes]] | None = None) -> None:
        """Run the app, with Starlette's plain-text 413 (a streamed body that grew past the limit) made ours, and
        the `extra` headers added to its answer."""
        rewriting: bytes | None = None  # our 413's body, once Starlette's 413 has started
        ended = False

        async def tracked() -> Message:  # whether the body has ended: receive() past its end waits forever
            nonlocal ended
            message = await receive()
            ended = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def rewrite(message: Message) -> None:
            nonlocal rewriting
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            if message["type"] == "http.response.start" and message["status"] == 413 and not is_quota(message):
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


def is_quota(message: Message) -> bool:
    """Whether a 413's start is a tenant's quota of bytes (errors.over_quota, which says what is left), not the
    body limit's."""
    return any(k.lower() == b"x-quota-bytes-left" for k, _ in message.get("headers", []))


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
