"""`earl compress`: the most accurate bundle under a byte budget, by successive halving over models and dims."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from earl_service.atomic import write_json
from earl_service.bundle.codebooks import NUMBERS_PER_CODE, codes_for
from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.precision import Precision, ProductQuantized
from earl_service.bundle.sizes import MIN_DIM, BundleSizes, save_exact
from earl_service.compress.config import METRICS, CompressConfig
from earl_service.config import ModelConfig, ModelKind, TrainConfig
from earl_service.config.options import train_configs_from_options
from earl_service.config.recipes import DEFAULT
from earl_service.data.dataset import Dataset
from earl_service.errors import ConfigError, DatasetError
from earl_service.train.evaluate import SUMMARY_KEYS
from earl_service.train.finetune import FineTune, fine_tune
from earl_service.train.loop import BUNDLE, Run, load_run, resolve_device, train

log = logging.getLogger(__name__)

STATE, PICK = "compress_state.json", "bundle.safetensors"
EVAL_SHARE = 0.5  # most of the time limit the search's validations may take (candidates are dropped to fit)
# Codebook fine-tuning of a candidate's pq exports: this share of its training slice on top (charged in every
# slice as slice_training plans it), and at most this many steps per export.
FINE_TUNE_SHARE, FINE_TUNE_STEPS = 0.25, 300
# Rungs before the last rank their candidates on one fixed random subset of at most this many valid triples (the
# same for every candidate); the last rung, whose scores choose the pick, on the whole split. A full validation of
# FB15k-237 (17,535 triples) takes 8-30 s on one core, so validating every export of a dozen candidates on it took
# more than rung 0's minutes and left nothing for training.
EARLY_VALID_TRIPLES = 2000
ProgressCallback = Callable[[dict[str, Any]], None]


@dataclass
class Job:
    """One compress job: its inputs and the state that survives a restart (saved as STATE after every step)."""

    dataset: Dataset
    out: Path
    config: CompressConfig
    train_configs: Mapping[ModelKind, TrainConfig]  # how each model kind's candidates train
    state: dict[str, Any]
    on_progress: ProgressCallback | None = None
    should_stop: Callable[[], bool] | None = None
    started: float = field(default_factory=time.monotonic)
    spent_before: float = 0.0

    @property
    def spent(self) -> float:
        return self.spent_before + time.monotonic() - self.started

    @property
    def time_left(self) -> float:
        return max(0.0, self.config.time_limit_minutes * 60 - self.spent)

    def save(self) -> None:
        self.state["spent_seconds"] = self.spent
        write_json(self.out / STATE, self.state)

    def emit(self, stage: str, candidate: str | None = None, **extra: Any) -> None:
        if self.on_progress is not None:
            rungs = self.state["rungs"]
            self.on_progress({"stage": stage, "candidate": candidate, "rung": len(rungs) - 1 if rungs else None,
                              "rungs": self.state.get("rung_count"), "time_left": self.time_left, **extra})

    def unit(self, name: str) -> dict[str, Any]:
        return next(u for u in self.state["candidates"] if u["name"] == name)

    def train_config(self, name: str) -> TrainConfig:
        """How candidate `name` trains: its model kind's TrainConfig."""
        return self.train_configs[self.unit(name)["model"]]

    def run_dir(self, name: str) -> Path:
        return self.out / "candidates" / name

    def export_path(self, name: str, precision: str) -> Path:
        """Where candidate `name`'s best weights are saved at `precision` (evaluated, and the pick's source)."""
        return self.run_dir(name) / f"export-{precision}.safetensors"


# ---------------------------------------------------------------- planning: candidates and checks before training


