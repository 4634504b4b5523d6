"""The ablation table (paper Tables 2 and 3, lower half): full EARL and its five ablations, compared at equal steps."""

from __future__ import annotations

import argparse
from functools import partial

from harness import md_table
from trainers import run_earl

from earl_service.config import ModelConfig
from paper_tables.cache import Bench
from paper_tables.report import budget_line, common_eval_step, quick_note, row_metrics, status, valid_mrr_at
from paper_tables.settings import ABLATIONS, FULL_MINUTES, PAPER_ABLATION, PROTOCOLS, SETTINGS


def _ablation_minutes(args: argparse.Namespace, name: str) -> float:
    """Full mode: CoDEx-S to convergence (a generous cap, early stopping ends it), the others the main table's
    budget, whether or not `--data` names the dataset, so that a sitting can train one half of the table."""
    if args.quick:
        return args.minutes or 2.0
    return args.converge_minutes if name == "codex-s" else args.minutes or FULL_MINUTES


def cmd_ablation(args: argparse.Namespace) -> None:
    b = Bench("ablation", args)
    names = args.data or (["codex-s"] if args.quick else ["codex-s", "fb15k-237"])
    plan = [(n, _ablation_minutes(args, n)) for n in names]
    for name, minutes in plan:
        ds, st = b.dataset(name), SETTINGS[name]
        budget = b.budget(name, minutes)
        for label, key in ABLATIONS:
            flags = {} if key == "full" else {key: True}
            cfg = ModelConfig(dim=st.earl_dim, seed=args.seed, **flags)
            b.run(label, name, partial(run_earl, ds, cfg, budget, protocols=PROTOCOLS, seed=args.seed), ablation=key)

    md = ["# Ablations (paper Tables 2 and 3, lower half)", quick_note(args)]
    equal_steps = {}
    for name, _ in plan:
        recs = [r for r in b.records if r["dataset"] == name]
        full = next((r for r in recs if r["ablation"] == "full" and "error" not in r), None)
        base = row_metrics(full)[0] if full else None
        paper = PAPER_ABLATION.get(name, {})
        at_step = common_eval_step(recs)
        equal_steps[name] = at_step
        rows = []
        for r in recs:
            mrr, h10, eff = row_metrics(r)
            rows.append([r["label"], r.get("parameters"), mrr, h10, eff,
                         None if mrr is None or base is None else mrr - base, paper.get(r["ablation"]),
                         r.get("steps"), r.get("median_step_seconds"), r.get("train_seconds"),
                         valid_mrr_at(r, at_step), status(r)])
        at = "valid MRR at step " + (f"{at_step:,}" if at_step else "n/a")
        md += [f"## {name} (test, seen protocol, EARL dim {SETTINGS[name].earl_dim})", "",
               md_table(["variant", "#P", "MRR", "Hits@10", "Effi", "MRR - full", "paper MRR", "steps", "s/step",
                         "train s", at, "converged?"], rows), "", budget_line(recs), ""]
    md += ["`valid MRR at step N` compares the variants at equal training steps: the validation MRR each run "
           "recorded at the last validation step all of the dataset's finished runs reached (the validation "
           "subset named in the budget line). Runs on machines of different speed get different step counts in "
           "the same wall-clock budget (`s/step` is each run's median seconds per training step); this column "
           "takes that out.", ""]
    md += ["w/o Reserved Entity: no reserved entities (hence no kNResEnt); w/o ConRel + kNResEnt: fixed random GNN "
           "inputs; w/o MulHop: no GNN layers. `paper MRR` is the paper's reported FB15k-237/WN18RR figure (GPU, to "
           "convergence); blank where the paper has none."]
    b.write({"plan": [{"dataset": n, "minutes_per_run": m} for n, m in plan], "equal_step": equal_steps},
            "\n".join(md))

