"""The paper's tables on a 2-core CPU, one subcommand per table, side by side with PyKEEN and the paper's figures.

    python bench/paper.py main [--quick]         # Tables 2/3: EARL, RotatE, PyKEEN RotatE, PyKEEN NodePiece+RotatE
    python bench/paper.py ablation [--quick]     # the five ablations + full EARL
    python bench/paper.py budget [--quick]       # Figure 4: MRR against #P, EARL vs RotatE (PNG)
    python bench/paper.py budget --calibrate 24  # this machine's step time for each finished point vs its record
    python bench/paper.py ksweep [--quick]       # Figure 5: k nearest reserved entities, k in {1, 5, 10, 30, 50} (PNG)
                                                 # full mode: 7,000 CoDEx-S steps per k, as the paper fixes steps
    python bench/paper.py convergence [--quick]  # valid MRR against wall-clock (PNG) + a search over training settings

Full mode uses the issue's budgets (2 h of wall-clock per run on FB15k-237 / WN18RR, CoDEx-S ablations to
convergence by early stopping, the k sweep a fixed step count per k) and takes hours to a day per table.
`--quick` trains on CoDEx-S for 1.5-4 minutes per run: it checks that every path works and gives a first look;
its numbers are not the paper's. Every run uses 2 torch threads and a wall-clock budget that includes periodic
validation; the best checkpoint by validation MRR is tested (filtered, realistic ranks). Results go to
bench/results/paper_<table>[_quick].{json,md,png}.

OMP_WAIT_POLICY defaults to PASSIVE here: on a shared 2-core machine, spinning OpenMP workers of a 2-thread run
lose most of their time to other processes (measured 3.0 -> 0.5 s per CoDEx-S RotatE step at load ~6).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede the first torch import (libgomp reads it once)

import argparse
import hashlib
import inspect
import json
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    RESULTS,
    default_datasets,
    describe_machine,
    environment,
    md_table,
    pyplot,
    save_png,
    widen_ylim,
    write_results,
)
from harness import (
    Budget,
    NodePieceSpec,
    Optim,
    dim_for_parameters,
    earl_parameters,
    effi,
    nodepiece_width_for,
    pykeen_rotate_dim_for,
    run_earl,
    run_pykeen,
    test_earl,
)

from earl_service.atomic import write_json
from earl_service.config import ModelConfig
from earl_service.data.dataset import Dataset, load_dataset
from earl_service.train.loop import CHECKPOINT, WARMUP_STEPS
from earl_service.train.run import cpu_has_native_bf16


def _amend(rec: dict, done: Path, why: str, figures: dict, before: str | None = None) -> dict:
    """A finished record with `figures` replaced, saved to `done`; the old ones stay under `why` (with the
    commit and date), as `rec[before]` when given, else as a dict of the replaced keys."""
    old = rec[before] if before else {k: rec[k] for k in figures}
    rec = {**rec, **figures, why: {"commit": environment()["commit"], "before": old,
                                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    write_json(done, rec)
    return rec


@dataclass(frozen=True)
class Setting:
    """Per-dataset choices: the paper's dims, a NodePiece tokenisation, how often to validate."""

    earl_dim: int
    rotate_dim: int  # the paper's small-dim RotatE; 0: the dim matching EARL's #P
    nodepiece: NodePieceSpec  # from PyKEEN's galkin2022 configs (CoDEx-S: the CoDEx-L one, 10% anchors)
    eval_every: int
    eval_max_triples: int


SETTINGS = {
    "fb15k-237": Setting(150, 100, NodePieceSpec(anchors=1000, anchor_tokens=20, relation_tokens=15), 250, 3000),
    "wn18rr": Setting(200, 50, NodePieceSpec(anchors=500, anchor_tokens=50, relation_tokens=4), 100, 3000),
    "codex-s": Setting(100, 0, NodePieceSpec(anchors=200, anchor_tokens=20, relation_tokens=6), 50, 500),
}

