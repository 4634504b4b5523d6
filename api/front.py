"""The front's rules on a request's headers, before any route (the gate, api/gate.py, applies them): how many
header fields it may carry, which Host it may name, and where a write may come from. Each rule returns the
refusal (status, reason) or None. And the headers every response carries (SecurityHeaders). The server-level
limits (header bytes and deadline, proxies) are api/server.py's.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .principal import is_write
from .settings import Settings

Refusal = tuple[int, str]
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})  # always answered: this machine by name or address
ANY = "*"


def refusal(scope: Scope, settings: Settings) -> Refusal | None:
    """The first of the front's rules that refuses the request, or None."""
    headers = Headers(scope=scope)
    return too_many_headers(scope, settings) or foreign_host(scope, headers, settings) or \
        foreign_write(scope, headers, settings)


def too_many_headers(scope: Scope, settings: Settings) -> Refusal | None:
    """431 past EARL_MAX_HEADERS fields: h11 bounds the bytes of the headers (EARL_MAX_HEADER_BYTES), not their
    number, and 100,000 tiny ones were accepted."""
    count = len(scope["headers"])
    if count <= settings.max_headers:
        return None
    return 431, f"the request has {count:,} header fields, more than the {settings.max_headers} this server takes " \
                "(EARL_MAX_HEADERS)"


def host_name(authority: str) -> str:
    """The host of a Host header or an origin's authority, without its port or an IPv6 address's brackets."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0].lower()
    return authority.rpartition(":")[0].lower() if authority.count(":") == 1 else authority.lower()


def foreign_host(scope: Scope, headers: Headers, settings: Settings) -> Refusal | None:
    """400 for a Host this server does not answer to: a page whose name was made to resolve to this machine (DNS
    rebinding) could otherwise read and write through the visitor's browser. Answered: localhost, 127.0.0.1, ::1,
    the address the connection came in on (the bind address, or the interface of a 0.0.0.0 bind), `earl serve
    --host` and EARL_ALLOWED_HOSTS (* for any, behind a proxy that checks it). A request without Host (HTTP/1.0)
    passes: browsers always send one."""
    if "host" not in headers or ANY in settings.allowed_host_list:
        return None
    host = host_name(headers["host"])
    server = scope.get("server") or ("", None)
    if host in LOCAL_HOSTS or host == _normal(server[0]) or host in settings.allowed_host_list:
        return None
    return 400, f"this server does not answer to the host {headers['host'][:100]!r}; use its address, or add the " \
                "name to EARL_ALLOWED_HOSTS"


def _normal(host: str | None) -> str:
    try:
        return str(ipaddress.ip_address(host or ""))
    except ValueError:
        return (host or "").lower()


def foreign_write(scope: Scope, headers: Headers, settings: Settings) -> Refusal | None:
    """403 for a write that a browser sent from another origin: without a token, any page the visitor opened could
    queue, cancel and delete (a no-cors fetch or a form needs no CORS answer to be sent). Browsers name the origin
    of every POST, PUT, PATCH and DELETE (Origin, and Sec-Fetch-Site); it must be this server's own (its Host) or
    one of EARL_ALLOWED_ORIGINS. Clients that send neither (curl, earl_client) are not browsers and pass."""
    if not is_write(scope["method"], get_route_path(scope)):
        return None
    origin = headers.get("origin")
    if origin is None:
        site = headers.get("sec-fetch-site", "same-origin")
        return None if site in ("same-origin", "none") else (403, f"a {site} write is refused: writes come from this "
                                                                  "server's own pages or from non-browser clients")
    if origin in settings.allowed_origin_list or urlsplit(origin).netloc.lower() == headers.get("host", "").lower():
        return None
    return 403, f"a write from the origin {origin[:100]!r} is refused: writes come from this server's own pages " \
                "(or EARL_ALLOWED_ORIGINS) or from non-browser clients"




# ---------------------------------------------------------------- on every response

# The console's pages and the API's answers: scripts, styles and data only from this origin, no inline script
# (the console has none), images also from data: (its icon) and blob: (a fetched plot); never framed.
CSP = ("default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = ((b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer"))


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response (refusals, errors and static files too) unless the response set
    that header itself (the docs page sets its own policy): the model view with its Delete button loaded in a
    cross-origin iframe."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in SECURITY_HEADERS if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


__all__ = ["CSP", "LOCAL_HOSTS", "SECURITY_HEADERS", "Refusal", "SecurityHeaders", "foreign_host", "foreign_write",
           "host_name", "refusal", "too_many_headers"]
