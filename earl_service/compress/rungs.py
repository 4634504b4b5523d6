"""One rung of the search: each survivor's slice of training, its exports at every precision and their validation."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from earl_service.bundle.model_io import Bundle, load_bundle
from earl_service.bundle.precision import Precision, ProductQuantized
from earl_service.bundle.sizes import save_exact
from earl_service.compress.candidates import dominated, fine_tuned, tuned_precisions, valid_fraction
from earl_service.compress.config import METRICS
from earl_service.compress.orders import order_trials, pq_codes
from earl_service.compress.state import (
    CompressRun,
    Export,
    Rung,
    RungResult,
    rung_budget,
)
from earl_service.data.dataset import Dataset
from earl_service.train.evaluate import SUMMARY_KEYS
from earl_service.train.finetune import FineTune, fine_tune
from earl_service.train.loop import run_bundle, train
from earl_service.train.run import Run, load_run

log = logging.getLogger(__name__)

# Codebook fine-tuning of a candidate's pq exports: this share of its training slice on top (charged in every
# slice as slice_training plans it), and at most this many steps per export.
FINE_TUNE_SHARE, FINE_TUNE_STEPS = 0.25, 300
# Untimed fine-tuning's charge, in training steps per fine-tuning step (timed: 0.7-1.8; a 25% share kept 316 s for
# 35 s at WordNet-full 2 MB's last rung, acd033b, and the search ended 303 s early).
UNTIMED_TUNE_STEPS = 2.0
# Rungs before the last rank their candidates on one fixed random subset of at most this many valid triples (the
# same for every candidate); the last rung, whose scores choose the pick, on the whole split. A full validation of
# FB15k-237 (17,535 triples) takes 8-30 s on one core, so validating every export of a dozen candidates on it took
# more than rung 0's minutes and left nothing for training. At 2,000, FB15k-237's 5-minute 2 MB search still spent
# 35% of its time validating and 11% training (2 cores); 500 is what issue 53 asks of an early rung.
EARLY_VALID_TRIPLES = 500
# The last rung validates (all of a survivor's exports together) and the pick is tested on the whole split while a
# pass over it costs at most this share of the time limit; beyond, on a fixed random subset of the size that does,
# never under EARLY_VALID_TRIPLES. At 1M entities one pass over 5,000 valid triples takes about 490 s (2 cores,
# every entity scored for each of 10,000 queries): 14% of an hour per export, and as much again for the test.
FINAL_EVAL_SHARE = 0.05


def early_fraction(dataset: Dataset) -> float:
    """The share of a whole validation that a rung before the last spends on each export."""
    return valid_fraction(dataset, EARLY_VALID_TRIPLES)


def run_rung(run: CompressRun) -> bool:
    """Train and evaluate every survivor of the current rung that has no result yet; False if stopped.

    Every survivor gets the same slice of the rung, fixed when the rung starts. A candidate that overruns its
    slice (at rung 0 its validations are estimates and the rest of its overhead unknown) takes the time from the
    later rungs, planned from the time left, not from the candidates after it: sharing out what was left instead
    starved the last four RotatE candidates of FB15k-237's 2 MB search to one step each at rung 0.
    """
    rung = run.state.rungs[-1]
    rungs_left = run.state.rung_count - rung.index
    slice_seconds = open_rung(run, rung)
    limit = final_limit(run) if rungs_left == 1 else EARLY_VALID_TRIPLES  # the last rung chooses the pick
    # The last rung runs its leader last, on whatever time the others left: estimates made before the search are
    # on the safe side, and on CoDEx-S at 1 MB in 10 minutes the rest of the rungs' slices went unused (51 s).
    order = rung.survivors[::-1] if rungs_left == 1 else rung.survivors
    if run.lanes is not None and rungs_left > 1:
        return run_in_lanes(run, rung, order, limit, slice_seconds)
    for name in order:
        if name in rung.results:
            continue  # done before a restart
        if run.should_stop is not None and run.should_stop():
            return False
        share = (max(run.time_left - test_reserve(run), slice_seconds)
                 if rungs_left == 1 and name == rung.survivors[0] else slice_seconds)
        result = carried_over(run, rung, name, limit) or run_slice(run, rung, name, limit, share)
        if result is None:
            return False
        rung.results[name] = result
        log.info("rung %d %s: %s %.4f after %d steps", rung.index, name, run.config.metric, result.score,
                 result.steps)
        run.save()
    return True


def run_in_lanes(run: CompressRun, rung: Rung, order: list[str], limit: int, slice_seconds: float) -> bool:
    """run_rung's slices in the search's lanes (lanes.py), several at once; those that carry their result over
    (carried_over) here first. False if stopped."""
    pending = {}
    for name in (n for n in order if n not in rung.results):
        if (result := carried_over(run, rung, name, limit)) is not None:
            rung.results[name] = result
        else:
            pending[name] = slice_seconds
    run.save()
    return not pending or run.lanes.run_slices(run, rung, pending, limit)


def open_rung(run: CompressRun, rung: Rung) -> float:
    """Fix `rung`'s budget (its share of the time left) and each survivor's slice of it, once, at its start; returns
    the slice. Slices run in the search's lanes (several at once, before the last rung: run_rung) share the
    budget's wall clock."""
    if rung.budget_seconds is None:
        rung.budget_seconds = rung_budget(max(run.time_left - test_reserve(run), 0.0), rung.index,
                                          run.state.rung_count)
    if rung.slice_seconds is None:
        in_lanes = run.lanes is not None and run.state.rung_count - rung.index > 1
        at_once = min(run.lanes.lanes, len(rung.survivors)) if in_lanes else 1
        rung.slice_seconds = rung.budget_seconds * at_once / len(rung.survivors)
    return rung.slice_seconds