# What the paper reports (Table 2: test, filtered, seen-entity protocol), as listed in
# shared/spec/reference-implementation.md. Shown beside our runs, never mixed into them.
PAPER_MAIN = {
    "fb15k-237": [("EARL+RotatE", 150, 1.8, 0.310, 0.501), ("RotatE", 100, 2.9, 0.296, 0.473),
                  ("NodePiece+RotatE", 100, 3.2, 0.256, 0.420), ("RotatE", 1000, 29.3, 0.336, 0.532)],
    "wn18rr": [("EARL+RotatE", 200, 3.8, 0.440, 0.527), ("RotatE", 50, 4.1, 0.411, 0.429),
               ("NodePiece+RotatE", 100, 4.4, 0.403, 0.515), ("RotatE", 500, 40.6, 0.508, 0.612)],
}
PAPER_ABLATION = {
    "fb15k-237": {"full": 0.310, "no_reserved": 0.306, "no_conrel": 0.309, "no_knn": 0.301, "no_conrel_knn": 0.302,
                  "no_mulhop": 0.250},
    "wn18rr": {"full": 0.440, "no_reserved": 0.347, "no_conrel": 0.432, "no_knn": 0.409, "no_conrel_knn": 0.350,
               "no_mulhop": 0.048},
}
# Finished runs, one JSON each, committed with the results: a full table is many 2-hour runs, more than one
# sitting, and a new checkout has no runs/ folder. Checkpoints of unfinished runs stay under --work.
RECORDS = RESULTS / "paper_runs"
PROTOCOLS = ("seen", "all")  # every run_earl call tests both, so that tables can share runs
PAPER_TARGET = {"fb15k-237": (0.310, 1.8e6), "wn18rr": (0.440, 3.8e6)}  # the goal: MRR >= x at <= #P
FULL_MINUTES = 120.0  # the budget per run on FB15k-237 / WN18RR
FULL_SEARCH_MINUTES = 30.0  # per settings-search run in full mode
PLOT_MIN_SPAN = 0.05  # least y-range of the budget curve's axes: MRR differences under 0.01 are run noise here
KSWEEP_STEPS = 7000  # full-mode k sweep: every k trains this many CoDEx-S steps (~210 epochs), as the paper trains
# each k a fixed count (14,000 / 20,000 steps); early stopping on a validation subset stops runs at steps that
# differ by more than k's effect (measured: 3,750-7,000 steps for k in 1, 5, 10), so it is not used there.
ABLATIONS = [("EARL (full)", "full"), ("w/o Reserved Entity", "no_reserved"), ("w/o ConRel", "no_conrel"),
             ("w/o kNResEnt", "no_knn"), ("w/o ConRel + kNResEnt", "no_conrel_knn"), ("w/o MulHop", "no_mulhop")]


