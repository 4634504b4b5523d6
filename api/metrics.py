"""Prometheus text exposition, hand-written: request counts and latency histograms per route, jobs, cache."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _labels(**values: str) -> str:
    escaped = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
               for k, v in values.items())
    return "{" + ",".join(escaped) + "}"


class Metrics:
    """Counters and histograms keyed by the route template (not the raw path: bounded label values)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self.buckets: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * len(BUCKETS))
        self.sums: dict[tuple[str, str], float] = defaultdict(float)
        self.counts: dict[tuple[str, str], int] = defaultdict(int)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[method, route, str(status)] += 1
            key = (method, route)
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    self.buckets[key][i] += 1
            self.sums[key] += seconds
            self.counts[key] += 1

    def render(self, jobs: dict[str, int], models_cached: int, models_registered: int) -> str:
        lines = ["# HELP earl_http_requests_total HTTP requests by method, route template and status.",
                 "# TYPE earl_http_requests_total counter"]
        with self._lock:
            for (method, route, status), n in sorted(self.requests.items()):
                lines.append(f"earl_http_requests_total{_labels(method=method, route=route, status=status)} {n}")
            lines += ["# HELP earl_http_request_duration_seconds Request latency by method and route template.",
                      "# TYPE earl_http_request_duration_seconds histogram"]
            for (method, route), counts in sorted(self.buckets.items()):
                for bound, n in zip(BUCKETS, counts, strict=True):
                    labels = _labels(method=method, route=route, le=f"{bound:g}")
                    lines.append(f"earl_http_request_duration_seconds_bucket{labels} {n}")
                total = self.counts[method, route]
                lines.append(f"earl_http_request_duration_seconds_bucket"
                             f"{_labels(method=method, route=route, le='+Inf')} {total}")
                lines.append(f"earl_http_request_duration_seconds_sum{_labels(method=method, route=route)} "
                             f"{self.sums[method, route]:.6f}")
                lines.append(f"earl_http_request_duration_seconds_count{_labels(method=method, route=route)} {total}")
        lines += ["# HELP earl_jobs Jobs in the store by state.", "# TYPE earl_jobs gauge"]
        lines += [f"earl_jobs{_labels(state=state)} {n}" for state, n in sorted(jobs.items())]
        lines += ["# HELP earl_models_cached Link predictors held in the API's LRU cache.",
                  "# TYPE earl_models_cached gauge", f"earl_models_cached {models_cached}",
                  "# HELP earl_models_registered Models in the registry.", "# TYPE earl_models_registered gauge",
                  f"earl_models_registered {models_registered}"]
        return "\n".join(lines) + "\n"


class MetricsMiddleware:
    """Times every HTTP request and records it under its route template (`unmatched` for 404 paths)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.observe(scope["method"], route, status, time.perf_counter() - start)
