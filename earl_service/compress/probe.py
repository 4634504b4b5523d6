"""Rung 0's first look: a challenger that learns sooner than the baseline's model, trailing the baseline after the
same short training, stops there instead of training the rest of its slice.

Every candidate's slice at rung 0 is the same share of the search, and a challenger that loses spends it all: on
FB15k-237 at 8 MB in 60 minutes (one core) EARL d335 took 565 s of rung 0 to validate at 0.1167 against RotatE
d255's 0.2941, and the pick, RotatE d255 int8, trained 2,732 s and tested 0.3059 where the same model trained
alone for the hour tested 0.3131 (bench/results/compress_fb15k-237_8MB_60min_c60_8_report.md,
compress_fb15k-237_60min_f60_8.md). So the baseline and each such challenger are validated after PROBE_SHARE of
the slice (on the rung's subset, the weights as trained), each on the same schedule it goes on with, and the
baseline's lead by MARGIN_SE standard errors cuts the challenger.
"""

from __future__ import annotations

import logging

from earl_service.compress.candidates import baseline_name, valid_fraction
from earl_service.compress.config import METRICS
from earl_service.compress.rungs import EARLY_VALID_TRIPLES, slice_training, timed_validation, train_slice
from earl_service.compress.state import CompressRun, Export, Rung, RungResult, ahead
from earl_service.config import ModelKind
from earl_service.train.run import load_run

log = logging.getLogger(__name__)

# Which model learns sooner than which: EARL rebuilds every entity from shared encoders and learns in hundreds of
# steps what RotatE's table of entities needs thousands for (issue 53). So a RotatE baseline ahead of an EARL
# challenger early says the challenger will not catch up: in every search of bench/results/compress_*_report.json
# under the default recipe where RotatE led EARL at rung 0, the pick was a RotatE (FB15k-237 at 2, 4 and 8 MB,
# CoDEx-S at 0.5 to 2 MB, WordNet-full at 2 and 8 MB). The converse is no evidence and cuts nothing: RotatE d178
# trailed EARL at rung 0 of FB15k-237's 2 MB search on 2 cores (0.1916 against 0.2495) and was the pick.
LEARNS_SOONER: dict[ModelKind, tuple[ModelKind, ...]] = {"earl": ("rotate",)}
# The look comes after this share of a slice's training, or later if a challenger needs longer for PROBE_STEPS
# steps (by its step estimated before the search); one that needs more than PROBE_LATEST of its slice for them is
# not looked at and trains its whole slice. EARL d335 on FB15k-237 validated at 0.0731 after 59 steps (chance is
# ~0.0005; RotatE d255 0.1426 after the same 194 s); WordNet-full's EARL d200 takes 2.9-5 s a step on one core, so
# at 8 MB in 30 minutes 50 steps would take more than its 250-s slice. With half the slice as the latest, an
# estimate of 5.09 s a step (127 s for 25) left EARL d200 unlooked at: it trained all 243 s to validate at 0.0035
# against RotatE d27's 0.3738, and the pick trained 1,176 s of the 1,800 (3594f52).
PROBE_SHARE, PROBE_STEPS, PROBE_LATEST = 0.25, 25, 0.75


def probed(run: CompressRun, rung: Rung) -> list[str]:
    """Who `rung` looks at, baseline first: at rung 0 only, the baseline and each survivor whose model learns sooner
    than the baseline's and can train PROBE_STEPS steps in PROBE_LATEST of its slice; none if no challenger
    qualifies."""
    base = baseline_name(run.state.candidates)
    if rung.index != 0 or rung.slice_seconds is None or base not in rung.survivors:
        return []
    kind = run.candidate(base).model
    challengers = [n for n in rung.survivors
                   if kind in LEARNS_SOONER.get(run.candidate(n).model, ())
                   and PROBE_STEPS * run.candidate(n).step_seconds <= PROBE_LATEST * rung.slice_seconds]
    return [base, *challengers] if challengers else []


