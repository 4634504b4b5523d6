"""Bounds on the work one request can start: predictions in flight."""

from __future__ import annotations

import math

import anyio


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
