"""Convergence on CPU: validation MRR against wall-clock (PNG), a search over training settings, the gap to the
paper's target."""

from __future__ import annotations

import argparse
from functools import partial

from harness import md_table, pyplot
from trainers import Budget, Optim, dim_for_parameters, earl_parameters, run_earl

from earl_service.config import ModelConfig
from earl_service.data import Dataset
from earl_service.train.run import cpu_has_native_bf16
from paper_tables.cache import Bench
from paper_tables.report import budget_line, quick_note, row_metrics, status
from paper_tables.settings import FULL_MINUTES, FULL_SEARCH_MINUTES, PAPER_TARGET, PROTOCOLS, SETTINGS

SEARCH = [  # (label, Optim overrides, run overrides): one factor at a time around the paper's settings
    # Only factors that change what a CPU step costs. The cost-neutral ones (lr, self-adversarial temperature,
    # margin) are answered at a fixed step count by bench/step_search.py, on any device: on FB15k-237 at the
    # 5,000 steps of a 2-hour budget the paper's lr 1e-3 beat 5e-4, 3e-3 and 5e-3 (bench/README.md).
    # Validation cadence is not a run either: each run's validation share (from its record's
    # `step_seconds_total`) measures what validating costs.
    ("paper settings", {}, {}),
    ("batch 2048", {"batch_size": 2048}, {}),
    ("batch 4096", {"batch_size": 4096}, {}),
    ("batch 4096, lr 2e-3", {"batch_size": 4096, "lr": 2e-3}, {}),
    ("negatives 128/side", {"negatives": 128}, {}),
    ("negatives 64/side", {"negatives": 64}, {}),
    ("bf16 autocast", {}, {"bf16": True}),
]


def searched_run(ds: Dataset, cfg: ModelConfig, budget: Budget, opt: dict, overrides: dict, seed: int) -> partial:
    """The EARL run of one search entry (Optim overrides, run overrides) under `budget`."""
    return partial(run_earl, ds, cfg, budget, optim=Optim(**opt), protocols=PROTOCOLS,
                   seed=seed, bf16=overrides.get("bf16", False))


def validation_share(rec: dict) -> float | None:
    """Share of the training budget spent outside training steps (validation, checkpoints); None for records
    written before `step_seconds_total` was kept."""
    total, train = rec.get("step_seconds_total"), rec.get("train_seconds")
    return None if total is None or not train else max(0.0, 1.0 - total / train)



def _search(b: Bench, args: argparse.Namespace, name: str, minutes: float) -> tuple[dict | None, list[str]]:
    """The settings search on `name`, EARL at the paper's dim: (the best run by validation MRR, labels skipped)."""
    ds, st = b.dataset(name), SETTINGS[name]
    base_budget = b.budget(name, minutes)
    skipped: list[str] = []
    for label, opt, bud in [] if args.no_search else SEARCH:
        if bud.get("bf16") and not cpu_has_native_bf16():
            print(f"    skipping '{label}': this CPU has no native bfloat16 matmul (emulated, several times slower)")
            skipped.append(label)
            continue
        b.run(f"search: {label}", name,
              searched_run(ds, ModelConfig(dim=st.earl_dim, seed=args.seed), base_budget, opt, bud, args.seed),
              phase="search", setting=label, optim_overrides=opt, budget_overrides=bud)
    searched = [r for r in b.records if r.get("phase") == "search" and "error" not in r]
    return (max(searched, key=lambda r: r["valid"].get("mrr", -1)) if searched else None), skipped