def run_key(dataset: str, fn: partial) -> str:
    """What decides a run's outcome: the trainer, the dataset and every argument (defaults filled in), hashed.

    Tables share runs through it (the main table's EARL row at the paper's settings is also the convergence
    curve and the ablation's full model), and a table run again reuses every run already finished.
    """
    bound = inspect.signature(fn.func).bind_partial(*fn.args, **fn.keywords)
    bound.apply_defaults()
    args = {k: v for k, v in bound.arguments.items() if not isinstance(v, Dataset)}
    text = f"{fn.func.__module__}.{fn.func.__qualname__}|{dataset}|{sorted(args.items())!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Bench:
    """One table's run: dataset cache, a run cache shared by all tables, partial results saved after every run.

    Every finished run is kept as `bench/results/paper_runs/<dataset>-<key>.json` (see `run_key`), committed with
    the results; checkpoints of unfinished runs live in `<work>/runs/<dataset>-<key>/`. A table run again
    loads those instead of training, and an EARL run that was interrupted resumes from its last checkpoint, so
    a table of many 2-hour runs can be completed over several sittings by repeating its command. `--report`
    trains nothing and writes the table from the finished runs; `--fresh` trains everything again.
    """

    def __init__(self, table: str, args: argparse.Namespace):
        self.table, self.args = table, args
        self.name = f"paper_{table}" + ("_quick" if args.quick else "") + (f"_{args.tag}" if args.tag else "")
        self.work = args.work / self.name
        self.records: list[dict] = []
        self._datasets: dict[str, Dataset] = {}
        # Others commit while a table runs for hours: the commit the code was loaded from, beside the one at write.
        self.started = {"commit": environment()["commit"], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def dataset(self, name: str) -> Dataset:
        if name not in self._datasets:
            self._datasets[name] = load_dataset(self.args.datasets / name)
        return self._datasets[name]

    def budget(self, name: str, minutes: float, **overrides: Any) -> Budget:
        st = SETTINGS[name]
        return Budget(minutes=minutes, eval_every=st.eval_every, eval_max_triples=st.eval_max_triples, **overrides)

    @staticmethod
    def matches(label: str, texts: list[str] | None) -> bool:
        """Whether the label contains one of the strings (any case): `--only`, `--retest`."""
        return any(t.lower() in label.lower() for t in texts or ())

    def retest(self, rec: dict, fn: partial, train_dir: Path, done: Path) -> dict:
        """`--retest`: test a finished run's best checkpoint again with the current code, keep the old figures."""
        protocols = fn.keywords.get("protocols", ("seen",))
        print(f"    retesting {train_dir} under {', '.join(protocols)}", flush=True)
        return _amend(rec, done, "retested", {"test": test_earl(fn.args[0], train_dir, protocols)}, before="test")

    def revalidate(self, rec: dict, fn: partial, train_dir: Path, done: Path) -> dict:
        """`--revalidate`: a finished run of this repository's trainer that ended between two validations (records
        written before the trainer validated a run's last step) gets that validation now. The run resumes from
        its final checkpoint with its budget already spent, so it trains no step: the last step is validated,
        kept if it is the best, and the best tested. The old figures are kept under 'revalidated'; the record's
        training measurements (load, wall-clock, commit) stay those of the training."""
        print(f"    validating the last step ({rec['steps']}) of {train_dir}", flush=True)
        new = fn(train_dir)
        if new["steps"] != rec["steps"]:
            raise RuntimeError(f"{train_dir}: revalidating trained {new['steps'] - rec['steps']} more steps")
        return _amend(rec, done, "revalidated",
                      {k: new[k] for k in ("best_step", "valid", "test", "history", "artifact_bytes")})

    def run(self, label: str, dataset: str, fn: partial, **extra: Any) -> dict:
        """Run one training (or reuse its finished record), tag and keep its record or error, save what we have."""
        key = run_key(dataset, fn)
        run_dir = self.args.work / "runs" / f"{dataset}-{key}"  # by key alone: another table's label finds it
        done = self.record_path(dataset, key)
        legacy = run_dir / "record.json"  # where records lived before they were committed
        print(f"[{time.strftime('%H:%M:%S')}] {self.name}: {dataset} / {label} ({run_dir.name})", flush=True)
        if self.args.fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
            done.unlink(missing_ok=True)
        if not done.exists() and legacy.exists():
            done.parent.mkdir(parents=True, exist_ok=True)
            write_json(done, json.loads(legacy.read_text()))
        if done.exists():
            rec = json.loads(done.read_text())
            if self.matches(label, self.args.retest) and fn.func is run_earl and (run_dir / "train").exists():
                rec = self.retest(rec, fn, run_dir / "train", done)
            validated = rec.get("history", {}).get("eval_steps") or []
            unvalidated = bool(validated) and validated[-1] < rec["steps"]
            if (self.matches(label, self.args.revalidate) and fn.func is run_earl and unvalidated
                    and (run_dir / "train" / CHECKPOINT).exists()):
                rec = self.revalidate(rec, fn, run_dir / "train", done)
            rec = {**rec, "reused": True}
        elif self.args.report or (self.args.only and not self.matches(label, self.args.only)):
            rec = {"error": "not run yet", "pending": True}
        else:
            try:
                env = environment()  # the code this attempt runs, taken before a multi-hour run, and its machine:
                # a table's runs span sittings, and a sitting may get a machine of another speed
                rec = {**fn(run_dir / "train"), "run_key": key, "run_commit": env["commit"], "first_label": label,
                       "machine": env["machine"]}
                done.parent.mkdir(parents=True, exist_ok=True)
                write_json(done, rec)
            except Exception as exc:  # one failed peer must not lose the other runs of a multi-hour table
                traceback.print_exc()
                rec = {"error": f"{type(exc).__name__}: {exc}"}
        rec = {"label": label, "dataset": dataset, **extra, **rec}
        self.records.append(rec)
        if "error" not in rec:
            seen = rec["test"].get("seen", {})
            print(f"    #P {rec['parameters']:,}  steps {rec['steps']}  {rec['stopped']}  "
                  f"test MRR {seen.get('mrr', float('nan')):.4f}  H@10 {seen.get('hits_at_10', float('nan')):.4f}  "
                  f"train {rec['train_seconds']:.0f}s" + ("  (finished earlier)" if rec.get("reused") else ""),
                  flush=True)
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "partial.json").write_text(json.dumps(self.records, indent=1, default=str))
        return rec

    def record_path(self, dataset: str, key: str) -> Path:
        """Where a finished run's record is kept (committed): by dataset and run key, shared by every table."""
        return self.args.records / f"{dataset}-{key}.json"

    def calibrate(self, label: str, dataset: str, fn: partial, steps: int) -> dict | None:
        """Time `steps` training steps of a finished run's configuration on this machine (no validation, no test),
        beside the step time its record measured on the machine that trained it; None if the run is not finished.

        A table's runs span sittings, and a sitting may get a machine of another speed: the ratio says how far a
        run's step count would move had it trained here.
        """
        done = self.record_path(dataset, run_key(dataset, fn))
        if not done.exists():
            return None
        rec = json.loads(done.read_text())
        print(f"[{time.strftime('%H:%M:%S')}] {self.name}: timing {steps} steps of {dataset} / {label}", flush=True)
        probe = Budget(minutes=60, max_steps=steps, eval_every=0)
        with tempfile.TemporaryDirectory(prefix="calibrate-") as out:
            args = [probe if isinstance(a, Budget) else a for a in fn.args]  # the run's budget, for a few steps
            here = fn.func(*args, Path(out), **{**fn.keywords, "final_eval": False})
        return {"label": label, "dataset": dataset, "run_key": rec.get("run_key"), "steps_timed": here["steps"],
                "median_step_seconds_here": here["median_step_seconds"],
                "median_step_seconds_recorded": rec["median_step_seconds"], "recorded_steps": rec["steps"],
                "recorded_machine": rec.get("machine"), "recorded_load_average_1min": rec.get("load_average_1min")}

    def write(self, data: dict, markdown: str) -> None:
        pending = sum(bool(r.get("pending")) for r in self.records)
        if pending:
            title, _, rest = markdown.partition("\n")
            markdown = (f"{title}\n\n**Incomplete**: {len(self.records) - pending} of {len(self.records)} runs "
                        "finished; the others show `not run yet`. Running the command without `--report` trains "
                        "them (finished runs are reused, an interrupted one resumes).\n" + rest)
        meta = {"table": self.table, "quick": self.args.quick, "seed": self.args.seed, "threads": 2,
                "started": self.started,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "runs": self.records}
        _, md = write_results(self.name, {**meta, **data}, markdown)
        print(md.read_text())

    def png(self, fig) -> str:
        return save_png(self.name, fig)


def _fmt_bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.2f} MB"


def _row_metrics(rec: dict, protocol: str = "seen") -> tuple:
    m = rec.get("test", {}).get(protocol, {})
    return m.get("mrr"), m.get("hits_at_10"), effi(rec, protocol)


