"""Atomic file writes: a reader sees the old file or the complete new one, never a partial write."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one os.replace, on error it is removed.

    The temporary name is hidden (leading dot), unique per call (concurrent writers never share one) and in the
    same directory, so the rename stays on one file system and is atomic. `fsync`: flush the temporary file's
    data to disk before the rename, so that a power loss cannot leave `path` naming an empty or partial file.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        if fsync:
            _sync(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _sync(path: Path) -> None:
    """fsync a closed file: the call flushes the file (its inode), whichever descriptor names it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> Path:
    with replacing(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """`obj` as indented JSON (values JSON does not know are written with str())."""
    return write_bytes(path, json.dumps(obj, indent=2, default=str).encode())


__all__ = ["replacing", "write_bytes", "write_json"]