def _curves(b: Bench, args: argparse.Namespace, name: str, minutes: float, best: dict | None) -> None:
    """Curves at the full budget on `name`: EARL (paper settings and best found), RotatE (paper settings)."""
    ds, st = b.dataset(name), SETTINGS[name]
    budget = b.budget(name, minutes)
    earl_cfg = ModelConfig(dim=st.earl_dim, seed=args.seed)
    b.run("EARL, paper settings", name,
          partial(run_earl, ds, earl_cfg, budget, protocols=PROTOCOLS, seed=args.seed),
          phase="curve", model_kind="earl")
    if best is not None and best["setting"] != "paper settings":
        b.run(f"EARL, best searched ({best['setting']})", name,
              searched_run(ds, earl_cfg, budget, best["optim_overrides"], best["budget_overrides"], args.seed),
              phase="curve", model_kind="earl")
    if args.no_rotate:
        return
    target = earl_parameters(ds, earl_cfg)
    rdim = st.rotate_dim or dim_for_parameters(ds, ModelConfig(model="rotate"), target)
    b.run(f"RotatE dim {rdim}, paper settings", name,
          partial(run_earl, ds, ModelConfig(model="rotate", dim=rdim, seed=args.seed), budget,
                  protocols=PROTOCOLS, seed=args.seed),
          phase="curve", model_kind="rotate")