def _status(rec: dict) -> str:
    if rec.get("pending"):
        return "not run yet"
    if "error" in rec:
        return "error: " + rec["error"][:80]
    if rec["stopped"] == "steps":  # a fixed-step design: the step count is the budget, not a shortfall
        return f"n/a (fixed {rec['steps']:,} steps)"
    return "yes (early stopping)" if rec["converged"] else f"no ({rec['stopped']})"


def _quick_note(args: argparse.Namespace) -> str:
    if args.tag:
        cut = [what for flag, what in ((args.no_search, "no settings search"), (args.no_rotate, "no RotatE curve"))
               if flag]
        return (f"\n**Partial run `{args.tag}`** (not the full mode): {', '.join(cut) or 'custom budget'}; "
                f"{args.minutes or 'default'} min per run; see the command below.\n")
    if not args.quick:
        return ""
    return ("\n**Quick mode**: CoDEx-S, a few minutes per run on a shared 2-core machine. A check that the whole "
            "path works and a first look, not the paper's numbers (the paper has no CoDEx-S figures).\n")


def _budget_line(recs: list[dict]) -> str:
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
            "wall-clock budget." + _machines_line(ok))


def _machines_line(recs: list[dict]) -> str:
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


# ---------------------------------------------------------------- main table


def cmd_main(args: argparse.Namespace) -> None:
    b = Bench("main", args)
    names = args.data or (["codex-s"] if args.quick else ["fb15k-237", "wn18rr"])
    minutes = args.minutes or (4.0 if args.quick else FULL_MINUTES)
    for name in names:
        ds, st = b.dataset(name), SETTINGS[name]
        budget = b.budget(name, minutes)
        earl = b.run(f"EARL+RotatE dim {st.earl_dim}", name,
                     partial(run_earl, ds, ModelConfig(dim=st.earl_dim, seed=args.seed), budget,
                             protocols=PROTOCOLS, seed=args.seed), row="earl")
        target = earl.get("parameters") or earl_parameters(ds, ModelConfig(dim=st.earl_dim))
        rdim = st.rotate_dim or dim_for_parameters(ds, ModelConfig(model="rotate"), target)
        why = "paper's small dim" if st.rotate_dim else "#P matched to EARL"
        b.run(f"RotatE dim {rdim} ({why})", name,
              partial(run_earl, ds, ModelConfig(model="rotate", dim=rdim, seed=args.seed), budget,
                      protocols=PROTOCOLS, seed=args.seed), row="rotate")
        if args.no_pykeen:
            continue
        pdim = pykeen_rotate_dim_for(ds, target)
        b.run(f"PyKEEN RotatE dim {pdim} (#P matched)", name,
              partial(run_pykeen, ds, "rotate", budget, dim=pdim, protocols=PROTOCOLS, seed=args.seed,
                      negatives_per_positive=args.pykeen_negatives), row="pykeen_rotate")
        width = nodepiece_width_for(ds, target, st.nodepiece)
        b.run(f"PyKEEN NodePiece+RotatE dim {width // 2} (#P matched)", name,
              partial(run_pykeen, ds, "nodepiece", budget, width=width, spec=st.nodepiece, protocols=PROTOCOLS,
                      seed=args.seed, negatives_per_positive=args.pykeen_negatives), row="pykeen_nodepiece")

    probe_md: list[str] = []
    if not args.no_pykeen and args.probe_steps:
        # What a step costs PyKEEN at the paper's negatives (256 per side = 512 per positive), beside this repo's.
        name = names[0]
        ds = b.dataset(name)
        probe = Budget(minutes=60, max_steps=args.probe_steps, eval_every=0)
        earl_rec = next(r for r in b.records if r["dataset"] == name and r["row"] == "earl")
        target = earl_rec.get("parameters") or earl_parameters(ds, ModelConfig(dim=SETTINGS[name].earl_dim))
        rdim = SETTINGS[name].rotate_dim or dim_for_parameters(ds, ModelConfig(model="rotate"), target)
        pdim = pykeen_rotate_dim_for(ds, target)
        b.run(f"probe: RotatE dim {rdim}, 256+256 negatives", name,
              partial(run_earl, ds, ModelConfig(model="rotate", dim=rdim), probe, final_eval=False), row="probe")
        b.run(f"probe: PyKEEN RotatE dim {pdim}, 512 negatives per positive", name,
              partial(run_pykeen, ds, "rotate", probe, dim=pdim, negatives_per_positive=512, final_eval=False),
              row="probe")
        probe_rows = [[r["label"], r.get("steps"), r.get("median_step_seconds")]
                      for r in b.records if r.get("row") == "probe"]
        probe_md = ["", f"Step-cost probe on {name} at the paper's negatives ({args.probe_steps} steps each, median over "
                    f"steps {WARMUP_STEPS + 1}+):", "", md_table(["run", "steps", "median s/step"], probe_rows)]
    md = ["# Main table (paper Tables 2 and 3): link prediction at a small parameter budget, same time budget",
          _quick_note(args), f"![test MRR against parameters]({_main_png(b, names)})", ""]
    for name in names:
        recs = [r for r in b.records if r["dataset"] == name]
        rows = []
        for protocol in PROTOCOLS:
            for r in recs:
                if r.get("row") == "probe":
                    continue
                mrr, h10, eff = _row_metrics(r, protocol)
                rows.append([protocol, r["label"], r.get("implementation", ""), r.get("dim"), r.get("parameters"), mrr,
                             h10, eff, r.get("train_seconds"), r.get("steps"), r.get("median_step_seconds"),
                             _fmt_bytes(r.get("artifact_bytes")), _status(r)])
        md += [f"## {name} (test split)", "",
               md_table(["protocol", "model", "implementation", "dim", "#P", "MRR", "Hits@10", "Effi (MRR/M#P)",
                         "train s", "steps", "s/step", "saved bytes", "converged?"], rows), "", _budget_line(recs), ""]
        if name in PAPER_MAIN:
            md += [f"Paper, {name} (reported, seen protocol, GPU, up to 100k steps):", "",
                   md_table(["model", "dim", "#P (M)", "MRR", "Hits@10"], [list(x) for x in PAPER_MAIN[name]]), ""]
    md += ["Protocols: `seen` drops test triples with an entity absent from train (the paper's); `all` ranks every "
           "test triple (entities first seen in test get an empty-neighbourhood embedding in EARL, an untrained "
           "vector drawn from the initial distribution in this repository's RotatE as in RotatE's own code, an "
           "untrained random vector in PyKEEN RotatE, padding tokens in NodePiece). "
           "Where no test triple has an unseen entity the two coincide. Filtered ranking against every entity, both "
           "directions, realistic ranks (ties count half). Effi = MRR per million trainable parameters.",
           "",
           f"PyKEEN rows: PyKEEN 1.11.1 components (sLCWA loop, NSSA loss with the same margin 10 and temperature "
           f"1, Adam lr 1e-3, batch 1024), {args.pykeen_negatives or 512} negatives per positive (filtered against "
           "train), validation on the same triples at the same step cadence with the same early stopping, 2 threads; "
           "parameter counts matched to EARL's. PyKEEN models are ranked by the harness from PyKEEN's own score "
           "(-||h o r - t||, in a matmul form checked against PyKEEN's `RankBasedEvaluator` in the tests): PyKEEN's "
           "evaluator took 100 s per FB15k-237 validation, which would have spent most of the budget. PyKEEN "
           "materialises every negative's embedding, so its steps cost more than this repository's fused kernel: "
           "`s/step` above, and the probe below at the paper's 256+256 negatives. Saved bytes: EARL/RotatE the fp32 "
           "safetensors bundle (weights + graph + vocabularies); PyKEEN `torch.save(state_dict)`.",
           *probe_md,
           "",
           "`converged?`: yes when early stopping ended training (patience exhausted) within the budget; otherwise "
           "the budget (time_limit) or the step cap ended it and the best validation checkpoint so far was tested."]
    b.write({"datasets": names, "minutes_per_run": minutes, "pykeen_negatives_per_positive": args.pykeen_negatives},
            "\n".join(md))


