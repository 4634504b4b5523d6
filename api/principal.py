"""Who sends a request and what it may do: the principal its credentials name (a key of a tenant, the shared
token, or nobody), the scope each request needs, and the key ring that keys are looked up in.

The gate (api/gate.py) decides from the headers alone, before a body is read, and leaves the principal in the
request's state for the routes (deps.PrincipalDep): ownership filters and quotas follow from it.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio

from earl_service.service.keys import SCOPES, ApiKey, find_key
from earl_service.service.tenants import DEFAULT_TENANT

from .settings import Settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # probes answer without a token, even with EARL_PROTECT_READS
CONSOLE_PATHS = ("/", "/console/")  # the web console's page and assets (routes/console.py): no data in them
READ_POSTS = frozenset({"/predict"})  # POSTs that only read (a batch of queries)
ADMIN_PATHS = ("/keys", "/audit")  # keys and the audit log: the admin scope only
ANONYMOUS = "anonymous"
KEY_RING_SECONDS = 1.0  # a key revoked from another process (`earl keys revoke`) stops working within this


@dataclass(frozen=True)
class Principal:
    """A request's sender: `key` (a key's name, "token" for EARL_API_TOKEN, or "anonymous") of `tenant`, with
    `scopes`. An admin sees every tenant's models and jobs; the others only their tenant's."""

    tenant: str
    key: str
    scopes: frozenset[str]
    key_id: str | None = None

    @property
    def sees_all(self) -> bool:
        return "admin" in self.scopes

    @property
    def owner(self) -> str | None:
        """The tenant whose objects this principal sees (None: all of them)."""
        return None if self.sees_all else self.tenant

    @property
    def bound(self) -> bool:
        """Whether the tenant's quotas (models, bytes, rate) bind it: keys without the admin scope."""
        return self.key_id is not None and not self.sees_all


EVERYTHING = frozenset(SCOPES)
OPEN = Principal(DEFAULT_TENANT, ANONYMOUS, EVERYTHING)  # no token, no key: anyone may do anything, as before
TOKEN = Principal(DEFAULT_TENANT, "token", EVERYTHING)  # EARL_API_TOKEN: the default tenant's admin
READER = Principal(DEFAULT_TENANT, ANONYMOUS, frozenset({"read"}))  # anonymous where reads are open
NOBODY = Principal(DEFAULT_TENANT, ANONYMOUS, frozenset())


def identify(settings: Settings, keys: list[ApiKey], presented: bytes) -> Principal:
    """The principal of a request that presented the bearer token `presented` (b"" for none), given the store's
    `keys`, revoked ones included: once a key has been made the server never falls back to its open mode, even when
    every key was revoked since. A credential that matches nothing counts as none."""
    if settings.api_token is None and not keys:
        return OPEN
    if presented:
        if settings.api_token is not None and hmac.compare_digest(presented,
                                                                   settings.api_token.get_secret_value().encode()):
            return TOKEN
        if (key := find_key(keys, presented)) is not None:
            return Principal(key.tenant, key.name, key.granted, key.id)
    reads_open = settings.open_reads if keys else not settings.protect_reads
    return READER if reads_open else NOBODY


def needed_scope(method: str, path: str) -> str | None:
    """The scope a request needs: none for the probes and the console's files, admin for keys and the audit log,
    write for a write (every method but GET/HEAD/OPTIONS, and the READ_POSTS), read for the rest (the OpenAPI
    schema and the docs pages included)."""
    if path in OPEN_PATHS or is_console_path(path):
        return None
    if any(path == p or path.startswith(p + "/") for p in ADMIN_PATHS):
        return "admin"
    return "write" if is_write(method, path) else "read"


def refusal(principal: Principal, needed: str | None) -> tuple[int, str] | None:
    """401 for an anonymous request that needs a scope it lacks, 403 for a key that lacks it, else None."""
    if needed is None or needed in principal.scopes:
        return None
    if principal.key == ANONYMOUS:
        return 401, UNAUTHORIZED
    return 403, f"the key {principal.key!r} of tenant {principal.tenant!r} lacks the {needed!r} scope this request " \
                "needs; ask an admin for a key that has it"


UNAUTHORIZED = "missing or wrong API token: send 'Authorization: Bearer <token>' (EARL_API_TOKEN or a key)"


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


class KeyRing:
    """The store's keys (revoked ones too: `identify`), read again when older than `seconds` (in a thread, one reader at a time): a
    key lookup per request costs no store query, and a key revoked elsewhere stops working within `seconds`
    (one revoked through the API at once: `forget`)."""

    def __init__(self, load: Callable[[], list[ApiKey]], *, seconds: float = KEY_RING_SECONDS) -> None:
        self.load, self.seconds = load, seconds
        self._keys: list[ApiKey] = []
        self._read_at = -math.inf
        self._lock = anyio.Lock()

    async def keys(self) -> list[ApiKey]:
        if time.monotonic() - self._read_at > self.seconds:
            async with self._lock:
                if time.monotonic() - self._read_at > self.seconds:
                    self._keys = await anyio.to_thread.run_sync(self.load)
                    self._read_at = time.monotonic()
        return self._keys

    def forget(self) -> None:
        self._read_at = -math.inf


__all__ = ["ADMIN_PATHS", "NOBODY", "OPEN", "READER", "TOKEN", "UNAUTHORIZED", "KeyRing", "Principal",
           "identify", "is_console_path", "is_write", "needed_scope", "presented_token", "refusal"]