def carried_over(run: CompressRun, rung: Rung, name: str, limit: int) -> RungResult | None:
    """Candidate `name`'s result at the rung before, when its slice of `rung` leaves no time to train and it is not
    the rung's leader: re-exporting and re-validating weights that did not change would only overrun the limit.
    On FB15k-237 at 2 MB in 5 minutes, RotatE d312's last slice (30 s) went on its whole-split validation (18 s)
    and exports (32 s) without a step, and the search overran by 6 s before the pick's test."""
    if rung.index == 0 or rung.survivors[0] == name:
        return None
    assert rung.slice_seconds is not None
    if slice_training(run, name, rung.slice_seconds, limit) > 0:
        return None
    log.info("rung %d %s: no time to train in a %.0f-s slice; its rung %d result stands", rung.index, name,
             rung.slice_seconds, rung.index - 1)
    return run.state.rungs[rung.index - 1].results[name]


def run_slice(run: CompressRun, rung: Rung, name: str, limit: int, share: float | None = None) -> RungResult | None:
    """Candidate `name`'s slice of `rung` (`share` wall seconds; default the rung's slice): train, export, validate
    on at most `limit` triples (0: all), and measure the rest of its overhead for its next slice; None if stopped."""
    assert rung.slice_seconds is not None
    seconds = slice_training(run, name, rung.slice_seconds if share is None else share, limit)
    trained_in_slice, schedule = seconds, None
    if look := rung.probes.get(name):  # the rest of the slice its looks (probe.py) started
        schedule = (look["schedule_start"], look["schedule_seconds"])
        trained_in_slice, seconds = schedule[1], max(sum(schedule) - run.candidate(name).train_seconds, 0.0)
    elif rung.index == run.state.rung_count - 1:
        # The last rung trains the one candidate left and ranks it against no one: its rate goes on along one
        # schedule over all of its training, back to where that schedule stands rather than to the peak.
        # RotatE d255 on FB15k-237 in 300 + 660 s tested 0.3162 so and 0.3133 warming up again (one core each,
        # bench/results/schedule_restart_fb15k-237_rotate-d255_r17.md).
        schedule = (0.0, run.candidate(name).train_seconds + seconds)
    started, cached = run.clock(), run.cache_seconds
    run.emit("train", name, seconds=seconds)
    if train_slice(run, name, seconds, schedule=schedule) is None:
        return None
    tune_seconds = min(FINE_TUNE_SHARE * trained_in_slice, tuning_cap(run, name)) * fine_tuned(run.candidate(name))
    exports = evaluate_exports(run, name, tune_seconds=tune_seconds, limit=limit)
    tuned = sum(e.get("fine_tune_seconds", 0.0) for e in exports.values())
    candidate = run.candidate(name)
    once = run.cache_seconds - cached  # graphs and packed parts built for the rest of the search: not again
    candidate.other_seconds = max(run.clock() - started - seconds - tuned - validations(run, name, limit) - once,
                                  0.0)
    return RungResult(exports=exports, train_seconds=candidate.train_seconds, steps=candidate.steps,
                      score=max(e[METRICS[run.config.metric]] for e in exports.values()))


# ---------------------------------------------------------------- the time of a slice