def plan_candidates(sizes: BundleSizes, config: CompressConfig) -> list[dict[str, Any]]:
    """Per model: the largest dim that fits at each precision (and pq code size), and half the smallest of those;
    each trained once in fp32 and exported at every precision that fits at its dim. Raises when nothing fits."""
    units = []
    uniform = [p for p in config.precisions if not Precision.parse(p).codes_tables]
    for model in config.models:
        tops = [d for p in uniform if (d := sizes.max_dim(model, p, config.max_bytes))]
        tops += [d for dim_of in pq_searches(config) if (d := dim_of(sizes, model, config.max_bytes))]
        if not tops:
            continue
        dims = set(tops) | ({min(tops) // 2} if min(tops) // 2 >= MIN_DIM else set())
        for dim in sorted(dims, reverse=True):
            wanted = uniform + pq_precisions(sizes, config, model, dim)
            fitting = {p: b for p in wanted if (b := sizes.bytes(model, dim, p)) <= config.max_bytes}
            if not fitting:  # half a pq:M dim that M does not divide, or where M codes nothing
                continue
            units.append({"name": f"{model}-d{dim}", "model": model, "dim": dim, "bytes": fitting,
                          "config": sizes.config(model, dim).to_dict()})
    if not units:
        floors = uniform or [ProductQuantized.FALLBACK.name]  # pq alone: no smaller than its fallback's weights
        smallest = min((sizes.bytes(m, MIN_DIM, p), m, p) for m in config.models for p in floors)
        raise ConfigError(
            f"max_bytes {config.max_bytes} is below the smallest bundle for this graph: {smallest[0]} bytes "
            f"({smallest[1]} dim {MIN_DIM} {smallest[2]}); the graph and vocabularies alone take "
            f"{sizes.fixed_bytes()} bytes")
    return units


PQDim = Callable[[BundleSizes, ModelKind, int], int | None]


def pq_searches(config: CompressConfig) -> list[PQDim]:
    """For each pq spelling asked for, how to find the largest dim that fits: `pq` at each NUMBERS_PER_CODE,
    `pq:M` with M fixed (dims where M divides 2 * dim)."""
    searches: list[PQDim] = []
    for precision in map(Precision.parse, config.precisions):
        if isinstance(precision, ProductQuantized) and not precision.codes:
            searches += [partial(_pq_dim_per_code, per_code=n) for n in NUMBERS_PER_CODE]
        elif isinstance(precision, ProductQuantized):
            searches.append(partial(_pq_dim_fixed, codes=precision.codes))
    return searches


def _pq_dim_per_code(sizes: BundleSizes, model: ModelKind, max_bytes: int, *, per_code: int) -> int | None:
    dim = sizes.max_pq_dim(model, per_code, max_bytes)
    return dim if dim and sizes.pq_codes(model, dim, ProductQuantized(codes_for(dim, per_code) or 0)) else None


def _pq_dim_fixed(sizes: BundleSizes, model: ModelKind, max_bytes: int, *, codes: int) -> int | None:
    dim = sizes.max_pq_codes_dim(model, codes, max_bytes)
    return dim if dim and sizes.pq_codes(model, dim, ProductQuantized(codes)) else None


def pq_precisions(sizes: BundleSizes, config: CompressConfig, model: ModelKind, dim: int) -> list[str]:
    """The pq:M exports of a (model, dim) candidate: each asked-for code size that divides its rows and codes at
    least one table (one that codes none would be int8 by another name)."""
    out = []
    for precision in map(Precision.parse, config.precisions):
        m = precision.codes if isinstance(precision, ProductQuantized) else None
        codes = [codes_for(dim, n) for n in NUMBERS_PER_CODE] if m == 0 else [m] if m else []
        out += [ProductQuantized(c).name for c in codes
                if c and (2 * dim) % c == 0 and sizes.pq_codes(model, dim, ProductQuantized(c))]
    return list(dict.fromkeys(out))


def rung_sizes(count: int, eta: int) -> list[int]:
    """Candidates per rung: count, ceil(count / eta), ... down to 1."""
    sizes = [count]
    while sizes[-1] > 1:
        sizes.append(math.ceil(sizes[-1] / eta))
    return sizes


def validation_seconds(dataset: Dataset, sizes: BundleSizes, units: list[dict],
                       train_configs: Mapping[ModelKind, TrainConfig]) -> dict[str, dict[int, float]]:
    """Seconds of one validation pass of each model's largest and smallest candidates (untrained), measured here:
    {model: {dim: seconds}}."""
    measured: dict[str, dict[int, float]] = {}
    for model in dict.fromkeys(u["model"] for u in units):
        dims = [u["dim"] for u in units if u["model"] == model]
        train_config = train_configs[model]
        measured[model] = {}
        for dim in sorted({max(dims), min(dims)}, reverse=True):
            run = Run.build(dataset, sizes.config(model, dim), resolve_device(train_config.device))
            times = []
            for _ in range(2):  # the first pass also builds the known-answer filter and warms caches
                start = time.perf_counter()
                run.evaluate("valid", batch_size=train_config.eval_batch_size)
                times.append(time.perf_counter() - start)
            measured[model][dim] = min(times)
    return measured


def with_validation_estimates(units: list[dict], measured: Mapping[str, Mapping[int, float]]) -> list[dict]:
    """Each candidate with the seconds of one validation pass at its dim ("validation_seconds"), interpolated
    linearly in dim between its model's measured dims. Scoring every entity costs about the dim, so charging
    every candidate its model's largest's time starved the small ones: on FB15k-237 at 8 MB (one core) RotatE
    d1540 took 69 s a pass, and RotatE d32, charged that for each of its exports, trained 3 s of its 51-s slice."""
    estimated = []
    for u in units:
        points = sorted(measured[u["model"]].items())
        (d0, s0), (d1, s1) = points[0], points[-1]
        seconds = s1 if d1 == d0 else s0 + (s1 - s0) * (u["dim"] - d0) / (d1 - d0)
        estimated.append({**u, "validation_seconds": max(seconds, 0.0)})
    return estimated


def largest_validation_seconds(measured: Mapping[str, Mapping[int, float]]) -> dict[str, float]:
    """Each model's validation pass at its largest candidate's dim (what the report and errors quote)."""
    return {model: by_dim[max(by_dim)] for model, by_dim in measured.items()}


def unit_validation_seconds(unit: dict, seconds: Mapping[str, float]) -> float:
    """One validation pass of `unit`: its own estimate, else its model's (a job saved before the estimates)."""
    return unit.get("validation_seconds", seconds[unit["model"]])


def valid_fraction(dataset: Dataset, limit: int) -> float:
    """The share of a whole validation that one on at most `limit` triples costs (0: the whole split)."""
    return min(1.0, limit / max(len(dataset.split("valid")), 1)) if limit else 1.0


def validation_cost(units: list[dict], seconds: dict[str, float], eta: int, early_fraction: float = 1.0) -> float:
    """Seconds the whole halving schedule spends validating: every export of each rung's survivors, on the
    subset (`early_fraction` of a whole validation) before the last rung."""
    per_candidate = sum(unit_validation_seconds(u, seconds) * len(u["bytes"]) for u in units) / len(units)
    sizes = rung_sizes(len(units), eta)
    return per_candidate * (early_fraction * sum(sizes[:-1]) + sizes[-1])


def fit_to_time(config: CompressConfig, units: list[dict], seconds: dict[str, float], early_fraction: float = 1.0,
                ) -> list[dict]:
    """Drop the smallest candidates until the schedule's validations take at most EVAL_SHARE of the time
    limit; refuse a limit shorter than validating the remaining candidates once."""
    limit, kept = config.time_limit_minutes * 60, list(units)
    while len(kept) > 1 and validation_cost(kept, seconds, config.eta, early_fraction) > EVAL_SHARE * limit:
        counts = {m: sum(u["model"] == m for u in kept) for m in seconds}
        crowded = max(counts, key=lambda m: counts[m])  # keep every model while another has more candidates
        kept.remove(min((u for u in kept if u["model"] == crowded), key=lambda u: u["dim"]))
    first = early_fraction if len(rung_sizes(len(kept), config.eta)) > 1 else 1.0  # rung 0's share of a validation
    need = sum(unit_validation_seconds(u, seconds) * len(u["bytes"]) for u in kept) * first
    if limit < need:
        raise ConfigError(
            f"a time limit of {config.time_limit_minutes:g} min is too short: validating {len(kept)} "
            f"candidate(s) once takes about {need:.1f} s here (one validation pass of each model's largest: "
            + ", ".join(f"{m} {s:.2f} s" for m, s in seconds.items())
            + f"); give at least {math.ceil(need / 60 / EVAL_SHARE)} min so that training gets time too")
    if len(kept) < len(units):
        log.info("kept %d of %d candidates so that validation takes at most %.0f%% of the time", len(kept),
                 len(units), 100 * EVAL_SHARE)
    return kept


def dataset_fingerprint(dataset: Dataset) -> str:
    digest = hashlib.sha256()
    for part in (dataset.train, dataset.valid):
        digest.update(part.tobytes() if part is not None else b"")
    return digest.hexdigest()[:16]


def new_state(job_config: CompressConfig, dataset: Dataset, sizes: BundleSizes, units: list[dict],
              seconds: dict[str, float]) -> dict[str, Any]:
    return {"settings": {**job_config.settings(), "dataset": dataset_fingerprint(dataset)},
            "graph_bytes": sizes.fixed_bytes(), "validation_seconds": seconds, "candidates": units,
            "rung_count": len(rung_sizes(len(units), job_config.eta)), "rungs": [], "spent_seconds": 0.0,
            "done": False}


def load_state(out: Path, config: CompressConfig, dataset: Dataset) -> dict[str, Any] | None:
    """The saved state of a job in `out` with the same settings (None if there is none); refuses another job's."""
    path = out / STATE
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    wanted = {**config.settings(), "dataset": dataset_fingerprint(dataset)}
    if state.get("settings") != wanted:
        raise ConfigError(f"{out} holds a compress job with other settings or data ({state.get('settings')}); "
                          "give another --out, or the same settings to continue it")
    return state


# ---------------------------------------------------------------- successive halving


def survivor_seconds(job: Job) -> float:
    """Training seconds planned for a candidate that survives every rung: each rung's equal share of the time
    limit, split among that rung's candidates (validation and exports make the real figure somewhat smaller)."""
    sizes = rung_sizes(len(job.state["candidates"]), job.config.eta)
    return sum(job.config.time_limit_minutes * 60 / len(sizes) / n for n in sizes)


def train_slice(job: Job, name: str, seconds: float) -> dict[str, Any] | None:
    """Train candidate `name` for about `seconds` more (continuing its checkpoint); None if stopped."""
    unit = job.unit(name)
    done_before = unit.get("train_seconds", 0.0)
    # train() counts time_limit_minutes from its checkpoint's elapsed time; 0 would mean no limit at all.
    limit = max(done_before + seconds, 1e-3) / 60
    # No validation inside train(): evaluate_exports validates every slice's weights, export by export, and a
    # second pass would take time from training (best.pt is then the slice's last weights).
    # A decaying schedule decays over what a candidate surviving every rung would train, not over each slice: a
    # slice's time limit grows rung by rung, and decaying to each slice's end would restart the rate every rung.
    config = replace(job.train_config(name), time_limit_minutes=limit, schedule_minutes=survivor_seconds(job) / 60,
                     seed=job.config.seed, progress=False, eval_every=0)

    def forward(progress: dict[str, Any]) -> None:
        job.emit("train", name, step=progress["step"], loss=progress["loss"], valid_mrr=progress["valid_mrr"])

    metrics = train(job.dataset, ModelConfig.from_dict(unit["config"]), config, job.run_dir(name), resume=True,
                    final_eval=False, on_progress=forward, should_stop=job.should_stop)
    if metrics["stopped"] == "cancelled":
        return None
    unit["train_seconds"], unit["steps"] = metrics["train_seconds"], metrics["steps"]
    return metrics


def evaluate_exports(job: Job, name: str, split: str = "valid", *, tune_seconds: float = 0.0, limit: int = 0,
                     ) -> dict[str, dict[str, Any]]:
    """Each precision's export of the candidate's best weights: its file bytes and `split` metrics of the
    dequantized weights (on the fixed subset of at most `limit` triples; 0: all, recorded as `valid_subset`).
    Quantized variants come from the same fp32 training, never a retraining; pq variants get faiss codebooks,
    then up to `tune_seconds` (shared among them) of codebook fine-tuning."""
    unit, run_dir, train_config = job.unit(name), job.run_dir(name), job.train_config(name)
    source = load_bundle(run_dir / BUNDLE)
    run = load_run(run_dir, job.dataset, device=train_config.device)
    coded = [p for p in unit["bytes"] if Precision.parse(p).codes_tables]
    subset = limit if 0 < limit < len(run.ranked_triples(split)) else 0
    results = {}
    for precision, expected in unit["bytes"].items():
        job.emit("evaluate", name, precision=precision)
        tables, tuning = None, {}
        if isinstance(chosen := Precision.parse(precision), ProductQuantized):
            tables = chosen.encode_tables(source.config, source.params, seed=job.config.seed)
            budget = FineTune(steps=FINE_TUNE_STEPS, seconds=tune_seconds / len(coded))
            started = time.monotonic()
            tables, budget = fine_tune(run, source.params, tables, train_config, budget)
            tuning = {"fine_tune_steps": len(budget.losses), "fine_tune_seconds": time.monotonic() - started}
        path = save_exact(source, job.export_path(name, precision), precision=precision,
                          metrics={"compress": {"candidate": name}}, expected=expected, pq_tables=tables)
        results[precision] = {"bytes": path.stat().st_size, **tuning, "valid_subset": subset,
                              **evaluate_bundle(run, path, split, batch_size=train_config.eval_batch_size,
                                                limit=limit)}
    return results


def evaluate_bundle(run: Run, path: Path, split: str, *, batch_size: int = 256, limit: int = 0) -> dict[str, Any]:
    """`split` metrics of the weights stored in bundle `path` (dequantized), through `run`'s model and graph, on
    Run.evaluate's fixed random subset of at most `limit` triples (0: all)."""
    params = {k: torch.from_numpy(v) for k, v in load_bundle(path).params.items()}
    run.model.load_state_dict(params, strict=False)  # every weight; the reserved ids are the run's own
    result = run.evaluate(split, batch_size=batch_size, limit=limit)
    return {k: result[k] for k in SUMMARY_KEYS}


def score(job: Job, results: dict[str, dict]) -> float:
    return max(r[METRICS[job.config.metric]] for r in results.values())


def validations(job: Job, name: str, limit: int) -> float:
    """Seconds of validating every export of candidate `name` on at most `limit` valid triples (0: all), from the
    validation pass timed before the search at its dim."""
    unit = job.unit(name)
    return (unit_validation_seconds(unit, job.state["validation_seconds"]) * len(unit["bytes"])
            * valid_fraction(job.dataset, limit))


def slice_training(job: Job, name: str, share: float, limit: int) -> float:
    """Training seconds of candidate `name` in a slice of `share` wall seconds: the slice less its validations (on
    at most `limit` triples) and the rest of its overhead (build, loading, exports) as measured at its last rung,
    with its pq exports' codebook fine-tuning on top of the training.

    Each part is charged as this rung will spend it, not as the last rung did: a rung before the last validates on
    a subset and the last on the whole split (8.8 times more on FB15k-237), and the fine-tuning grows with the
    slice. Carrying the overhead measured at the previous rung over unchanged undercounted the last rung of
    FB15k-237's 8 MB search by about 95 s of validations, and the job overran its 60 minutes by 69 s."""
    unit = job.unit(name)
    tuning = FINE_TUNE_SHARE if any(Precision.parse(p).codes_tables for p in unit["bytes"]) else 0.0
    rest = share - validations(job, name, limit) - unit.get("other_seconds", 0.0)
    return max(rest, 0.0) / (1 + tuning)


def test_reserve(job: Job) -> float:
    """Seconds to keep back for the pick's test evaluation after the last rung, at the slowest survivor's: a
    whole pass over the test split at its validation speed, and loading its run (its other overhead, as measured
    at its last rung)."""
    test, valid = job.dataset.test, job.dataset.split("valid")
    if test is None or not len(test):
        return 0.0
    units = [job.unit(n) for n in job.state["rungs"][-1]["survivors"]]
    return max(unit_validation_seconds(u, job.state["validation_seconds"]) * len(test) / max(len(valid), 1)
               + u.get("other_seconds", 0.0) for u in units)


def run_rung(job: Job) -> bool:
    """Train and evaluate every survivor of the current rung that has no result yet; False if stopped.

    Every survivor gets the same slice of the rung, fixed when the rung starts. A candidate that overruns its
    slice (at rung 0 its validations are estimates and the rest of its overhead unknown) takes the time from the
    later rungs, planned from the time left, not from the candidates after it: sharing out what was left instead
    starved the last four RotatE candidates of FB15k-237's 2 MB search to one step each at rung 0.
    """
    rung = job.state["rungs"][-1]
    rungs_left = job.state["rung_count"] - rung["index"]
    rung.setdefault("budget_seconds", max(job.time_left - test_reserve(job), 0.0) / rungs_left)
    rung.setdefault("slice_seconds", rung["budget_seconds"] / len(rung["survivors"]))
    limit = 0 if rungs_left == 1 else EARLY_VALID_TRIPLES  # the last rung chooses the pick: the whole split
    for name in rung["survivors"]:
        if name in rung["results"]:
            continue  # done before a restart
        if job.should_stop is not None and job.should_stop():
            return False
        seconds = slice_training(job, name, rung["slice_seconds"], limit)
        started = time.monotonic()
        job.emit("train", name, seconds=seconds)
        if train_slice(job, name, seconds) is None:
            return False
        results = evaluate_exports(job, name, tune_seconds=FINE_TUNE_SHARE * seconds, limit=limit)
        tuned = sum(r.get("fine_tune_seconds", 0.0) for r in results.values())
        unit = job.unit(name)
        unit["other_seconds"] = max(time.monotonic() - started - seconds - tuned - validations(job, name, limit), 0.0)
        rung["results"][name] = {"exports": results, "train_seconds": unit["train_seconds"], "steps": unit["steps"],
                                 "score": score(job, results)}
        log.info("rung %d %s: %s %.4f after %d steps", rung["index"], name, job.config.metric,
                 rung["results"][name]["score"], unit["steps"])
        job.save()
    return True


def survivors(ranked: list[str], keep: int, model_of: Callable[[str], str]) -> list[str]:
    """The best `keep` of `ranked` (best first), and always the best of each model kind.

    Model kinds learn at different speeds: on CoDEx-S at 0.5 MB, RotatE dim 27 scored 0.013 valid MRR after 18 s
    and EARL dim 40 0.247, yet given 10 minutes alone RotatE reached 0.358 test MRR and EARL 0.317
    (bench/results/compress_codex-s.md). An early rung ranks within a kind well and across kinds badly, so each
    kind's leader goes on to the last rung and the final comparison is made on equal footing.
    """
    leaders: dict[str, str] = {}
    for name in ranked:
        leaders.setdefault(model_of(name), name)
    chosen = set(leaders.values())
    for name in ranked:
        if len(chosen) >= keep:
            break
        chosen.add(name)
    return [n for n in ranked if n in chosen]


def next_rung(job: Job) -> None:
    """Keep the best 1/eta by score (and each model's best), or mark the search done after the last rung."""
    rung = job.state["rungs"][-1]
    if rung["index"] + 1 >= job.state["rung_count"]:
        job.state["done"] = True
    else:
        keep = rung_sizes(len(job.state["candidates"]), job.config.eta)[rung["index"] + 1]
        ranked = sorted(rung["survivors"], key=lambda n: -rung["results"][n]["score"])
        kept = survivors(ranked, keep, lambda n: job.unit(n)["model"])
        job.state["rungs"].append({"index": rung["index"] + 1, "survivors": kept, "results": {}})
    job.save()


def search(job: Job) -> bool:
    """Successive halving from wherever the saved state stopped; False if stopped before the last rung."""
    if not job.state["rungs"]:
        job.state["rungs"].append({"index": 0, "survivors": [u["name"] for u in job.state["candidates"]],
                                   "results": {}})
    while not job.state["done"]:
        if not run_rung(job):
            job.save()
            return False
        next_rung(job)
    return True


# ---------------------------------------------------------------- the pick and its outputs


def exports_table(job: Job) -> list[dict[str, Any]]:
    """One row per candidate and precision: its latest evaluation (from the last rung it reached)."""
    latest: dict[str, tuple[int, dict]] = {}
    for rung in job.state["rungs"]:
        for name, result in rung["results"].items():
            latest[name] = (rung["index"], result)
    rows = []
    for name, (index, result) in latest.items():
        unit = job.unit(name)
        for precision, values in result["exports"].items():
            rows.append({"candidate": name, "model": unit["model"], "dim": unit["dim"], "precision": precision,
                         "rung": index, "steps": result["steps"], "train_seconds": result["train_seconds"],
                         **values})
    return rows


def choose(rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The best row validated on the whole split (the last rung's: rows from earlier rungs were ranked on a subset,
    against other candidates with less training); among equals, the smaller file."""
    key = METRICS[metric]
    whole = [r for r in rows if not r.get("valid_subset")] or rows
    return max(whole, key=lambda r: (r[key], -r["bytes"]))


def finish(job: Job) -> dict[str, Any]:
    """Write the pick as OUT/bundle.safetensors with its test metrics, and the report beside it."""
    from earl_service.compress.report import build_report, write_report

    rows = exports_table(job)
    pick = choose(rows, job.config.metric)
    name, precision = pick["candidate"], pick["precision"]
    job.emit("export", name, precision=precision)
    test = None
    if job.dataset.test is not None and len(job.dataset.test):
        train_config = job.train_config(name)
        run = load_run(job.run_dir(name), job.dataset, device=train_config.device)
        test = evaluate_bundle(run, job.export_path(name, precision), "test", batch_size=train_config.eval_batch_size)
    report = build_report(job, rows, pick, test)
    source = load_bundle(job.run_dir(name) / BUNDLE)
    save_exact(source, job.out / PICK, precision=precision, metrics=pick_metrics(report),
               expected=job.unit(name)["bytes"][precision])
    write_report(job.out, report)
    job.emit("done", name, precision=precision)
    return report


def pick_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """The short summary the pick's bundle carries (shown by `earl info`); report.json has the rest."""
    pick = report["pick"]
    return {"valid": {k: pick[k] for k in SUMMARY_KEYS}, "test": report["test"],
            "compress": {"max_bytes": report["max_bytes"], "bytes": pick["bytes"], "candidate": pick["candidate"],
                         "precision": pick["precision"], "metric": report["metric"],
                         "candidates": len(report["candidates"]), "exports": len(report["exports"]),
                         "rungs": len(report["rungs"]), "minutes": round(report["spent_seconds"] / 60, 2),
                         "report": "report.json"}}


def compress(dataset: Dataset, out_dir: str | os.PathLike, config: CompressConfig, *,
             train_configs: Mapping[ModelKind, TrainConfig] | None = None,
             on_progress: ProgressCallback | None = None, should_stop: Callable[[], bool] | None = None,
             ) -> dict[str, Any] | None:
    """Search for the most accurate bundle of at most config.max_bytes bytes within the time limit; writes
    OUT/bundle.safetensors, report.json, report.md and frontier.png and returns the report. Every bundle carries
    the dataset's labels (counted in its bytes; load_dataset(labels=False) leaves them out). A job stopped
    by `should_stop` returns None; run it again with the same OUT to continue from where it stopped.
    `train_configs` says how each model kind's candidates train (default: the default recipe's; the time limit,
    seed and validation cadence are the search's own)."""
    if dataset.valid is None or not len(dataset.valid):
        raise DatasetError("compress picks on validation metrics: the dataset needs a valid split")
    out = Path(out_dir)
    train_configs = train_configs or train_configs_from_options({"progress": False}, recipe=DEFAULT)
    state = load_state(out, config, dataset)
    if state is None:
        planning = time.monotonic()
        sizes = BundleSizes(dataset, seed=config.seed)
        units = plan_candidates(sizes, config)
        measured = validation_seconds(dataset, sizes, units, train_configs)
        units, seconds = with_validation_estimates(units, measured), largest_validation_seconds(measured)
        units = fit_to_time(config, units, seconds, valid_fraction(dataset, EARLY_VALID_TRIPLES))
        state = new_state(config, dataset, sizes, units, seconds)
        # Timing the validations is part of the search: on one core it took 3 of FB15k-237's 60 minutes at 8 MB.
        state["spent_seconds"] = time.monotonic() - planning
    out.mkdir(parents=True, exist_ok=True)
    job = Job(dataset, out, config, train_configs, state, on_progress, should_stop,
              spent_before=state["spent_seconds"])
    job.save()
    if not search(job):
        return None
    return finish(job)


__all__ = ["compress", "evaluate_bundle", "pick_metrics"]
