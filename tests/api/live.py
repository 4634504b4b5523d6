"""A real uvicorn on 127.0.0.1 in a thread of the test process (so a test can hold a route with a hook), and a
raw HTTP/1.1 reader for tests that must see exactly what goes over the socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from conftest import free_port
from starlette.types import ASGIApp

from api.server import server_config
from api.settings import Settings


@contextmanager
def live(app: ASGIApp, *, start_timeout: float = 60.0, settings: Settings | None = None) -> Iterator[str]:
    """`app` served by uvicorn on a free port until the block ends; yields its base URL. With `settings`, served
    as `earl serve` serves it (api/server.py: header limits and deadline, keep-alive, trusted proxies)."""
    if settings is None:
        config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                timeout_graceful_shutdown=5)
    else:
        config = server_config(app, settings, host="127.0.0.1", port=free_port(), log_level="warning")
        config.timeout_graceful_shutdown = 5
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert thread.is_alive(), "uvicorn exited while starting"
        assert time.monotonic() < deadline, f"uvicorn did not start within {start_timeout} s"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the body"
        body += chunk
    return int(status_line.split()[1]), headers, body
