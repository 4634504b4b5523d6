"""A run's record of where its memory went (the process's memory itself: earl_service/memory.py)."""

from __future__ import annotations

from dataclasses import dataclass

from earl_service.memory import current_rss_mb, peak_rss_mb, reset_peak_rss


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

    def restart_peak(self) -> bool:
        """Fold the peak so far into the build's (what ran after the build too: a checkpoint's restore, the
        optimizer, the kernel's load), then restart the count for the steps' own; False where it cannot restart."""
        self.build_peak_rss_mb = max(self.build_peak_rss_mb, peak_rss_mb())
        return reset_peak_rss()


__all__ = ["MemoryUse"]
