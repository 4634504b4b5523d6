"""The HTTP server's settings, defined once: `server_config` gives the uvicorn.Config that `earl serve` (and so the
Makefile and the Docker image) runs the app with, and `DeadlineH11` gives uvicorn's h11 protocol the one limit it
lacks, a deadline for a request's headers.

uvicorn 0.54 bounds the request line and headers only through h11 (`h11_max_incomplete_event_size`; its default
httptools parser has no bound, so h11 is chosen here), closes idle keep-alive connections (`timeout_keep_alive`),
and has no header-read timeout: a connection that trickles its headers a byte at a time, or sends none, is held
for as long as the client likes (1,000 such sockets were held 60 s, none closed). The header count is checked by
api/front.py, since h11 counts none. `uvicorn api.main:app` without these options serves without them.
"""

from __future__ import annotations

import asyncio

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import Settings

REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class DeadlineH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's line and headers: `header_seconds` from the
    connection's start, or from the first byte of a later request on a kept-alive connection, however slowly
    the bytes come. Past it the server answers 408 and closes. The body has no such deadline (an upload may be
    slow); the gate and the routes bound what it may hold."""

    header_seconds = 10.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers(connected=True)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def _watch_headers(self, *, connected: bool = False) -> None:
        """Start the deadline while a request's headers are awaited (none from a new connection, or some from a
        kept-alive one), stop it once they are in."""
        awaiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        started = connected or bool(self.conn.trailing_data[0])
        if awaiting and started and self._deadline is None:
            self._deadline = self.loop.call_later(self.header_seconds, self._headers_too_slow)
        elif not awaiting:
            self._stop_deadline()

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.conn.their_state is h11.IDLE and not answering and not self.transport.is_closing():
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()


def deadline_protocol(seconds: float) -> type[DeadlineH11]:
    """DeadlineH11 with a deadline of `seconds` (uvicorn builds its protocol from the class alone)."""
    return type("DeadlineH11", (DeadlineH11,), {"header_seconds": seconds})


def server_config(app: ASGIApp, settings: Settings, *, host: str, port: int, log_level: str = "info",
                  ) -> uvicorn.Config:
    """How the API is served, from the settings (docs/security.md#settings): header bytes
    (EARL_MAX_HEADER_BYTES), the header deadline (EARL_HEADER_TIMEOUT_SECONDS), idle keep-alive
    (EARL_KEEP_ALIVE_SECONDS), and X-Forwarded-For honoured only from EARL_TRUSTED_PROXIES (uvicorn's own
    default trusts 127.0.0.1, so any local client could claim another address)."""
    proxies = settings.trusted_proxy_list
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          http=deadline_protocol(settings.header_timeout_seconds),
                          h11_max_incomplete_event_size=settings.max_header_bytes,
                          timeout_keep_alive=settings.keep_alive_seconds,
                          proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None, server_header=False)


__all__ = ["DeadlineH11", "deadline_protocol", "server_config"]
