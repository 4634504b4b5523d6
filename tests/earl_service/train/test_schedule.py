"""The learning-rate schedule: its shape over a budget, the split rates, and an exact resume."""

import json
import math
import time

import pytest
import torch
from conftest import tiny_dataset

from earl_service.config import ModelConfig, TrainConfig
from earl_service.errors import ConfigError
from earl_service.model.modules import build_model
from earl_service.train.loop import CHECKPOINT, train
from earl_service.train.schedule import budget_used, build_optimizer, lr_factor, param_groups

FAST = dict(batch_size=32, negatives=8, eval_every=0, eval_batch_size=16, progress=False, checkpoint_every=5)


def test_cosine_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(lr_schedule="cosine", warmup=0.1, lr_floor=0.05)
    assert lr_factor(cfg, 0.0) == pytest.approx(1e-3)
    assert lr_factor(cfg, 0.05) == pytest.approx(0.5)
    assert lr_factor(cfg, 0.1) == pytest.approx(1.0)
    assert lr_factor(cfg, 0.55) == pytest.approx(0.05 + 0.95 * 0.5)  # half-way through the decay
    assert lr_factor(cfg, 1.0) == pytest.approx(0.05)


def test_linear_decays_in_a_straight_line_and_constant_stays():
    cfg = TrainConfig(lr_schedule="linear")
    assert [lr_factor(cfg, u) for u in (0.0, 0.25, 1.0)] == pytest.approx([1.0, 0.75, 0.0])
    assert lr_factor(TrainConfig(), 0.9) == 1.0


def test_the_budget_is_whichever_of_steps_and_time_ends_first():
    cfg = TrainConfig(steps=1000, time_limit_minutes=10)
    assert budget_used(cfg, 100, 300.0) == pytest.approx(0.5)  # half the time, a tenth of the steps
    assert budget_used(cfg, 900, 60.0) == pytest.approx(0.9)
    assert budget_used(cfg, 2000, 0.0) == 1.0


def test_a_schedule_budget_of_its_own_outlasts_the_time_limit_of_one_slice():
    cfg = TrainConfig(steps=0, time_limit_minutes=1, schedule_minutes=10)  # a first slice of a 10-minute plan
    assert budget_used(cfg, 50, 60.0) == pytest.approx(0.1)
    assert budget_used(TrainConfig(steps=0, time_limit_minutes=1), 50, 60.0) == 1.0


def test_a_slice_decays_its_own_budget_from_where_it_starts():
    cfg = TrainConfig(steps=0, time_limit_minutes=3, schedule_minutes=2, schedule_start_minutes=1)  # a 2nd slice
    assert budget_used(cfg, 50, 30.0) == 0.0  # before its start: the warm-up's beginning
    assert budget_used(cfg, 50, 120.0) == pytest.approx(0.5)
    assert budget_used(cfg, 50, 180.0) == 1.0


def test_compress_slices_restart_the_schedule_at_each_rung(monkeypatch, tmp_path):
    """Each slice of a candidate decays over that slice's training, from the training it had before."""
    from types import SimpleNamespace

    from earl_service.compress import rungs

    seen = []

    def fake_train(dataset, model_config, cfg, out, **kwargs):
        seen.append(cfg)
        return {"train_seconds": cfg.time_limit_minutes * 60, "steps": 10, "stopped": "time_limit"}

    monkeypatch.setattr(rungs, "train", fake_train)
    candidate = SimpleNamespace(config=None, train_seconds=90.0, steps=5)
    job = SimpleNamespace(candidate=lambda name: candidate, config=SimpleNamespace(seed=0), dataset=None, graphs=None,
                          train_config=lambda name: TrainConfig(lr_schedule="cosine"), run_dir=lambda name: tmp_path,
                          clock=lambda: 0.0, charge=lambda *a, **k: None, emit=lambda *a, **k: None, should_stop=None)
    rungs.train_slice(job, "rotate-d10", 60.0)
    assert seen[0].schedule_start_minutes == pytest.approx(1.5) and seen[0].schedule_minutes == pytest.approx(1.0)
    assert seen[0].time_limit_minutes == pytest.approx(2.5)
    assert candidate.train_seconds == pytest.approx(150.0)


def test_a_held_state_is_not_rewound_to_before_its_slice_is_done(tmp_path):
    """A slice killed during its decay resumes the decay: its caller's record (the seconds before the slice) is
    short of the held state."""
    from earl_service.train import slices

    (tmp_path / CHECKPOINT).write_text("decaying")
    slices.keep_held(tmp_path, {"train_seconds": 135.0, "steps": 10})
    assert slices.rewind(tmp_path, 90.0) is None and (tmp_path / CHECKPOINT).read_text() == "decaying"
    assert slices.rewind(tmp_path, 150.0) == {"train_seconds": 135.0, "steps": 10}


def test_a_decay_share_holds_the_rate_until_the_decay_begins():
    cfg = TrainConfig(lr_schedule="cosine", warmup=0.1, decay_share=0.4)
    assert lr_factor(cfg, 0.05) == pytest.approx(0.5)  # the warm-up as before
    assert [lr_factor(cfg, u) for u in (0.1, 0.3, 0.6)] == pytest.approx([1.0, 1.0, 1.0])
    assert lr_factor(cfg, 0.8) == pytest.approx(0.5) and lr_factor(cfg, 1.0) == pytest.approx(0.0)
    whole = TrainConfig(lr_schedule="linear", warmup=0.2)  # decay_share 1: from the warm-up's end, as before
    assert [lr_factor(whole, u) for u in (0.2, 0.6, 1.0)] == pytest.approx([1.0, 0.5, 0.0])


