"""Fine-tuning of a pq bundle's codebooks: the centroids train, the codes stay (bundle.codebooks encodes them)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from earl_service.bundle.codebooks import PQTables, order_columns
from earl_service.bundle.precision import ProductQuantized
from earl_service.config import TrainConfig
from earl_service.train.distributed import Ranks
from earl_service.train.loop import Learner, train_step
from earl_service.train.readout import LossReadout, read_every
from earl_service.train.rows import table_config
from earl_service.train.run import Run
from earl_service.train.state import TrainState


class Gather(nn.Module):
    """A table as a gather from trainable codebooks through fixed codes (a parametrization: the original is unused)."""

    codes: torch.Tensor

    back: torch.Tensor | None

    def __init__(self, codes: np.ndarray, codebooks: np.ndarray, device: torch.device | str = "cpu",
                 columns: np.ndarray | None = None) -> None:
        super().__init__()
        self.register_buffer("codes", torch.from_numpy(codes.astype(np.int64)).to(device))  # (N, M)
        self.codebooks = nn.Parameter(torch.from_numpy(codebooks.astype(np.float32)).to(device))  # (M, 256, s)
        # A table coded in another order (Layout.columns): where each of the row's columns is among the coded numbers.
        back = None if columns is None else torch.from_numpy(np.argsort(columns)).to(device)
        self.register_buffer("back", back)

    def forward(self, original: torch.Tensor | None = None) -> torch.Tensor:
        m = self.codebooks.shape[0]
        rows = self.codebooks[torch.arange(m, device=self.codes.device)[None, :], self.codes]  # (N, M, s)
        rows = rows.reshape(len(self.codes), -1)  # (N, M * s), in code order
        return rows if self.back is None else rows[:, self.back]


@dataclass
class FineTune:
    """How long codebook fine-tuning may run, and what it did."""

    steps: int = 300
    seconds: float = 60.0
    lr: float | None = None  # every table's rate; None: rates()
    losses: list[float] = field(default_factory=list)


# A per-entity table's codebooks (RotatE's, an imported model's) train at this multiple of their rms: Adam moves a
# value by about its rate a step whatever the value's size, and RotatE's entity values are ~0.5 at d22 but ~0.04 at
# d182-d220. 300 steps after post-hoc codebooks at the recipe's 1e-2 took valid MRR from 0.3990 to 0.3315 on
# CoDEx-S d220 pq:110 and from 0.2897 to 0.2721 on FB15k-237 d182 pq:91, and from 0.4610 to 0.4677 on WordNet-full
# d22 pq:11. Of 1e-2, 3e-3, 1e-3 and 3e-4 the best were 3e-4 (0.4136), 3e-4 or 1e-3 (0.2967, 0.2963) and 1e-2, about
# 0.01-0.02 x the rms each time; at 0.02 x the rms: 0.4114, 0.2964 and 0.4675 (bench/results/finetune_lr_*.md).
# EARL's coded tables keep the recipe's rate (unmeasured).
RELATIVE_LR = 0.02


def rates(tables: PQTables, cfg: TrainConfig) -> dict[str, float]:
    """The rate each coded table's codebooks fine-tune at: RELATIVE_LR x their rms for a per-entity table, the
    recipe's (cfg.lr) for the others."""
    return {name: RELATIVE_LR * float(np.sqrt(np.mean(np.square(books, dtype=np.float64)))) if name == "entities"
            else cfg.lr for name, (_, books) in tables.items()}


def fine_tune(run: Run, params: dict[str, np.ndarray], tables: PQTables, cfg: TrainConfig,
              budget: FineTune | None = None, orders: dict[str, str] | None = None) -> tuple[PQTables, FineTune]:
    """Train the codebooks of `tables` (codes fixed; each table in its order of `orders`, contiguous where not
    given) with the ordinary training step, for at most budget.steps steps and budget.seconds; every other weight
    is frozen at its stored (ProductQuantized.FALLBACK) value. run.model is left holding the weights the returned
    tables decode to."""
    budget, model, orders = budget or FineTune(), run.model, orders or {}
    cfg = table_config(model, cfg)  # as the table trained (read before the parametrization decodes it)
    stored = ProductQuantized.stored_values(params, tables, orders)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in stored.items()}, strict=False)
    frozen = {name: p.requires_grad for name, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    gathers = {}
    for name, (codes, books) in tables.items():
        columns = order_columns(params[name].shape[1], orders.get(name, "contiguous"))
        gathers[name] = Gather(codes, books, run.device, columns)
        parametrize.register_parametrization(model, name, gathers[name], unsafe=True)
    lr = rates(tables, cfg) if budget.lr is None else dict.fromkeys(tables, budget.lr)
    optimizer = torch.optim.Adam([{"params": [g.codebooks], "lr": lr[name]} for name, g in gathers.items()])
    learner = Learner.build(run, optimizer, cfg, ranks=Ranks(), device=run.device)
    state, start = TrainState.start(cfg.seed, run.device), time.perf_counter()
    losses = LossReadout(read_every(run.device))  # the losses stay on the device until a read
    model.train()
    while state.step < budget.steps and time.perf_counter() - start < budget.seconds:
        loss = train_step(learner, state)
        losses.add(state.step, loss)
        if losses.due:
            budget.losses += [record.loss for record in losses.read()]
    budget.losses += [record.loss for record in losses.read()]
    model.eval()
    out = {name: (codes, gathers[name].codebooks.detach().cpu().numpy().astype(np.float16))
           for name, (codes, _) in tables.items()}
    for name in tables:
        parametrize.remove_parametrizations(model, name, leave_parametrized=False)
    stored = ProductQuantized.stored_values(params, out, orders)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in stored.items()}, strict=False)
    for name, p in model.named_parameters():
        p.requires_grad_(frozen.get(name, True))
    return out, budget


__all__ = ["RELATIVE_LR", "FineTune", "Gather", "fine_tune", "rates"]
