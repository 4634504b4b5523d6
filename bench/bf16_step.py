"""fp32 against bf16 autocast: seconds per EARL training step on this CPU, and which oneDNN kernels ran.

Paper settings (batch 1024, 256 negatives per side, full-graph encoding), `earl train` in its own process with
2 threads, median over the timed steps, for: `--compute fp32`, `--compute bf16`, and fp32 with torch, oneDNN
and MKL held to their AVX2 kernels (`--avx2`: what an AVX2-only CPU runs, measured on this one, same clock).
A short bf16 run under `ONEDNN_VERBOSE=1` then lists the matmul implementations that oneDNN chose
(`brg_matmul:avx512_core_amx` is AMX; `avx512_core_bf16` is AVX512-BF16; anything else is emulation).

    python bench/bf16_step.py                     # FB15k-237, EARL dim 150, 10 steps each
    python bench/bf16_step.py --data wn18rr       # EARL dim 200
    python bench/bf16_step.py --avx2 --tag amd    # also fp32 on AVX2 kernels; results file suffixed _amd
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, write_results
from speed import DATASETS, run_train

# The switches that keep each library to AVX2 (torch's own kernels, oneDNN, MKL's BLAS).
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def onednn_matmuls(data: Path, dim: int) -> dict[str, int]:
    """oneDNN matmul/inner-product implementations seen in 2 bf16 steps, with their counts."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "earl_service.cli.main", "train", str(data), "--out", out, "--dim", str(dim),
               "--steps", "2", "--eval-every", "0", "--no-final-eval", "--no-progress", "--threads", "2",
               "--compute", "bf16", "--device", "cpu"]
        text = subprocess.run(cmd, check=True, capture_output=True, text=True,
                              env={**os.environ, "ONEDNN_VERBOSE": "1"}).stdout
    seen: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) > 6 and parts[2] == "primitive" and parts[3] == "exec" and parts[5] in ("matmul",
                                                                                               "inner_product"):
            seen[f"{parts[5]} {parts[6]}"] += 1
        elif "isa:" in line:
            seen[line.split("isa:", 1)[1].strip()] += 0  # the ISA oneDNN detected, listed with count 0
    return dict(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--data", choices=sorted(DATASETS), default="fb15k-237")
    parser.add_argument("--steps", type=int, default=10, help="steps timed per setting")
    parser.add_argument("--avx2", action="store_true", help="also time fp32 held to AVX2 kernels")
    parser.add_argument("--tag", default="", help="suffix of the results file (a second machine's run)")
    args = parser.parse_args()
    data, dim = args.datasets / args.data, DATASETS[args.data]

    settings = [("fp32", ["--compute", "fp32"], {}), ("bf16 autocast", ["--compute", "bf16"], {})]
    settings = [(label, ["--device", "cpu", *extra], env) for label, extra, env in settings]
    if args.avx2:
        settings.append(("fp32, AVX2 kernels only", ["--device", "cpu", "--compute", "fp32"], AVX2_ONLY))
    rows = []
    for label, extra, env in settings:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            r = run_train(data, dim, args.steps, extra)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        rows.append({"setting": label, **r})
        print(f"{label:28s} {r['median_step_seconds']:.3f} s/step", flush=True)
    fp32 = rows[0]["median_step_seconds"]
    kernels = onednn_matmuls(data, dim)

    name = f"bf16_step_{args.data}" + (f"_{args.tag}" if args.tag else "")
    md = [f"# EARL step cost, fp32 against bf16 autocast: {args.data}, dim {dim}, paper settings", "",
          f"`earl train`, 2 threads, median of {args.steps} steps, no validation.", "",
          md_table(["setting", "median s/step", "speed-up vs fp32", "peak RSS MB"],
                   [[r["setting"], r["median_step_seconds"], fp32 / r["median_step_seconds"], r["peak_rss_mb"]]
                    for r in rows]), "",
          "oneDNN matmul kernels in 2 bf16 steps (`ONEDNN_VERBOSE=1`; count 0: the ISA oneDNN detected):", "",
          md_table(["implementation", "calls"], [[k, v] for k, v in kernels.items()])]
    _, mdp = write_results(name, {"dataset": args.data, "dim": dim, "steps_timed": args.steps, "settings": rows,
                                  "onednn_matmuls": kernels}, "\n".join(md))
    print(mdp.read_text())


if __name__ == "__main__":
    main()
