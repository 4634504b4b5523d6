"""What planning measures before a search: a training step, a validation pass and a slice's setup."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_dataset

from earl_service.bundle.sizes import BundleSizes
from earl_service.compress import costs as costs_module
from earl_service.compress.candidates import plan_candidates
from earl_service.compress.config import CompressConfig
from earl_service.config import MODELS, ModelConfig, TrainConfig
from earl_service.train import run as run_module
from earl_service.train.run import GraphCache, Run

TINY = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=1))


def test_planning_times_a_training_step_and_leaves_the_model_as_it_was():
    run = Run.build(tiny_dataset(), ModelConfig(model="earl", dim=16), torch.device("cpu"))
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    assert costs_module.step_seconds(run, TINY["earl"], steps=2) > 0
    after = run.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_planning_times_fewer_steps_once_they_take_long(monkeypatch):
    """One untimed step, then TIMING_STEPS timed, or fewer once they have taken TIMING_SECONDS (at least one):
    EARL d320's ~9-s steps on WordNet-full are not timed four times over."""
    run = Run.build(tiny_dataset(), ModelConfig(model="rotate", dim=16), torch.device("cpu"))
    calls, real = [], costs_module.train_step

    def counted(learner, state):
        calls.append(state.step)
        return real(learner, state)

    monkeypatch.setattr(costs_module, "train_step", counted)
    assert costs_module.step_seconds(run, TINY["rotate"], steps=3, seconds=0.0) > 0
    assert len(calls) == 2  # the untimed step and one timed
    calls.clear()
    costs_module.step_seconds(run, TINY["rotate"], steps=3, seconds=600.0)
    assert len(calls) == 4


def test_a_candidates_setup_is_estimated_before_its_first_slice(monkeypatch):
    """Building a run, twice a slice (to train, and with the trained weights to export), timed in planning, is
    each candidate's other_seconds until its first slice measures them: a one-candidate search has no later rung
    to take up what its only slice did not plan for (5M entities: +5.6%). Filling the search's cache is not."""
    slow, real = 0.3, Run.build

    def build(*args, **kwargs):
        time.sleep(slow)
        return real(*args, **kwargs)

    monkeypatch.setattr(costs_module.Run, "build", build)
    dataset = tiny_dataset()
    sizes = BundleSizes(dataset)
    config = CompressConfig(max_bytes=sizes.bytes("rotate", 32, "fp32"), time_limit_minutes=1, models=("rotate",),
                            precisions=("fp32", "int8"))
    units = plan_candidates(sizes, config)
    known = run_module.KnownAnswers

    def slow_known(*args):  # the first build fills the cache with the known answers, slowly
        time.sleep(5 * slow)
        return known(*args)

    monkeypatch.setattr(run_module, "KnownAnswers", slow_known)
    graphs = GraphCache(dataset)
    measured = costs_module.measure_costs(dataset, units, TINY, graphs)
    assert graphs.build_seconds >= 5 * slow
    assert all(2 * slow <= costs.setup < 2 * 3 * slow for costs in measured["rotate"].values())
    estimated = costs_module.with_estimates(units, measured)
    assert all(u.other_seconds >= 2 * slow for u in estimated)
    assert min(u.other_seconds for u in estimated) == pytest.approx(min(c.setup for c in measured["rotate"].values()))


def test_the_parts_planning_packs_for_the_sizes_serve_every_export(monkeypatch):
    """Planning packs the graph, names and labels to know the bundles' bytes; the search's exports ship those same
    parts from its cache (the search's process first exported at its last rung when its slices ran in lanes,
    packing there, unplanned: minutes for a 10M-triple graph)."""
    from earl_service.bundle.model_io import Bundle
    from earl_service.compress.candidates import plan
    from earl_service.compress.state import CompressRun
    from earl_service.train.loop import run_bundle

    dataset = tiny_dataset()
    config = CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 32, "fp32"), time_limit_minutes=1,
                            precisions=("fp32", "int8"))
    graphs = GraphCache(dataset)
    state = plan(dataset, config, TINY, early_fraction=1.0, graphs=graphs)
    job = CompressRun(dataset, Path("unused"), config, TINY, state, graphs=graphs)
    bundle = run_bundle(Run.build(dataset, state.candidates[0].config, torch.device("cpu"), graphs=graphs))
    expected = bundle.fixed_parts()

    def packed_again(self):
        raise AssertionError("packed again")

    monkeypatch.setattr(Bundle, "fixed_parts", packed_again)
    parts = job.shipped(bundle)._cache["packed"]  # what its file will hold: planning's parts, equal to its own
    assert {k: v.tobytes() for k, v in parts.items()} == {k: v.tobytes() for k, v in expected.items()}