def _label_below(x: float, y: float, points: list[tuple], ax) -> bool:
    """Whether a run's label goes below its point: when a higher run sits close to its right, under where the label
    (about 45% of the axes wide) would run (WN18RR's PyKEEN RotatE 3.77M / 0.472 beside RotatE dim 50 4.06M / 0.474)."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    return any(0 < px - x < 0.45 * (x1 - x0) and 0 <= py - y < 0.04 * (y1 - y0) for px, py, _ in points)


def _main_png(b: Bench, names: list[str]) -> str:
    """Test MRR (seen) against #P per dataset: the finished runs here, filled, beside the paper's, hollow."""
    plt = pyplot()
    colour = {"earl": "C0", "rotate": "C1", "pykeen_rotate": "C2", "pykeen_nodepiece": "C3"}
    paper_colour = {"EARL+RotatE": "C0", "RotatE": "C1", "NodePiece+RotatE": "C3"}
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        points = [(r["parameters"] / 1e6, mrr, r) for r in b.records
                  if r["dataset"] == name and r.get("row") in colour and (mrr := _row_metrics(r)[0]) is not None]
        for x, y, r in points:
            ax.scatter(x, y, c=colour[r["row"]], zorder=3)
        for model, dim, params, mrr, _ in (x for x in PAPER_MAIN.get(name, []) if x[2] < 10):  # large dims: off-scale
            ax.scatter(params, mrr, facecolors="none", edgecolors=paper_colour[model], zorder=2)
            ax.annotate(f"paper: {model} {dim}", (params, mrr), fontsize=7, color="grey", xytext=(4, -9),
                        textcoords="offset points")
        ax.margins(x=0.3, y=0.15)
        for x, y, r in points:  # after the margins: label placement reads the axes' limits
            ax.annotate(r["label"], (x, y), fontsize=7, xytext=(4, -9 if _label_below(x, y, points, ax) else 3),
                        textcoords="offset points")
        ax.scatter([], [], c="grey", label="filled: this table's runs (CPU budget)")
        ax.scatter([], [], facecolors="none", edgecolors="grey", label="hollow: paper (GPU, to convergence)")
        ax.legend(fontsize=7, loc="best")
        ax.set(xlabel="trainable parameters (M)", ylabel="test MRR (filtered, seen)", title=name)
        ax.grid(alpha=0.3)
    return b.png(fig)


