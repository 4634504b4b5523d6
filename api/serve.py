"""`earl serve`: the HTTP API and one training worker on one machine, until SIGINT/SIGTERM.

The `earl` command finds this subcommand through the 'earl.commands' entry point (pyproject.toml), so the library
never imports the web app. Only argparse is needed to add it; uvicorn and the app load when it runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from earl_service.cli.home import add_service_options
from earl_service.errors import ConfigError

if TYPE_CHECKING:  # pydantic loads only when `earl serve` runs
    from .settings import Settings


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the HTTP API and one training worker on this machine")
    add_service_options(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--worker-threads", type=int, default=2, help="torch threads of the worker")
    p.add_argument("--no-worker", action="store_true", help="API only (workers run elsewhere)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (warning hides the per-request access log)")
    p.add_argument("--stop-timeout", type=float, default=60.0,
                   help="seconds the worker gets to checkpoint its job on shutdown before it is killed")
    p.set_defaults(func=serve)


def serve(a: argparse.Namespace) -> int:
    import uvicorn

    from .main import create_app
    from .server import server_config
    from .settings import Settings

    settings = Settings(home=Path(a.home), store=a.store)  # the token and limits still come from EARL_*
    if a.host not in ("0.0.0.0", "::"):  # the name it binds is one it answers to (a wildcard is no name)
        settings.allowed_hosts = ",".join([settings.allowed_hosts, a.host])
    check_open_writes(a.host, settings)
    worker = None if a.no_worker else start_worker(a.home, a.store, threads=a.worker_threads)
    # uvicorn handles SIGINT/SIGTERM itself (drains requests, returns from run()), then re-raises the signal
    # into the handlers it found. Make those no-ops so that we get here, stop the worker, and exit 0.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)
    try:
        uvicorn.Server(server_config(create_app(settings), settings, host=a.host, port=a.port,
                                     log_level=a.log_level)).run()
    finally:
        if worker is not None:
            stop_worker(worker, timeout=a.stop_timeout)
    return 0


def check_open_writes(host: str, settings: Settings) -> None:
    """Refuse to serve writes without a token beyond this machine, unless EARL_ALLOW_OPEN_WRITES says so:
    anyone who can reach the port could then queue jobs, upload bundles and delete models."""
    if settings.api_token is None and not settings.allow_open_writes and not is_loopback(host):
        raise ConfigError(f"--host {host} serves beyond this machine, and without EARL_API_TOKEN anyone who can "
                          "reach it may queue jobs and delete models: set EARL_API_TOKEN, or set "
                          "EARL_ALLOW_OPEN_WRITES=true to serve open writes on purpose")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def start_worker(home: str, store: str, *, threads: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "earl_service.cli.main", "worker", "--home", home, "--store", store,
                             "--threads", str(threads)])


def stop_worker(worker: subprocess.Popen, *, timeout: float) -> None:
    """SIGTERM (the worker checkpoints and requeues its job), then SIGKILL if it takes longer than `timeout`."""
    if worker.poll() is not None:
        return
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
