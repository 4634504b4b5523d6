"""GET /jobs/{id}/events: a job's state and progress as Server-Sent Events, until it ends (the console's feed).

The stream polls the store (the worker's heartbeat writes progress about once a second) and sends an event only
when the job changed; a comment line keeps idle proxies from closing it. Its lifetime is bounded: after
STREAM_SECONDS it closes and the client reconnects (EventSource, or the console's own reader, does). Once the job
has ended it sends the run's curve (history.json, thinned to CURVE_POINTS) and closes.

Hidden from the OpenAPI schema: a stream has no response model, and a schema-driven fuzzer would hold it open.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, HTTPException
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from earl_service.errors import EarlError
from earl_service.service.home import ServiceHome
from earl_service.service.records import TERMINAL, Job
from earl_service.service.store import JobStore
from earl_service.train.outputs import HISTORY

from ..deps import HomeDep, JobId, PrincipalDep, StoreDep, StreamSlotsDep
from ..limits import StreamSlots
from ..schemas import JobOut
from .jobs import visible_job

router = APIRouter(prefix="/jobs", tags=["jobs"])
POLL_SECONDS = 0.5  # the worker beats every second (WorkerConfig.heartbeat_seconds)
HEARTBEAT_SECONDS = 15.0  # a comment line at least this often
STREAM_SECONDS = 300.0  # then the stream closes; the client reconnects
RETRY_MS = 2000  # the reconnect delay a plain EventSource uses
CURVE_POINTS = 500  # a finished run's loss curve is thinned to about this many points
HISTORY_MAX_BYTES = 64 * 2**20  # a larger history.json is not sent (100k steps take ~8 MB)


class SlotStream(StreamingResponse):
    """A stream that gives its slot back when the response ends, however it ends: finished, the client gone, or
    never started."""

    def __init__(self, content: AsyncIterator[bytes], slots: StreamSlots, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slots.give_back()


def sse(event: str, data: Any) -> bytes:
    """One Server-Sent Event; `data` as JSON on one line."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def thinned(xs: list[Any], ys: list[Any], points: int = CURVE_POINTS) -> tuple[list[Any], list[Any]]:
    """Every n-th point so that about `points` remain, the last one always kept."""
    stride = max(1, -(-len(xs) // points))
    keep = list(range(0, len(xs), stride))
    if xs and keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def run_curve(home: ServiceHome, job_id: str) -> dict[str, list[Any]] | None:
    """The finished run's loss and valid-MRR curves from its history.json; None when there is none (a compress
    job, a failed or swept run) or it cannot be read."""
    path: Path = home.run_dir(job_id) / HISTORY
    try:
        if path.stat().st_size > HISTORY_MAX_BYTES:
            return None
        history = json.loads(path.read_bytes())
        steps, losses = thinned(list(history["steps"]), list(history["losses"]))
        return {"steps": steps, "losses": losses, "eval_steps": list(history["eval_steps"]),
                "eval_mrr": list(history["eval_mrr"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


async def job_events(store: JobStore, home: ServiceHome, job: Job, *, lifetime: float) -> AsyncIterator[bytes]:
    """`job` events while the job changes, a `curve` and `end` once it has ended; closes after `lifetime`."""
    yield f"retry: {RETRY_MS}\n\n".encode()
    deadline, last_beat, sent = time.monotonic() + lifetime, time.monotonic(), None
    while True:
        shown = JobOut(**job.to_dict()).model_dump()
        if shown != sent:
            yield sse("job", shown)
            sent, last_beat = shown, time.monotonic()
        if job.state in TERMINAL:
            yield sse("curve", await run_in_threadpool(run_curve, home, job.id))
            yield sse("end", {"state": job.state})
            return
        if time.monotonic() >= deadline:
            return
        if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
            yield b": heartbeat\n\n"
            last_beat = time.monotonic()
        await anyio.sleep(POLL_SECONDS)
        try:
            latest: Job | None = await run_in_threadpool(store.get_job, job.id)
        except EarlError:  # the store is busy or unreachable for a moment: ask again at the next poll
            continue
        if latest is None:  # removed meanwhile
            yield sse("end", {"state": "gone"})
            return
        job = latest


@router.get("/{job_id}/events", include_in_schema=False)
async def job_event_stream(job_id: JobId, store: StoreDep, home: HomeDep, slots: StreamSlotsDep,
                           who: PrincipalDep) -> SlotStream:
    """text/event-stream of the job: `job` (JobOut) on each change, then `curve` and `end` when it ends."""
    job = await run_in_threadpool(visible_job, store, job_id, who)  # a 404 (or the store's 503) before the stream starts
    if not slots.take():  # given back by the response, however it ends
        raise HTTPException(503, f"{slots.size} event streams are open, the most this server keeps "
                                 f"(EARL_MAX_EVENT_STREAMS); poll GET /jobs/{job_id} or try again shortly",
                            headers={"Retry-After": "10"})
    return SlotStream(job_events(store, home, job, lifetime=STREAM_SECONDS), slots, media_type="text/event-stream",
                      headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
