"""Subprocesses a bench starts: `earl train` runs (several at once), and the API server on a free port, with
its memory read from /proc."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.machine import REPO

SAMPLE_S = 0.05  # child_peak's VmRSS sampling period


def train_process(args: list[str], out: Path) -> subprocess.Popen:
    """`earl train ARGS --out OUT` in its own process from the repository, its output in OUT/train.log."""
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "train.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "earl_service.cli.main", "train", *args, "--out", str(out)], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run_settings(grid: list[tuple[str, list[str]]], start, finish, *, parallel: int, done: list[dict] | None = None,
                 partial: Path | None = None) -> list[dict]:
    """Run each (label, flags) of `grid`, `parallel` at once: start(label, flags) -> (out dir, Popen); when one
    ends, finish(label, flags, out, returncode, wall seconds) -> its record. Returns `done` + the records in the
    order they finished; `partial` (JSON) holds them after each one (what a cut-off run still leaves)."""
    pending, running, done = list(grid), [], list(done or [])
    while pending or running:
        while pending and len(running) < parallel:
            label, flags = pending.pop(0)
            running.append((label, flags, *start(label, flags), time.perf_counter()))
            print(f"[{time.strftime('%H:%M:%S')}] started {label}", flush=True)
        for item in list(running):
            label, flags, out, proc, started = item
            if proc.poll() is None:
                continue
            running.remove(item)
            done.append(finish(label, flags, out, proc.returncode, time.perf_counter() - started))
            if partial is not None:
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps(done, indent=1))
            rec = done[-1]
            print(f"[{time.strftime('%H:%M:%S')}] finished {label}: rc {proc.returncode}, valid MRR "
                  f"{(rec.get('valid') or {}).get('mrr')}, test MRR {(rec.get('test') or {}).get('mrr')}", flush=True)
        time.sleep(1)
    return done


def status_kib(pid: int, key: str) -> int:
    """VmRSS, VmHWM, ... of process `pid` in KiB, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


def child_peak(command: list[str], log: Path, *, own_peak_mib: Callable[[], float] | None = None,
               env: dict[str, str] | None = None) -> dict:
    """Run `command` from the repository (`env` over this environment), its output in `log`; wall seconds and its
    whole peak RSS.

    The peak is the largest of: the kernel's count at exit (os.wait4's ru_maxrss, what `time -v` prints), the
    child's VmRSS sampled every SAMPLE_S, and `own_peak_mib()`, what the child reports itself. The kernel's count
    alone is not enough: earl's training and compress restart it to tell their phases apart
    (earl_service/memory.reset_peak_rss), so at exit it holds only the peak since the last restart."""
    t0, sampled_kib = time.perf_counter(), 0
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
                break
            with contextlib.suppress(OSError, RuntimeError):  # exiting between the two calls
                sampled_kib = max(sampled_kib, status_kib(proc.pid, "VmRSS"))
            time.sleep(SAMPLE_S)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        last = (log.read_text().strip().splitlines() or [""])[-1]
        raise RuntimeError(f"{' '.join(command[2:4])} exited with {proc.returncode}: {last} (log: {log})")
    peaks = {"exit_count": usage.ru_maxrss / 1024, "sampled": sampled_kib / 1024,
             "own": own_peak_mib() if own_peak_mib else 0.0}
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(max(peaks.values()), 1),
            "peaks_mib": {k: round(v, 1) for k, v in peaks.items()}}


def reset_peak(pid: int) -> int:
    """Reset the process's peak RSS (VmHWM) to its current RSS; returns that RSS in KiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_kib(pid, "VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> None:
    """Poll `base`/readyz until it answers 200; raise if the server exits first or `timeout` seconds pass."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn not ready after {timeout} s")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def api_server(home: Path, *, token: str = "", log: Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 120.0, tree: Path = REPO, serve: bool = False,
               ) -> Iterator[tuple[str, subprocess.Popen]]:
    """`uvicorn api.main:app` (with `serve`: `earl serve --no-worker`, as deployed, with its server settings) of
    the code in `tree` on a free 127.0.0.1 port over `home` (SQLite store); yields (base URL, process) once
    /readyz answers 200, and stops it (SIGTERM) afterwards. Its output goes to `log`."""
    port = free_port()
    env = {**os.environ, "EARL_HOME": str(home), "EARL_STORE": "sqlite", "EARL_API_TOKEN": token, **(env or {})}
    out = log.open("w") if log else subprocess.DEVNULL
    command = ["-m", "earl_service.cli.main", "serve", "--no-worker"] if serve else ["-m", "uvicorn", "api.main:app"]
    proc = subprocess.Popen([sys.executable, *command, "--host", "127.0.0.1", "--port", str(port), "--log-level",
                             "warning"], cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, timeout)
        yield base, proc
    finally:
        _stop(proc)
        if log:
            out.close()
