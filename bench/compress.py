"""`earl compress` against two baselines given the same time: EARL at default settings, RotatE at matched bytes.

One command per table; each row is a dataset, a byte budget and minutes. Every method gets the row's minutes:
the compress job for its whole search (training, validations, exports), each baseline for training. Both
baselines are exported at the highest precision that fits the budget (fp32, else fp16, else int8), with plain
weights as compress writes them, and all three are evaluated on the test split from the exported file.

    python bench/compress.py codex-s             # 0.5, 1, 2 MB at 10 min
    python bench/compress.py codex-s --quick     # 0.5, 1, 2 MB at 3 min
    python bench/compress.py fb15k-237           # 2, 4, 8 MB at 60 min (about 9 hours)
    python bench/compress.py wn18rr              # 4 MB at 60 min (3 hours)

Writes bench/results/compress_<dataset>[_quick].{json,md,png}, rewritten after every row.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, default_datasets, md_table, pyplot, save_png, write_results

from earl_service.budget import BundleSizes, save_exact
from earl_service.bundle import load_bundle
from earl_service.bundle_format import PRECISIONS
from earl_service.compress import compress, evaluate_bundle
from earl_service.compress_config import CompressConfig, parse_size
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data import load_dataset, relation_labels
from earl_service.train import BUNDLE, load_run, train

TABLES = {"codex-s": (("0.5MB", "1MB", "2MB"), 10.0), "fb15k-237": (("2MB", "4MB", "8MB"), 60.0),
          "wn18rr": (("4MB",), 60.0)}
QUICK_MINUTES = 3.0


def baseline(ds, labels, sizes: BundleSizes, config: ModelConfig, minutes: float, budget: int, out: Path) -> dict:
    """Train `config` for `minutes`, export at the highest precision that fits, test it from the file."""
    precision = next((p for p in PRECISIONS if sizes.bytes(config.model, config.dim, p) <= budget), None)
    row = {"model": config.model, "dim": config.dim, "precision": precision}
    if precision is None:
        return {**row, "bytes": sizes.bytes(config.model, config.dim, "int8"), "test_mrr": None, "fits": False}
    start = time.monotonic()
    train(ds, config, TrainConfig(time_limit_minutes=minutes, progress=False), out, final_eval=False,
          relation_labels=labels)
    expected = sizes.bytes(config.model, config.dim, precision)
    path = save_exact(load_bundle(out / BUNDLE), out / f"export-{precision}.safetensors", precision=precision,
                      metrics={}, expected=expected)
    test = evaluate_bundle(load_run(out, ds), path, "test")
    return {**row, "bytes": expected, "test_mrr": test["mrr"], "fits": True, "seconds": time.monotonic() - start}


def run_row(name: str, budget_text: str, minutes: float, root: Path) -> dict:
    folder = default_datasets() / name
    ds, labels = load_dataset(folder), relation_labels(folder)
    budget = parse_size(budget_text)
    sizes = BundleSizes(ds, relation_labels=labels)
    start = time.monotonic()
    report = compress(ds, root / "compress", CompressConfig(max_bytes=budget, time_limit_minutes=minutes),
                      relation_labels=labels)
    assert report is not None
    pick = report["pick"]
    rotate_dim = sizes.max_dim("rotate", "fp32", budget)
    rows = {"compress": {"model": pick["model"], "dim": pick["dim"], "precision": pick["precision"],
                         "bytes": pick["bytes"], "test_mrr": report["test"]["mrr"], "fits": True,
                         "seconds": time.monotonic() - start, "candidates": len(report["candidates"])},
            "earl_default": baseline(ds, labels, sizes, ModelConfig(), minutes, budget, root / "earl-default"),
            "rotate_matched": (baseline(ds, labels, sizes, ModelConfig(model="rotate", dim=rotate_dim), minutes,
                                        budget, root / f"rotate-d{rotate_dim}") if rotate_dim else
                               {"model": "rotate", "fits": False, "test_mrr": None})}
    return {"dataset": name, "budget": budget_text, "max_bytes": budget, "minutes": minutes, **rows}


def _cell(method: dict) -> str:
    if not method["fits"]:
        return "does not fit"
    return f"{method['test_mrr']:.4f} ({method['model']} d{method['dim']} {method['precision']}, {method['bytes']:,} B)"


def markdown(rows: list[dict], quick: bool) -> str:
    table = md_table(["dataset", "budget", "minutes", "compress pick: test MRR", "EARL default", "RotatE matched bytes"],
                     [[r["dataset"], r["budget"], r["minutes"], _cell(r["compress"]), _cell(r["earl_default"]),
                       _cell(r["rotate_matched"])] for r in rows])
    note = ("Quick mode: minutes shortened from the issue's table; timings on a shared machine are noisy, so the "
            "same command can pick differently on another run.\n\n" if quick else "")
    return ("# Compress to a byte budget vs baselines with the same time\n\n" + note + table + "\n\n"
            "Test MRR (filtered, seen protocol) of the exported file. EARL default: dim 150, exported at the highest "
            "precision that fits. RotatE matched bytes: the largest fp32 RotatE that fits. Every method gets the "
            "row's minutes (compress: the whole search; baselines: training).\n")


def plot(rows: list[dict], name: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    methods = ("compress", "earl_default", "rotate_matched")
    for i, method in enumerate(methods):
        xs = [j + (i - 1) * 0.27 for j in range(len(rows))]
        ax.bar(xs, [r[method]["test_mrr"] or 0 for r in rows], width=0.27, label=method)
    ax.set_xticks(range(len(rows)), [f"{r['dataset']} {r['budget']}" for r in rows])
    ax.set(ylabel="test MRR (exported bundle)", title="Same minutes, same byte budget")
    ax.legend(fontsize=8)
    return save_png(name, fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=sorted(TABLES))
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MINUTES:g} minutes per method and row")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_compress")
    a = parser.parse_args()
    budgets, minutes = TABLES[a.dataset]
    minutes = QUICK_MINUTES if a.quick else minutes
    name = f"compress_{a.dataset}" + ("_quick" if a.quick else "")
    rows = []
    for budget in budgets:
        rows.append(run_row(a.dataset, budget, minutes, a.runs / name / budget))
        write_results(name, {"rows": rows}, markdown(rows, a.quick) + f"\n![test MRR]({plot(rows, name)})\n")
        print(rows[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