def validations(run: CompressRun, name: str, limit: int) -> float:
    """Seconds of validating the current rung's exports of candidate `name` (rung_exports) on at most `limit`
    valid triples (0: all), and their codes' orders on the early subset (orders.order_trials), from the validation
    pass timed before the search at its dim."""
    candidate, exports = run.candidate(name), rung_exports(run, name)
    seconds = run.state.validation_seconds
    return (candidate.validation(seconds, valid_fraction(run.dataset, limit)) * len(exports)
            + candidate.validation(seconds, early_fraction(run.dataset)) * order_trials(candidate, exports))


def slice_training(run: CompressRun, name: str, share: float, limit: int) -> float:
    """Training seconds of candidate `name` in a slice of `share` wall seconds: the slice less its validations (on
    at most `limit` triples) and the rest of its overhead (build, loading, exports) as measured at its last rung,
    with its pq exports' codebook fine-tuning on top of the training.

    Each part is charged as this rung will spend it, not as the last rung did: a rung before the last validates on
    a subset and the last on the whole split (8.8 times more on FB15k-237), and the fine-tuning grows with the
    slice. Carrying the overhead measured at the previous rung over unchanged undercounted the last rung of
    FB15k-237's 8 MB search by about 95 s of validations, and the job overran its 60 minutes by 69 s."""
    candidate = run.candidate(name)
    rest = max(share - validations(run, name, limit) - candidate.other_seconds, 0.0)
    if not fine_tuned(candidate):
        return rest
    return max(rest / (1 + FINE_TUNE_SHARE), rest - tuning_cap(run, name))


def tuning_cap(run: CompressRun, name: str) -> float:
    """The most seconds candidate `name`'s codebook fine-tuning takes in a slice: FINE_TUNE_STEPS per tuned export
    at its latest timed rate, else at UNTIMED_TUNE_STEPS of its estimated steps (unbounded without an estimate)."""
    candidate = run.candidate(name)
    exports = len(tuned_precisions(candidate))
    for result in reversed([rung.results[name] for rung in run.state.rungs if name in rung.results]):
        rates = [e["fine_tune_seconds"] / e["fine_tune_steps"] for e in result.exports.values()
                 if e.get("fine_tune_steps")]
        if rates:
            return FINE_TUNE_STEPS * max(rates) * exports
    if candidate.step_seconds > 0:
        return FINE_TUNE_STEPS * UNTIMED_TUNE_STEPS * candidate.step_seconds * exports
    return math.inf


def final_limit(run: CompressRun, split: str = "valid") -> int:
    """The triples of `split` the last rung validates on ("valid") or the pick is tested on ("test"): 0 (all) while
    a pass costs at most FINAL_EVAL_SHARE of the time limit at the current rung's slowest survivor, else the
    subset that does (at least EARLY_VALID_TRIPLES). A validation counts every export of the survivor; a pass
    whose cost is all fixed (ranking nothing per triple) gains nothing from a subset. Triples counted as ranked:
    the seen ones."""
    triples, valid = run.dataset.seen_count(split), max(run.dataset.seen_count("valid"), 1)
    share, by_model = FINAL_EVAL_SHARE * run.config.time_limit_minutes * 60, run.state.validation_seconds
    fitting = []  # the triples each survivor's pass (every export of it) can take in `share`
    for c in (run.candidate(n) for n in run.state.rungs[-1].survivors):
        exports = len(c.bytes) if split == "valid" else 1
        fixed = c.validation(by_model, 0.0)
        per_triple = (c.validation(by_model) - fixed) / valid
        if per_triple > 0 and exports * (fixed + per_triple * triples) > share:
            fitting.append(max(int((share / exports - fixed) / per_triple), 0))
    if not fitting:
        return 0
    subset = max(min(fitting), EARLY_VALID_TRIPLES)
    return 0 if subset >= triples else subset


def test_reserve(run: CompressRun) -> float:
    """Seconds to keep back for the pick's test evaluation after the last rung, at the slowest survivor's: a
    pass over the test split (or the subset final_limit allows) at its validation speed, and loading its run (its
    other overhead, as measured at its last rung)."""
    if run.dataset.test is None or not len(run.dataset.test):
        return 0.0
    tested = final_limit(run, "test") or run.dataset.seen_count("test")
    survivors = [run.candidate(n) for n in run.state.rungs[-1].survivors]
    return max(c.validation(run.state.validation_seconds, tested / max(run.dataset.seen_count("valid"), 1))
               + c.other_seconds for c in survivors)


