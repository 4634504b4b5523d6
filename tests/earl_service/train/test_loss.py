"""Negatives: both ways of redrawing leave no known true triple among the negatives the loss trains on, the
fixed-shape way (the GPU's) calls nothing that needs a value on the host, and an ignored negative counts for
nothing in the loss."""

import collections

import pytest
import torch
from conftest import codex_s_path
from torch.overrides import TorchFunctionMode

from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.model.modules import RotatE
from earl_service.train.distributed import Ranks
from earl_service.train.loop import Learner, train_step
from earl_service.train.loss import NegativeSampler, loss_fn
from earl_service.train.run import Run
from earl_service.train.schedule import build_optimizer
from earl_service.train.state import TrainState

CPU = torch.device("cpu")
# Ops whose result has a data-dependent shape or that bring a value to the host: on CUDA each is a host sync.
HOST_SYNCS = {"nonzero", "unique", "masked_select", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy",
              "repeat_interleave", "bincount", "any", "all"}


class OpNames(TorchFunctionMode):
    """The torch functions and tensor methods called inside the block, counted by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def codex():
    return load_dataset(codex_s_path())


def _batch(ds, size=1024, seed=0):
    triples = torch.as_tensor(ds.train, dtype=torch.long)
    return triples[torch.randperm(len(triples), generator=torch.Generator().manual_seed(seed))[:size]]


@pytest.mark.parametrize("fixed_shapes", [False, True])
def test_negatives_never_train_on_a_known_true_triple(codex, fixed_shapes):
    """CoDEx-S is dense (2,034 entities; ~4% of uniform head draws are true answers): every negative either
    makes no training triple or is flagged for the loss to ignore, the flags are exact, and few are left."""
    ds = codex
    sampler = NegativeSampler(ds.train, ds.num_train_entities, ds.num_relations, CPU, fixed_shapes=fixed_shapes)
    batch = _batch(ds)
    h, r, t = batch[:, 0], batch[:, 1], batch[:, 2]
    neg = sampler.sample(h, r, t, 256, torch.Generator().manual_seed(1))
    assert neg.heads.shape == neg.tails.shape == (1024, 256)
    assert int(neg.heads.min()) >= 0 and int(neg.tails.max()) < ds.num_train_entities
    true = {tuple(x) for x in ds.train.tolist()}
    head_true = torch.tensor([[(x, rr, tt) in true for x in row] for (_, rr, tt), row in
                              zip(batch.tolist(), neg.heads.tolist(), strict=True)])
    tail_true = torch.tensor([[(hh, rr, x) in true for x in row] for (hh, rr, _), row in
                              zip(batch.tolist(), neg.tails.tolist(), strict=True)])
    head_flag, tail_flag = neg.known if neg.known is not None else (torch.zeros_like(head_true),) * 2
    assert torch.equal(head_flag, head_true) and torch.equal(tail_flag, tail_true)
    assert (head_true.sum() + tail_true.sum()) / (2 * head_true.numel()) < 0.002  # from ~4% before the rounds


def test_shared_negatives_are_one_draw_per_chunk_with_exact_known_flags(codex):
    """negative_chunk C: positives [iC, (i+1)C) share their corruptions; the true ones are flagged, not redrawn."""
    ds = codex
    sampler = NegativeSampler(ds.train, ds.num_train_entities, ds.num_relations, CPU)
    batch = _batch(ds, size=100)
    neg = sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], 64, torch.Generator().manual_seed(1), chunk=32)
    assert neg.heads.shape == neg.tails.shape == (100, 64)
    for side in (neg.heads, neg.tails):
        assert all(torch.equal(side[i], side[i // 32 * 32]) for i in range(100))
        assert not torch.equal(side[0], side[32]) and len({tuple(side[i].tolist()) for i in range(100)}) == 4
    true = {tuple(x) for x in ds.train.tolist()}
    head_true = torch.tensor([[(x, rr, tt) in true for x in row] for (_, rr, tt), row in
                              zip(batch.tolist(), neg.heads.tolist(), strict=True)])
    assert neg.known is not None and torch.equal(neg.known[0], head_true) and bool(head_true.any())


def test_both_ways_draw_the_same_distribution(codex):
    """Redrawn hits only (CPU) or every round through a mask (GPU): the same share of each entity among the
    tail negatives of one query, within sampling noise."""
    ds = codex
    h, r = torch.full((4000,), int(ds.train[0, 0])), torch.full((4000,), int(ds.train[0, 1]))
    counts = {}
    for fixed in (False, True):
        sampler = NegativeSampler(ds.train, ds.num_train_entities, ds.num_relations, CPU, fixed_shapes=fixed)
        neg = sampler.sample(h, r, h, 256, torch.Generator().manual_seed(2))
        kept = neg.tails if neg.known is None else neg.tails[~neg.known[1]]
        counts[fixed] = torch.bincount(kept.reshape(-1), minlength=ds.num_train_entities).double()
    share = {fixed: c / c.sum() for fixed, c in counts.items()}
    draws = 4000 * 256
    noise = (2 * draws / ds.num_train_entities) ** 0.5 / draws  # sd of a share's difference (~500 draws each)
    assert (share[True] - share[False]).abs().max() < 6 * noise


@pytest.mark.parametrize("model", ["rotate", "earl"])
def test_a_fixed_shape_step_calls_nothing_that_syncs_the_host(codex, model):
    """The full-graph step with the GPU's sampler, ops recorded: none of them would wait for a GPU (the CPU's
    stand-in for test_cuda.py's set_sync_debug_mode check). Adam's `item()` reads its step counters, which it
    keeps on the CPU on every device. The CPU's compacting sampler, as a control, is caught."""
    ds = codex
    tcfg = TrainConfig(batch_size=256, negatives=16, progress=False, device="cpu")
    run = Run.build(ds, ModelConfig(model=model, dim=16), CPU)
    learner = Learner.build(run, build_optimizer(run.model, tcfg), tcfg, ranks=Ranks(), device=CPU)
    state = TrainState.start(0)
    run.model.train()
    names = {}
    for fixed in (True, False):
        learner.sampler = NegativeSampler(ds.train, ds.num_train_entities, ds.num_relations, CPU, fixed_shapes=fixed)
        train_step(learner, state)  # the optimizer's state is built on the first step
        with OpNames() as ops:
            for _ in range(3):
                train_step(learner, state)
        names[fixed] = set(ops.names)
    assert names[True] & HOST_SYNCS == set()
    assert "nonzero" in names[False]


