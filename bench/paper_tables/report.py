"""What every paper table prints beside its rows: status, the budget and machines line, equal-step comparisons."""

from __future__ import annotations

import argparse

from harness import describe_machine
from trainers import Budget, effi


def fmt_bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.2f} MB"


def row_metrics(rec: dict, protocol: str = "seen") -> tuple:
    m = rec.get("test", {}).get(protocol, {})
    return m.get("mrr"), m.get("hits_at_10"), effi(rec, protocol)


def status(rec: dict) -> str:
    if rec.get("pending"):
        return "not run yet"
    if "error" in rec:
        return "error: " + rec["error"][:80]
    if rec["stopped"] == "steps":  # a fixed-step design: the step count is the budget, not a shortfall
        return f"n/a (fixed {rec['steps']:,} steps)"
    return "yes (early stopping)" if rec["converged"] else f"no ({rec['stopped']})"


def quick_note(args: argparse.Namespace) -> str:
    if args.tag:
        cut = [what for flag, what in ((args.no_search, "no settings search"), (args.no_rotate, "no RotatE curve"))
               if flag]
        return (f"\n**Partial run `{args.tag}`** (not the full mode): {', '.join(cut) or 'custom budget'}; "
                f"{args.minutes or 'default'} min per run; see the command below.\n")
    if not args.quick:
        return ""
    return ("\n**Quick mode**: CoDEx-S, a few minutes per run on a shared 2-core machine. A check that the whole "
            "path works and a first look, not the paper's numbers (the paper has no CoDEx-S figures).\n")


def budget_line(recs: list[dict]) -> str:
    ok = [r for r in recs if "error" not in r and r.get("row") != "probe"]  # probes time a few steps, unbudgeted
    if not ok:
        return ""

    def describe(b: dict) -> str:
        stop = (f"a fixed {b['max_steps']:,} steps, no early stopping (best validation checkpoint tested)"
                if Budget(**b).patience_outlasts_run else f"patience {b['patience']}")
        return (f"{b['minutes']:g} min wall-clock (validation included), validation every {b['eval_every']} steps on "
                f"{b['eval_max_triples'] or 'all'} valid triples, {stop}")

    per_dataset = {r.get("dataset"): describe(r["budget"]) for r in ok}
    budgets = (next(iter(per_dataset.values())) if len(set(per_dataset.values())) == 1
               else "; ".join(f"{name}: {text}" for name, text in per_dataset.items()))
    loads = [r["load_average_1min"]["start"] for r in ok] + [r["load_average_1min"]["end"] for r in ok]
    steal = [r["cpu_steal_share"] for r in ok if r.get("cpu_steal_share") is not None]
    steal_note = (f"; CPU time taken by other guests of the VM (steal): {100 * min(steal):.0f}-{100 * max(steal):.0f}%"
                  if steal else "")
    return (f"Budget per run: {budgets}; 2 torch threads. 1-minute load average at the start and end of these runs: "
            f"{min(loads):.1f}-{max(loads):.1f} on 2 cores{steal_note}. Busy machines give fewer steps in the same "
            "wall-clock budget." + machines_line(ok))


def machines_line(recs: list[dict]) -> str:
    """Which machine trained which run, from the records that name one (those written since the records kept
    it): a table's runs span sittings, and one sitting's machine can be faster or slower than another's."""
    by_machine: dict[str, list[str]] = {}
    for r in recs:
        if r.get("machine"):
            by_machine.setdefault(describe_machine(r["machine"]), []).append(r.get("label", "?"))
    if not by_machine:
        return ""
    unnamed = len(recs) - sum(map(len, by_machine.values()))
    parts = [f"{machine}: {', '.join(labels)}" for machine, labels in by_machine.items()]
    if unnamed:
        parts.append(f"{unnamed} run{'s' * (unnamed > 1)} whose record predates this field (the machine is in the "
                     "footer of the version of this file that the run wrote, in git history)")
    return " Trained on " + "; ".join(parts) + "."



def common_eval_step(recs: list[dict]) -> int | None:
    """The last validation step that every finished run of a table recorded (None if they share none)."""
    steps = [set(r["history"]["eval_steps"]) for r in recs if "error" not in r and r.get("history")]
    return max(set.intersection(*steps), default=None) if steps else None


def valid_mrr_at(rec: dict, step: int | None) -> float | None:
    hist = rec.get("history") or {}
    return dict(zip(hist.get("eval_steps", []), hist.get("eval_mrr", []), strict=True)).get(step)

