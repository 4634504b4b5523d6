"""Housekeeping of the service home: staging files and unrecorded model versions that a crash left, and runs and
uploads past their retention."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from earl_service.service.home import ServiceHome
from earl_service.service.locks import lock_if_free, remove_if_unheld
from earl_service.service.records import TERMINAL
from earl_service.service.store import JobStore

log = logging.getLogger(__name__)

# A staging file older than this has no live writer: an upload is checked, and a bundle exported or verified, well
# within it; a slower writer would only see its own request fail, never a bundle damaged.
STALE_AFTER_S = 15 * 60.0
DAY_S = 86_400.0


def sweep(home: ServiceHome, store: JobStore, *, keep_days: float, now: float | None = None) -> list[Path]:
    """The sweeps below; returns what was removed."""
    return (sweep_staging(home, now=now) + sweep_unrecorded(home, store) + sweep_cancelled_uploads(home, store)
            + expire_runs(home, store, keep_days=keep_days, now=now))


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


def sweep_unrecorded(home: ServiceHome, store: JobStore) -> list[Path]:
    """Remove the model versions that a publish moved into models/ but never recorded: a process killed between
    the move and the store's record leaves the version's pending marker (ServiceHome.pending_path) beside it. A
    model whose lock is held has a publish in flight and is left alone; a version the record names was recorded
    after all, and only its marker goes. A model without a record and without versions left goes whole (a
    compress job's report with it). Folders without a marker are never touched: another store may own them."""
    removed = []
    for marker in home.models.glob("*/.v*.pending"):
        model_id, number = marker.parent.name, home.pending_version(marker)
        with lock_if_free(home.lock_path(model_id)) as free:
            if not free or number is None:
                continue
            record = store.get_model(model_id)
            recorded = 0 if record is None else home.version_of(model_id, record.path) or 1
            version = home.version_path(model_id, number)
            if number > recorded and version.exists():
                remove(version)
                removed.append(version)
            marker.unlink(missing_ok=True)
            folder = home.model_dir(model_id)
            if record is None and not any(folder.glob("v*.safetensors")):
                remove(folder)
                removed.append(folder)
    if removed:
        log.warning("removed %d unrecorded model version(s) a crash left: %s", len(removed),
                    ", ".join(map(home.relative, removed)))
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


def sweep_cancelled_uploads(home: ServiceHome, store: JobStore) -> list[Path]:
    """Remove uploads/<job>/ of cancelled jobs at any age: the cancel route and the worker remove them at once,
    this catches a process that died in between. Their runs stay for the retention days (a curve to look at)."""
    removed = []
    for name in job_names(home):
        folder = home.upload_dir(name)
        if folder.is_dir() and (job := store.get_job(name)) is not None and job.state == "cancelled":
            remove(folder)
            removed.append(folder)
    if removed:
        log.info("removed the uploads of %d cancelled job(s)", len(removed))
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


__all__ = ["DAY_S", "STALE_AFTER_S", "expire_runs", "remove", "sweep", "sweep_cancelled_uploads", "sweep_staging",
           "sweep_unrecorded"]
