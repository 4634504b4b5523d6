"""Timing and memory helpers: latency percentiles, a process's CPU time and resident memory."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall seconds of `repeats` calls of fn()."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used, user + system (utime + stime in /proc/<pid>/stat), seconds: on a shared machine
    the figure its load inflates least (wall time also counts the waits for a core)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
