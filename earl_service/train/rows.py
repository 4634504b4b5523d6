"""Row updates: a RotatE step that gathers, differentiates and updates only the entity rows its batch touches.

A full-table step costs O(N) whatever the batch: the gather's backward zero-fills an (N, 2d) gradient and Adam
then reads and writes four (N, 2d) tensors. At a million entities (d20, one core) that was 0.56 s a step, 86% of
it those fills and Adam's passes, against ~0.06 s of distances. Here a step gathers its U unique rows (each
positive's ends and corruptions) into a small table whose gradient is a sparse (U, 2d) tensor (`_Rows`), and
`RowAdam` updates those rows only: lazy Adam, as torch's SparseAdam and TensorFlow's LazyAdam do (a row's moments
move only when the row is in a batch; bias correction counts every step). Dense parameters (RotatE's relations)
get ordinary Adam in the same optimizer, so one state_dict checkpoints both.

Where it applies (`TrainConfig.row_updates`): "auto" turns it on for RotatE on a CPU where a step draws fewer
entity ids than the table has rows (`draws_per_step`: at the default recipe's batch 1024 x 128 negatives, from
264,192 entities); below that nearly every row is touched anyway and gathering costs more than it saves. From
BIG_TABLE_ROWS entities RotatE's positives also share their corruptions by chunks of SHARED_CHUNK
(`negative_chunk`), so a step touches thousands of rows, not hundreds of thousands. On a GPU the full-table
passes are cheap and the unique ids would be a host sync, so neither is automatic there. Measurements, and
what sharing costs given longer budgets: docs/scaling.md#big-rotate-tables-shared-corruptions-and-row-updates.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from earl_service.config import TrainConfig
from earl_service.errors import ConfigError
from earl_service.model.modules import RotatEModel

BIG_TABLE_ROWS = 500_000  # between WordNet-full (117k: sharing loses at 30 minutes) and 1M (it wins)
SHARED_CHUNK = 64


def big_table(model: torch.nn.Module) -> bool:
    """A RotatE table on a CPU of at least BIG_TABLE_ROWS entities, where a step's O(N) passes dominate."""
    return (isinstance(model, RotatEModel) and model.entities.device.type == "cpu"
            and model.entities.shape[0] >= BIG_TABLE_ROWS)


def table_config(model: torch.nn.Module, cfg: TrainConfig) -> TrainConfig:
    """`cfg` as `model`'s table trains with it: TrainConfig.big_table_negatives a side on a big table whose
    positives share corruptions (a step then costs less and the budget covers more epochs), `cfg` elsewhere and
    where `--negative-chunk 1` gives each positive its own (measured only with sharing: 8472610)."""
    if cfg.big_table_negatives and big_table(model) and not cfg.sampled and negative_chunk(model, cfg) > 1:
        return replace(cfg, negatives=cfg.big_table_negatives)
    return cfg


def negative_chunk(model: torch.nn.Module, cfg: TrainConfig) -> int:
    """How many consecutive positives share their corruptions in a full-graph step: TrainConfig.negative_chunk
    where given, else SHARED_CHUNK on a big table (a step then draws 2 x K per 64 positives, not per positive:
    6,144 ids, not 264,192, at batch 1024 x 128), else 0 (each positive its own, redrawn off known answers).
    Sharing buys steps at a cost per step: it wins where the budget covers few epochs (1M entities in an hour)
    and lost on WordNet-full given 30 minutes, hence the threshold."""
    return cfg.negative_chunk or (SHARED_CHUNK if big_table(model) else 0)


def wants_row_updates(model: torch.nn.Module, cfg: TrainConfig) -> bool:
    """Whether `model`'s steps should update rows (TrainConfig.row_updates), on the device its weights are on:
    auto where a step draws fewer entity ids than the table has rows."""
    if cfg.row_updates == "off":
        return False
    rotate = isinstance(model, RotatEModel)
    if cfg.row_updates == "on":
        if not rotate:
            raise ConfigError("--row-updates on applies to RotatE only (EARL's encoder touches every row)")
        if cfg.cuda_graphs:
            raise ConfigError("--row-updates on cannot be captured in a CUDA graph (each step's rows differ)")
        return True
    return (rotate and model.entities.device.type == "cpu"
            and model.entities.shape[0] >= draws_per_step(cfg, negative_chunk(model, cfg)))