# ---------------------------------------------------------------- which exports a rung makes


def rung_exports(run: CompressRun, name: str) -> list[str]:
    """The precisions the current rung exports and validates for candidate `name`: every one at the last rung
    (the report's frontier shows them all); before it, all but the dominated, which cannot change its rank."""
    candidate = run.candidate(name)
    if run.state.rungs and run.state.rungs[-1].index == run.state.rung_count - 1:
        return list(candidate.bytes)
    skipped = dominated(candidate)
    return [p for p in candidate.bytes if p not in skipped]


# ---------------------------------------------------------------- training and evaluating a candidate


def train_slice(run: CompressRun, name: str, seconds: float,
                schedule: tuple[float, float] | None = None) -> dict[str, Any] | None:
    """Train candidate `name` for about `seconds` more (continuing its checkpoint); None if stopped. Its rate decays
    over `schedule` (start, length: seconds of its training), by default over these `seconds` from now."""
    candidate = run.candidate(name)
    start, length = schedule or (candidate.train_seconds, seconds)
    # train() counts time_limit_minutes from its checkpoint's elapsed time; 0 would mean no limit at all.
    limit = max(candidate.train_seconds + seconds, 1e-3) / 60
    # No validation inside train(): evaluate_exports validates every slice's weights, export by export, and a
    # second pass would take time from training (best.pt is then the slice's last weights).
    # A decaying schedule decays over each slice, warming up again at the next (a restart per rung but the last:
    # run_slice), so that a rung compares what each candidate reaches in its slice. Decaying once over what a
    # survivor of every rung would train left rung 0 ranking at the peak rate: on CoDEx-S at 2 MB, RotatE d473
    # validated 0.2210 there against EARL d182's 0.2764 and was cut, though trained alone for the 10 minutes it
    # tested 0.4218 to the pick's 0.3346.
    config = replace(run.train_config(name), time_limit_minutes=limit, schedule_minutes=max(length, 1e-3) / 60,
                     schedule_start_minutes=start / 60, seed=run.config.seed, progress=False, eval_every=0)

    def forward(progress: dict[str, Any]) -> None:
        run.emit("train", name, step=progress["step"], loss=progress["loss"], valid_mrr=progress["valid_mrr"])

    # No bundle.safetensors per slice: evaluate_exports builds the source of the exports from the run's weights.
    # Writing one packed the training graph each time (xz), 71 s of a 1M-entity, 10M-triple slice on one core.
    started, trained_before = run.clock(), candidate.train_seconds
    metrics = train(run.dataset, candidate.config, config, run.run_dir(name), resume=True, final_eval=False,
                    on_progress=forward, should_stop=run.should_stop, graphs=run.graphs, curves=False,
                    write_bundle=False)
    stepped = metrics["train_seconds"] - trained_before  # the steps; the rest of the call built the run
    run.charge("train", stepped)
    run.charge("setup", run.clock() - started - stepped, peak_mb=metrics.get("memory", {}).get("build_peak_rss_mb", 0.0))
    if metrics["stopped"] == "cancelled":
        return None
    candidate.train_seconds, candidate.steps = metrics["train_seconds"], metrics["steps"]
    return metrics


def evaluate_exports(run: CompressRun, name: str, split: str = "valid", *, tune_seconds: float = 0.0,
                     limit: int = 0) -> dict[str, Export]:
    """The current rung's exports (rung_exports) of the candidate's best weights: each one's file bytes and `split`
    metrics of the dequantized weights (on the fixed subset of at most `limit` triples; 0: all, recorded as
    `valid_subset`). Quantized variants come from the same fp32 training, never a retraining; pq variants get
    faiss codebooks, then (unless dominated) up to `tune_seconds` (shared among them) of codebook fine-tuning."""
    candidate, train_config = run.candidate(name), run.train_config(name)
    with run.timed("setup"):
        model_run, source = trained(run, name)
    tuned = tuned_precisions(candidate)
    subset = limit if 0 < limit < len(model_run.ranked_triples(split)) else 0
    results, validating = {}, 0.0
    for precision in rung_exports(run, name):
        expected = candidate.bytes[precision]
        run.emit("evaluate", name, precision=precision)
        tables, orders = None, None
        tuning: dict[str, Any] = {}
        if isinstance(chosen := Precision.parse(precision), ProductQuantized):
            tables, orders, tuning = pq_codes(run, name, chosen, source, model_run, EARLY_VALID_TRIPLES)
            tuning |= {"fine_tune_steps": 0, "fine_tune_seconds": 0.0}
            if precision in tuned:
                budget = FineTune(steps=FINE_TUNE_STEPS, seconds=tune_seconds / len(tuned))
                started = time.monotonic()
                with run.timed("fine_tune"):
                    tables, budget = fine_tune(model_run, source.params, tables, train_config, budget, orders)
                tuning |= {"fine_tune_steps": len(budget.losses), "fine_tune_seconds": time.monotonic() - started}
        with run.timed("export"):
            path = save_exact(source, run.export_path(name, precision), precision=precision,
                              metrics={"compress": {"candidate": name}}, expected=expected, pq_tables=tables,
                              pq_orders=orders)
        with run.timed("setup"):
            load_weights(model_run, path)
        metrics, seconds = timed_validation(run, model_run, split, batch_size=train_config.eval_batch_size,
                                            limit=limit)
        validating += seconds
        results[precision] = {"bytes": path.stat().st_size, **tuning, "valid_subset": subset, **metrics}
    if split == "valid" and results:
        candidate.calibrate(run.state.validation_seconds, validating / len(results), valid_fraction(run.dataset, limit))
    return results