# ---------------------------------------------------------------- ablation


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

    md = ["# Ablations (paper Tables 2 and 3, lower half)", _quick_note(args)]
    equal_steps = {}
    for name, _ in plan:
        recs = [r for r in b.records if r["dataset"] == name]
        full = next((r for r in recs if r["ablation"] == "full" and "error" not in r), None)
        base = _row_metrics(full)[0] if full else None
        paper = PAPER_ABLATION.get(name, {})
        common = _common_eval_step(recs)
        equal_steps[name] = common
        rows = []
        for r in recs:
            mrr, h10, eff = _row_metrics(r)
            rows.append([r["label"], r.get("parameters"), mrr, h10, eff,
                         None if mrr is None or base is None else mrr - base, paper.get(r["ablation"]),
                         r.get("steps"), r.get("median_step_seconds"), r.get("train_seconds"),
                         _valid_mrr_at(r, common), _status(r)])
        at = "valid MRR at step " + (f"{common:,}" if common else "n/a")
        md += [f"## {name} (test, seen protocol, EARL dim {SETTINGS[name].earl_dim})", "",
               md_table(["variant", "#P", "MRR", "Hits@10", "Effi", "MRR - full", "paper MRR", "steps", "s/step",
                         "train s", at, "converged?"], rows), "", _budget_line(recs), ""]
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


def _common_eval_step(recs: list[dict]) -> int | None:
    """The last validation step that every finished run of a table recorded (None if they share none)."""
    steps = [set(r["history"]["eval_steps"]) for r in recs if "error" not in r and r.get("history")]
    return max(set.intersection(*steps), default=None) if steps else None


def _valid_mrr_at(rec: dict, step: int | None) -> float | None:
    hist = rec.get("history") or {}
    return dict(zip(hist.get("eval_steps", []), hist.get("eval_mrr", []), strict=True)).get(step)


# ---------------------------------------------------------------- parameter budget (Figure 4)


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
        _write_calibration(b, name, [(label, fn) for label, fn, _, _ in points], args.calibrate)
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
    rows = [[r["label"], r.get("target_parameters"), r.get("parameters"), *_row_metrics(r), r.get("steps"),
             r.get("train_seconds"), _status(r)] for r in b.records]
    md = [f"# MRR against parameter budget (paper Figure 4) on {name}", _quick_note(args), f"![MRR vs #P]({png})", "",
          md_table(["model", "target #P", "#P", "MRR", "Hits@10", "Effi", "steps", "train s", "converged?"], rows),
          "", _budget_line(b.records), "",
          "EARL's #P is varied through its dim (reserved ratio 0.1); RotatE's through its dim. Test split, seen "
          "protocol. The same wall-clock budget for every point: larger models do fewer steps in it."]
    b.write({"dataset": name, "targets_millions": targets, "minutes_per_run": minutes}, "\n".join(md))


def _write_calibration(b: Bench, dataset: str, runs: list[tuple[str, partial]], steps: int) -> None:
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
    _, md_path = write_results(f"{b.name}_calibration", meta, "\n".join(md))
    print(md_path.read_text())


# ---------------------------------------------------------------- k sweep (Figure 5)


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
    rows = [[r["k"], r.get("parameters"), *_row_metrics(r)[:2], r.get("steps"), r.get("train_seconds"), _status(r)]
            for r in b.records]
    md = [f"# Effect of k in kNResEnt (paper Figure 5) on {name}", _quick_note(args), f"![MRR vs k]({png})", "",
          md_table(["k", "#P", "MRR", "Hits@10", "steps", "train s", "converged?"], rows), "", _budget_line(b.records),
          "", f"EARL dim {st.earl_dim}, reserved ratio 0.1, test split, seen protocol. k changes no parameter count."]
    b.write({"dataset": name, "ks": ks, "minutes_per_run": minutes, "steps_per_run": steps}, "\n".join(md))


# ---------------------------------------------------------------- convergence + settings search


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


def _searched_run(ds: Dataset, cfg: ModelConfig, budget: Budget, opt: dict, overrides: dict, seed: int) -> partial:
    """The EARL run of one search entry (Optim overrides, run overrides) under `budget`."""
    return partial(run_earl, ds, cfg, budget, optim=Optim(**opt), protocols=PROTOCOLS,
                   seed=seed, bf16=overrides.get("bf16", False))


def _validation_share(rec: dict) -> float | None:
    """Share of the training budget spent outside training steps (validation, checkpoints); None for records
    written before `step_seconds_total` was kept."""
    total, train = rec.get("step_seconds_total"), rec.get("train_seconds")
    return None if total is None or not train else max(0.0, 1.0 - total / train)