def _plot(b: Bench, names: list[str], search_on: str) -> str:
    plt = pyplot()
    curves = [r for r in b.records if r.get("phase") == "curve" and "error" not in r]
    searched = [r for r in b.records if r.get("phase") == "search" and "error" not in r]
    panels = len(names) + bool(searched)  # no empty search panel when the search was skipped
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
    axes = axes[0]
    for ax, name in zip(axes, names, strict=False):  # the search panel, if any, comes after
        for r in (r for r in curves if r["dataset"] == name):
            h = r["history"]
            colour = "C1" if r["model_kind"] == "rotate" else "C2" if "best searched" in r["label"] else "C0"
            ax.plot([s / 60 for s in h["eval_seconds"]], h["eval_mrr"], marker=".", ms=3, c=colour, label=r["label"])
        if name in PAPER_TARGET:
            ax.axhline(PAPER_TARGET[name][0], ls="--", c="grey", lw=1, label="paper EARL (test MRR)")
        ax.set(xlabel="wall-clock (min, validation included)", ylabel="valid MRR (filtered)", title=name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if searched:
        ax = axes[-1]
        for r in searched:
            h = r["history"]
            ax.plot([s / 60 for s in h["eval_seconds"]], h["eval_mrr"], lw=1, label=r["setting"])
        ax.set(xlabel="wall-clock (min)", ylabel="valid MRR", title=f"settings search, EARL on {search_on}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return b.png(fig)


def _cadence(b: Bench, search_on: str) -> str:
    shares = [x for r in b.records if (x := validation_share(r)) is not None]
    if not shares:
        return "Validation cadence: no run here recorded its step time total, so the cost of validating is unmeasured."
    return (f"Validation cadence: validating (every {SETTINGS[search_on].eval_every} steps on at most "
            f"{SETTINGS[search_on].eval_max_triples} triples on {search_on}) and checkpointing took "
            f"{min(shares):.1%}-{max(shares):.1%} of the budget across these runs ('validation share'), the most "
            "that validating less often could give back to training.")


def _gap_line(b: Bench, name: str) -> str:
    recs = [r for r in b.records if r.get("phase") == "curve" and "error" not in r and r["dataset"] == name
            and r["model_kind"] == "earl"]
    if name not in PAPER_TARGET:
        return f"- {name}: the paper has no figure for this dataset, so there is no gap to state here."
    want, max_p = PAPER_TARGET[name]
    if not recs:
        return f"- {name}: no EARL run finished."
    top = max(recs, key=lambda r: r["test"]["seen"]["mrr"])
    got, curve = top["test"]["seen"]["mrr"], top["history"]["eval_mrr"]
    verdict = "reached" if got >= want else f"short by {want - got:.4f}"
    still = (not top["converged"]) and bool(curve) and curve[-1] >= max(curve) - 1e-9
    return (f"- {name}: best EARL test MRR {got:.4f} with {top['parameters'] / 1e6:.2f}M parameters in "
            f"{top['train_seconds'] / 60:.0f} min ({top['label']}); the paper's target is >= {want:.3f} at <= "
            f"{max_p / 1e6:.1f}M: {verdict}"
            + (", and validation MRR was still at its best when the budget ended." if still else "."))


def _gap(b: Bench, names: list[str]) -> list[str]:
    gap = [_gap_line(b, name) for name in names]
    if not any(n in PAPER_TARGET for n in names):
        full_runs = len(SEARCH) + 2 * 3  # the search, then 3 curves on each of FB15k-237 and WN18RR
        full_hours = (len(SEARCH) * FULL_SEARCH_MINUTES + 2 * 3 * FULL_MINUTES) / 60
        gap.append("- The paper's CPU claim (FB15k-237 MRR >= 0.310 at <= 1.8M parameters and WN18RR >= 0.440 at "
                   "<= 3.8M within 2 hours of 2-core CPU) is **untested by this run**: it needs the full mode "
                   f"(`python bench/paper.py convergence`: {full_runs} runs, {full_hours:.1f} h of training budget).")
    return gap


def _markdown(b: Bench, args: argparse.Namespace, names: list[str], search_on: str, search_minutes: float,
              curve_minutes: float, best: dict | None, skipped: list[str]) -> str:
    search_rows = [[r["setting"], r.get("valid", {}).get("mrr"), *row_metrics(r)[:2], r.get("steps"),
                    r.get("median_step_seconds"), len(r.get("history", {}).get("eval_mrr", [])),
                    validation_share(r), status(r)] for r in b.records if r.get("phase") == "search"]
    curve_rows = [[r["dataset"], r["label"], r.get("parameters"), *row_metrics(r)[:2], r.get("steps"),
                   r.get("train_seconds"), status(r)] for r in b.records if r.get("phase") == "curve"]
    md = ["# Convergence on CPU: validation MRR against wall-clock, and a search over training settings",
          quick_note(args), f"![valid MRR vs wall-clock]({_plot(b, names, search_on)})", "",
          f"## Settings search (EARL dim {SETTINGS[search_on].earl_dim} on {search_on}, {search_minutes:g} min each, "
          "one factor at a time around the paper's settings; chosen by validation MRR)", "",
          ("The factors searched here change what a CPU step costs (batch, negatives, precision); lr, temperature and "
           "margin do not, and `bench/step_search.py` compares them at a fixed step count on any device."), "",
          md_table(["setting", "valid MRR", "test MRR", "test Hits@10", "steps", "median s/step", "validations",
                    "validation share", "converged?"], search_rows), "", _cadence(b, search_on), "",
          *([f"Not run on this machine: {', '.join(skipped)} (its CPU has no native bfloat16 matmul, so autocast "
             "is emulated and several times slower than float32).", ""] if skipped else []),
          f"Best by validation MRR: **{best['setting'] if best else 'none'}**.", "",
          f"## Curves ({curve_minutes:g} min per run)", "",
          md_table(["dataset", "run", "#P", "test MRR", "test Hits@10", "steps", "train s", "converged?"], curve_rows),
          "", budget_line([r for r in b.records if r.get("phase") == "curve"]), "",
          "## Gap to the paper", "", *_gap(b, names)]
    return "\n".join(md)


def cmd_convergence(args: argparse.Namespace) -> None:
    b = Bench("convergence", args)
    names = args.data or (["codex-s"] if args.quick else ["fb15k-237", "wn18rr"])
    curve_minutes = args.minutes or (4.0 if args.quick else FULL_MINUTES)
    search_minutes = args.search_minutes or (1.5 if args.quick else FULL_SEARCH_MINUTES)
    search_on = names[0]
    best, skipped = _search(b, args, search_on, search_minutes)
    for name in names:
        _curves(b, args, name, curve_minutes, best)
    md = _markdown(b, args, names, search_on, search_minutes, curve_minutes, best, skipped)
    b.write({"datasets": names, "search_dataset": search_on, "search_minutes": search_minutes,
             "curve_minutes": curve_minutes, "best_setting": best["setting"] if best else None}, md)
