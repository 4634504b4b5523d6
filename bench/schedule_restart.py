"""What a compress survivor's restarts cost: one model trained for the same seconds either under one decaying
schedule (a baseline trained alone) or in slices that each decay and warm up again (compress's rungs:
rungs.train_slice), continuing the same weights. Both arms use the recipe compress trains candidates with.

    python bench/schedule_restart.py fb15k-237 --model rotate --dim 255 --slices 300,600 --threads 1 --tag s15
    # or one arm per core, then the table from both:
    taskset -c 0 python bench/schedule_restart.py ... --arm single &
    taskset -c 1 python bench/schedule_restart.py ... --arm restart; python bench/schedule_restart.py ... --arm none

Each arm's last weights are ranked on the whole valid and test splits (fp32, filtered, seen protocol). An arm's
result is kept under runs/schedule_restart/<dataset>_<tag>/<arm>/result.json; the table reads every arm there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compress import dataset_folder
from harness import md_table, write_results

from earl_service.config import ModelConfig
from earl_service.config.options import train_configs_from_options
from earl_service.config.recipes import DEFAULT
from earl_service.data.dataset import load_dataset
from earl_service.train.loop import train

ARMS = ("single", "restart")


def run_arm(ds, model: ModelConfig, slices: list[float], out: Path, seed: int) -> dict:
    """Train `model` over `slices` (seconds each), each slice's rate decaying over the slice alone, continuing the
    checkpoint, as rungs.train_slice does; the last weights ranked on valid and test."""
    recipe = train_configs_from_options({"progress": False}, recipe=DEFAULT)[model.model]
    trained, metrics, started = 0.0, {}, time.monotonic()
    for index, seconds in enumerate(slices):
        config = replace(recipe, time_limit_minutes=(trained + seconds) / 60, schedule_minutes=seconds / 60,
                         schedule_start_minutes=trained / 60, seed=seed, eval_every=0)
        metrics = train(ds, model, config, out, resume=index > 0, final_eval=index == len(slices) - 1,
                        write_bundle=False, curves=False)
        trained = metrics["train_seconds"]
    summary = {split: {k: metrics[split][k] for k in ("mrr", "hits_at_10", "standard_error") if k in metrics[split]}
               for split in ("valid", "test")}
    return {"slices": slices, "steps": metrics["steps"], "train_seconds": trained,
            "wall_seconds": time.monotonic() - started, **summary}


def markdown(args, results: dict[str, dict]) -> str:
    rows = []
    for arm, r in results.items():
        se = r["test"].get("standard_error", {}).get("mrr")
        rows.append([arm, " + ".join(f"{s:g}" for s in r["slices"]), r["steps"], round(r["train_seconds"]),
                     round(r["valid"]["mrr"], 4), round(r["test"]["mrr"], 4), se and round(se, 4)])
    lines = [f"# One schedule or restarts per slice: {args.model} d{args.dim} on {args.dataset}", "",
             md_table(["arm", "slices (s)", "steps", "train s", "valid MRR", "test MRR", "test SE"], rows)]
    if set(ARMS) <= set(results):
        a, b = results["single"]["test"], results["restart"]["test"]
        se = math.hypot(a.get("standard_error", {}).get("mrr", 0.0), b.get("standard_error", {}).get("mrr", 0.0))
        lines += ["", f"Restart minus single, test MRR: {b['mrr'] - a['mrr']:+.4f} ({se:.4f} standard error of the "
                  "difference, unpaired; both rank the same triples, so on the safe side)."]
    lines += ["", "Both arms train the same model for the same total seconds with the recipe compress trains its "
              "candidates with (the default); `single` decays once over the whole time (a baseline trained alone), "
              "`restart` decays over each slice and warms up again at the next (compress's rungs)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--model", default="rotate", choices=("rotate", "earl"))
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--slices", required=True, help="seconds per slice, comma-separated (single: their sum)")
    parser.add_argument("--arm", default="both", choices=(*ARMS, "both", "none"),
                        help="which arm to train now (none: only write the table from the arms already run)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    slices = [float(s) for s in args.slices.split(",")]
    root = Path("runs/schedule_restart") / f"{args.dataset}_{args.tag}"
    arms = ARMS if args.arm == "both" else () if args.arm == "none" else (args.arm,)
    if arms:
        ds = load_dataset(dataset_folder(args.dataset), labels=False)
        for arm in arms:
            out = root / arm
            result = run_arm(ds, ModelConfig(model=args.model, dim=args.dim),
                             [sum(slices)] if arm == "single" else slices, out / "run", args.seed)
            out.mkdir(parents=True, exist_ok=True)
            (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    results = {arm: json.loads((root / arm / "result.json").read_text())
               for arm in ARMS if (root / arm / "result.json").exists()}
    if results:
        name = f"schedule_restart_{args.dataset}_{args.model}-d{args.dim}_{args.tag}"
        write_results(name, {"dataset": args.dataset, "model": args.model, "dim": args.dim, "slices": slices,
                             "arms": results}, markdown(args, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