def draws_per_step(cfg: TrainConfig, chunk: int) -> int:
    """Entity ids one full-graph step draws: each positive's head and tail, and K head and K tail corruptions
    per positive, or per `chunk` positives where they share them."""
    draws = -(-cfg.batch_size // chunk) if chunk else cfg.batch_size
    return 2 * (cfg.batch_size + draws * cfg.negatives)


class RowAdam(torch.optim.Optimizer):
    """Adam for dense gradients and lazy Adam for sparse ones (the rows a step touched), in one optimizer.

    Per parameter: step, exp_avg (m) and exp_avg_sq (v), as torch's Adam keeps them. For a sparse gradient with
    rows I (each once, as `_Rows` gives them) and values g: m[I] = b1 m[I] + (1 - b1) g, v[I] likewise with g^2,
    and p[I] -= lr / (1 - b1^t) * m[I] / (sqrt(v[I] / (1 - b2^t)) + eps): torch's SparseAdam (which adds eps before
    the bias correction), t counting every step. A dense gradient gets the same update on every row: torch's Adam.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        assert closure is None, "RowAdam takes no closure"
        for group in self.param_groups:
            lr, (b1, b2), eps = float(group["lr"]), group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                t = float(state["step"])
                step_size, root_bias = lr / (1 - b1**t), math.sqrt(1 - b2**t)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                if p.grad.is_sparse:  # gather the rows, update them, scatter them back
                    rows, g = p.grad._indices()[0], p.grad._values()
                    p_rows, m_rows, v_rows = (x.index_select(0, rows) for x in (p, m, v))
                    _adam(p_rows, m_rows, v_rows, g, b1, b2, eps, step_size, root_bias)
                    for x, x_rows in ((p, p_rows), (m, m_rows), (v, v_rows)):
                        x.index_copy_(0, rows, x_rows)
                else:
                    _adam(p, m, v, p.grad, b1, b2, eps, step_size, root_bias)


def _adam(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b1: float, b2: float, eps: float,
          step_size: float, root_bias: float) -> None:
    """One Adam update of `p` and its moments `m`, `v` in place from gradient `g`."""
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    p.addcdiv_(m, v.sqrt().div_(root_bias).add_(eps), value=-step_size)


class _Rows(torch.autograd.Function):
    """table[ids] for sorted unique `ids`, whose backward is the sparse (U, 2d) gradient of those rows: already
    coalesced (F.embedding's sparse gradient would be sorted again, 10% of a step at a million entities)."""

    @staticmethod
    def forward(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return table.index_select(0, ids)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
        table, ids = inputs
        ctx.save_for_backward(ids)
        ctx.shape = table.shape

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (ids,) = ctx.saved_tensors
        return torch.sparse_coo_tensor(ids[None], grad, ctx.shape, is_coalesced=True, check_invariants=False), None


def gather_rows(
    model: torch.nn.Module, batch: torch.Tensor, neg_heads: torch.Tensor, neg_tails: torch.Tensor, *,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch's unique entity rows as a table whose gradient is sparse, and the batch renumbered into it.

    (B, 3) positives, (B, K) head and tail corruptions -> (U, 2d) rows, (R, d) relations, and the positives and
    corruptions with entity ids local to the rows: loss_fn on them equals loss_fn on the whole table. `shared`
    (Negatives.shared: the (2, C, K) draws the corruptions repeat per chunk, and each positive's chunk): the same
    result from sorting 2 x C x K ids instead of 2 x B x K (at 1M entities, batch 1024 x 128 in chunks of 64,
    6,144 instead of 264,192).
    """
    assert isinstance(model, RotatEModel), "row updates are RotatE's (wants_row_updates)"
    b, k = neg_heads.shape
    drawn = (neg_heads.reshape(-1), neg_tails.reshape(-1)) if shared is None else (shared[0].reshape(-1),)
    unique, local = torch.unique(torch.cat([batch[:, 0], batch[:, 2], *drawn]), return_inverse=True)
    rows = _Rows.apply(model.entities, unique)
    local_batch = torch.stack([local[:b], batch[:, 1], local[b : 2 * b]], 1)
    if shared is None:
        return (rows, model.relations, local_batch, local[2 * b : 2 * b + b * k].view(b, k),
                local[2 * b + b * k :].view(b, k))
    draws, owner = shared
    local_draws = local[2 * b :].view(draws.shape)  # (2, C, K)
    return rows, model.relations, local_batch, local_draws[0][owner], local_draws[1][owner]


__all__ = ["BIG_TABLE_ROWS", "SHARED_CHUNK", "RowAdam", "big_table", "draws_per_step", "gather_rows", "negative_chunk",
           "wants_row_updates"]