def cmd_convergence(args: argparse.Namespace) -> None:
    b = Bench("convergence", args)
    names = args.data or (["codex-s"] if args.quick else ["fb15k-237", "wn18rr"])
    curve_minutes = args.minutes or (4.0 if args.quick else FULL_MINUTES)
    search_minutes = args.search_minutes or (1.5 if args.quick else FULL_SEARCH_MINUTES)
    search_on = names[0]

    # 1. The search, on the first dataset, EARL at the paper's dim; selection by validation MRR.
    ds, st = b.dataset(search_on), SETTINGS[search_on]
    base_budget = b.budget(search_on, search_minutes)
    skipped: list[str] = []
    for label, opt, bud in [] if args.no_search else SEARCH:
        if bud.get("bf16") and not cpu_has_native_bf16():
            print(f"    skipping '{label}': this CPU has no native bfloat16 matmul (emulated, several times slower)")
            skipped.append(label)
            continue
        b.run(f"search: {label}", search_on,
              _searched_run(ds, ModelConfig(dim=st.earl_dim, seed=args.seed), base_budget, opt, bud, args.seed),
              phase="search", setting=label, optim_overrides=opt, budget_overrides=bud)
    searched = [r for r in b.records if r.get("phase") == "search" and "error" not in r]
    best = max(searched, key=lambda r: r["valid"].get("mrr", -1)) if searched else None
    best_opt, best_bud = (best["optim_overrides"], best["budget_overrides"]) if best else ({}, {})

    # 2. Curves at the full budget: EARL (paper settings and best found), RotatE (paper settings), per dataset.
    for name in names:
        ds, st = b.dataset(name), SETTINGS[name]
        budget = b.budget(name, curve_minutes)
        earl_cfg = ModelConfig(dim=st.earl_dim, seed=args.seed)
        b.run("EARL, paper settings", name,
              partial(run_earl, ds, earl_cfg, budget, protocols=PROTOCOLS, seed=args.seed),
              phase="curve", model_kind="earl")
        if best is not None and best["setting"] != "paper settings":
            b.run(f"EARL, best searched ({best['setting']})", name,
                  _searched_run(ds, earl_cfg, budget, best_opt, best_bud, args.seed), phase="curve", model_kind="earl")
        if args.no_rotate:
            continue
        target = earl_parameters(ds, earl_cfg)
        rdim = st.rotate_dim or dim_for_parameters(ds, ModelConfig(model="rotate"), target)
        b.run(f"RotatE dim {rdim}, paper settings", name,
              partial(run_earl, ds, ModelConfig(model="rotate", dim=rdim, seed=args.seed), budget,
                      protocols=PROTOCOLS, seed=args.seed),
              phase="curve", model_kind="rotate")

    plt = pyplot()
    curves = [r for r in b.records if r.get("phase") == "curve" and "error" not in r]
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
    png = b.png(fig)

    search_rows = [[r["setting"], r.get("valid", {}).get("mrr"), *_row_metrics(r)[:2], r.get("steps"),
                    r.get("median_step_seconds"), len(r.get("history", {}).get("eval_mrr", [])),
                    _validation_share(r), _status(r)] for r in b.records if r.get("phase") == "search"]
    shares = [x for r in b.records if (x := _validation_share(r)) is not None]
    cadence = (f"Validation cadence: validating (every {SETTINGS[search_on].eval_every} steps on at most "
               f"{SETTINGS[search_on].eval_max_triples} triples on {search_on}) and checkpointing took "
               f"{min(shares):.1%}-{max(shares):.1%} of the budget across these runs ('validation share'), the most "
               "that validating less often could give back to training." if shares else
               "Validation cadence: no run here recorded its step time total, so the cost of validating is unmeasured.")
    curve_rows = [[r["dataset"], r["label"], r.get("parameters"), *_row_metrics(r)[:2], r.get("steps"),
                   r.get("train_seconds"), _status(r)] for r in b.records if r.get("phase") == "curve"]
    gap = []
    for name in names:
        recs = [r for r in curves if r["dataset"] == name and r["model_kind"] == "earl"]
        if name not in PAPER_TARGET:
            gap.append(f"- {name}: the paper has no figure for this dataset, so there is no gap to state here.")
            continue
        want, max_p = PAPER_TARGET[name]
        if not recs:
            gap.append(f"- {name}: no EARL run finished.")
            continue
        top = max(recs, key=lambda r: r["test"]["seen"]["mrr"])
        got, curve = top["test"]["seen"]["mrr"], top["history"]["eval_mrr"]
        verdict = "reached" if got >= want else f"short by {want - got:.4f}"
        still = (not top["converged"]) and bool(curve) and curve[-1] >= max(curve) - 1e-9
        gap.append(f"- {name}: best EARL test MRR {got:.4f} with {top['parameters'] / 1e6:.2f}M parameters in "
                   f"{top['train_seconds'] / 60:.0f} min ({top['label']}); the paper's target is >= {want:.3f} at <= "
                   f"{max_p / 1e6:.1f}M: {verdict}"
                   + (", and validation MRR was still at its best when the budget ended." if still else "."))
    if not any(n in PAPER_TARGET for n in names):
        full_runs = len(SEARCH) + 2 * 3  # the search, then 3 curves on each of FB15k-237 and WN18RR
        full_hours = (len(SEARCH) * FULL_SEARCH_MINUTES + 2 * 3 * FULL_MINUTES) / 60
        gap.append("- The paper's CPU claim (FB15k-237 MRR >= 0.310 at <= 1.8M parameters and WN18RR >= 0.440 at "
                   "<= 3.8M within 2 hours of 2-core CPU) is **untested by this run**: it needs the full mode "
                   f"(`python bench/paper.py convergence`: {full_runs} runs, {full_hours:.1f} h of training budget).")
    md = ["# Convergence on CPU: validation MRR against wall-clock, and a search over training settings",
          _quick_note(args), f"![valid MRR vs wall-clock]({png})", "",
          f"## Settings search (EARL dim {SETTINGS[search_on].earl_dim} on {search_on}, {search_minutes:g} min each, "
          "one factor at a time around the paper's settings; chosen by validation MRR)", "",
          ("The factors searched here change what a CPU step costs (batch, negatives, precision); lr, temperature and "
           "margin do not, and `bench/step_search.py` compares them at a fixed step count on any device."), "",
          md_table(["setting", "valid MRR", "test MRR", "test Hits@10", "steps", "median s/step", "validations",
                    "validation share", "converged?"], search_rows), "", cadence, "",
          *([f"Not run on this machine: {', '.join(skipped)} (its CPU has no native bfloat16 matmul, so autocast "
             "is emulated and several times slower than float32).", ""] if skipped else []),
          f"Best by validation MRR: **{best['setting'] if best else 'none'}**.", "",
          f"## Curves ({curve_minutes:g} min per run)", "",
          md_table(["dataset", "run", "#P", "test MRR", "test Hits@10", "steps", "train s", "converged?"], curve_rows),
          "", _budget_line([r for r in b.records if r.get("phase") == "curve"]), "",
          "## Gap to the paper", "", *gap]
    b.write({"datasets": names, "search_dataset": search_on, "search_minutes": search_minutes,
             "curve_minutes": curve_minutes, "best_setting": best["setting"] if best else None}, "\n".join(md))


