"""Codebook compression: test MRR against bundle bytes for RotatE dims and EARL at fp32, fp16, int8 and pq (several
code sizes, with and without codebook fine-tuning), every export from the same trained run.

    taskset -c 1 python bench/pq.py codex-s --threads 1        # RotatE 50/100/200/500 + EARL 100, 3 min each
    python bench/pq.py fb15k-237 --threads 1                    # RotatE 50/100/200/500 + EARL 150, 20 min each
    python bench/pq.py codex-s --minutes 1 --dims 50,100        # a quick look

Writes bench/results/pq_<dataset>.{json,md,png}. Trained runs are kept under --runs and reused by a rerun (delete
them to retrain), and so are their measured exports (exports.json in the run folder, per fine-tuning setting), so a
long table can be filled piece by piece, one core each (`--dims 200 --no-earl --tag d200`; `--dims ''` for EARL
alone), and written whole by a last run over every model that only measures what is missing. Also times a faiss
IndexPQ search against exact search over the decoded table (synthetic rows, sizes up to a million) for the docs'
question whether an index over the codes would pay.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import torch
from harness import REPO, default_datasets, md_table, pyplot, save_png, write_results

from earl_service.atomic import write_json
from earl_service.bundle.codebooks import codes_for
from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.precision import ProductQuantized
from earl_service.bundle.sizes import BundleSizes, save_exact
from earl_service.compress.rungs import evaluate_bundle
from earl_service.config import ModelConfig, TrainConfig
from earl_service.config.options import train_configs_from_options
from earl_service.config.recipes import DEFAULT, RECIPES
from earl_service.data.dataset import load_dataset
from earl_service.train.finetune import FineTune, fine_tune
from earl_service.train.loop import BUNDLE, train
from earl_service.train.run import load_run

SETTINGS = {"codex-s": {"minutes": 3.0, "earl_dim": 100, "goal": (400_000, 0.38)},
            "fb15k-237": {"minutes": 20.0, "earl_dim": 150, "goal": (2_000_000, 0.300)}}
ROTATE_DIMS = (50, 100, 200, 500)
NUMBERS_PER_CODE = (2, 4, 8, 16)  # floats per code byte: pq:M with M = 2 * dim / this


def trained(ds, config: ModelConfig, train_config: TrainConfig, out: Path) -> dict:
    """Train `config` into `out` unless a run is already there; its steps and training seconds."""
    if not (out / BUNDLE).exists():
        train(ds, config, train_config, out, final_eval=False)
    metrics = json.loads((out / "metrics.json").read_text())
    return {"train_steps": metrics.get("steps"), "train_seconds": metrics.get("train_seconds")}


def exports(ds, sizes: BundleSizes, config: ModelConfig, train_config: TrainConfig, out: Path,
            ft: FineTune) -> list[dict]:
    """Every precision of one trained run: bytes (predicted, checked on the file) and test MRR; codebooks are
    fine-tuned with the run's own training settings, as a compress job does. Rows measured before with the same
    fine-tuning are read back from the run folder."""
    cache, key = out / "exports.json", f"ft{ft.steps}-{ft.seconds:g}s"
    measured = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in measured:
        measured[key] = measure_exports(ds, sizes, config, train_config, out, ft)
        write_json(cache, measured)
    return measured[key]


def measure_exports(ds, sizes: BundleSizes, config: ModelConfig, train_config: TrainConfig, out: Path,
                    ft: FineTune) -> list[dict]:
    source, run = load_bundle(out / BUNDLE), load_run(out, ds, device="cpu")
    rows = []

    def export(precision: str, tables=None, tuned: bool = False, **extra) -> None:
        expected = sizes.bytes(config.model, config.dim, precision)
        path = save_exact(source, out / f"export-{precision}{'-ft' if tuned else ''}.safetensors",
                          precision=precision, metrics={}, expected=expected, pq_tables=tables)
        test = evaluate_bundle(run, path, "test")
        rows.append({"model": config.model, "dim": config.dim, "precision": precision, "fine_tuned": tuned,
                     "bytes": expected, "test_mrr": test["mrr"], "test_hits_at_10": test["hits_at_10"], **extra})
        print(rows[-1], flush=True)

    for precision in ("fp32", "fp16", "int8"):
        export(precision)
    for per_code in NUMBERS_PER_CODE:
        m = codes_for(config.dim, per_code)
        if m is None or not sizes.pq_codes(config.model, config.dim, f"pq:{m}"):
            continue  # no table of this model pays for codebooks at this size: pq would be int8 by another name
        start = time.perf_counter()
        tables = ProductQuantized(m).encode_tables(source.config, source.params, weights=source.row_weights())
        export(f"pq:{m}", tables, numbers_per_code=per_code, encode_seconds=time.perf_counter() - start)
        tuned, info = fine_tune(run, source.params, tables, train_config, FineTune(ft.steps, ft.seconds))
        export(f"pq:{m}", tuned, tuned=True, numbers_per_code=per_code, fine_tune_steps=len(info.losses),
               fine_tune_loss=[info.losses[0], info.losses[-1]] if info.losses else None)
    return rows


def index_timing(width: int, codes: int, rows_list: tuple[int, ...], queries: int = 256, k: int = 10) -> list[dict]:
    """Seconds per query of exact L2 search over a decoded float table against faiss IndexPQ (ADC over the codes),
    synthetic rows: what serving from the codes instead of the decoded vectors would gain."""
    import faiss

    rng = np.random.default_rng(0)
    out = []
    for rows in rows_list:
        x = rng.standard_normal((rows, width), dtype=np.float32)
        q = rng.standard_normal((queries, width), dtype=np.float32)
        index = faiss.IndexPQ(width, codes, 8)
        index.train(x[: min(rows, 65536)])
        index.add(x)
        decoded = index.reconstruct_n(0, rows)
        flat = faiss.IndexFlatL2(width)
        flat.add(decoded)
        timing = {}
        for name, idx in (("exact", flat), ("indexpq", index)):
            start = time.perf_counter()
            idx.search(q, k)
            timing[name] = (time.perf_counter() - start) / queries
        _, exact_ids = flat.search(q, k)
        _, pq_ids = index.search(q, k)
        agree = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(exact_ids, pq_ids, strict=True)]))
        out.append({"rows": rows, "width": width, "codes": codes, "exact_ms": 1e3 * timing["exact"],
                    "indexpq_ms": 1e3 * timing["indexpq"], "top10_agreement": agree,
                    "decoded_bytes": rows * width * 4, "code_bytes": rows * codes})
        print(out[-1], flush=True)
    return out


def markdown(name: str, minutes: float, recipe: str, rows: list[dict], index: list[dict],
             goal: tuple[int, float]) -> str:
    budget, target = goal
    best = max((r for r in rows if r["bytes"] <= budget), key=lambda r: r["test_mrr"], default=None)
    fp32 = max((r for r in rows if r["precision"] == "fp32"), key=lambda r: r["test_mrr"])
    verdict = ("no export fits" if best is None else
               f"best export within {budget:,} bytes: {best['model']} dim {best['dim']} {best['precision']}"
               f"{' fine-tuned' if best['fine_tuned'] else ''}, {best['bytes']:,} bytes, test MRR {best['test_mrr']:.4f}"
               + (f" (goal {target}: met)" if best["test_mrr"] >= target else
                  f" (goal {target}: missed by {target - best['test_mrr']:.4f})"))
    table = md_table(["model", "dim", "train steps", "precision", "floats/code", "fine-tuned (steps)", "bytes",
                      "test MRR", "test hits@10"],
                     [[r["model"], r["dim"], r.get("train_steps"), r["precision"], r.get("numbers_per_code"),
                       f"yes ({r['fine_tune_steps']})" if r["fine_tuned"] else "", f"{r['bytes']:,}", r["test_mrr"],
                       r["test_hits_at_10"]]
                      for r in sorted(rows, key=lambda r: (r["model"], r["dim"], r["bytes"], r["fine_tuned"]))])
    idx = md_table(["rows", "width", "codes", "exact ms/query", "IndexPQ ms/query", "top-10 agreement"],
                   [[f"{r['rows']:,}", r["width"], r["codes"], r["exact_ms"], r["indexpq_ms"], r["top10_agreement"]]
                    for r in index])
    return (f"# Codebook compression (pq) on {name}\n\n"
            f"Every model trained once for {minutes:g} minutes with the {recipe} recipe (the machine line below "
            "gives the cores and the load; the step counts are what each run got), then "
            "exported at every precision from the same weights; pq exports post-hoc (faiss ProductQuantizer, "
            "codes against fp16 centroids) and again after codebook fine-tuning (codes fixed, centroids trained "
            "with the training loss). Bytes are the whole bundle file (graph, vocabularies, padded metrics), "
            "predicted before writing and checked on the file. Test MRR: filtered, seen protocol.\n\n"
            f"**{verdict}.** Highest fp32: {fp32['model']} dim {fp32['dim']}, {fp32['bytes']:,} bytes, "
            f"{fp32['test_mrr']:.4f}.\n\n{table}\n\n![test MRR against bytes](pq_{name}.png)\n\n"
            "## IndexPQ against exact search over the decoded table\n\nSynthetic Gaussian rows, L2, 256 queries, "
            f"one thread; exact = IndexFlatL2 over the decoded floats.\n\n{idx}\n")


def plot(name: str, rows: list[dict], goal: tuple[int, float]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    markers = {"fp32": "o", "fp16": "s", "int8": "^"}
    colours = {}
    for r in rows:
        key = f"{r['model']} d{r['dim']}"
        colours.setdefault(key, f"C{len(colours)}")
        marker = markers.get(r["precision"], "D" if r["fine_tuned"] else "x")
        ax.scatter(r["bytes"] / 1e6, r["test_mrr"], color=colours[key], marker=marker)
    for key, colour in colours.items():
        ax.scatter([], [], color=colour, label=key)
    for label, marker in (*markers.items(), ("pq post-hoc", "x"), ("pq fine-tuned", "D")):
        ax.scatter([], [], color="gray", marker=marker, label=label)
    ax.axvline(goal[0] / 1e6, color="red", ls="--", lw=1)
    ax.axhline(goal[1], color="red", ls=":", lw=1, label=f"goal: {goal[1]} within {goal[0] / 1e6:g} MB")
    ax.set_xscale("log")
    ax.set(xlabel="bundle file (MB, log)", ylabel="test MRR", title=f"{name}: MRR against bundle bytes")
    ax.legend(fontsize=7, loc="lower right")
    return save_png(f"pq_{name}", fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=sorted(SETTINGS))
    parser.add_argument("--minutes", type=float, help="training minutes per model (default per dataset)")
    parser.add_argument("--dims", default=",".join(map(str, ROTATE_DIMS)), help="RotatE dims ('': none)")
    parser.add_argument("--no-earl", action="store_true")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default=DEFAULT,
                        help="training settings of every model, as a compress job's (default: the default recipe)")
    parser.add_argument("--ft-steps", type=int, default=300)
    parser.add_argument("--ft-seconds", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=0, help="torch and faiss threads (0: default)")
    parser.add_argument("--index-rows", type=lambda t: tuple(int(x) for x in t.split(",")), default=None)
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_pq")
    parser.add_argument("--tag", default="", help="results under pq_<dataset>_<tag> (a partial run beside the table)")
    a = parser.parse_args()
    if a.threads:
        import faiss

        torch.set_num_threads(a.threads)
        faiss.omp_set_num_threads(a.threads)
    setting = SETTINGS[a.dataset]
    minutes = a.minutes or setting["minutes"]
    ds = load_dataset(default_datasets() / a.dataset, labels=False)  # as the committed results: bytes of weights
    sizes = BundleSizes(ds)
    configs = [ModelConfig(model="rotate", dim=int(d)) for d in a.dims.split(",") if d.strip()]
    configs += [] if a.no_earl else [ModelConfig(dim=setting["earl_dim"])]
    if not configs:
        parser.error("no model to run: --dims is empty and --no-earl is set")
    # each model kind trains (and fine-tunes) as a compress job's candidates do: the recipe's values for it
    recipe_configs = train_configs_from_options({"progress": False}, recipe=a.recipe)
    rows: list[dict] = []
    for config in configs:
        train_config = dataclasses.replace(recipe_configs[config.model], time_limit_minutes=minutes, threads=a.threads)
        out = a.runs / a.dataset / f"{config.model}-d{config.dim}-{minutes:g}min-{a.recipe}"
        training = trained(ds, config, train_config, out)
        for row in exports(ds, sizes, config, train_config, out, FineTune(a.ft_steps, a.ft_seconds)):
            rows.append({**row, **training})
    index = index_timing(200, 50, a.index_rows or (len(ds.entities), 100_000, 1_000_000))
    data = {"dataset": a.dataset, "minutes": minutes, "recipe": a.recipe, "rows": rows, "index": index,
            "goal": setting["goal"], "fine_tune": {"steps": a.ft_steps, "seconds": a.ft_seconds}}
    name = a.dataset + (f"_{a.tag}" if a.tag else "")
    plot(name, rows, setting["goal"])
    write_results(f"pq_{name}", data, markdown(name, minutes, a.recipe, rows, index, setting["goal"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
