"""EARL's reserved entities at a fixed byte budget: fewer of them buy a wider dim, more of them a narrower one.

The paper (its "Analysis of #ResEnt" at 1M and 2M parameters) found FB15k-237 gains with the dim and WN18RR with
the reserved count, and suggests adjusting both per dataset. Each row here is EARL at one reserved ratio, at the
largest dim whose int8 bundle fits the budget, trained for the same minutes with the default recipe (as compress
trains its candidates and bench/compress.py its baselines) and tested from its int8 file.

    python bench/reserved.py fb15k-237 --budget 2MB --minutes 10 --threads 1
    python bench/reserved.py wordnet-full-noinv --budget 2MB --minutes 10 --threads 1 --ratio 0.025 --ratio 0.1

Writes bench/results/reserved_<dataset>_<budget>_<minutes>min[_<tag>].{json,md,png}, rewritten after each ratio; a
rerun keeps the ratios already measured (--fresh starts over).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from compress import baseline
from harness import REPO, RESULTS, dataset_folder, environment, md_table, pyplot, save_png, write_results

from earl_service.bundle.sizes import BundleSizes
from earl_service.compress.config import parse_size
from earl_service.config import ModelConfig
from earl_service.data.dataset import load_dataset

RATIOS = (0.025, 0.05, 0.1, 0.2)


def measure(ds, ratio: float, budget: int, minutes: float, out: Path) -> dict:
    """EARL with `ratio` of its entities reserved, at the largest dim whose int8 bundle fits `budget`, trained
    `minutes` and tested from its int8 file (baseline in bench/compress.py)."""
    base = ModelConfig(model="earl", reserved_ratio=ratio)
    sizes = BundleSizes(ds, base=base)
    dim = sizes.max_dim("earl", "int8", budget)
    if dim is None:
        return {"ratio": ratio, "dim": None, "fits": False}
    row = baseline(ds, sizes, sizes.config("earl", dim), minutes, budget, out / f"r{ratio:g}", precisions=("int8",))
    reserved = sizes.untrained(sizes.config("earl", dim)).reserved
    return {"ratio": ratio, "reserved": int(len(reserved)), **row}


def markdown(rows: list[dict], title: str) -> str:
    table = md_table(["reserved ratio", "reserved entities", "dim", "int8 bytes", "steps", "test MRR", "SE"],
                     [[r["ratio"], r.get("reserved"), r.get("dim"), r.get("bytes"), r.get("steps"), r.get("test_mrr"),
                       r.get("test_se")] for r in rows])
    return f"# {title}\n\n{table}\n"


def plot(rows: list[dict], name: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    done = [r for r in rows if r.get("test_mrr") is not None]
    ax.errorbar([r["ratio"] for r in done], [r["test_mrr"] for r in done], yerr=[r.get("test_se") or 0 for r in done],
                marker="o", capsize=3)
    for r in done:
        ax.annotate(f"d{r['dim']}", (r["ratio"], r["test_mrr"]), textcoords="offset points", xytext=(4, 4))
    ax.set_xscale("log")
    ax.set_xlabel("reserved ratio (log)")
    ax.set_ylabel("test MRR (int8)")
    return save_png(name, fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--budget", default="2MB")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--ratio", type=float, action="append", help=f"reserved ratio (repeatable; default {RATIOS})")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--fresh", action="store_true", help="forget the ratios already measured")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_reserved")
    a = parser.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    name = f"reserved_{a.dataset}_{a.budget}_{a.minutes:g}min" + (f"_{a.tag}" if a.tag else "")
    previous = RESULTS / f"{name}.json"
    rows = {r["ratio"]: r for r in ([] if a.fresh or not previous.exists() else json.loads(previous.read_text())["rows"])}
    ds = load_dataset(dataset_folder(a.dataset), labels=False)
    title = f"EARL's reserved ratio at {a.budget} (int8), {a.minutes:g} minutes each: {a.dataset}"
    for ratio in a.ratio or RATIOS:
        if ratio in rows:
            continue
        rows[ratio] = {**measure(ds, ratio, parse_size(a.budget), a.minutes, a.runs / name), "commit": environment()["commit"]}
        done = sorted(rows.values(), key=lambda r: r["ratio"])
        write_results(name, {"dataset": a.dataset, "budget": a.budget, "minutes": a.minutes, "rows": done},
                      markdown(done, title) + f"\n![test MRR]({plot(done, name)})\n")
        print(rows[ratio], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
