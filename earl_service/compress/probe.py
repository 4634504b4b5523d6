"""Looks inside a rung: a challenger that learns sooner than another survivor's model, trailing it after the same
short training, stops there instead of training the rest of its slice.

Every candidate's slice of a rung is the same share of it, and a challenger that loses spends it all: on FB15k-237
at 8 MB in 60 minutes (one core) EARL d335 took 565 s of rung 0 to validate at 0.1167 against RotatE d255's 0.2941,
and the pick, RotatE d255 int8, trained 2,732 s and tested 0.3059 where the same model trained alone for the hour
tested 0.3131 (bench/results/compress_fb15k-237_8MB_60min_c60_8_report.md, compress_fb15k-237_60min_f60_8.md).
So in every rung but the last, the reference (the baseline, or the best survivor of the model that learns later)
and each such challenger are validated at LOOK_SHARES of the slice (on the rung's subset, the weights as trained),
each on the same schedule it goes on with, and the reference's lead by MARGIN_SE standard errors cuts the
challenger at the first look that shows it.
"""

from __future__ import annotations

import logging

from earl_service.compress.candidates import baseline_candidate, baseline_name, valid_fraction
from earl_service.compress.config import METRICS
from earl_service.compress.rungs import EARLY_VALID_TRIPLES, slice_training, timed_validation, train_slice
from earl_service.compress.state import CompressRun, Export, Rung, RungResult, ahead
from earl_service.config import ModelKind
from earl_service.train.run import load_run

log = logging.getLogger(__name__)

# Which model learns sooner than which: EARL rebuilds every entity from shared encoders and learns in hundreds of
# steps what RotatE's table of entities needs thousands for (issue 53). So a RotatE ahead of an EARL challenger
# early says the challenger will not catch up: in every search of bench/results/compress_*_report.json under the
# default recipe where RotatE led EARL at rung 0, the pick was a RotatE (FB15k-237 at 2, 4 and 8 MB, CoDEx-S at
# 0.5 to 2 MB, WordNet-full at 2 and 8 MB). The converse is no evidence and cuts nothing: RotatE d178 trailed EARL
# at rung 0 of FB15k-237's 2 MB search on 2 cores (0.1916 against 0.2495) and was the pick.
LEARNS_SOONER: dict[ModelKind, tuple[ModelKind, ...]] = {"earl": ("rotate",)}
# The looks come at these shares of a slice's training, the first later if a challenger needs longer for
# PROBE_STEPS steps (by its step estimated before the search); one that needs more than PROBE_LATEST of its slice
# for them is not looked at and trains its whole slice. EARL d335 on FB15k-237 validated at 0.0731 after 59 steps
# (chance is ~0.0005; RotatE d255 0.1426 after the same 194 s); WordNet-full's EARL d200 takes 2.9-5 s a step on
# one core, so at 8 MB in 30 minutes 50 steps would take more than its 250-s slice. With half the slice as the
# latest, an estimate of 5.09 s a step (127 s for 25) left EARL d200 unlooked at: it trained all 243 s to validate
# at 0.0035 against RotatE d27's 0.3738, and the pick trained 1,176 s of the 1,800 (3594f52).
# One look was not enough where both models start near chance: on WordNet-full-noinv at 2 MB in 30 minutes
# (117k entities) EARL d48 is the baseline (no RotatE int8 fits), RotatE d22 pq:11 scores under EARL a quarter of
# the way into rung 0 and far above it at the end (0.1453 against 0.0334), and EARL trained its whole 273-s slice;
# the pick, RotatE d22 pq:11, trained 1,298 s where alone it trains the 1,800 (floor30_2).
LOOK_SHARES, PROBE_STEPS, PROBE_LATEST = (0.25, 0.5, 0.75), 25, 0.75


def later_learner(run: CompressRun, rung: Rung) -> str | None:
    """Whom `rung`'s looks measure the challengers against: the search's baseline where it survives and its
    model learns later than another's; else the best survivor of such a model (by the rung before's scores; at
    rung 0, that model's own baseline, candidates.baseline_candidate)."""
    later = {kind for kinds in LEARNS_SOONER.values() for kind in kinds}
    base = baseline_name(run.state.candidates)
    if base in rung.survivors and run.candidate(base).model in later:
        return base
    theirs = [n for n in rung.survivors if run.candidate(n).model in later]
    if not theirs:
        return None
    if rung.index == 0:
        chosen = baseline_candidate([run.candidate(n) for n in theirs])
        return chosen.name if chosen is not None else None
    before = run.state.rungs[rung.index - 1].results
    return max(theirs, key=lambda n: before[n].score if n in before else -1.0)


def probed(run: CompressRun, rung: Rung) -> list[str]:
    """Who `rung` looks at, the reference first (later_learner): in every rung but the last, the reference and
    each survivor whose model learns sooner than the reference's and can train PROBE_STEPS steps in PROBE_LATEST
    of its slice; none if no challenger qualifies."""
    if rung.index >= run.state.rung_count - 1 or rung.slice_seconds is None:
        return []
    ref = later_learner(run, rung)
    if ref is None:
        return []
    kind = run.candidate(ref).model
    challengers = [n for n in rung.survivors
                   if kind in LEARNS_SOONER.get(run.candidate(n).model, ())
                   and PROBE_STEPS * run.candidate(n).step_seconds <= PROBE_LATEST * rung.slice_seconds]
    return [ref, *challengers] if challengers else []


