"""Housekeeping of the service home: staging files that a crash left, and runs and uploads past their retention."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from earl_service.service.home import ServiceHome
from earl_service.service.locks import remove_if_unheld
from earl_service.service.records import TERMINAL
from earl_service.service.store import JobStore

log = logging.getLogger(__name__)

# A staging file older than this has no live writer: an upload is checked, and a bundle exported or verified, well
# within it; a slower writer would only see its own request fail, never a bundle damaged.
STALE_AFTER_S = 15 * 60.0
DAY_S = 86_400.0


def sweep(home: ServiceHome, store: JobStore, *, keep_days: float, now: float | None = None) -> list[Path]:
    """Both sweeps below; returns what was removed."""
    return sweep_staging(home, now=now) + expire_runs(home, store, keep_days=keep_days, now=now)


def sweep_staging(home: ServiceHome, *, older_than: float = STALE_AFTER_S, now: float | None = None) -> list[Path]:
    """Remove staging files last modified more than `older_than` seconds ago, and lock files that nobody holds.

    By age rather than all at start: another API process or a worker sharing the home may be writing one now.
    """
    cutoff = (time.time() if now is None else now) - older_than
    removed = []
    for path in staging_files(home):
        try:
            stale = path.lstat().st_mtime < cutoff
        except FileNotFoundError:  # its writer finished meanwhile
            continue
        if stale:
            remove(path)
            removed.append(path)
    for lock in home.models.glob(".*.lock"):
        remove_if_unheld(lock)
    if removed:
        log.info("removed %d stale staging file(s): %s", len(removed), ", ".join(map(home.relative, removed)))
    return removed


def staging_files(home: ServiceHome) -> Iterator[Path]:
    """Hidden names ending in .tmp anywhere under uploads/, runs/ and models/ (atomic writes, set-aside deletes),
    and every hidden entry at the top of uploads/ (an upload while it is checked keeps its own suffix)."""
    for top in (home.uploads, home.runs, home.models):
        for folder, dirs, files in os.walk(top):
            at_uploads = Path(folder) == home.uploads
            for name in [*dirs, *files]:
                if name.startswith(".") and (at_uploads or name.endswith(".tmp")):
                    yield Path(folder) / name
            dirs[:] = [d for d in dirs if not d.startswith(".")]


def expire_runs(home: ServiceHome, store: JobStore, *, keep_days: float, now: float | None = None) -> list[Path]:
    """Remove runs/<job>/ and uploads/<job>/ of jobs that ended (succeeded, failed or cancelled) more than
    `keep_days` days ago; 0 keeps them all. The jobs' records and models stay.

    A folder whose job the store does not know is left alone: it may belong to another store on this home.
    """
    if keep_days <= 0:
        return []
    cutoff = (time.time() if now is None else now) - keep_days * DAY_S
    removed = []
    for name in job_names(home):
        job = store.get_job(name)
        if job is not None and job.state in TERMINAL and job.finished is not None and job.finished < cutoff:
            folders = [f for f in (home.run_dir(name), home.upload_dir(name)) if f.is_dir()]
            for folder in folders:
                remove(folder)
            removed += folders
    if removed:
        log.info("removed %d run and upload folder(s) of jobs that ended over %g days ago", len(removed), keep_days)
    return removed


def job_names(home: ServiceHome) -> list[str]:
    """The job ids that have a folder in uploads/ or runs/ (or both), each once: one store lookup per job."""
    tops = [home.uploads, home.runs]
    return sorted({p.name for top in tops if top.is_dir() for p in top.iterdir()
                   if p.is_dir() and not p.name.startswith(".")})


def remove(path: Path) -> None:
    """Remove a file or a folder if present; a failure is logged, not raised, so a sweep or a delete goes on."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("cannot remove %s: %s", path, exc)


__all__ = ["DAY_S", "STALE_AFTER_S", "expire_runs", "remove", "sweep", "sweep_staging"]
