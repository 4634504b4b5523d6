"""Shared by the benchmarks: where the data is, what machine and commit ran, and writing JSON + markdown."""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
# x86 features that change this project's CPU step times: wide vectors for the kernels, native bf16 for --bf16.
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def default_datasets() -> Path:
    return Path(os.environ.get("EARL_DATASETS", REPO.parent / "shared" / "datasets"))


def environment() -> dict:
    import torch

    cpuinfo: dict[str, str] = {}  # the first core's entries
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            cpuinfo.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = cpuinfo.get("model name") or platform.processor()
    flags = set(cpuinfo.get("flags", "").split())
    try:
        bogomips = float(cpuinfo["bogomips"])
    except (KeyError, ValueError):
        bogomips = None
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = None
    commit, dirty = os.environ.get("EARL_BENCH_COMMIT", ""), False  # a copied tree (lent GPU) whose .git may be stale
    if not commit:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=False).stdout.strip()
        # Results files are the benchmarks' own output (a table rewrites its file after every run), not code.
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                     ":(exclude)bench/results"], cwd=REPO, capture_output=True, text=True,
                                    check=False).stdout.strip())
        commit = commit or "unknown (no git)"
    return {
        # Two machines can share a model name ("AMD EPYC") and differ twofold in step time: the vector features
        # that set the kernels' speed, and the clock (bogomips), tell them apart in every results file.
        "machine": {"cpu": cpu, "cpu_features": [f for f in CPU_FEATURES if f in flags], "bogomips": bogomips,
                    "cores": os.cpu_count(), "cores_allowed": len(os.sched_getaffinity(0)),
                    "torch_threads": torch.get_num_threads(), "memory_gib": round(mem_gb, 1) if mem_gb else None,
                    "platform": platform.platform(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                    else None},
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "commit": commit + ("-dirty" if dirty else ""),
        # Quoted so it can be pasted back into a shell: `--only "EARL dim 201"` is one argument, not three.
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # Other work on the machine skews timings: the 1/5/15-minute load averages when results were written.
        "load_average": list(os.getloadavg()),
    }


def describe_machine(machine: dict) -> str:
    """One line for `environment()["machine"]`: CPU, the vector features and clock that set step times, size."""
    features = ", ".join(machine.get("cpu_features") or []) or "no AVX2"
    clock = f", bogomips {machine['bogomips']:.0f}" if machine.get("bogomips") else ""
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ""
    cores = machine["cores"]
    if machine.get("cores_allowed", cores) != cores:  # pinned with taskset: the run had fewer cores than the box
        cores = f"{machine['cores_allowed']} of {cores}"
    return f"{machine['cpu']} ({features}{clock}), {cores} cores, {machine['memory_gib']} GiB{gpu}"


def write_results(name: str, data: dict, markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    env = environment()
    js = RESULTS / f"{name}.json"
    md = RESULTS / f"{name}.md"
    js.write_text(json.dumps({**env, **data}, indent=2, default=str) + "\n")
    footer = (f"\n\nMachine: {describe_machine(env['machine'])}; torch {env['torch']}; commit `{env['commit']}`; "
              f"{env['date']}; load average {env['load_average'][1]:.1f} (5 min).\nCommand: `{env['command']}`\n")
    md.write_text(markdown.rstrip() + footer)
    return js, md


def pyplot():
    """matplotlib.pyplot on the Agg backend (these machines have no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def widen_ylim(ax, span: float) -> None:
    """Make `ax`'s y-axis at least `span` tall, around its current centre.

    matplotlib fits the axis to the data, so two MRRs 0.0004 apart fill the plot and read as a cliff; a floor on
    the span keeps run-to-run noise looking like noise.
    """
    lo, hi = ax.get_ylim()
    if hi - lo < span:
        mid = (lo + hi) / 2
        ax.set_ylim(mid - span / 2, mid + span / 2)


def save_png(name: str, fig) -> str:
    """Write `fig` as bench/results/<name>.png and close it; returns the file name for the markdown."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    pyplot().close(fig)
    return f"{name}.png"


def md_table(headers: list[str], rows: list[list]) -> str:
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.4g}"
        return "" if x is None else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def api_server(home: Path, *, token: str = "", log: Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 120.0, tree: Path = REPO) -> Iterator[tuple[str, subprocess.Popen]]:
    """`uvicorn api.main:app` of the code in `tree` on a free 127.0.0.1 port over `home` (SQLite store); yields
    (base URL, process) once /readyz answers 200, and stops it (SIGTERM) afterwards. Its output goes to `log`."""
    import httpx

    port = free_port()
    env = {**os.environ, "EARL_HOME": str(home), "EARL_STORE": "sqlite", "EARL_API_TOKEN": token, **(env or {})}
    out = log.open("w") if log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:app", "--host", "127.0.0.1", "--port",
                             str(port), "--log-level", "warning"], cwd=tree, env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {proc.returncode} before it was ready")
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn not ready after {timeout} s")
            time.sleep(0.1)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log:
            out.close()


def rss_mib(pid: int) -> float:
    """Resident set size of a process (VmRSS in /proc/<pid>/status), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