def revalidate(run: CompressRun, name: str, limit: int) -> Export:
    """Candidate `name`'s best export at the current rung (the file it wrote there) validated again on at most
    `limit` valid triples (0: all): the same weights on a larger sample."""
    precision = run.state.rungs[-1].results[name].best(METRICS[run.config.metric])
    with run.timed("setup"):
        model_run = load_run(run.run_dir(name), run.dataset, device=run.train_config(name).device, graphs=run.graphs)
    subset = limit if 0 < limit < len(model_run.ranked_triples("valid")) else 0
    with run.timed("validate"):
        metrics = evaluate_bundle(model_run, run.export_path(name, precision), "valid",
                                  batch_size=run.train_config(name).eval_batch_size, limit=limit)
    return {"precision": precision, "valid_subset": subset, **metrics}


def trained(run: CompressRun, name: str) -> tuple[Run, Bundle]:
    """Candidate `name`'s run rebuilt with its trained weights, and the bundle of those weights as the search ships
    it: the source of its exports. Taken before any export's weights are loaded into the run (evaluate_bundle)."""
    model_run = load_run(run.run_dir(name), run.dataset, device=run.train_config(name).device, graphs=run.graphs)
    return model_run, run.shipped(run_bundle(model_run))


def evaluate_bundle(run: Run, path: Path, split: str, *, batch_size: int = 256, limit: int = 0) -> dict[str, Any]:
    """`split` metrics of the weights stored in bundle `path` (dequantized), through `run`'s model and graph, on
    Run.evaluate's fixed random subset of at most `limit` triples (0: all)."""
    load_weights(run, path)
    return evaluate_weights(run, split, batch_size=batch_size, limit=limit)


def load_weights(run: Run, path: Path) -> None:
    """Put the weights stored in bundle `path` (dequantized) into `run`'s model."""
    params = {k: torch.from_numpy(v) for k, v in load_bundle(path).params.items()}
    run.model.load_state_dict(params, strict=False)  # every weight; the reserved ids are the run's own


def timed_validation(run: CompressRun, model_run: Run, split: str, *, batch_size: int,
                     limit: int) -> tuple[dict[str, Any], float]:
    """evaluate_weights of `model_run`, charged to "validate", and its seconds: the ranking alone, as planning timed
    it (what Candidate.calibrate scales a candidate's estimate to), not reading an export file."""
    started = run.clock()
    with run.timed("validate"):
        metrics = evaluate_weights(model_run, split, batch_size=batch_size, limit=limit)
    return metrics, run.clock() - started


def evaluate_weights(run: Run, split: str, *, batch_size: int = 256, limit: int = 0) -> dict[str, Any]:
    """`split` metrics of `run`'s model as it stands (summary and standard errors), on at most `limit` triples."""
    result = run.evaluate(split, batch_size=batch_size, limit=limit)
    return {**{k: result[k] for k in SUMMARY_KEYS}, "standard_error": result["standard_error"]}


__all__ = ["EARLY_VALID_TRIPLES", "FINAL_EVAL_SHARE", "early_fraction", "evaluate_bundle", "evaluate_weights",
           "final_limit", "load_weights", "open_rung", "revalidate", "run_rung", "slice_training", "timed_validation",
           "train_slice", "trained"]
