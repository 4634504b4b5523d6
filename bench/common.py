"""Shared by the benchmarks: where the data is, what machine and commit ran, and writing JSON + markdown."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def default_datasets() -> Path:
    return Path(os.environ.get("EARL_DATASETS", REPO.parent / "shared" / "datasets"))


def environment() -> dict:
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = None
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True).stdout.strip())
    return {
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gb, 1) if mem_gb else None,
                    "platform": platform.platform(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                    else None},
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "commit": commit + ("-dirty" if dirty else ""),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_results(name: str, data: dict, markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    env = environment()
    js = RESULTS / f"{name}.json"
    md = RESULTS / f"{name}.md"
    js.write_text(json.dumps({**env, **data}, indent=2, default=str) + "\n")
    machine = env["machine"]
    footer = (f"\n\nMachine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB"
              f"{', GPU ' + machine['gpu'] if machine['gpu'] else ''}; torch {env['torch']}; commit `{env['commit']}`; "
              f"{env['date']}.\nCommand: `{env['command']}`\n")
    md.write_text(markdown.rstrip() + footer)
    return js, md


def md_table(headers: list[str], rows: list[list]) -> str:
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.4g}"
        return "" if x is None else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)
