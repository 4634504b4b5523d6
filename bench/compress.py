"""`earl compress` against the simplest baselines given the same bytes and minutes.

One command per table; each row is a dataset, a byte budget and minutes. Every method gets the row's minutes:
the compress job for its whole search (training, validations, exports), each baseline for training. The
baselines (METHODS): RotatE and EARL each at the largest dim whose int8 bundle fits, RotatE at pq codes, and the older columns, EARL
at dim 150 and RotatE at the largest fp32 dim; plain weights as compress writes them; every method is evaluated
on the test split from its exported file.

    python bench/compress.py codex-s             # 0.5, 1, 2 MB at 10 min
    python bench/compress.py codex-s --quick     # 0.5, 1, 2 MB at 3 min
    python bench/compress.py fb15k-237           # 2, 4, 8 MB at 60 min (about 9 hours)
    python bench/compress.py wn18rr              # 4 MB at 60 min (3 hours)
    python bench/compress.py fb15k-237 --budget 2MB --method compress   # one piece of a long table
    python bench/compress.py wordnet-full-noinv --budget 2MB --minutes 10   # data/ (make wordnet-full), 10 min

Writes bench/results/compress_<dataset>[_quick][_<M>min][_nograph].{json,md,png}, rewritten after every method. A rerun keeps the
methods already measured and runs the rest, so a long table can be filled piece by piece (`--budget`,
`--method`); `--fresh` starts over. Pieces run side by side from separate checkouts each write their own file;
`--merge OTHER.json` adds the methods another file measured (each method keeps the machine and commit it ran on).
Each compress row also records its search: minutes spent and the best candidate of each model kind on the whole
valid split, read from the run folder's report.json (a merged file's run folder is the `runs/` beside it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from harness import REPO, dataset_folder, environment, md_table, pyplot, save_png, write_results

from earl_service.bundle.codebooks import default_codes
from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.precision import ProductQuantized, registered
from earl_service.bundle.sizes import BundleSizes, save_exact
from earl_service.compress.candidates import plan_candidates
from earl_service.compress.config import RESERVED_RATIO, CompressConfig, parse_size, split_ratios
from earl_service.compress.rungs import evaluate_bundle
from earl_service.compress.search import choose, compress
from earl_service.config import ModelConfig
from earl_service.config.options import train_configs_from_options
from earl_service.config.recipes import DEFAULT
from earl_service.data.dataset import load_dataset
from earl_service.train.loop import BUNDLE, train
from earl_service.train.run import load_run

TABLES = {"codex-s": (("0.5MB", "1MB", "2MB"), 10.0), "fb15k-237": (("2MB", "4MB", "8MB"), 60.0),
          "wn18rr": (("4MB",), 60.0), "wordnet-full-noinv": (("2MB", "8MB"), 30.0),
          "wordnet-full": (("2MB", "8MB"), 30.0)}
QUICK_MINUTES = 3.0
UNIFORM = tuple(p.family for p in registered() if not p.codes_tables)  # fp32, fp16, int8: best first


def baseline(ds, sizes: BundleSizes, config: ModelConfig, minutes: float, budget: int, out: Path, *,
             precisions: tuple[str, ...] = UNIFORM, graph: bool = True) -> dict:
    """Train `config` for `minutes`, export at the first of `precisions` that fits (without the graph when not
    `graph`), test it from the file."""
    precision = next((p for p in precisions if sizes.bytes(config.model, config.dim, p) <= budget), None)
    row = {"model": config.model, "dim": config.dim, "precision": precision, "graph": graph}
    if precision is None:
        return {**row, "bytes": sizes.bytes(config.model, config.dim, "int8"), "test_mrr": None, "fits": False}
    start = time.monotonic()
    # The recipe compress trains its candidates with (the default: for EARL a 3e-3 cosine schedule and bf16 where
    # native; RotatE the paper's values): a baseline must not differ from the search's candidates but in its time.
    # No validation during training (eval_every 0): the search ships its candidates' last weights and validates
    # only between rungs, and the default recipe's cadence (the whole split every 100 steps) spent most of a
    # baseline's minutes validating on FB15k-237: one pass takes ~20 s (RotatE d50) to ~55 s (d255) on one core,
    # where 100 steps take 5 s and 33 s. Until this commit the baselines trained so (bench/results tables before it).
    recipe = train_configs_from_options({"progress": False}, recipe=DEFAULT)[config.model]
    metrics = train(ds, config, replace(recipe, time_limit_minutes=minutes, eval_every=0), out, final_eval=False)
    expected = sizes.bytes(config.model, config.dim, precision)
    trained = load_bundle(out / BUNDLE)
    path = save_exact(trained if graph else trained.without_graph(), out / f"export-{precision}.safetensors",
                      precision=precision, metrics={}, expected=expected)
    test = evaluate_bundle(load_run(out, ds), path, "test")
    return {**row, "bytes": expected, "test_mrr": test["mrr"], "test_se": test["standard_error"]["mrr"], "fits": True,
            "seconds": time.monotonic() - start,
            "steps": metrics["steps"], "train_seconds": metrics["train_seconds"], "validated_during_training": False}


def compress_method(ds, minutes: float, budget: int, out: Path, known_answers: str, parallel: int = 1,
                    reserved_ratios: tuple[float, ...] = (RESERVED_RATIO,)) -> dict:
    start = time.monotonic()
    report = compress(ds, out, CompressConfig(max_bytes=budget, time_limit_minutes=minutes,
                                              known_answers=known_answers, parallel=parallel,
                                              reserved_ratios=reserved_ratios))
    assert report is not None
    pick = report["pick"]
    return {"model": pick["model"], "dim": pick["dim"], "precision": pick["precision"], "bytes": pick["bytes"],
            "candidate": pick["candidate"], "reserved_ratios": list(reserved_ratios),
            "test_mrr": report["test"]["mrr"], "fits": True, "seconds": time.monotonic() - start,
            "candidates": len(report["candidates"]), "parallel": parallel, **search_summary(report)}


def search_summary(report: dict) -> dict:
    """What a compress report says of its search: minutes spent, and each model kind's best export validated on
    the whole split (early rungs rank on a subset, not comparable), so a row shows how close the other kind came."""
    exports = report["exports"]
    best = {}
    for model in dict.fromkeys(r["model"] for r in exports if not r.get("valid_subset")):
        r = choose([r for r in exports if r["model"] == model], "mrr")  # the rule that chose the pick
        best[model] = {"dim": r["dim"], "precision": r["precision"], "bytes": r["bytes"], "valid_mrr": r["mrr"]}
    return {"search_minutes": report["spent_seconds"] / 60, "best_of_model": best}


# The baselines with the same bytes and minutes: each model at the largest dim whose int8 bundle fits (int8 buys
# four times fp32's dims for a few thousandths of MRR, bench/results/bundle_sizes.md), trained the whole time; and
# the older columns: EARL at its default dim 150, RotatE at the largest fp32 dim.
# And RotatE coded as `--precision pq` codes it (default_codes: about 4 numbers a code byte) at the largest
# dim that fits, trained the whole time and coded after (codebooks fit once, not fine-tuned): where no RotatE int8
# fits (WordNet-full at 2 MB) the simplest RotatE a user could ship.
METHODS = ("compress", "rotate_int8", "earl_int8", "earl_default", "rotate_matched", "rotate_pq")
MATCHED = {"rotate_int8": ("rotate", "int8"), "earl_int8": ("earl", "int8"), "rotate_matched": ("rotate", "fp32")}


def run_method(method: str, name: str, budget_text: str, minutes: float, root: Path,
               known_answers: str = "graph", parallel: int = 1,
               reserved_ratios: tuple[float, ...] = (RESERVED_RATIO,)) -> dict:
    # Without labels (entity labels would take 90 KB of FB15k-237's budgets): the budgets buy weights, as in the
    # committed results, which carried no entity labels.
    ds = load_dataset(dataset_folder(name), labels=False)
    budget = parse_size(budget_text)
    graphless = CompressConfig(max_bytes=budget, time_limit_minutes=1, known_answers=known_answers).graphless
    sizes = BundleSizes(ds, graphless=graphless)
    if method == "compress":
        return compress_method(ds, minutes, budget, root / "compress", known_answers, parallel, reserved_ratios)
    if method == "earl_default":
        return baseline(ds, sizes, ModelConfig(), minutes, budget, root / "earl-default")
    if method == "rotate_pq":  # the widest of the search's own RotatE pq candidates at pq's default code size
        config = CompressConfig(max_bytes=budget, time_limit_minutes=1, known_answers=known_answers,
                                models=("rotate",), precisions=("pq",))
        coded = [(c.dim, name) for c in plan_candidates(sizes, config)
                 if (name := ProductQuantized(default_codes(c.dim)).name) in c.bytes]
        if not coded:
            return {"model": "rotate", "fits": False, "test_mrr": None}
        dim, precision = max(coded)
        return baseline(ds, sizes, ModelConfig(model="rotate", dim=dim), minutes, budget, root / f"rotate-d{dim}-pq",
                        precisions=(precision,), graph="rotate" not in graphless)
    model, precision = MATCHED[method]
    dim = sizes.max_dim(model, precision, budget)
    if not dim:
        return {"model": model, "fits": False, "test_mrr": None}
    return baseline(ds, sizes, ModelConfig(model=model, dim=dim), minutes, budget, root / f"{model}-d{dim}",
                    precisions=(precision,), graph=model not in graphless)


def _cell(method: dict | None) -> str:
    if method is None:
        return "not run yet"
    if not method["fits"]:
        return "does not fit"
    name = method.get("candidate") or f"{method['model']} d{method['dim']}"  # rows before the candidate was recorded
    return f"{method['test_mrr']:.4f} ({name} {method['precision']}, {method['bytes']:,} B)"


def _best_cell(compress_row: dict | None, model: str) -> str:
    if not compress_row or "best_of_model" not in compress_row:
        return "not recorded"
    best = compress_row["best_of_model"].get(model)
    if best is None:
        return "none on the whole split"
    return f"{best['valid_mrr']:.4f} (d{best['dim']} {best['precision']}, {best['bytes']:,} B)"


def markdown(rows: list[dict], quick: bool) -> str:
    table = md_table(["dataset", "budget", "minutes", "compress pick: test MRR", "RotatE int8 matched bytes",
                      "EARL int8 matched bytes", "EARL default", "RotatE fp32 matched bytes",
                      "RotatE pq matched bytes"],
                     [[r["dataset"], r["budget"], r["minutes"], *(_cell(r.get(m)) for m in METHODS)] for r in rows])
    searches = md_table(["dataset", "budget", "search minutes", "best EARL export: valid MRR",
                         "best RotatE export: valid MRR"],
                        [[r["dataset"], r["budget"], _minutes(r.get("compress")),
                          _best_cell(r.get("compress"), "earl"), _best_cell(r.get("compress"), "rotate")] for r in rows])
    note = ("Quick mode: minutes shortened from the issue's table; timings on a shared machine are noisy, so the "
            "same command can pick differently on another run.\n\n" if quick else "")
    return ("# Compress to a byte budget vs baselines with the same time\n\n" + note + table + "\n\n"
            "Test MRR (filtered, seen protocol) of the exported file. Int8 matched bytes: the model at the largest "
            "dim whose int8 bundle fits. EARL default: dim 150, exported at the highest precision that fits. RotatE "
            "fp32 matched bytes: the largest fp32 RotatE that fits. RotatE pq matched bytes: the largest RotatE at pq's "
            "default code size (about 4 numbers a code byte) that fits, its codebooks fit once on the trained weights "
            "(not fine-tuned as the search's are). Every method gets the row's minutes (compress: "
            "the whole search; baselines: training), each baseline with the recipe compress trains its candidates with "
            "(the default; before commit 928b5f7 the baselines trained with the paper's), training the whole time and "
            "shipping its last weights (before commit bfc477b it validated the whole valid split every 100 steps "
            "inside its minutes). A table named _nograph ran with --known-answers none: compress "
            "and the RotatE baselines write RotatE bundles without the graph.\n\n"
            "Inside each compress search: the best export of each model kind validated on the whole valid split (the "
            "last rung's; earlier rungs rank on a subset), and the minutes the search spent by its own clock (exports "
            "and the pick's test evaluation included; the validation timing before the first rung only from "
            "commit ef37aa8 on).\n\n" + searches + "\n")


def _minutes(compress_row: dict | None) -> str:
    return f"{compress_row['search_minutes']:.1f}" if compress_row and "search_minutes" in compress_row else ""


def plot(rows: list[dict], name: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(METHODS)
    for i, method in enumerate(METHODS):
        xs = [j + (i - (len(METHODS) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [(r.get(method) or {}).get("test_mrr") or 0 for r in rows], width=width, label=method)
    ax.set_xticks(range(len(rows)), [f"{r['dataset']} {r['budget']}" for r in rows])
    ax.set(ylabel="test MRR (exported bundle)", title="Same minutes, same byte budget")
    ax.legend(fontsize=8)
    return save_png(name, fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=sorted(TABLES))
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MINUTES:g} minutes per method and row")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_compress")
    parser.add_argument("--budget", action="append", help="run only this row (repeatable); a budget outside the "
                                                          "dataset's table is a row of its own")
    parser.add_argument("--method", action="append", choices=METHODS, help="run only this method (repeatable)")
    parser.add_argument("--minutes", type=float, default=None, help="minutes per method and row (a table of its own)")
    parser.add_argument("--known-answers", choices=("graph", "none"), default="graph",
                        help="none: RotatE bundles (the search's and the baselines') leave the graph out")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--parallel", type=int, default=1, help="compress: candidates a rung trains at once")
    parser.add_argument("--reserved-ratios", type=split_ratios, default=(RESERVED_RATIO,),
                        help="compress: EARL's reserved shares to search, e.g. 0.1,0.4 (earl compress's option)")
    parser.add_argument("--fresh", action="store_true", help="forget the methods already measured")
    parser.add_argument("--tag", default="", help="a table of its own (compress_DATASET..._TAG): two sittings pinned "
                                                  "to one core each write apart, then --merge joins them")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="a results file of the same table whose methods this one lacks (repeatable)")
    a = parser.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    budgets, minutes = TABLES[a.dataset]
    budgets += tuple(b for b in a.budget or () if b not in budgets)
    minutes = a.minutes or (QUICK_MINUTES if a.quick else minutes)
    name = (f"compress_{a.dataset}" + ("_quick" if a.quick else "") + (f"_{a.minutes:g}min" if a.minutes else "")
            + ("_nograph" if a.known_answers == "none" else "") + (f"_{a.tag}" if a.tag else ""))
    rows = {r["budget"]: r for r in ([] if a.fresh else previous_rows(name, minutes))}
    fill_searches(rows, a.runs / name)
    if a.merge:
        merge_rows(rows, a.merge, minutes)
        done = measured(rows, budgets)
        write_results(name, {"rows": done}, markdown(done, a.quick) + f"\n![test MRR]({plot(done, name)})\n")
        return 0
    for budget in budgets:
        if a.budget and budget not in a.budget:
            continue
        row = rows.setdefault(budget, {"dataset": a.dataset, "budget": budget, "max_bytes": parse_size(budget),
                                       "minutes": minutes})
        for method in METHODS:
            if method in row or (a.budget and budget not in a.budget) or (a.method and method not in a.method):
                continue
            row[method] = run_method(method, a.dataset, budget, minutes, a.runs / name / budget, a.known_answers,
                                     a.parallel, a.reserved_ratios)
            # Each method records where it ran: pieces of one table may come from different sittings.
            env = environment()
            row[method]["environment"], row[method]["commit"] = env["machine"], env["commit"]
            done = measured(rows, budgets)
            write_results(name, {"rows": done}, markdown(done, a.quick) + f"\n![test MRR]({plot(done, name)})\n")
            print(budget, method, row[method], flush=True)
    return 0


def measured(rows: dict[str, dict], budgets: tuple[str, ...]) -> list[dict]:
    """The rows of `budgets` (in order) that hold at least one measured method: the table's other budgets are not
    shown as rows still to run."""
    return [rows[b] for b in budgets if b in rows and any(m in rows[b] for m in METHODS)]


def merge_rows(rows: dict[str, dict], files: list[Path], minutes: float) -> None:
    """Add to `rows` (by budget) the methods that `files` measured and `rows` lacks; a file of other minutes is
    refused (its rows would not be the same table)."""
    for path in files:
        other = json.loads(path.read_text()).get("rows", [])
        for r in other:
            if r.get("minutes") != minutes:
                raise SystemExit(f"{path}: row {r.get('budget')} has {r.get('minutes')} minutes, this table {minutes}")
            row = rows.setdefault(r["budget"], {k: v for k, v in r.items() if k not in METHODS})
            for method in METHODS:
                if method in r and method not in row:
                    row[method] = r[method]
        fill_searches(rows, path.resolve().parents[2] / "runs" / "bench_compress" / path.stem)


def fill_searches(rows: dict[str, dict], table_runs: Path) -> None:
    """Give compress rows measured before search_summary existed their summary, from the report.json the search
    left in its run folder (`table_runs`/BUDGET/compress), where that folder is still on disk and its pick's test
    MRR is the row's (a later search in the same folder is not the row's)."""
    for budget, row in rows.items():
        path = table_runs / budget / "compress" / "report.json"
        if "compress" not in row or "best_of_model" in row["compress"] or not path.exists():
            continue
        report = json.loads(path.read_text())
        if report.get("test") and report["test"]["mrr"] == row["compress"]["test_mrr"]:
            row["compress"].update(search_summary(report))


def previous_rows(name: str, minutes: float) -> list[dict]:
    """Rows of an earlier run of the same table (same minutes), to be completed rather than redone."""
    path = REPO / "bench" / "results" / f"{name}.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text()).get("rows", [])
    return [r for r in rows if r.get("minutes") == minutes]


if __name__ == "__main__":
    sys.exit(main())
