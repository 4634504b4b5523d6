"""The paper tables' run cache: every run keyed by what decides its outcome, finished ones reused across tables
and sittings, interrupted ones resumed; `Bench` is one table's sitting over that cache."""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

from harness import environment, save_png, write_results
from trainers import Budget, run_earl, run_pykeen, test_earl

from earl_service.atomic import write_json
from earl_service.data import Dataset, load_dataset
from earl_service.train.loop import CHECKPOINT
from paper_tables.settings import SETTINGS


def amend(rec: dict, done: Path, why: str, figures: dict, before: str | None = None) -> dict:
    """A finished record with `figures` replaced, saved to `done`; the old ones stay under `why` (with the
    commit and date), as `rec[before]` when given, else as a dict of the replaced keys."""
    old = rec[before] if before else {k: rec[k] for k in figures}
    rec = {**rec, **figures, why: {"commit": environment()["commit"], "before": old,
                                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    write_json(done, rec)
    return rec



# The committed records were keyed when both trainers lived in bench/harness.py: their names then, or every finished
# run would be trained again.
KEYED_AS = {run_earl: "harness.run_earl", run_pykeen: "harness.run_pykeen"}


def run_key(dataset: str, fn: partial) -> str:
    """What decides a run's outcome: the trainer, the dataset and every argument (defaults filled in), hashed.

    Tables share runs through it (the main table's EARL row at the paper's settings is also the convergence
    curve and the ablation's full model), and a table run again reuses every run already finished.
    """
    bound = inspect.signature(fn.func).bind_partial(*fn.args, **fn.keywords)
    bound.apply_defaults()
    args = {k: v for k, v in bound.arguments.items() if not isinstance(v, Dataset)}
    trainer = KEYED_AS.get(fn.func) or f"{fn.func.__module__}.{fn.func.__qualname__}"
    text = f"{trainer}|{dataset}|{sorted(args.items())!r}"
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
        return amend(rec, done, "retested", {"test": test_earl(fn.args[0], train_dir, protocols)}, before="test")

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
        return amend(rec, done, "revalidated",
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
        self.write_file(self.name, {**meta, **data}, markdown)

    def write_file(self, name: str, data: dict, markdown: str) -> None:
        """Write `name`.{json,md} to bench/results/ (the table's own files, or a companion such as its calibration)."""
        _, md = write_results(name, data, markdown)
        print(md.read_text())

    def png(self, fig) -> str:
        return save_png(self.name, fig)