# ---------------------------------------------------------------- CLI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=["main", "ablation", "budget", "ksweep", "convergence"])
    parser.add_argument("--quick", action="store_true", help="CoDEx-S, minutes per run")
    parser.add_argument("--datasets", type=Path, default=default_datasets(), help="folder holding the datasets")
    parser.add_argument("--data", nargs="+", choices=sorted(SETTINGS), help="which datasets (default per table)")
    parser.add_argument("--minutes", type=float, help="wall-clock budget per run (default per table and mode)")
    parser.add_argument("--converge-minutes", type=float, default=180.0,
                        help="cap for 'to convergence' runs in full mode (early stopping normally ends them)")
    parser.add_argument("--search-minutes", type=float, help="budget per settings-search run (convergence)")
    parser.add_argument("--no-search", action="store_true", help="convergence: skip the settings search")
    parser.add_argument("--no-rotate", action="store_true", help="convergence: EARL curves only")
    parser.add_argument("--tag", default="", help="suffix for the results files of a partial or custom run")
    parser.add_argument("--targets", type=float, nargs="+", help="budget: parameter targets in millions")
    parser.add_argument("--ks", type=int, nargs="+", help="ksweep: values of k")
    parser.add_argument("--steps", type=int,
                        help=f"ksweep: training steps per k, no early stopping (full mode default {KSWEEP_STEPS}; "
                             "quick mode: its minutes only)")
    parser.add_argument("--pykeen-negatives", type=int, default=64,
                        help="main: PyKEEN negatives per positive (0: the paper's 512, i.e. 256 per side)")
    parser.add_argument("--no-pykeen", action="store_true", help="main: skip the PyKEEN rows")
    parser.add_argument("--probe-steps", type=int, default=6,
                        help="main: steps timed at the paper's negatives for RotatE here and in PyKEEN (0: skip)")
    parser.add_argument("--calibrate", type=int, metavar="STEPS",
                        help="budget: train nothing for the table; time STEPS steps of each finished run's "
                             "configuration on this machine against its record (<table>_calibration.{json,md})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("runs/bench_paper"),
                        help="scratch: unfinished runs' checkpoints (WORK/runs/<dataset>-<key>/train), partial tables")
    parser.add_argument("--records", type=Path, default=RECORDS,
                        help="finished-run records (committed, so that tables accumulate across sittings)")
    parser.add_argument("--report", action="store_true",
                        help="train nothing: write the table from the runs finished so far")
    parser.add_argument("--fresh", action="store_true", help="train every run again, ignoring finished ones")
    parser.add_argument("--retest", nargs="+", metavar="TEXT",
                        help="test the finished runs of this repository's trainer whose label contains one of these "
                             "again with the current code, from their best checkpoint under --work (the record keeps "
                             "the earlier figures under 'retested')")
    parser.add_argument("--revalidate", nargs="+", metavar="TEXT",
                        help="finished runs of this repository's trainer whose label contains one of these and that "
                             "ended between two validations: validate their last step from the final checkpoint "
                             "under --work, keep it if best, test the best (old figures kept under 'revalidated')")
    parser.add_argument("--only", nargs="+", metavar="TEXT",
                        help="train only the runs whose label contains one of these (e.g. NodePiece); the others "
                             "are reported as finished earlier or not run yet, as with --report")
    args = parser.parse_args()
    if args.calibrate is not None and args.calibrate <= WARMUP_STEPS:
        parser.error(f"--calibrate needs more than {WARMUP_STEPS} steps: the trainer's median step time skips the "
                     f"first {WARMUP_STEPS} (warm-up)")
    import torch

    torch.set_num_threads(2)
    {"main": cmd_main, "ablation": cmd_ablation, "budget": cmd_budget, "ksweep": cmd_ksweep,
     "convergence": cmd_convergence}[args.table](args)


if __name__ == "__main__":
    main()
