"""The training step captured once in a CUDA graph and replayed (`--cuda-graphs`).

On one H200 a full-graph step launches 430 kernels (EARL d150, FB15k-237) or 260 (RotatE d500), and the host's
launches, not the card, set the pace: 14.0 and 9.5 ms per step eagerly, 5.1 and 3.4 ms replayed from a graph
(bench/results/cuda_profile.md). A replay repeats the captured kernels on the same memory, so whatever varies
between steps must live in that memory and be written outside the graph:

- the batch: its rows are `order[pos + arange(B)]`, with `order` this epoch's permutation and `pos` a 0-dim
  tensor, both written before each replay; every batch is full, so each epoch's last `T mod B` rows are skipped
  (the eager step trains them as a shorter batch);
- the learning rate: a tensor per param group that `set_lr` fills (Adam runs `capturable`, its step counts on the
  card);
- the negatives: drawn inside the graph from the run's generator, registered with it, so that each replay draws
  new ones and the generator's state (checkpoints, resumes) advances as an eager step's would.

The first WARMUP_STEPS steps run eagerly on a side stream (lazy initialisations must not happen during a
capture), the next is captured and every later one replayed; bf16 autocast runs without its cast cache (which a
capture would freeze). Not for sampled training or several ranks: those keep the eager step, with a log line
saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch

from earl_service.config import TrainConfig
from earl_service.train.distributed import Ranks
from earl_service.train.state import TrainState

log = logging.getLogger(__name__)

WARMUP_STEPS = 3


class Learner(Protocol):
    """What of train/loop.py's Learner a graphed step reads (the loop imports this module, not the reverse)."""

    device: torch.device
    triples: torch.Tensor
    cfg: TrainConfig
    ranks: Ranks
    optimizer: torch.optim.Optimizer


Step = Callable[[Any, TrainState], torch.Tensor]  # loop.eager_step: the learner and state -> the loss
BatchStep = Callable[[Any, TrainState, torch.Tensor], torch.Tensor]  # loop.step_on_batch


class GraphedStep:
    """A Learner's step as a CUDA graph; `step` has train_step's contract (the loss, a 0-dim device tensor)."""

    def __init__(self, learner: Learner, eager: Step, on_batch: BatchStep) -> None:
        """`eager` steps the warm-up; `on_batch` is the step the graph captures, on rows it gathers itself."""
        self.eager, self.on_batch = eager, on_batch
        device, rows = learner.device, len(learner.triples)
        self.batch_size = min(learner.cfg.batch_size, rows)
        self.order = torch.arange(rows, device=device)  # this epoch's permutation, rewritten in place
        self.pos = torch.zeros((), dtype=torch.long, device=device)  # the batch's first row in `order`
        self.offsets = torch.arange(self.batch_size, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.loss: torch.Tensor | None = None  # the captured step's output, overwritten by each replay
        self.warmed = 0
        make_capturable(learner.optimizer, device)

    @staticmethod
    def refusal(learner: Learner) -> str | None:
        """Why this learner's steps cannot be captured, or None when they can."""
        if learner.device.type != "cuda":
            return f"CUDA graphs need a CUDA device, not {learner.device.type}"
        if learner.ranks.world > 1:
            return "CUDA graphs are for one process (DDP's collectives are not captured here)"
        if learner.cfg.sampled:
            return "sampled training draws neighbourhoods on the CPU each step"
        return None

    @classmethod
    def build(cls, learner: Learner, eager: Step, on_batch: BatchStep) -> GraphedStep | None:
        """The graphed step where it applies (`--cuda-graphs`), else None with the reason logged."""
        if not learner.cfg.cuda_graphs:
            return None
        if (reason := cls.refusal(learner)) is not None:
            log.warning("--cuda-graphs: not used: %s", reason)
            return None
        return cls(learner, eager, on_batch)

    def step(self, learner: Learner, state: TrainState) -> torch.Tensor:
        if self.warmed < WARMUP_STEPS:
            self.warmed += 1
            return self._on_side_stream(lambda: self.eager(learner, state), learner.device)
        self.next_rows(state)
        if self.graph is None:
            self._capture(learner, state)
        assert self.graph is not None and self.loss is not None
        self.graph.replay()
        state.step += 1
        return self.loss.clone()  # the next replay overwrites self.loss; the readout holds this step's

    def next_rows(self, state: TrainState) -> None:
        """Point `pos` at the next full batch of this epoch's order, drawing a new order (written into `order`)
        where the epoch has no full batch left. Writes only: nothing here waits on the card."""
        rows = len(self.order)
        if state.epoch_order is not self.order:
            if state.epoch_order is None:
                state.epoch_pos = rows  # no epoch yet: a new order below
            else:
                self.order.copy_(state.epoch_order)  # an epoch begun eagerly (the warm-up, a resume) goes on
            state.epoch_order = self.order
        if state.epoch_pos + self.batch_size > rows:
            self.order.copy_(torch.randperm(rows, generator=state.rng, device=self.order.device))
            state.epoch_pos = 0
        self.pos.fill_(state.epoch_pos)
        state.epoch_pos += self.batch_size

    def _capture(self, learner: Learner, state: TrainState) -> None:
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(state.rng)  # each replay draws new negatives, and the generator advances
        with torch.cuda.graph(graph):
            batch = learner.triples[self.order[self.pos + self.offsets]]
            self.loss = self.on_batch(learner, state, batch)
        self.graph = graph
        log.info("training step captured in a CUDA graph at step %d", state.step)

    @staticmethod
    def _on_side_stream(fn: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream(device).wait_stream(side)
        return out


def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Adam with its step counts and learning rates on `device`, so that a captured step advances them."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        group["lr"] = torch.tensor(float(group["lr"]), device=device)
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state and "step" in state:
                state["step"] = state["step"].to(device=device, dtype=torch.float32)


__all__ = ["WARMUP_STEPS", "GraphedStep", "make_capturable"]
