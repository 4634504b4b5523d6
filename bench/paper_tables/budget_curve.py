"""Figure 4: test MRR against the parameter budget, EARL against RotatE (PNG), and the machine calibration."""

from __future__ import annotations

import argparse
from functools import partial

from harness import describe_machine, md_table, pyplot, widen_ylim
from trainers import dim_for_parameters, run_earl

from earl_service.config import ModelConfig
from earl_service.train.loop import WARMUP_STEPS
from paper_tables.cache import Bench
from paper_tables.report import budget_line, quick_note, row_metrics, status
from paper_tables.settings import FULL_MINUTES, PLOT_MIN_SPAN, PROTOCOLS


def cmd_budget(args: argparse.Namespace) -> None:
    b = Bench("budget", args)
    name = (args.data or ["codex-s" if args.quick else "fb15k-237"])[0]
    targets = args.targets or ([0.05, 0.1, 0.25, 0.5] if args.quick else [1.0, 2.0, 3.0, 4.0, 5.0])
    minutes = args.minutes or (1.5 if args.quick else FULL_MINUTES)
    ds = b.dataset(name)
    budget = b.budget(name, minutes)
    points = []
    for model in ("earl", "rotate"):
        for target in targets:
            dim = dim_for_parameters(ds, ModelConfig(model=model), int(target * 1e6))
            cfg = ModelConfig(model=model, dim=dim, seed=args.seed)
            points.append((f"{'EARL' if model == 'earl' else 'RotatE'} dim {dim}",
                           partial(run_earl, ds, cfg, budget, protocols=PROTOCOLS, seed=args.seed), model, target))
    if args.calibrate:
        write_calibration(b, name, [(label, fn) for label, fn, _, _ in points], args.calibrate)
        return
    for label, fn, model, target in points:
        b.run(label, name, fn, model_kind=model, target_parameters=int(target * 1e6))

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for model, label in (("earl", "EARL+RotatE"), ("rotate", "RotatE")):
        recs = sorted((r for r in b.records if r["model_kind"] == model and "error" not in r),
                      key=lambda r: r["parameters"])
        xs = [r["parameters"] / 1e6 for r in recs]
        for ax, key in zip(axes, ("mrr", "hits_at_10"), strict=True):
            ax.plot(xs, [r["test"]["seen"][key] for r in recs], marker="o", label=label)
    for ax, key in zip(axes, ("MRR", "Hits@10"), strict=True):
        ax.set(xlabel="trainable parameters (M)", ylabel=f"test {key} (filtered)", title=f"{name}: {key} vs #P")
        widen_ylim(ax, PLOT_MIN_SPAN)
        ax.grid(alpha=0.3)
        ax.legend()
    png = b.png(fig)
    rows = [[r["label"], r.get("target_parameters"), r.get("parameters"), *row_metrics(r), r.get("steps"),
             r.get("train_seconds"), status(r)] for r in b.records]
    md = [f"# MRR against parameter budget (paper Figure 4) on {name}", quick_note(args), f"![MRR vs #P]({png})", "",
          md_table(["model", "target #P", "#P", "MRR", "Hits@10", "Effi", "steps", "train s", "converged?"], rows),
          "", budget_line(b.records), "",
          "EARL's #P is varied through its dim (reserved ratio 0.1); RotatE's through its dim. Test split, seen "
          "protocol. The same wall-clock budget for every point: larger models do fewer steps in it."]
    b.write({"dataset": name, "targets_millions": targets, "minutes_per_run": minutes}, "\n".join(md))


def write_calibration(b: Bench, dataset: str, runs: list[tuple[str, partial]], steps: int) -> None:
    """`--calibrate N`: this machine's step time for every finished run of the table against the recorded one,
    written to `<table>_calibration.{json,md}` (the table itself is left as it is)."""
    rows = [row for label, fn in runs if (row := b.calibrate(label, dataset, fn, steps))]
    table = [[r["label"], describe_machine(r["recorded_machine"]) if r["recorded_machine"] else "not recorded",
              r["median_step_seconds_recorded"], r["recorded_steps"], r["median_step_seconds_here"],
              r["median_step_seconds_recorded"] / r["median_step_seconds_here"]] for r in rows]
    md = [f"# Step time of {b.name}'s finished runs on this machine against their records", "",
          md_table(["run", "trained on (record)", "recorded median s/step", "recorded steps",
                    f"median s/step here ({steps} steps)", "recorded / here"], table), "",
          f"Each finished run's configuration trains {steps} steps here with 2 torch threads (no validation, no "
          f"test; median over steps {WARMUP_STEPS + 1}+, as the record's median is over its run's). A ratio above 1 "
          "means this machine is faster than the one that trained the run: in the same wall-clock budget it would "
          "have done about that many times the steps. Runs whose record predates the `machine` field name no "
          "machine; the version of the table that the run wrote names it in its footer (git history)."]
    meta = {"table": b.table, "calibrates": b.name, "steps_timed": steps, "threads": 2, "runs": rows}
    b.write_file(f"{b.name}_calibration", meta, "\n".join(md))

