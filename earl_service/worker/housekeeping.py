"""Housekeeping of the service home: removing what deletes and sweeps leave behind."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)


def remove(path: Path) -> None:
    """Remove a file or a folder if present; a failure is logged, not raised, so a sweep or a delete goes on."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("cannot remove %s: %s", path, exc)


__all__ = ["remove"]
