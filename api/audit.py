"""The audit log's writer: every write request (principal.is_write), refused or not, appended to the store's log
once it is answered: who (the key's name and tenant, from the gate), what (method, path, the job's or model's id),
when and the status. GET /audit (routes/audit.py) reads it back."""

from __future__ import annotations

import logging
import time
from functools import partial

import anyio
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from earl_service.service.audit import AuditEntry

from .principal import NOBODY, Principal, is_write

log = logging.getLogger(__name__)
TARGET = "audit_target"  # a route that makes an object names its id in the request's state under this key
PATH_TARGETS = ("job_id", "model_id", "key_id")


class AuditLog:
    """ASGI middleware outside the gate, so that the gate's refusals (401, 403, 429, 413) are logged too. The
    entry is written after the answer has gone out, in a thread; a store that cannot take it is logged, and the
    answer stands."""

    def __init__(self, app: ASGIApp, *, keep: int) -> None:
        self.app, self.keep = app, keep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_write(scope["method"], get_route_path(scope)):
            await self.app(scope, receive, send)
            return
        status = 500  # unless an answer started: the app raised

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            with anyio.CancelScope(shield=True):  # a client gone mid-answer still leaves its entry
                await self.append(scope, status)

    async def append(self, scope: Scope, status: int) -> None:
        state = scope.get("state") or {}
        who: Principal = state.get("principal", NOBODY)
        params = scope.get("path_params") or {}
        target = state.get(TARGET) or next((str(params[k]) for k in PATH_TARGETS if k in params), None)
        entry = AuditEntry(time=time.time(), tenant=who.tenant, key=who.key, key_id=who.key_id,
                           method=scope["method"], path=get_route_path(scope)[:300], target=target, status=status)
        try:
            store = scope["app"].state.store
            await anyio.to_thread.run_sync(partial(store.append_audit, entry, keep=self.keep))
        except Exception:  # noqa: BLE001 - the answer has gone out; the log must not turn it into an error
            log.exception("cannot append to the audit log: %s", entry)


__all__ = ["TARGET", "AuditLog"]
