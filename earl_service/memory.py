"""This process's memory: resident now and at its peak (restartable), and handing the allocator's free memory back
to the system (glibc's malloc_trim) where a loop's freed temporaries would otherwise stay with the process."""

from __future__ import annotations

import ctypes
import functools
import os
import resource
from collections.abc import Callable
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


class GrowthGuard:
    """Hands the allocator's free memory back (release_free_memory) when the process has grown by more than
    `slack_mb` since the guard was made: `check()` after each batch of a loop that frees large temporaries. Cheaper
    than a trim every batch (which faults the pages in again: 12% of a ranking pass's time)."""

    def __init__(self, slack_mb: float) -> None:
        self.baseline, self.slack_mb = current_rss_mb(), slack_mb

    def check(self) -> None:
        now = current_rss_mb()
        if now is not None and self.baseline is not None and now - self.baseline > self.slack_mb:
            release_free_memory()


def reset_peak_rss() -> bool:
    """Restart the peak-RSS count from the current RSS (Linux >= 4.0), so that the training steps' peak can
    be told apart from the graph build's. False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


__all__ = ["GrowthGuard", "current_rss_mb", "peak_rss_mb", "release_free_memory", "reset_peak_rss"]
