"""Negative sampling and the self-adversarial loss, for full-graph and sampled (mini-batch) EARL steps."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from earl_service.config import TrainConfig
from earl_service.model.kernels import rotate_distance
from earl_service.model.modules import RotatE
from earl_service.train.run import Run


class NegativeSampler:
    """Uniform corruptions with replacement, resampled where they hit a known true answer from train."""

    def __init__(self, train: np.ndarray, num_entities: int, num_relations: int, device: torch.device):
        self.n, self.r = num_entities, num_relations
        h, r, t = (torch.as_tensor(train[:, i], dtype=torch.long) for i in range(3))
        self.tail_keys = torch.unique((h * num_relations + r) * num_entities + t).to(device)  # sorted
        self.head_keys = torch.unique((t * num_relations + r) * num_entities + h).to(device)
        self.device = device

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

    def sample(
        self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor, k: int, gen: torch.Generator, max_rounds: int = 20
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) positives -> (neg_heads (B, K), neg_tails (B, K)) entity ids."""
        out = []
        for keys, query in ((self.head_keys, t * self.r + r), (self.tail_keys, h * self.r + r)):
            cand = torch.randint(0, self.n, (h.numel(), k), generator=gen).to(self.device)
            flat = cand.view(-1)
            bad = self._known(keys, query[:, None], cand).view(-1).nonzero().squeeze(1)  # (M,) flat positions
            # Redraw only the hits, a few rounds (queries with thousands of true answers need more than one).
            for _ in range(max_rounds):
                if bad.numel() == 0:
                    break
                flat[bad] = torch.randint(0, self.n, (bad.numel(),), generator=gen).to(self.device)
                bad = bad[self._known(keys, query[bad // k], flat[bad])]
            out.append(cand)
        return out[0], out[1]


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
    negatives = torch.randint(0, run.index.num_entities, (2, chunks, k), generator=gen)  # heads, tails
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


__all__ = ["NegativeSampler", "loss_fn", "sampled_loss"]
