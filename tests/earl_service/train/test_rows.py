"""Row updates: RowAdam is Adam on dense gradients and SparseAdam on row gradients, a step on the gathered rows
is the full-table step's loss and gradient, the auto rule, and a row-updated run resumes bit for bit."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import tiny_dataset

from earl_service.config import ModelConfig, TrainConfig
from earl_service.errors import ConfigError
from earl_service.model.modules import RotatE, RotatEModel, build_model
from earl_service.train import rows as rows_module
from earl_service.train.loop import CHECKPOINT, train
from earl_service.train.loss import loss_fn
from earl_service.train.rows import (
    BIG_TABLE_ROWS,
    SHARED_CHUNK,
    RowAdam,
    draws_per_step,
    gather_rows,
    negative_chunk,
    table_config,
    wants_row_updates,
)
from earl_service.train.schedule import build_optimizer


def _steps(optimizer_cls, grads, **kwargs):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50, 6))
    opt = optimizer_cls([p], lr=0.05, **kwargs)
    for g in grads:
        p.grad = g
        opt.step()
    return p.detach()


def test_row_adam_is_adam_on_dense_gradients():
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(50, 6, generator=gen) for _ in range(6)]
    torch.testing.assert_close(_steps(RowAdam, grads), _steps(torch.optim.Adam, grads), rtol=1e-6, atol=1e-6)


def test_row_adam_is_sparse_adam_on_row_gradients():
    """Lazy: rows outside a step's gradient keep their weights and moments; bias correction counts every step.
    (SparseAdam adds eps before the second moment's bias correction, Adam after: differences ~1e-5 relative.)"""
    gen = torch.Generator().manual_seed(2)
    grads = []
    for _ in range(6):
        rows = torch.randperm(50, generator=gen)[:12].sort().values
        grads.append(torch.sparse_coo_tensor(rows[None], torch.randn(12, 6, generator=gen), (50, 6),
                                              check_invariants=True).coalesce())
    lazy = _steps(RowAdam, grads)
    torch.testing.assert_close(lazy, _steps(torch.optim.SparseAdam, grads), rtol=1e-4, atol=1e-5)
    torch.manual_seed(0)
    untouched = sorted(set(range(50)) - {int(i) for g in grads for i in g.indices()[0]})
    assert untouched and torch.equal(lazy[untouched], torch.randn(50, 6)[untouched])


def _rotate(n=30, r=4, dim=5):
    model = RotatEModel(ModelConfig(model="rotate", dim=dim), r, n)
    return model, RotatE(model.config)


def test_the_gathered_rows_give_the_full_tables_loss_and_gradient():
    model, scorer = _rotate()
    gen = torch.Generator().manual_seed(3)
    batch = torch.stack([torch.randint(0, 30, (8,), generator=gen), torch.randint(0, 4, (8,), generator=gen),
                         torch.randint(0, 30, (8,), generator=gen)], 1)
    neg_heads, neg_tails = torch.randint(0, 30, (8, 5), generator=gen), torch.randint(0, 30, (8, 5), generator=gen)
    full = loss_fn(scorer, model.entities, model.relations, batch, neg_heads, neg_tails, 1.0)
    full.backward()
    dense = model.entities.grad.clone()
    model.entities.grad = None
    rows, relations, local, local_heads, local_tails = gather_rows(model, batch, neg_heads, neg_tails)
    assert rows.shape[0] == torch.cat([batch[:, 0], batch[:, 2], neg_heads.ravel(), neg_tails.ravel()]).unique().numel()
    gathered = loss_fn(scorer, rows, relations, local, local_heads, local_tails, 1.0)
    gathered.backward()
    torch.testing.assert_close(gathered, full)
    sparse = model.entities.grad
    assert sparse.is_sparse and sparse._values().shape == rows.shape
    torch.testing.assert_close(sparse.to_dense(), dense)


def test_shared_corruptions_renumber_their_draws_as_the_copies_would():
    """gather_rows from a chunked draw's (2, C, K) draws gives what it gives from their (B, K) copies."""
    from earl_service.train.loss import NegativeSampler

    model, _ = _rotate()
    gen = torch.Generator().manual_seed(5)
    train = np.stack([np.arange(20) % 30, np.arange(20) % 4, (np.arange(20) * 7) % 30], 1)
    batch = torch.as_tensor(train[:10], dtype=torch.long)
    neg = NegativeSampler(train, 30, 4, torch.device("cpu")).sample(batch[:, 0], batch[:, 1], batch[:, 2], 6, gen,
                                                                    chunk=4)
    assert neg.shared is not None and neg.shared[0].shape == (2, 3, 6)
    copies = gather_rows(model, batch, neg.heads, neg.tails)
    shared = gather_rows(model, batch, neg.heads, neg.tails, shared=neg.shared)
    for a, b in zip(copies, shared, strict=True):
        torch.testing.assert_close(a, b)


def test_auto_updates_rows_where_a_step_draws_fewer_ids_than_the_table_holds():
    cfg = TrainConfig(batch_size=4, negatives=3)
    assert draws_per_step(cfg, 0) == 2 * 4 * (3 + 1) and draws_per_step(cfg, 3) == 2 * (4 + 2 * 3)
    small, _ = _rotate(n=draws_per_step(cfg, 0) - 1)
    big, _ = _rotate(n=draws_per_step(cfg, 0))
    assert not wants_row_updates(small, cfg) and wants_row_updates(big, cfg)
    assert wants_row_updates(small, TrainConfig(batch_size=4, negatives=3, negative_chunk=3))
    assert isinstance(build_optimizer(big, cfg), RowAdam)
    assert type(build_optimizer(small, cfg)) is torch.optim.Adam
    assert wants_row_updates(small, TrainConfig(row_updates="on"))
    assert not wants_row_updates(big, TrainConfig(batch_size=4, negatives=3, row_updates="off"))
    earl = build_model(ModelConfig(dim=4), 40, 3, torch.arange(8))
    assert not wants_row_updates(earl, TrainConfig(row_updates="auto", batch_size=1, negatives=1))
    with pytest.raises(ConfigError, match="RotatE only"):
        wants_row_updates(earl, TrainConfig(row_updates="on"))
    with pytest.raises(ConfigError, match="CUDA graph"):
        wants_row_updates(small, TrainConfig(row_updates="on", cuda_graphs=True))


def test_big_tables_share_corruptions_in_chunks_unless_told():
    """From BIG_TABLE_ROWS entities RotatE's positives share corruptions by SHARED_CHUNK (6,144 draws a step at
    the default 1024 x 128, so the rows update alone); a given --negative-chunk always wins."""
    cfg = TrainConfig(batch_size=1024, negatives=128)
    below, _ = _rotate(n=BIG_TABLE_ROWS - 1, dim=1)
    table, _ = _rotate(n=BIG_TABLE_ROWS, dim=1)
    assert negative_chunk(below, cfg) == 0 and wants_row_updates(below, cfg)  # 264,192 draws a step < its rows
    assert negative_chunk(table, cfg) == SHARED_CHUNK and wants_row_updates(table, cfg)
    assert negative_chunk(table, TrainConfig(negative_chunk=1)) == 1 == negative_chunk(below, TrainConfig(negative_chunk=1))
    earl = build_model(ModelConfig(dim=4), 40, 3, torch.arange(8))
    assert negative_chunk(earl, cfg) == 0


def test_big_tables_train_with_their_own_negatives(tmp_path, monkeypatch):
    """TrainConfig.big_table_negatives replaces --negatives where the table is big (as negative_chunk decides),
    in the run's steps and in the config its checkpoint records; nowhere else."""
    cfg = TrainConfig(negatives=128, big_table_negatives=32)
    below, _ = _rotate(n=BIG_TABLE_ROWS - 1, dim=1)
    table, _ = _rotate(n=BIG_TABLE_ROWS, dim=1)
    assert table_config(table, cfg).negatives == 32 and table_config(below, cfg) == cfg
    assert table_config(table, TrainConfig(negatives=128)).negatives == 128  # 0: --negatives everywhere
    assert table_config(table, replace(cfg, sampled=True)).negatives == 128
    assert table_config(table, replace(cfg, negative_chunk=1)).negatives == 128  # no sharing: the field's premise
    assert table_config(table, replace(cfg, negative_chunk=16)).negatives == 32
    earl = build_model(ModelConfig(dim=4), 40, 3, torch.arange(8))
    assert table_config(earl, cfg) == cfg
    monkeypatch.setattr(rows_module, "BIG_TABLE_ROWS", 10)  # the tiny graph's 40 entities make a big table
    ds = tiny_dataset()
    train(ds, ModelConfig(model="rotate", dim=4), TrainConfig(steps=2, batch_size=32, negatives=8, big_table_negatives=3,
          eval_every=0, progress=False), tmp_path, final_eval=False, write_bundle=False)
    assert torch.load(tmp_path / CHECKPOINT, weights_only=True)["train_config"]["negatives"] == 3


def test_a_row_updated_run_learns_and_resumes_bit_for_bit(tmp_path):
    ds, cfg = tiny_dataset(), ModelConfig(model="rotate", dim=4)
    fast = dict(batch_size=32, negatives=8, eval_every=4, eval_batch_size=16, progress=False, checkpoint_every=4,
                lr=0.05, row_updates="on")
    train(ds, cfg, TrainConfig(steps=12, **fast), tmp_path / "straight", final_eval=False, write_bundle=False)
    train(ds, cfg, TrainConfig(steps=7, **fast), tmp_path / "split", final_eval=False, write_bundle=False)
    train(ds, cfg, TrainConfig(steps=12, **fast), tmp_path / "split", resume=True, final_eval=False,
          write_bundle=False)
    a, b = (torch.load(tmp_path / run / CHECKPOINT, weights_only=True) for run in ("straight", "split"))
    assert a["history"]["losses"] == b["history"]["losses"]
    assert a["history"]["losses"][-1] < a["history"]["losses"][0]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert set(a["optimizer"]["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
