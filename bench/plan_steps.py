"""Planning's step estimates against each planned candidate's measured step, on one graph and budget.

A compress search times one training step at each model's widest and narrowest candidate (costs.measure_costs)
and interpolates the others linearly in the dim (costs.with_estimates). Here every planned candidate is timed as
planning times its extremes (costs.step_seconds: 3 steps after one untimed, at most 5 s), and again over
`--steps` steps, beside the estimate the search would use.

    python bench/plan_steps.py wordnet-full-noinv --budget 2MB --threads 1
    python bench/plan_steps.py fb15k-237 --budget 2MB --threads 1 --steps 10

Writes bench/results/plan_steps_<dataset>_<budget>.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from harness import add_datasets_argument, dataset_folder, md_table, write_results

from earl_service.bundle.sizes import BundleSizes
from earl_service.compress.candidates import plan_candidates
from earl_service.compress.config import CompressConfig, parse_size
from earl_service.compress.costs import (
    TIMING_SECONDS,
    TIMING_STEPS,
    Costs,
    step_seconds,
    timed_extremes,
    with_estimates,
)
from earl_service.config import recipes
from earl_service.config.options import train_configs_from_options
from earl_service.data.dataset import load_dataset
from earl_service.train.run import Run, resolve_device


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--budget", default="2MB")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="steps of the longer timing of each candidate")
    add_datasets_argument(parser)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    ds = load_dataset(dataset_folder(a.dataset, a.datasets), labels=False)
    config = CompressConfig(max_bytes=parse_size(a.budget), time_limit_minutes=10)
    candidates = plan_candidates(BundleSizes(ds, seed=config.seed), config)
    train_configs = train_configs_from_options({"progress": False}, recipe=recipes.DEFAULT)
    planned, measured = [], {}
    for c in candidates:
        run = Run.build(ds, c.config, resolve_device("cpu"))
        short = step_seconds(run, train_configs[c.model], TIMING_STEPS, TIMING_SECONDS)
        long = step_seconds(run, train_configs[c.model], a.steps, 60.0 * a.steps)
        measured[c.name] = (short, long)
        print(c.name, f"{short:.3f}", f"{long:.3f}", flush=True)
    # The estimates as planning forms them: from the short timings of the configs it times (timed_extremes; the
    # validation costs are not timed here).
    short_of = {c.config: measured[c.name][0] for c in candidates}
    extremes = {model: {dim: Costs(0.0, 0.0, short_of[config])
                        for dim, config in timed_extremes([c for c in candidates if c.model == model]).items()}
                for model in dict.fromkeys(c.model for c in candidates)}
    for c in with_estimates(candidates, extremes):
        short, long = measured[c.name]
        planned.append({"candidate": c.name, "model": c.model, "dim": c.dim,
                        "reserved_ratio": c.config.reserved_ratio if c.model == "earl" else None,
                        "estimate_s": c.step_seconds, "timed_like_planning_s": short, "timed_s": long,
                        "estimate_over_timed": c.step_seconds / long})
    rows = [[r["candidate"], r["estimate_s"], r["timed_like_planning_s"], r["timed_s"], r["estimate_over_timed"]]
            for r in planned]
    md = (f"# Planning's step estimates, {a.dataset} at {a.budget}\n\n"
          f"Each planned candidate's training step: planning's estimate (linear in the dim between each model's "
          f"widest and narrowest, timed as planning times them: {TIMING_STEPS} steps after one untimed, at most "
          f"{TIMING_SECONDS:g} s), the same short timing at its own dim, and the mean of {a.steps} steps; "
          f"{a.threads} thread(s), default recipe.\n\n"
          + md_table(["candidate", "estimate s", f"timed ({TIMING_STEPS} steps) s", f"timed ({a.steps} steps) s",
                      "estimate / timed"], rows) + "\n")
    write_results(f"plan_steps_{a.dataset}_{a.budget}", {"dataset": a.dataset, "budget": a.budget,
                                                         "threads": a.threads, "steps": a.steps,
                                                         "candidates": planned}, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
