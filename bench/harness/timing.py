"""Timing and memory helpers: latency percentiles, a process's resident memory."""

from __future__ import annotations

import statistics
from pathlib import Path


def percentiles(ms: list[float]) -> dict[str, float]:
    """Median, p95 and p99 of latencies in milliseconds (nearest lower rank), rounded to the microsecond."""
    ms = sorted(ms)
    return {"p50_ms": round(statistics.median(ms), 3), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3),
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 3)}


def rss_mib(pid: int) -> float:
    """Resident set size of a process (VmRSS in /proc/<pid>/status), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
