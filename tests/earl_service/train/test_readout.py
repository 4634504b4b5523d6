"""Losses read every few steps: the same history, progress, weights and resume as a read after every step, and a
non-finite loss still stops the run, at the next read, naming the step where it first appeared.

On a CPU the loop reads every step (a read costs nothing there); these tests set the cadence a GPU uses (or an
odd one, off the validation and checkpoint cadences) so that the deferred reads run here, without a GPU.
"""

import functools
import math

import pytest
import torch
from conftest import tiny_dataset

from earl_service.config import ModelConfig, TrainConfig
from earl_service.train import loop as loop_module
from earl_service.train.loop import CHECKPOINT, train
from earl_service.train.loss import NegativeSampler
from earl_service.train.readout import LossReadout, read_every

TINY = ModelConfig(dim=4, k=3, reserved_ratio=0.2)
FAST = dict(batch_size=32, negatives=8, eval_batch_size=16, progress=False)


def test_a_read_returns_every_pending_step_and_names_the_first_non_finite_one():
    losses = LossReadout(every=3)
    for step, value in enumerate([0.5, 0.25], start=1):
        losses.add(step, torch.tensor(value), seconds=0.1, since_start=step, lr_factor=0.5)
    assert not losses.due
    records = losses.read()
    assert [(r.step, r.loss, r.since_start, r.lr_factor) for r in records] == [(1, 0.5, 1, 0.5), (2, 0.25, 2, 0.5)]
    assert losses.read() == []  # read once
    for step, value in enumerate([1.0, float("nan"), float("inf")], start=3):
        losses.add(step, torch.tensor(value))
    assert losses.due
    with pytest.raises(FloatingPointError, match="at step 4"):
        losses.read()
    assert read_every(torch.device("cpu")) == 1 and read_every(torch.device("cuda")) > 1


def _history_and_progress(tmp_path, monkeypatch, every, name, **train_kwargs):
    monkeypatch.setattr(loop_module, "read_every", lambda device: every)
    reports = []
    tcfg = TrainConfig(steps=13, eval_every=5, checkpoint_every=6, **FAST)
    train(tiny_dataset(), TINY, tcfg, tmp_path / name, final_eval=False, write_bundle=False,
          on_progress=reports.append, **train_kwargs)
    return torch.load(tmp_path / name / CHECKPOINT, weights_only=True), reports


def test_deferred_reads_keep_the_history_progress_and_weights(tmp_path, monkeypatch):
    """Reads every 4 steps (and at validations, checkpoints and the end) against a read after every step: the
    same losses per step in the history and the progress callback, bit for bit, and the same weights."""
    each, each_reports = _history_and_progress(tmp_path, monkeypatch, 1, "each")
    deferred, deferred_reports = _history_and_progress(tmp_path, monkeypatch, 4, "deferred")
    for key in ("steps", "losses", "lr_factors", "eval_steps", "eval_mrr"):
        assert deferred["history"][key] == each["history"][key], key
    assert len(deferred["history"]["losses"]) == len(deferred["history"]["step_times"]) == 13
    for key in ("step", "loss", "valid_mrr", "total"):
        assert [r[key] for r in deferred_reports] == [r[key] for r in each_reports], key
    assert [r["step"] for r in deferred_reports] == list(range(1, 14))
    for key in each["model"]:
        assert torch.equal(deferred["model"][key], each["model"][key]), key


def test_a_non_finite_loss_stops_the_run_at_the_next_read(tmp_path, monkeypatch):
    """The loss turns NaN at step 3; with reads every 4 steps the run stops at step 4's read (a validation's),
    naming step 3, and validates and checkpoints nothing after step 2."""
    real_step = loop_module.train_step

    def spoiled_step(learner, state):
        loss = real_step(learner, state)
        return loss * math.nan if state.step == 3 else loss

    monkeypatch.setattr(loop_module, "read_every", lambda device: 4)
    monkeypatch.setattr(loop_module, "train_step", spoiled_step)
    tcfg = TrainConfig(steps=10, eval_every=4, checkpoint_every=2, **FAST)
    with pytest.raises(FloatingPointError, match="loss became nan at step 3"):
        train(tiny_dataset(), TINY, tcfg, tmp_path, final_eval=False, write_bundle=False)
    saved = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert saved["state"]["step"] == 2 and saved["history"]["eval_steps"] == []


@pytest.mark.parametrize("sampled", [False, True])
def test_a_deferred_run_with_fixed_shape_negatives_resumes_exactly(tmp_path, monkeypatch, sampled):
    """The CUDA step's ways, on the CPU: reads every 4 steps and negatives redrawn through masks. Cancelled after
    7 steps and resumed, the run repeats the uninterrupted run's losses, validations, generator and weights."""
    monkeypatch.setattr(loop_module, "read_every", lambda device: 4)
    monkeypatch.setattr(loop_module, "NegativeSampler", functools.partial(NegativeSampler, fixed_shapes=True))
    ds = tiny_dataset()
    tcfg = TrainConfig(steps=12, eval_every=3, checkpoint_every=5, sampled=sampled, fanout=(3, 2), negative_chunk=8,
                       **FAST)
    train(ds, TINY, tcfg, tmp_path / "straight", final_eval=False, write_bundle=False)
    calls = []
    first = train(ds, TINY, tcfg, tmp_path / "split", final_eval=False, write_bundle=False,
                  should_stop=lambda: calls.append(1) or len(calls) > 7)
    assert first["steps"] == 7 and first["stopped"] == "cancelled"
    train(ds, TINY, tcfg, tmp_path / "split", resume=True, final_eval=False, write_bundle=False)
    a, b = (torch.load(tmp_path / run / CHECKPOINT, weights_only=True) for run in ("straight", "split"))
    for key in ("steps", "losses", "eval_steps", "eval_mrr"):
        assert a["history"][key] == b["history"][key], key
    assert len(a["history"]["losses"]) == 12
    assert torch.equal(a["generator"], b["generator"])
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
