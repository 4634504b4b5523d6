"""A lock that every process sharing the service home respects: flock on a file, removed by the holder on release."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; threads and processes wait their turn.

    The holder removes the file on release, so no lock files pile up. That is safe: a waiter that opened the old
    file gets the lock on a file `path` no longer names, sees so, and starts again on the current one.
    """
    fd = _acquire(path, blocking=True)
    assert fd is not None
    try:
        yield
    finally:
        _release(path, fd)


@contextmanager
def lock_if_free(path: Path) -> Iterator[bool]:
    """Hold the lock on `path` for the block if nobody holds it (yields True), else hold nothing (False)."""
    fd = _acquire(path, blocking=False)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            _release(path, fd)


def remove_if_unheld(path: Path) -> bool:
    """Remove a lock file that nobody holds (one left by a killed process); a held one is left alone."""
    fd = _acquire(path, blocking=False)
    if fd is None:
        return False
    _release(path, fd)
    return True


def _acquire(path: Path, *, blocking: bool) -> int | None:
    """An open descriptor holding the lock on the file `path` names now; None if not blocking and it is held."""
    mode = fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _names(path, fd):
            return fd
        os.close(fd)  # the holder before us removed it: lock the file that replaced it


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)


def _release(path: Path, fd: int) -> None:
    try:
        path.unlink(missing_ok=True)  # while still holding the lock, or a newcomer could lock the old file
    finally:
        os.close(fd)


__all__ = ["file_lock", "lock_if_free", "remove_if_unheld"]
