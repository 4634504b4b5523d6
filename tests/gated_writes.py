"""A process whose model extends stop at a gate, for the race tests: `python gated_writes.py GATE serve HOME PORT`
(uvicorn on the API) or `python gated_writes.py GATE extend HOME MODEL TRIPLES` (one ModelRegistry.extend).

Each extend touches GATE/entered-<n> when it reaches Bundle.extend (after the current bundle was read) and goes on
once GATE/go exists. `extend` first touches GATE/ready-<pid> and waits for GATE/start, so that two such processes
begin together. Every wait ends after WAIT_S, so a broken test fails instead of hanging.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

# Run as a script, sys.path[0] is tests/, whose earl_service/ (the tests' mirror, no __init__) would shadow the
# package as a namespace: the checkout comes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WAIT_S = 120.0


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def hold_extends(gate: Path) -> None:
    from earl_service.bundle.model_io import Bundle

    extend, count = Bundle.extend, itertools.count()

    def gated(self, triples_path):
        (gate / f"entered-{os.getpid()}-{next(count)}").touch()
        wait_for_file(gate / "go")
        return extend(self, triples_path)

    Bundle.extend = gated


def main(gate: Path, command: str, home: str, *args: str) -> None:
    hold_extends(gate)
    if command == "serve":
        import uvicorn

        from api.main import create_app
        from api.settings import Settings

        uvicorn.run(create_app(Settings(home=home)), host="127.0.0.1", port=int(args[0]), log_level="warning")
        return
    from earl_service.service.home import ServiceHome
    from earl_service.service.registry import ModelRegistry
    from earl_service.service.sqlite_store import SqliteStore

    service = ServiceHome(home)
    registry = ModelRegistry(service, SqliteStore(service.store_target("sqlite")))
    (gate / f"ready-{os.getpid()}").touch()
    wait_for_file(gate / "start")
    registry.extend(args[0], Path(args[1]), shown_name=Path(args[1]).name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
