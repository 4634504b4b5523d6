"""The CUDA-graph step's host side (earl_service/train/graphed.py), which runs on any device: when it refuses, how it
walks the epochs with full batches only, and how a graphed run's optimizer saves so that an eager run on any
device loads it. The capture and the replays themselves are checked against the eager step in test_cuda.py."""

import logging
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_dataset

from earl_service.config import ModelConfig, TrainConfig
from earl_service.train.checkpoint import portable_optimizer_state
from earl_service.train.distributed import Ranks
from earl_service.train.graphed import GraphedStep, make_capturable
from earl_service.train.loop import Learner, eager_step, step_on_batch, train
from earl_service.train.run import Run
from earl_service.train.schedule import build_optimizer, set_lr
from earl_service.train.state import TrainState


def _stepper(rows: int, batch_size: int) -> GraphedStep:
    """A GraphedStep over `rows` training rows on the CPU (its host side only: nothing is captured here)."""
    param = torch.nn.Parameter(torch.zeros(2))
    learner = SimpleNamespace(device=torch.device("cpu"), triples=torch.zeros(rows, 3, dtype=torch.long),
                              cfg=TrainConfig(batch_size=batch_size), optimizer=torch.optim.Adam([param]))
    return GraphedStep(learner, eager_step, step_on_batch)  # type: ignore[arg-type]


def test_epochs_go_by_full_batches_of_one_permutation_each():
    stepper, state = _stepper(10, 4), TrainState.start(0)
    seen, positions = [], []
    for _ in range(4):  # two full batches per epoch of 10 rows; the last 2 rows of each epoch are skipped
        stepper.next_rows(state)
        positions.append(int(stepper.pos))
        seen.append(stepper.order[positions[-1] : positions[-1] + 4].tolist())
    assert positions == [0, 4, 0, 4]
    first, second = seen[0] + seen[1], seen[2] + seen[3]
    assert len(set(first)) == len(set(second)) == 8  # no row twice within an epoch
    assert state.epoch_order is stepper.order and state.epoch_pos == 8
    assert first != second  # a new permutation for the second epoch


def test_an_epoch_begun_eagerly_goes_on():
    """The warm-up steps (and a resumed run) draw from the eager order: the graph's batches continue it."""
    stepper, state = _stepper(12, 4), TrainState.start(0)
    eager = state.next_rows(12, 4)  # one eager batch
    stepper.next_rows(state)
    assert int(stepper.pos) == 4 and state.epoch_pos == 8
    assert stepper.order[:4].tolist() == eager.tolist()
    stepper.next_rows(state)
    assert int(stepper.pos) == 8 and state.epoch_pos == 12
    stepper.next_rows(state)  # no rows left: a new epoch
    assert int(stepper.pos) == 0 and state.epoch_pos == 4


def test_a_graphed_optimizer_saves_as_an_eager_one_loads():
    """make_capturable puts the rates and step counts on the device; the checkpoint holds plain floats and no
    capturable flag, so an eager run (here on the CPU) loads it and steps."""
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([{"params": [param], "lr": 1e-2, "base_lr": 1e-2}])
    param.grad = torch.ones(3)
    opt.step()
    make_capturable(opt, torch.device("cpu"))
    group = opt.param_groups[0]
    assert group["capturable"] and isinstance(group["lr"], torch.Tensor)
    set_lr(opt, TrainConfig(lr=1e-2, lr_schedule="linear", steps=10), step=5, elapsed=0.0)
    assert float(group["lr"]) == pytest.approx(5e-3)  # filled in place, not replaced: a capture keeps reading it
    saved = portable_optimizer_state(opt.state_dict())
    assert saved["param_groups"][0]["lr"] == pytest.approx(5e-3) and not saved["param_groups"][0]["capturable"]
    fresh = torch.optim.Adam([{"params": [param], "lr": 1e-2, "base_lr": 1e-2}])
    fresh.load_state_dict(saved)
    fresh.step()  # eager Adam on the CPU takes it


def test_cuda_graphs_are_refused_with_a_reason_where_they_cannot_run(caplog):
    ds = tiny_dataset()
    cfg = TrainConfig(batch_size=32, negatives=4, cuda_graphs=True, device="cpu", progress=False)
    run = Run.build(ds, ModelConfig(model="rotate", dim=4), torch.device("cpu"))
    learner = Learner.build(run, build_optimizer(run.model, cfg), cfg, ranks=Ranks(), device=torch.device("cpu"))
    with caplog.at_level(logging.WARNING):
        assert GraphedStep.build(learner, eager_step, step_on_batch) is None
    assert "need a CUDA device" in caplog.text
    plain = Learner.build(run, build_optimizer(run.model, TrainConfig()), TrainConfig(), ranks=Ranks(),
                          device=torch.device("cpu"))
    assert GraphedStep.build(plain, eager_step, step_on_batch) is None  # not asked for


def test_a_cpu_run_asked_for_cuda_graphs_trains_eagerly(tmp_path):
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    base = dict(steps=6, batch_size=32, negatives=4, eval_every=0, progress=False, device="cpu")
    plain = train(ds, cfg, TrainConfig(**base), tmp_path / "a", final_eval=False, write_bundle=False)
    asked = train(ds, cfg, TrainConfig(**base, cuda_graphs=True), tmp_path / "b", final_eval=False,
                  write_bundle=False)
    assert asked["steps"] == plain["steps"] == 6
    a, b = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=True) for run in "ab")
    assert a["history"]["losses"] == b["history"]["losses"]