def test_an_ignored_negative_counts_for_nothing():
    """A flagged column gives the loss of the same batch without that column (the self-adversarial weights are
    renormalised over the rest); a row with every negative flagged adds nothing."""
    gen = torch.Generator().manual_seed(0)
    scorer = RotatE(ModelConfig(model="rotate", dim=4))
    entities, relations = torch.randn(30, 8, generator=gen), torch.randn(3, 4, generator=gen)
    batch = torch.tensor([[0, 1, 2], [3, 0, 4], [5, 2, 6]])
    neg_heads, neg_tails = torch.randint(0, 30, (3, 5), generator=gen), torch.randint(0, 30, (3, 5), generator=gen)
    ignore = torch.zeros(3, 5, dtype=torch.bool)
    ignore[:, 2] = True
    flagged = loss_fn(scorer, entities, relations, batch, neg_heads, neg_tails, 1.0, ignore=(ignore, ignore))
    keep = [0, 1, 3, 4]
    dropped = loss_fn(scorer, entities, relations, batch, neg_heads[:, keep], neg_tails[:, keep], 1.0)
    torch.testing.assert_close(flagged, dropped)
    unflagged = loss_fn(scorer, entities, relations, batch, neg_heads, neg_tails, 1.0)
    none = torch.zeros_like(ignore)
    assert torch.equal(loss_fn(scorer, entities, relations, batch, neg_heads, neg_tails, 1.0, ignore=(none, none)),
                       unflagged)
    every = torch.ones_like(ignore)
    only_positives = loss_fn(scorer, entities, relations, batch, neg_heads, neg_tails, 1.0, ignore=(every, every))
    assert torch.isfinite(only_positives) and only_positives < unflagged
