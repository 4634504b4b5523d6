"""The front's rules on a request's headers, before any route (the gate, api/gate.py, applies them): how many
header fields it may carry. Each rule returns the refusal (status, reason) or None."""

from __future__ import annotations

from starlette.types import Scope

from .settings import Settings

Refusal = tuple[int, str]


def refusal(scope: Scope, settings: Settings) -> Refusal | None:
    """The first of the front's rules that refuses the request, or None."""
    return too_many_headers(scope, settings)


def too_many_headers(scope: Scope, settings: Settings) -> Refusal | None:
    """431 past EARL_MAX_HEADERS fields: h11 bounds the bytes of the headers (EARL_MAX_HEADER_BYTES), not their
    number, and 100,000 tiny ones were accepted."""
    count = len(scope["headers"])
    if count <= settings.max_headers:
        return None
    return 431, f"the request has {count:,} header fields, more than the {settings.max_headers} this server takes " \
                "(EARL_MAX_HEADERS)"


__all__ = ["Refusal", "refusal", "too_many_headers"]
