"""bench/results/cuda_image.{json,md}: what `make cuda-image` (docker/cuda_image.sh) built and what its smoke test saw.

Standard library only: it runs with the host's python3, without the project's venv.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def machine() -> dict[str, Any]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return {"host": platform.node(), "cpu": model, "flags": [f for f in FLAGS if f in flags],
            "docker": sh("docker", "version", "-f", "{{.Server.Version}}")}


def layers(image: str, top: int = 6) -> list[dict[str, Any]]:
    """The image's biggest layers: bytes and the Dockerfile step that made each."""
    rows = []
    for line in sh("docker", "history", "--no-trunc", "--format", "{{json .}}", image).splitlines():
        row = json.loads(line)
        rows.append({"bytes": parse_size(row["Size"]), "step": row["CreatedBy"][-160:]})
    return sorted(rows, key=lambda r: -r["bytes"])[:top]


def parse_size(text: str) -> int:
    """docker history's sizes ('5.32GB', '12.3kB', '0B') as bytes (decimal units, as docker prints them)."""
    units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * units[unit])
    return 0


def smoke(path: Path) -> dict[str, Any]:
    """The imports' JSON line and the training's last lines from the smoke log."""
    lines = path.read_text().splitlines()
    imports = next(json.loads(line[len("SMOKE "):]) for line in lines if line.startswith("SMOKE "))
    bundle = next((line for line in lines if line.rstrip().endswith("bundle.safetensors")), "")
    return {"imports": imports, "bundle_written": bool(bundle), "bundle_line": bundle.strip(),
            "train_tail": [line for line in lines if line and not line.startswith("SMOKE ")][-8:]}


def write(results: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    s, imports = results["smoke"], results["smoke"]["imports"]
    m = results["machine"]
    text = "\n".join([
        "# make cuda-image", "",
        f"Commit {results['commit']}, {results['date']}, on {m['cpu']} ({', '.join(m['flags'])}), docker {m['docker']}, "
        f"no GPU; `{results['command']}`.", "",
        f"Image `{results['image']}`: **{results['image_bytes'] / 1e9:.2f} GB** (its Debian base "
        f"`{results['base']}` {results['base_bytes'] / 1e6:.0f} MB).", "",
        "| step | seconds |", "|---|---|", *[f"| {k} | {v} |" for k, v in results["seconds"].items()], "",
        "| biggest layers | bytes |", "|---|---|",
        *[f"| `{row['step'].replace('|', '/')}` | {row['bytes'] / 1e6:,.0f} MB |" for row in results["layers"]], "",
        f"Inside the image (`--network none`, no GPU): torch {imports['torch']} built for CUDA {imports['torch_cuda']} "
        f"(cuDNN {imports['cudnn']}), FAISS {imports['faiss']} with its GPU classes: {imports['faiss_gpu_classes']}; "
        f"CUDA available: {imports['cuda_available']} (no GPU here); the prebuilt C++ kernel loads: {imports['kernel']}.",
        "", f"`earl train --device cpu` (CoDEx-S, 30 steps, dim 32) wrote its bundle: {s['bundle_written']} "
        f"(`{s['bundle_line']}`). Its last lines:", "", *[f"    {line}" for line in s["train_tail"]]])
    out.with_suffix(".md").write_text(text + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--smoke", type=Path, required=True, help="the smoke test's log")
    parser.add_argument("--steps", nargs="*", default=[], help="NAME=SECONDS of each step of the build")
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    results = {"commit": sh("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": "make cuda-image",
               "machine": machine(), "image": a.image, "base": a.base,
               "image_bytes": int(sh("docker", "image", "inspect", "-f", "{{.Size}}", a.image)),
               "base_bytes": int(sh("docker", "image", "inspect", "-f", "{{.Size}}", a.base)),
               "seconds": {k: int(v) for k, v in (step.split("=", 1) for step in a.steps)},
               "layers": layers(a.image), "smoke": smoke(a.smoke)}
    imports = results["smoke"]["imports"]
    if not (results["smoke"]["bundle_written"] and imports["kernel"] and imports["torch_cuda"]
            and imports["faiss_gpu_classes"]):
        raise SystemExit(f"the smoke test failed: {results['smoke']}")
    write(results, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
