"""This process's resident memory (now, peak, a fresh peak) and a run's record of where its memory went."""

from __future__ import annotations

import ctypes
import functools
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def current_rss_mb() -> float | None:
    """Resident memory now (Linux /proc; None elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Hand the allocator's free memory back to the system (glibc's malloc_trim, which also releases free pages
    inside the heap; nothing elsewhere). For loops whose (batch, N) temporaries are freed between small allocations
    that stay: glibc keeps the freed chunks it cannot coalesce, and the process grows a batch at a time."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def reset_peak_rss() -> bool:
    """Restart the peak-RSS count from the current RSS (Linux >= 4.0), so that the training steps' peak can
    be told apart from the graph build's. False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class MemoryUse:
    """metrics.json's "memory": the build's time and peak, the neighbour index, the kernel load, the steps' peak."""

    graph_build_seconds: float
    build_peak_rss_mb: float
    after_build_rss_mb: float | None
    index_mb: float | None  # sampled training's NeighborIndex; None for full-graph training
    kernel_load_seconds: float | None = None
    train_peak_rss_mb: float | None = None  # None where the peak could not be reset after the build

    @classmethod
    def after_build(cls, build_seconds: float, index_bytes: int | None) -> MemoryUse:
        """Measured right after the graph (or the neighbour index) was built."""
        return cls(build_seconds, peak_rss_mb(), current_rss_mb(), None if index_bytes is None else index_bytes / 2**20)


__all__ = ["MemoryUse", "current_rss_mb", "peak_rss_mb", "release_free_memory", "reset_peak_rss"]
