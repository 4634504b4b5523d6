"""What planning measures of a compress search's candidates before it starts: the seconds of a validation pass,
of a training step and of a slice's setup, at each model's largest and smallest dims, and the estimates at every
other dim between them."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import NamedTuple

import torch

from earl_service.compress.state import Candidate
from earl_service.config import ModelConfig, ModelKind, TrainConfig
from earl_service.data.dataset import Dataset
from earl_service.train.distributed import Ranks
from earl_service.train.evaluate import ranking_batch
from earl_service.train.loop import Learner, train_step
from earl_service.train.readout import LossReadout
from earl_service.train.rows import table_config
from earl_service.train.run import GraphCache, Run, cache_seconds, resolve_device
from earl_service.train.schedule import build_optimizer
from earl_service.train.state import TrainState

# A validation pass is timed on two fixed subsets of the valid split, of one and of three ranking batches, and
# fitted as fixed + per-triple seconds (the fixed part: the model's embeddings of every entity), after a
# one-triple warm-up that builds the caches. Timing whole passes took 101 of the 105 s of FB15k-237's planning at
# 2 MB (8 passes of 17,535 triples, 2 cores), a third of a 5-minute search; subsets of 250 and 1,000 triples
# (after a warm-up on 250) still took 221 of the 279 s that WordNet-full's planning at 8 MB spent timing (one core;
# EARL d320 alone 155 s, at ~30 ms a triple), where a ranking batch holds 143 triples. Subsets of part of a batch
# misjudge: 64 and 256 triples (a quarter of one of FB15k-237's batches, and one) put EARL d136's pass 24% short.
TIMING_BATCHES = (1, 3)
TIMING_STEPS = 3  # training steps timed per measured candidate (after one untimed)
# ... or fewer, once they have taken this long: EARL d320's steps on WordNet-full take ~9 s each on one core, and
# four of them were a fifth of that search's planning; a step that long varies by a few percent.
TIMING_SECONDS = 5.0


# A slice builds its candidate's run twice: train() to train it, and again with the trained weights for its
# exports. Until its first slice has measured its whole overhead (Candidate.other_seconds), that is its estimate:
# a one-candidate search has one rung, and no later rung takes up what its only slice did not plan for (at 5M
# entities, 40 MB in 30 minutes on one core, 56 s of setup, and the search ended 5.6% past its limit with the
# pick's test). Timing a checkpoint written and read back besides cost that planning 36 s and 3.5 GB more at 5M
# and still saw a quarter of the slice's 70 s of setup: the writes and reads of a search under memory pressure are
# not those of planning's.
SLICE_BUILDS = 2


class Costs(NamedTuple):
    """What planning measures of a (model, dim): seconds of one validation pass, its fixed part, one step, and a
    slice's builds of its run (SLICE_BUILDS)."""

    valid: float
    fixed: float
    step: float
    setup: float = 0.0




def measure_costs(dataset: Dataset, candidates: list[Candidate],
                  train_configs: Mapping[ModelKind, TrainConfig], graphs: GraphCache | None = None,
                  ) -> dict[str, dict[int, Costs]]:
    """Seconds of one validation pass and its fixed part (estimated from two timed subsets, pass_seconds), of one
    training step (step_seconds) and of building the run (SLICE_BUILDS of them: a slice's setup) of each model's
    largest and smallest candidates (timed_extremes), untrained, each built as its candidate's config says:
    {model: {dim: costs}}."""
    measured: dict[str, dict[int, Costs]] = {}
    for model in dict.fromkeys(c.model for c in candidates):
        theirs = [c for c in candidates if c.model == model]
        train_config = train_configs[model]
        measured[model] = {}
        device = resolve_device(train_config.device)
        torch.empty(0, device=device)  # a GPU's context, created once, is not a build's
        for dim, config in timed_extremes(theirs).items():
            started, cached = time.perf_counter(), cache_seconds(graphs)
            run = Run.build(dataset, config, device, graphs=graphs)
            built = time.perf_counter() - started - (cache_seconds(graphs) - cached)

            def evaluate(limit: int, run: Run = run, batch_size: int = train_config.eval_batch_size) -> None:
                run.evaluate("valid", batch_size=batch_size, limit=limit)

            batch = ranking_batch(train_config.eval_batch_size, run.dataset.num_train_entities)
            valid, fixed = pass_seconds(evaluate, len(run.ranked_triples("valid")), batch)
            measured[model][dim] = Costs(valid, fixed, step_seconds(run, train_config), SLICE_BUILDS * built)
    return measured


