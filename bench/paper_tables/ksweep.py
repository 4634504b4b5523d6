"""Figure 5: the effect of k, the nearest reserved entities of kNResEnt, at a fixed step count per k (PNG)."""

from __future__ import annotations

import argparse
from functools import partial

from harness import md_table, pyplot
from trainers import run_earl

from earl_service.config import ModelConfig
from paper_tables.cache import Bench
from paper_tables.report import budget_line, quick_note, row_metrics, status
from paper_tables.settings import KSWEEP_STEPS, PROTOCOLS, SETTINGS


def cmd_ksweep(args: argparse.Namespace) -> None:
    b = Bench("ksweep", args)
    name = (args.data or ["codex-s"])[0]
    ks = args.ks or [1, 5, 10, 30, 50]
    minutes = args.minutes or (2.0 if args.quick else args.converge_minutes)
    ds, st = b.dataset(name), SETTINGS[name]
    steps = args.steps or (None if args.quick else KSWEEP_STEPS)
    budget = b.budget(name, minutes)  # full mode: every k the same fixed steps (module note on KSWEEP_STEPS)
    budget = budget if steps is None else budget.fixed_steps(steps)
    for k in ks:
        cfg = ModelConfig(dim=st.earl_dim, k=k, seed=args.seed)
        b.run(f"EARL k={k}", name, partial(run_earl, ds, cfg, budget, protocols=PROTOCOLS, seed=args.seed), k=k)

    plt = pyplot()
    ok = [r for r in b.records if "error" not in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("mrr", "MRR"), ("hits_at_10", "Hits@10")):
        ax.plot([r["k"] for r in ok], [r["test"]["seen"][key] for r in ok], marker="o", label=label)
    ax.set(xlabel="k (nearest reserved entities)", ylabel="test metric (filtered)", title=f"{name}: effect of k")
    ax.grid(alpha=0.3)
    ax.legend()
    png = b.png(fig)
    rows = [[r["k"], r.get("parameters"), *row_metrics(r)[:2], r.get("steps"), r.get("train_seconds"), status(r)]
            for r in b.records]
    md = [f"# Effect of k in kNResEnt (paper Figure 5) on {name}", quick_note(args), f"![MRR vs k]({png})", "",
          md_table(["k", "#P", "MRR", "Hits@10", "steps", "train s", "converged?"], rows), "", budget_line(b.records),
          "", f"EARL dim {st.earl_dim}, reserved ratio 0.1, test split, seen protocol. k changes no parameter count."]
    b.write({"dataset": name, "ks": ks, "minutes_per_run": minutes, "steps_per_run": steps}, "\n".join(md))

