"""Bounds on the work one request can start: predictions in flight, event streams open, the size of a job, a
client's queued jobs, a tenant's requests per second."""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from dataclasses import dataclass
from typing import Any

import anyio

from earl_service.errors import ConfigError
from earl_service.service.store import JobStore
from earl_service.service.tenants import Quota

from .settings import Settings


class PredictSlots:
    """At most `size` predictions computed at once. The others wait on the event loop (holding no thread, so the
    thread pool stays free for everything else) for up to `wait` seconds, then get a 503 with Retry-After."""

    def __init__(self, size: int, *, wait: float) -> None:
        self.size, self.wait = size, wait
        self._semaphore = anyio.Semaphore(size)

    async def acquire(self) -> bool:
        """True with a slot held (give it back with `release`), False when none freed up in time."""
        with anyio.move_on_after(self.wait):
            await self._semaphore.acquire()
            return True
        return False

    def release(self) -> None:
        self._semaphore.release()

    @property
    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.wait)))

    @property
    def busy(self) -> str:
        return (f"the server is computing {self.size} predictions at once (EARL_MAX_CONCURRENT_PREDICTS) and none "
                f"finished within {self.wait:g} s (EARL_PREDICT_QUEUE_SECONDS); try again shortly")


class StreamSlots:
    """At most `size` event streams open in this API process (each one polls the store). Taking a slot is the
    check and the count in one step on the event loop (no await between them): when the count grew only once a
    stream had started, 300 concurrent requests all passed the check first and 79 streams opened under a cap
    of 64."""

    def __init__(self, size: int) -> None:
        self.size, self.open = size, 0

    def take(self) -> bool:
        """True with a slot held (give it back with `give_back`), False when all are taken."""
        if self.open >= self.size:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        assert self.open > 0
        self.open -= 1


@dataclass(frozen=True)
class RateAnswer:
    """A rate check's outcome: whether the request may go on, what is left of the burst, and when to retry."""

    allowed: bool
    remaining: int
    retry_after: float

    def headers(self, rate: float) -> list[tuple[bytes, bytes]]:
        return [(b"x-ratelimit-limit", f"{rate:g}".encode()), (b"x-ratelimit-remaining", str(self.remaining).encode())]


class TenantRates:
    """A token bucket per tenant: `rate` requests a second on average, up to `burst` at once; per API process.
    Taking a token is the check and the count in one step on the event loop (no await between them), so
    concurrent requests cannot pass together. Tenants come from keys, so the buckets are as many as the keys'."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, when counted)

    def take(self, tenant: str, *, now: float | None = None) -> RateAnswer:
        now = time.monotonic() if now is None else now
        tokens, then = self._buckets.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            return RateAnswer(False, 0, (1.0 - tokens) / self.rate)
        self._buckets[tenant] = (tokens - 1.0, now)
        return RateAnswer(True, int(tokens - 1.0), 0.0)


def _over_caps(params: dict[str, Any], settings: Settings) -> list[str]:
    """Each of this server's caps that `params` exceed, with the setting that raises it."""
    caps = [("dim", params["dim"], settings.max_job_dim, "EARL_MAX_JOB_DIM"),
            ("batch_size x negatives", params["batch_size"] * params["negatives"], settings.max_batch_x_negatives,
             "EARL_MAX_BATCH_X_NEGATIVES"),
            ("nproc_per_node", params["nproc_per_node"], settings.max_nproc, "EARL_MAX_NPROC"),
            ("time_limit (minutes)", params["time_limit"], settings.max_job_minutes, "EARL_MAX_JOB_MINUTES")]
    return [f"{name} {value:,} is over {cap:,} ({setting})" for name, value, cap, setting in caps if value > cap]


def bounded_job_params(params: dict[str, Any], settings: Settings, *,
                       trained: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`params` within this server's caps (on top of the form's own limits): ConfigError (422) naming every cap
    exceeded and the setting that raises it. A job without a time limit gets EARL_MAX_JOB_MINUTES. The caps
    apply to `trained` (api/compress_jobs.trained_params: what each model kind trains with), default `params`."""
    over = list(dict.fromkeys(line for values in trained or [params] for line in _over_caps(values, settings)))
    if over:
        raise ConfigError(f"this server's job limits: {'; '.join(over)}; ask for less, or ask its operator to "
                          "raise the setting")
    return {**params, "time_limit": params["time_limit"] or settings.max_job_minutes}


def client_key(secret: bytes, settings: Settings, *, token: bytes, address: str | None,
               tenant: str | None = None) -> str:
    """Who a job belongs to, for the queue quota: its `tenant` when it came with a key (all the tenant's keys
    share one quota), else its token when the server has one, else its network address.
    A job's params are readable by anyone who may read jobs, so this is an HMAC keyed by the install's secret
    (ServiceHome.secret): a plain hash of a token could be tested against guesses offline, and one of an address
    reversed by trying the 2**32 of them."""
    if tenant is not None:
        who = f"tenant:{tenant}".encode()
    else:
        who = b"token:" + token if settings.api_token is not None else f"addr:{address}".encode()
    return hmac.new(secret, who, hashlib.sha256).hexdigest()[:16]


def unfinished_jobs(store: JobStore, client: str) -> int:
    """How many queued or running jobs `client` has: counted by the store, never by reading the job table here."""
    return store.count_unfinished(client)


def room_headers(store: JobStore, tenant: str, quota: Quota) -> dict[str, str]:
    """X-Quota-Models-Left and X-Quota-Bytes-Left: what `tenant` may still register under `quota`."""
    return {f"X-Quota-{what.capitalize()}-Left": str(left)
            for what, left in store.tenant_usage(tenant).left(quota).items()}
