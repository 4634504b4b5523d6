"""What planning measures before a search: a training step, a validation pass and a slice's setup."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import tiny_dataset

from earl_service.bundle.sizes import BundleSizes
from earl_service.compress import costs as costs_module
from earl_service.compress.candidates import plan_candidates
from earl_service.compress.config import CompressConfig
from earl_service.config import MODELS, ModelConfig, TrainConfig
from earl_service.train.run import Run

TINY = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=1))


def test_planning_times_a_training_step_and_leaves_the_model_as_it_was():
    run = Run.build(tiny_dataset(), ModelConfig(model="earl", dim=16), torch.device("cpu"))
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    step, saved = costs_module.step_seconds(run, TINY["earl"], steps=2)
    assert step > 0 and saved == 0.0  # no scratch folder: no checkpoint timed
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
    assert costs_module.step_seconds(run, TINY["rotate"], steps=3, seconds=0.0)[0] > 0
    assert len(calls) == 2  # the untimed step and one timed
    calls.clear()
    costs_module.step_seconds(run, TINY["rotate"], steps=3, seconds=600.0)
    assert len(calls) == 4


def test_planning_times_a_checkpoint_written_and_read_back_and_leaves_nothing(tmp_path, monkeypatch):
    """The checkpoint as the timed steps leave it (the optimizer's moments too) and the best weights, written in
    the scratch folder and read back; the folder is left as it was and the model too."""
    run = Run.build(tiny_dataset(), ModelConfig(model="rotate", dim=16), torch.device("cpu"))
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    written = []
    real = costs_module.Checkpointer.save

    def save(checkpoints):
        real(checkpoints)
        written.append(sorted(p.name for p in checkpoints.out.iterdir()))

    monkeypatch.setattr(costs_module.Checkpointer, "save", save)
    step, saved = costs_module.step_seconds(run, TINY["rotate"], steps=1, scratch=tmp_path)
    assert step > 0 and saved > 0
    assert written == [["checkpoint.pt"]]
    assert list(tmp_path.iterdir()) == []
    assert all(torch.equal(before[k], run.model.state_dict()[k]) for k in before)


def test_a_candidates_setup_is_estimated_before_its_first_slice(tmp_path, monkeypatch):
    """Building a run (twice a slice: to train, and with the trained weights to export) and its checkpoint round
    trip, measured in planning, are each candidate's other_seconds until its first slice measures them: a
    one-candidate search has no later rung to take up what its only slice did not plan for (5M entities: +5.6%)."""
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
    measured = costs_module.measure_costs(dataset, sizes, units, TINY, scratch=tmp_path)
    assert all(costs.setup >= 2 * slow for costs in measured["rotate"].values())
    estimated = costs_module.with_estimates(units, measured)
    assert all(u.other_seconds >= 2 * slow for u in estimated)
    assert min(u.other_seconds for u in estimated) == pytest.approx(min(c.setup for c in measured["rotate"].values()))
