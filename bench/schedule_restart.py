"""What a compress survivor's slices cost: one model trained for the same seconds under one decaying schedule (a
baseline trained alone), in slices that each decay and warm up again (`restart`), or in slices that hold the rate
and decay at their end, each going on from where the last one's decay began (`held`: train/slices.py). Every
arm uses the recipe compress trains candidates with.

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
from earl_service.train.slices import rewind, train_slice

ARMS = ("single", "restart", "held", "continued")
DECAY_SHARE = 0.2  # the held arm's default: the last fifth of each slice


def run_arm(ds, model: ModelConfig, slices: list[float], out: Path, seed: int, decay_share: float = 1.0,
            continued: bool = False) -> dict:
    """Train `model` over `slices` (seconds each) through train/slices.py, each slice's rate
    decaying over its last `decay_share` and the next slice going on from where that decay began (1: over the
    whole slice, the next warming up again from its end); with `continued`, every slice after the first runs on
    one schedule over all the slices, its rate going back to where that schedule is rather than to the peak. The
    last weights ranked on valid and test."""
    recipe = replace(train_configs_from_options({"progress": False}, recipe=DEFAULT)[model.model], seed=seed,
                     eval_every=0)
    trained, metrics, started = 0.0, {}, time.monotonic()
    for index, seconds in enumerate(slices):
        if (held := rewind(out, trained)) is not None:
            trained = held["train_seconds"]
        schedule = (0.0, sum(slices)) if continued and index else (trained, seconds)
        metrics = train_slice(ds, model, recipe, out, trained=trained, seconds=seconds, schedule=schedule,
                              decay_share=decay_share, final_eval=index == len(slices) - 1, write_bundle=False,
                              curves=False)
        trained = metrics["train_seconds"]
    summary = {split: {k: metrics[split][k] for k in ("mrr", "hits_at_10", "standard_error") if k in metrics[split]}
               for split in ("valid", "test")}
    return {"slices": slices, "decay_share": decay_share, "steps": metrics["steps"], "train_seconds": trained,
            "wall_seconds": time.monotonic() - started, **summary}


def markdown(args, results: dict[str, dict]) -> str:
    rows = []
    for arm, r in results.items():
        se = r["test"].get("standard_error", {}).get("mrr")
        rows.append([arm, " + ".join(f"{s:g}" for s in r["slices"]), r["steps"], round(r["train_seconds"]),
                     round(r["valid"]["mrr"], 4), round(r["test"]["mrr"], 4), se and round(se, 4)])
    lines = [f"# One schedule or slices: {args.model} d{args.dim} on {args.dataset}", "",
             md_table(["arm", "slices (s)", "steps", "train s", "valid MRR", "test MRR", "test SE"], rows)]
    base = next((arm for arm in ("single", "restart") if arm in results), None)  # what the others are set against
    for arm in ARMS:
        if base is not None and arm in results and arm != base:
            a, b = results[base]["test"], results[arm]["test"]
            se = math.hypot(*(x.get("standard_error", {}).get("mrr", 0.0) for x in (a, b)))
            lines += ["", f"{arm.capitalize()} minus {base}, test MRR: {b['mrr'] - a['mrr']:+.4f} ({se:.4f} standard "
                      "error of the difference, unpaired; both rank the same triples, so on the safe side)."]
    lines += ["", "Every arm trains the same model for the same total seconds with the recipe compress trains its "
              "candidates with (the default): `single` decays once over the whole time (a baseline trained alone); "
              "`restart` decays over each slice and warms up again at the next (compress's rungs); `held` holds "
              "the rate and decays over each slice's last `decay_share`, the next slice going on from where that "
              "decay began (train/slices.py), so the decays of all slices but the last "
              "are spent on judging the slice alone; `continued` decays over the first slice, then runs the rest on "
              "one schedule over all the slices (the rate back to where that schedule is, not to the peak)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--model", default="rotate", choices=("rotate", "earl"))
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--slices", required=True, help="seconds per slice, comma-separated (single: their sum)")
    parser.add_argument("--arm", default="all", choices=(*ARMS, "all", "none"),
                        help="which arm to train now (none: only write the table from the arms already run)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decay-share", type=float, default=DECAY_SHARE,
                        help="the held arm's decay: this last share of each slice")
    parser.add_argument("--tag", default="run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    slices = [float(s) for s in args.slices.split(",")]
    root = Path("runs/schedule_restart") / f"{args.dataset}_{args.tag}"
    arms = ARMS if args.arm == "all" else () if args.arm == "none" else (args.arm,)
    if arms:
        ds = load_dataset(dataset_folder(args.dataset), labels=False)
        for arm in arms:
            out = root / arm
            result = run_arm(ds, ModelConfig(model=args.model, dim=args.dim),
                             [sum(slices)] if arm == "single" else slices, out / "run", args.seed,
                             args.decay_share if arm == "held" else 1.0, continued=arm == "continued")
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
