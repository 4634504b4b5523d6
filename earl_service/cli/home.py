"""The service home's options, --home and --store, shared by `earl worker`, `earl keys` and `earl serve`: the
command line is the service's edge, so EARL_HOME and EARL_STORE give their defaults, as for the API."""

from __future__ import annotations

import argparse
import os


def add_service_options(p: argparse.ArgumentParser) -> None:
    """--home and --store, shared by `earl worker` and `earl serve`."""
    p.add_argument("--home", default=os.environ.get("EARL_HOME", "artifacts"),
                   help="service home: uploads/, runs/, models/, earl.sqlite3 (default $EARL_HOME or ./artifacts)")
    p.add_argument("--store", default=os.environ.get("EARL_STORE", "sqlite"),
                   help="'sqlite' (HOME/earl.sqlite3), a SQLite path or a redis:// URL (default $EARL_STORE or sqlite)")


__all__ = ["add_service_options"]