def look_seconds(run: CompressRun, rung: Rung) -> float:
    """Seconds of training before the first look, the same for everyone `rung` looks at: the first of
    LOOK_SHARES of its slice, or PROBE_STEPS of its slowest probed challenger's steps if longer."""
    assert rung.slice_seconds is not None
    steps = [PROBE_STEPS * run.candidate(n).step_seconds for n in probed(run, rung)]
    return max([LOOK_SHARES[0] * rung.slice_seconds, *steps])


def look_points(run: CompressRun, rung: Rung) -> list[float]:
    """Seconds into the slice's training of each of `rung`'s looks: the first (look_seconds), then every later
    share of LOOK_SHARES."""
    assert rung.slice_seconds is not None
    first = look_seconds(run, rung)
    return [first, *(share * rung.slice_seconds for share in LOOK_SHARES if share * rung.slice_seconds > first)]


def looks(run: CompressRun, rung: Rung) -> bool:
    """Take `rung`'s looks (look_points) at its probed candidates, each look cutting the challengers the reference
    beats, until none is left or the last look; a restart takes only the looks not yet taken. False if stopped.
    A rung that a job saved by an earlier version began without looks goes on without them."""
    names = [] if rung.results and not rung.probes else probed(run, rung)
    if not names:
        return True
    ref, points = names[0], look_points(run, rung)
    for number, point in enumerate(points, start=1):
        looking = [n for n in names if n not in rung.cut]
        if len(looking) < 2 or ref in rung.results:
            break
        for name in looking:
            if name in rung.probes and rung.probes[name].get("look", 1) >= number:  # taken before a restart
                continue
            if run.should_stop is not None and run.should_stop():
                return False
            look = probe(run, rung, name, point, len(points))
            if look is None:
                return False
            rung.probes[name] = {**look, "look": number}
            run.save()
        cut(run, rung, ref, looking[1:])
    return True


def probe(run: CompressRun, rung: Rung, name: str, point: float, count: int = 1) -> Export | None:
    """Train candidate `name` up to `point` seconds into its slice's training, on the schedule of its whole slice
    (the rest of the slice, rungs.run_slice, continues it), and validate its weights on the rung's subset; None if
    stopped. The first of the rung's `count` looks fixes where that schedule starts and how long it runs: the
    slice's training less the looks' validations."""
    assert rung.slice_seconds is not None
    candidate = run.candidate(name)
    fraction = valid_fraction(run.dataset, EARLY_VALID_TRIPLES)
    if earlier := rung.probes.get(name):
        start, planned = earlier["schedule_start"], earlier["schedule_seconds"]
    else:
        validation = candidate.validation(run.state.validation_seconds, fraction)
        start = candidate.train_seconds
        planned = max(slice_training(run, name, rung.slice_seconds, EARLY_VALID_TRIPLES) - count * validation, 1e-3)
    seconds = max(start + min(point, planned) - candidate.train_seconds, 0.0)
    run.emit("train", name, seconds=seconds, probe=True)
    if seconds > 0 and train_slice(run, name, seconds, schedule=(start, planned)) is None:
        return None
    run.emit("evaluate", name, probe=True)
    config = run.train_config(name)
    with run.timed("setup"):
        model_run = load_run(run.run_dir(name), run.dataset, device=config.device, graphs=run.graphs)
    result, seconds = timed_validation(run, model_run, "valid", batch_size=config.eval_batch_size,
                                       limit=EARLY_VALID_TRIPLES)
    candidate.calibrate(run.state.validation_seconds, seconds, fraction)
    subset = EARLY_VALID_TRIPLES if len(model_run.ranked_triples("valid")) > EARLY_VALID_TRIPLES else 0
    log.info("rung %d %s: look %.4f after %d steps", rung.index, name, result[METRICS[run.config.metric]],
             candidate.steps)
    return {**result, "valid_subset": subset, "steps": candidate.steps, "train_seconds": candidate.train_seconds,
            "schedule_start": start, "schedule_seconds": planned}


def cut(run: CompressRun, rung: Rung, ref: str, challengers: list[str]) -> None:
    """Stop each challenger that trained PROBE_STEPS steps and that the reference's look beats by MARGIN_SE
    standard errors: its look is its result at the rung. Left alone, the reference stops there too (the rest of
    its slice is the next rung's, which search.next_rung makes the last)."""
    key = METRICS[run.config.metric]
    for name in challengers:
        look = rung.probes[name]
        if name not in rung.cut and look["steps"] >= PROBE_STEPS and ahead(rung.probes[ref], look, key):
            log.info("rung %d %s: cut at look %d, %.4f against %s's %.4f", rung.index, name, look.get("look", 1),
                     look[key], ref, rung.probes[ref][key])
            rung.cut.append(name)
            rung.results[name] = from_look(look, key)
    if all(n == ref or n in rung.cut for n in rung.survivors):
        rung.results.setdefault(ref, from_look(rung.probes[ref], key))
    run.save()


def from_look(look: Export, key: str) -> RungResult:
    """A rung result made of a look alone: its score, no exports."""
    return RungResult(exports={}, train_seconds=look["train_seconds"], steps=look["steps"], score=look[key])


__all__ = ["LEARNS_SOONER", "LOOK_SHARES", "PROBE_LATEST", "PROBE_STEPS", "cut", "later_learner", "look_points",
           "look_seconds", "looks", "probe", "probed"]