def look_seconds(run: CompressRun, rung: Rung) -> float:
    """Seconds of training before the look, the same for everyone `rung` looks at: PROBE_SHARE of its slice, or
    PROBE_STEPS of its slowest probed challenger's steps if longer."""
    assert rung.slice_seconds is not None
    steps = [PROBE_STEPS * run.candidate(n).step_seconds for n in probed(run, rung)]
    return max([PROBE_SHARE * rung.slice_seconds, *steps])


def first_look(run: CompressRun, rung: Rung) -> bool:
    """Look at `rung`'s probed candidates that have no look yet (a restart keeps the earlier ones), then cut the
    challengers the baseline beats; False if stopped. A rung 0 that a job saved by an earlier version began
    without looks goes on without them."""
    names = [] if rung.results and not rung.probes else probed(run, rung)
    for name in names:
        if name in rung.probes:
            continue
        if run.should_stop is not None and run.should_stop():
            return False
        look = probe(run, rung, name)
        if look is None:
            return False
        rung.probes[name] = look
        run.save()
    if names:
        cut(run, rung, names[0], names[1:])
    return True


def probe(run: CompressRun, rung: Rung, name: str) -> Export | None:
    """Train candidate `name` for the look's seconds (look_seconds), on the schedule of its whole slice's training
    (the rest of the slice, rungs.run_slice, continues it), and validate its weights on the rung's subset; None if
    stopped. The look records where that schedule starts and how long it runs."""
    assert rung.slice_seconds is not None
    candidate = run.candidate(name)
    fraction = valid_fraction(run.dataset, EARLY_VALID_TRIPLES)
    look = candidate.validation(run.state.validation_seconds, fraction)
    planned = max(slice_training(run, name, rung.slice_seconds, EARLY_VALID_TRIPLES) - look, 1e-3)
    start, seconds = candidate.train_seconds, min(look_seconds(run, rung), planned)
    run.emit("train", name, seconds=seconds, probe=True)
    if train_slice(run, name, seconds, schedule=(start, planned)) is None:
        return None
    run.emit("evaluate", name, probe=True)
    config = run.train_config(name)
    with run.timed("setup"):
        model_run = load_run(run.run_dir(name), run.dataset, device=config.device, graphs=run.graphs)
    result, seconds = timed_validation(run, model_run, "valid", batch_size=config.eval_batch_size,
                                       limit=EARLY_VALID_TRIPLES)
    candidate.calibrate(run.state.validation_seconds, seconds, fraction)
    subset = EARLY_VALID_TRIPLES if len(model_run.ranked_triples("valid")) > EARLY_VALID_TRIPLES else 0
    log.info("rung %d %s: first look %.4f after %d steps", rung.index, name, result[METRICS[run.config.metric]],
             candidate.steps)
    return {**result, "valid_subset": subset, "steps": candidate.steps, "train_seconds": candidate.train_seconds,
            "schedule_start": start, "schedule_seconds": planned}


def cut(run: CompressRun, rung: Rung, base: str, challengers: list[str]) -> None:
    """Stop each challenger that trained PROBE_STEPS steps and that the baseline's look beats by MARGIN_SE standard
    errors: its look is its result at the rung. Left alone, the baseline stops there too (the rest of its slice
    is the next rung's, which search.next_rung makes the last)."""
    key = METRICS[run.config.metric]
    for name in challengers:
        look = rung.probes[name]
        if name not in rung.cut and look["steps"] >= PROBE_STEPS and ahead(rung.probes[base], look, key):
            log.info("rung %d %s: cut at the first look, %.4f against %s's %.4f", rung.index, name, look[key],
                     base, rung.probes[base][key])
            rung.cut.append(name)
            rung.results[name] = from_look(look, key)
    if all(n == base or n in rung.cut for n in rung.survivors):
        rung.results.setdefault(base, from_look(rung.probes[base], key))
    run.save()


def from_look(look: Export, key: str) -> RungResult:
    """A rung result made of a look alone: its score, no exports."""
    return RungResult(exports={}, train_seconds=look["train_seconds"], steps=look["steps"], score=look[key])


__all__ = ["LEARNS_SOONER", "PROBE_LATEST", "PROBE_SHARE", "PROBE_STEPS", "cut", "first_look", "look_seconds", "probe", "probed"]