def test_a_real_slice_holds_then_decays_and_keeps_where_the_decay_began(tmp_path):
    from earl_service.train import slices

    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    tcfg = TrainConfig(lr_schedule="cosine", **FAST)
    metrics = slices.train_slice(ds, cfg, tcfg, tmp_path, trained=0.0, seconds=1.0, schedule=(0.0, 1.0),
                                 decay_share=0.5, final_eval=False, write_bundle=False)
    held = json.loads((tmp_path / slices.HELD_AT).read_text())
    factors = torch.load(tmp_path / CHECKPOINT, weights_only=True)["history"]["lr_factors"]
    assert 0 < held["steps"] <= metrics["steps"] == len(factors)
    assert factors[: held["steps"]] == pytest.approx([1.0] * held["steps"])  # held at the base rate
    assert all(f < 1.0 for f in factors[held["steps"]:])  # then decaying, from the first step after it
    assert slices.rewind(tmp_path, metrics["train_seconds"]) == held
    state = torch.load(tmp_path / CHECKPOINT, weights_only=True)["state"]
    assert (state["step"], state["elapsed"]) == (held["steps"], pytest.approx(held["train_seconds"]))


def test_a_slice_stopped_after_a_slow_write_goes_on_from_the_clock_that_stopped_it(tmp_path, monkeypatch):
    """The clock runs on while a checkpoint is written; the held state records the reading that ended the hold,
    so that the next steps decay rather than repeat the held rate (a slow disk made the CI see this)."""
    from earl_service.train import slices
    from earl_service.train.checkpoint import Checkpointer

    save, saves = Checkpointer.save, []

    def slow_save(self, *args, **kwargs):
        if not saves:  # the first step's checkpoint takes past the hold's end (0.5 s)
            time.sleep(0.6)
        saves.append(1)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "save", slow_save)
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    tcfg = TrainConfig(lr_schedule="cosine", **{**FAST, "checkpoint_every": 1})
    slices.train_slice(ds, cfg, tcfg, tmp_path, trained=0.0, seconds=1.0, schedule=(0.0, 1.0), decay_share=0.5,
                       final_eval=False, write_bundle=False)
    held = json.loads((tmp_path / slices.HELD_AT).read_text())
    factors = torch.load(tmp_path / CHECKPOINT, weights_only=True)["history"]["lr_factors"]
    assert held["train_seconds"] > 0.5  # the hold's end, not the end of its last step
    assert factors[held["steps"]] < 1.0


def test_bad_schedule_values_are_refused():
    with pytest.raises(ConfigError, match="lr_schedule"):
        TrainConfig(lr_schedule="step")
    with pytest.raises(ConfigError, match="warmup"):
        TrainConfig(warmup=1.5)


def test_encoder_lr_splits_tables_from_the_shared_encoder():
    model = build_model(ModelConfig(dim=4, k=3, reserved_ratio=0.2), 40, 3, torch.arange(8))
    groups = param_groups(model, TrainConfig(lr=1e-3, encoder_lr=3e-4))
    tables = {id(p) for p in groups[0]["params"]}
    named = dict(model.named_parameters())
    assert tables == {id(named[n]) for n in ("reserved_embeddings", "relation_ends", "relations")}
    assert [g["base_lr"] for g in groups] == [1e-3, 3e-4]
    assert sum(len(g["params"]) for g in groups) == len(named)
    rotate = build_model(ModelConfig(model="rotate", dim=4), 40, 3, torch.arange(8))
    assert len(param_groups(rotate, TrainConfig(encoder_lr=3e-4))) == 1  # no encoder: one group
    assert len(param_groups(model, TrainConfig())) == 1  # no split asked: as before


def test_a_step_budget_decays_the_rate_to_its_floor_over_the_run(tmp_path):
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    tcfg = TrainConfig(steps=10, lr_schedule="cosine", warmup=0.2, **FAST)
    train(ds, cfg, tcfg, tmp_path, final_eval=False, write_bundle=False)
    factors = torch.load(tmp_path / CHECKPOINT, weights_only=True)["history"]["lr_factors"]
    assert factors == pytest.approx([lr_factor(tcfg, s / 10) for s in range(10)])
    assert factors[2] == pytest.approx(1.0) and factors[-1] == pytest.approx((1 + math.cos(math.pi * 7 / 8)) / 2)


def test_a_resumed_run_continues_on_the_same_schedule(tmp_path):
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    tcfg = TrainConfig(steps=12, lr_schedule="linear", warmup=0.25, encoder_lr=5e-4, **FAST)
    train(ds, cfg, tcfg, tmp_path / "straight", final_eval=False, write_bundle=False)
    calls = []
    train(ds, cfg, tcfg, tmp_path / "split", final_eval=False, write_bundle=False,
          should_stop=lambda: calls.append(1) or len(calls) > 7)
    train(ds, cfg, tcfg, tmp_path / "split", resume=True, final_eval=False, write_bundle=False)
    a, b = (torch.load(tmp_path / run / CHECKPOINT, weights_only=True) for run in ("straight", "split"))
    assert a["history"]["lr_factors"] == b["history"]["lr_factors"]
    assert [g["lr"] for g in a["optimizer"]["param_groups"]] == [g["lr"] for g in b["optimizer"]["param_groups"]]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_the_optimizer_starts_at_the_schedules_first_rate():
    model = build_model(ModelConfig(model="rotate", dim=4), 40, 3, torch.arange(8))
    optimizer = build_optimizer(model, TrainConfig(lr=1e-2, lr_schedule="cosine", warmup=0.5))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-5)
