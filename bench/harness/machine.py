"""What every results file records about the run: the machine, the commit, the command, the date and the load."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# x86 features that change this project's CPU step times: wide vectors for the kernels, native bf16 for --bf16.
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's entries for the first core (empty where there is none)."""
    cpuinfo: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            cpuinfo.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return cpuinfo


def _machine() -> dict:
    import torch

    cpuinfo = _cpuinfo()
    flags = set(cpuinfo.get("flags", "").split())
    try:
        bogomips = float(cpuinfo["bogomips"])
    except (KeyError, ValueError):
        bogomips = None
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = None
    # Two machines can share a model name ("AMD EPYC") and differ twofold in step time: the vector features
    # that set the kernels' speed, and the clock (bogomips), tell them apart in every results file.
    return {"cpu": cpuinfo.get("model name") or platform.processor(),
            "cpu_features": [f for f in CPU_FEATURES if f in flags], "bogomips": bogomips,
            "cores": os.cpu_count(), "cores_allowed": len(os.sched_getaffinity(0)),
            "torch_threads": torch.get_num_threads(), "memory_gib": round(mem_gb, 1) if mem_gb else None,
            "platform": platform.platform(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _commit() -> str:
    commit = os.environ.get("EARL_BENCH_COMMIT", "")  # a copied tree (lent GPU) whose .git may be stale
    if commit:
        return commit
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    # Results files are the benchmarks' own output (a table rewrites its file after every run), not code.
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 ":(exclude)bench/results"], cwd=REPO, capture_output=True, text=True,
                                check=False).stdout.strip())
    return (commit or "unknown (no git)") + ("-dirty" if dirty else "")


def environment() -> dict:
    import torch

    return {
        "machine": _machine(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "commit": _commit(),
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


class LoadWatch:
    """What else used the machine during a run: the load average, and the share of CPU time the hypervisor gave
    to other guests (`steal` in /proc/stat; on a shared VM it slows a run without showing in the load)."""

    def __init__(self):
        self.load = os.getloadavg()
        self.ticks = _cpu_ticks()

    def summary(self) -> dict:
        ticks = _cpu_ticks()
        steal = None
        if self.ticks and ticks:
            delta = [b - a for a, b in zip(self.ticks, ticks, strict=True)]  # same kernel, same /proc/stat columns
            total = sum(delta[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
            steal = round(delta[7] / total, 4) if total > 0 else None
        return {"load_average_1min": {"start": round(self.load[0], 2), "end": round(os.getloadavg()[0], 2)},
                "cpu_steal_share": steal}


def _cpu_ticks() -> list[int] | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    return [int(x) for x in fields[1:]] if fields[0] == "cpu" and len(fields) > 8 else None