def timed_extremes(theirs: list[Candidate]) -> dict[int, ModelConfig]:
    """The configs planning builds and times of one model's candidates, by dim, widest first: its widest and its
    narrowest (interpolation fills the dims between). Among EARL's reserved shares at one dim the widest is timed at
    the smallest share and the narrowest at the largest (a share's kNN graph builds in its setup: the extremes'
    setups are timed where their dims differ); at one dim in all, the widest alone."""
    by_dim = sorted(theirs, key=lambda c: (c.dim, -c.config.reserved_ratio))
    narrowest, widest = by_dim[0], by_dim[-1]
    return {widest.dim: widest.config} | ({narrowest.dim: narrowest.config} if narrowest.dim != widest.dim else {})


def step_seconds(run: Run, train_config: TrainConfig, steps: int = TIMING_STEPS,
                 seconds: float = TIMING_SECONDS) -> float:
    """Mean seconds of `steps` training steps of `run`'s model as train() takes them (fewer once they have taken
    `seconds`, at least one), after one untimed (its first builds caches), on a copy of the weights: `run` is left
    as it was."""
    weights = {k: v.clone() for k, v in run.model.state_dict().items()}
    train_config = table_config(run.model, train_config)  # as train() will step it
    learner = Learner.build(run, build_optimizer(run.model, train_config), train_config, ranks=Ranks(),
                            device=run.device)
    state = TrainState.start(train_config.seed, run.device)
    losses = LossReadout(steps)  # read once a pass: the read waits for a GPU to finish the steps it queued
    run.model.train()
    losses.add(state.step, train_step(learner, state))
    losses.read()
    started, timed = time.perf_counter(), 0
    while timed < steps and (timed == 0 or time.perf_counter() - started < seconds):
        losses.add(state.step, train_step(learner, state))
        timed += 1
    losses.read()  # on a GPU the clock above saw queued steps: all `steps` run, and the read waits for them
    mean = (time.perf_counter() - started) / timed
    run.model.eval()
    run.model.load_state_dict(weights)
    return mean


def pass_seconds(evaluate: Callable[[int], None], triples: int, batch: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Seconds of a validation pass over `triples` triples, and the fixed part of them, from passes over
    TIMING_BATCHES ranking batches of `batch` triples (after a one-triple warm-up that builds the caches and the
    known-answer filter): fixed + per-triple seconds, extrapolated linearly (a split of one batch: all per triple)."""
    small, large = (min(n * batch, triples) for n in TIMING_BATCHES)
    evaluate(1)  # warm-up: caches, the known-answer filter

    def timed(limit: int) -> float:
        start = clock()
        evaluate(limit)
        return clock() - start

    first = timed(small)
    if large == small:
        return first, 0.0
    per_triple = max(timed(large) - first, 0.0) / (large - small)
    return first + per_triple * (triples - small), max(first - per_triple * small, 0.0)


def with_estimates(candidates: list[Candidate], measured: Mapping[str, Mapping[int, Costs]]) -> list[Candidate]:
    """Each candidate with the seconds of one validation pass (and its fixed part), of one training step and of a
    slice's builds (its other_seconds until its first slice measures them) at its dim, interpolated linearly in dim
    between its model's measured dims. Scoring every entity costs about the dim, so charging every candidate its
    model's largest's time starved the small ones: on FB15k-237 at 8 MB (one core) RotatE d1540 took 69 s a pass,
    and RotatE d32, charged that for each of its exports, trained 3 s of its 51-s slice."""
    estimated = []
    for c in candidates:
        points = sorted(measured[c.model].items())
        (d0, low), (d1, high) = points[0], points[-1]
        at = 0.0 if d1 == d0 else (c.dim - d0) / (d1 - d0)
        valid, fixed, step, setup = (max(a + (b - a) * at, 0.0) for a, b in zip(low, high, strict=True))
        estimated.append(replace(c, validation_seconds=valid, validation_fixed=min(fixed, valid), step_seconds=step,
                                 other_seconds=setup))
    return estimated


def largest_validation_seconds(measured: Mapping[str, Mapping[int, Costs]]) -> dict[str, float]:
    """Each model's validation pass at its largest candidate's dim (what the report and errors quote)."""
    return {model: by_dim[max(by_dim)].valid for model, by_dim in measured.items()}


__all__ = ["SLICE_BUILDS", "TIMING_BATCHES", "TIMING_SECONDS", "TIMING_STEPS", "Costs", "largest_validation_seconds",
           "measure_costs", "pass_seconds", "step_seconds", "timed_extremes", "with_estimates"]
