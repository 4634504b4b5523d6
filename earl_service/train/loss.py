"""Negative sampling and the self-adversarial loss, for full-graph and sampled (mini-batch) EARL steps."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from earl_service.config import TrainConfig
from earl_service.model.kernels import rotate_distance
from earl_service.model.modules import RotatE
from earl_service.train.run import Run


class Negatives(NamedTuple):
    """A batch's corruptions and where they still make a known true triple."""

    heads: torch.Tensor  # (B, K) entity ids
    tails: torch.Tensor  # (B, K)
    known: tuple[torch.Tensor, torch.Tensor] | None  # (head mask, tail mask), (B, K) bool each: loss_fn's `ignore`
    # Shared corruptions (sample's `chunk`): the (2, C, K) draws and each positive's chunk (B,), heads and tails
    # being draws[0][owner] and draws[1][owner]; gather_rows renumbers the C x K draws, not the B x K copies.
    shared: tuple[torch.Tensor, torch.Tensor] | None = None


class NegativeSampler:
    """Uniform corruptions with replacement, redrawn for a few rounds where they hit a known true answer from
    train; the hits left after the last round are flagged (Negatives.known) for the loss to ignore.

    Two ways to redraw, the same distribution: on the CPU only the hits are redrawn (nonzero compacts them; the
    CPU's work stays small and its draws are those of earlier versions); on a GPU the compacted shapes would be
    host syncs, so every round redraws the whole (B, K) draw and keeps the new ids only where the old were hits
    (torch.where), `FIXED_ROUNDS` times whatever happened. Queries with thousands of true answers (CoDEx-S's
    gender or country) keep a few hits after those rounds; they are ignored, not trained as negatives.
    """

    COMPACT_ROUNDS = 20
    FIXED_ROUNDS = 4  # each round is ~6 small kernels per side: enough to leave ~0.05% of CoDEx-S's head draws

    def __init__(self, train: np.ndarray, num_entities: int, num_relations: int, device: torch.device, *,
                 fixed_shapes: bool | None = None):
        self.n, self.r = num_entities, num_relations
        h, r, t = (torch.as_tensor(train[:, i], dtype=torch.long) for i in range(3))
        self.tail_keys = torch.unique((h * num_relations + r) * num_entities + t).to(device)  # sorted
        self.head_keys = torch.unique((t * num_relations + r) * num_entities + h).to(device)
        self.device = device
        self.fixed_shapes = device.type != "cpu" if fixed_shapes is None else fixed_shapes

    def _known(self, keys: torch.Tensor, query: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Whether (query, candidate) is a true pair; query and candidates broadcast together."""
        probe = query * self.n + candidates
        pos = torch.searchsorted(keys, probe).clamp(max=keys.numel() - 1)
        return keys[pos] == probe

    def known_masks(
        self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor, neg_heads: torch.Tensor, neg_tails: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) positives and (B, K) candidates -> (B, K) bool each: the candidate makes a known true triple."""
        return (self._known(self.head_keys, (t * self.r + r)[:, None], neg_heads),
                self._known(self.tail_keys, (h * self.r + r)[:, None], neg_tails))

    def sample(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor, k: int, gen: torch.Generator, *,
               chunk: int = 0) -> Negatives:
        """(B,) positives -> K head and K tail corruptions each, drawn from `gen` (on the sampler's device).

        `chunk` > 0: each run of `chunk` consecutive positives shares its K and K (TrainConfig.negative_chunk), so
        a step touches 2 x K x chunks rows, not 2 x K x B; shared corruptions cannot be redrawn per positive, so
        those that make a known triple with theirs are flagged (Negatives.known) for the loss to ignore.
        """
        if chunk:
            owner = torch.arange(h.numel(), device=h.device) // chunk  # (B,) each positive's chunk
            draws = self._draw((2, -(-h.numel() // chunk), k), gen)
            heads, tails = draws[0][owner], draws[1][owner]
            return Negatives(heads, tails, self.known_masks(h, r, t, heads, tails), shared=(draws, owner))
        redraw = self._fixed_rounds if self.fixed_shapes else self._compact_rounds
        heads, head_hits = redraw(self.head_keys, t * self.r + r, k, gen)
        tails, tail_hits = redraw(self.tail_keys, h * self.r + r, k, gen)
        if head_hits is None and tail_hits is None:
            return Negatives(heads, tails, None)
        none_left = torch.zeros_like(heads, dtype=torch.bool)
        return Negatives(heads, tails, (none_left if head_hits is None else head_hits,
                                        none_left if tail_hits is None else tail_hits))

    def _draw(self, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.n, shape, generator=gen, device=self.device)

    def _compact_rounds(
        self, keys: torch.Tensor, query: torch.Tensor, k: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B,) queries -> (B, K) candidates, and the hits left after the rounds (None: none left)."""
        cand = self._draw((query.numel(), k), gen)
        flat = cand.view(-1)
        bad = self._known(keys, query[:, None], cand).view(-1).nonzero().squeeze(1)  # (M,) flat positions
        for _ in range(self.COMPACT_ROUNDS):
            if bad.numel() == 0:
                break
            flat[bad] = self._draw((bad.numel(),), gen)
            bad = bad[self._known(keys, query[bad // k], flat[bad])]
        if bad.numel() == 0:
            return cand, None
        hits = torch.zeros(cand.numel(), dtype=torch.bool, device=cand.device)
        return cand, hits.index_fill_(0, bad, True).view_as(cand)

    def _fixed_rounds(
        self, keys: torch.Tensor, query: torch.Tensor, k: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) queries -> (B, K) candidates and (B, K) hits left, every shape known before the draws."""
        cand = self._draw((query.numel(), k), gen)
        hits = self._known(keys, query[:, None], cand)  # (B, K)
        for _ in range(self.FIXED_ROUNDS):
            cand = torch.where(hits, self._draw(tuple(cand.shape), gen), cand)
            hits = hits & self._known(keys, query[:, None], cand)
        return cand, hits


def loss_fn(
    scorer: RotatE, entities: torch.Tensor, relations: torch.Tensor, batch: torch.Tensor,
    neg_heads: torch.Tensor, neg_tails: torch.Tensor, adversarial_temperature: float,
    *, ignore: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Self-adversarial negative-sampling loss over both corruption sides.

    loss = -(mean_b log s(g - d_pos) + mean_{b,side} sum_j w_j log s(d_neg_j - g)) / 2, w = softmax(a (g - d_neg))
    detached, taken within each side's K negatives. `ignore` (head mask, tail mask), each (B, K) bool, drops
    negatives that are true triples (sampled training shares negatives, so they cannot be redrawn per row).
    """
    h, r, t = batch[:, 0], batch[:, 1], batch[:, 2]
    rel = relations[r]  # (B, d)
    # One gather for heads and tails: its backward is one scatter into an (N, 2d) zero buffer, not one per use.
    head, tail = entities[torch.cat([h, t])].chunk(2)  # (B, 2d) each
    head_rot = scorer.rotate(head, rel)  # h o r, (B, 2d)
    tail_rot = scorer.rotate(tail, rel, inverse=True)  # conj(r) o t, (B, 2d)
    pos = scorer.gamma - scorer.distance(head_rot, tail)  # (B,)
    # Tail corruptions compare h o r with t'; head corruptions compare h' with conj(r) o t (|r_i| = 1).
    query = torch.cat([head_rot, tail_rot])  # (2B, 2d)
    neg = scorer.gamma - rotate_distance(query, entities, torch.cat([neg_tails, neg_heads]))  # (2B, K)
    if ignore is None:
        weights = torch.softmax(adversarial_temperature * neg, dim=1).detach()
    else:
        skip = torch.cat([ignore[1], ignore[0]])  # (2B, K), ordered like `query`
        logits = (adversarial_temperature * neg).masked_fill(skip, float("-inf"))
        weights = torch.softmax(logits, dim=1).nan_to_num(0.0).detach()  # a row with nothing left adds 0
    neg_term = (weights * F.logsigmoid(-neg)).sum(1).mean()
    return -(F.logsigmoid(pos).mean() + neg_term) / 2


def sampled_loss(
    net: torch.nn.Module, run: Run, sampler: NegativeSampler, batch: torch.Tensor, rows: slice, cfg: TrainConfig,
    fanout: list[int | None], gen: torch.Generator, rng: np.random.Generator,
) -> tuple[torch.Tensor, int]:
    """This rank's rows of the global batch, encoded through sampled neighbourhoods: the mean loss over them
    and the number of entities encoded.

    Each chunk of `negative_chunk` consecutive positives shares K head and K tail corruptions (drawn for the
    whole global batch from `gen`, so every rank and a single process see the same ones). The entities to
    encode are then the rows' heads and tails plus 2K per chunk, whatever the size of the graph.
    """
    assert run.index is not None
    device = batch.device
    size, k = len(batch), cfg.negatives
    chunk = cfg.negative_chunk or size
    chunks = -(-size // chunk)
    # Drawn where the generator lives (the run's device), then to the host: this path samples on the CPU anyway.
    negatives = torch.randint(0, run.index.num_entities, (2, chunks, k), generator=gen, device=gen.device).cpu()
    mine = batch[rows].cpu()  # (b, 3)
    b = len(mine)
    row_chunk = torch.arange(rows.start, rows.start + b) // chunk  # (b,) global chunk of each row
    first = int(row_chunk[0])
    used = negatives[:, first : int(row_chunk[-1]) + 1]  # (2, c, K) the chunks these rows touch
    seeds, local = torch.unique(torch.cat([mine[:, 0], mine[:, 2], used.reshape(-1)]), return_inverse=True)
    sub = run.index.sample(seeds.numpy(), fanout, rng).to(device)
    local_batch = torch.stack([local[:b], mine[:, 1], local[b : 2 * b]], 1).to(device)  # (b, 3) local entity ids
    local_neg = local[2 * b :].reshape(used.shape)[:, row_chunk - first].to(device)  # (2, b, K)
    global_neg = used[:, row_chunk - first].to(device)  # (2, b, K)
    h, r, t = (mine[:, i].to(device) for i in range(3))
    ignore = sampler.known_masks(h, r, t, global_neg[0], global_neg[1])  # shared negatives that are true triples
    entities, relations = net(sub.inputs, sub.layers)  # (n_seeds, 2d), (R, d)
    loss = loss_fn(run.scorer, entities.float(), relations.float(), local_batch, local_neg[0], local_neg[1],
                   cfg.adversarial_temperature, ignore=ignore)
    return loss, sub.nodes.numel()


__all__ = ["NegativeSampler", "Negatives", "loss_fn", "sampled_loss"]
