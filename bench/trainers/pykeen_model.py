"""PyKEEN's RotatE and NodePiece+RotatE as the paper tables' peers: parameter counts, the models, their ranking."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from earl_service.data import Dataset
from earl_service.train.evaluate import KnownAnswers, realistic_ranks
from trainers.budget import PAPER_OPTIM, Optim


@dataclass(frozen=True)
class NodePieceSpec:
    """NodePiece tokenisation as in PyKEEN's galkin2022 configs: anchors per entity, relations per entity.

    Those configs search anchors with CSGraphAnchorSearcher, which in PyKEEN 1.11.1 sizes its graph from the
    largest entity id in train and fails when valid/test hold entities absent from train; run_pykeen uses the
    BFS ScipySparseAnchorSearcher (also nearest anchors by hops), which takes the entity count.
    """

    anchors: int
    anchor_tokens: int
    relation_tokens: int

    @property
    def tokens(self) -> int:
        return self.anchor_tokens + self.relation_tokens


def pykeen_rotate_parameters(ds: Dataset, dim: int) -> int:
    """PyKEEN's RotatE stores complex entities and relations: 2*dim reals each."""
    return 2 * dim * (ds.num_entities + ds.num_relations)


def pykeen_nodepiece_parameters(ds: Dataset, width: int, spec: NodePieceSpec) -> int:
    """NodePiece+RotatE parameters at real width `width` (complex dim width/2), MLP aggregation, inverse relations.

    anchors (A+1) x w, relation tokens (2R+1) x w, ConcatMLP (T*w -> 2w -> w) with biases. Checked against the
    built model in run_pykeen (the record keeps the counted number).
    """
    t = spec.tokens
    return 2 * t * width * width + 2 * width * width + width * (spec.anchors + 1 + 2 * ds.num_relations + 1 + 3)


def nodepiece_width_for(ds: Dataset, target: int, spec: NodePieceSpec) -> int:
    """The even real width whose NodePiece parameter count is closest to `target`."""
    return min(range(2, 4001, 2), key=lambda w: abs(pykeen_nodepiece_parameters(ds, w, spec) - target))


def pykeen_rotate_dim_for(ds: Dataset, target: int) -> int:
    return max(1, round(target / (2 * (ds.num_entities + ds.num_relations))))


def _seeded_anchor_searcher(seed: int) -> Any:
    """PyKEEN's ScipySparseAnchorSearcher, its pick among each entity's nearest anchors drawn from `seed`.

    PyKEEN's own pick uses an unseeded generator, so two builds of one NodePiece model got different anchor tokens.
    """
    from pykeen.nn.node_piece.anchor_search import ScipySparseAnchorSearcher

    class SeededSearcher(ScipySparseAnchorSearcher):
        def select(self, pool: np.ndarray, k: int) -> np.ndarray:  # (entities, anchors) bool -> (entities, k), -1 pads
            rng = np.random.default_rng(seed)
            tokens = np.full((pool.shape[0], k), -1, dtype=int)
            for i, row in enumerate(pool):
                (reachable,) = row.nonzero()
                chosen = rng.choice(reachable, size=min(k, reachable.size), replace=False, shuffle=False)
                tokens[i, : len(chosen)] = chosen
            return tokens

    return SeededSearcher()


def build_pykeen_model(ds: Dataset, kind: str, *, dim: int = 0, width: int = 0, spec: NodePieceSpec | None = None,
                       optim: Optim = PAPER_OPTIM, seed: int = 0) -> tuple[torch.nn.Module, Any, dict]:
    """PyKEEN's RotatE (complex `dim`) or NodePiece+RotatE (real `width`) on `ds`: (model, triples factory, shape)."""
    from pykeen.losses import NSSALoss
    from pykeen.models import NodePiece, RotatE
    from pykeen.triples import CoreTriplesFactory

    # Every entity of every split gets an id (valid/test-only ones never occur in a training triple), so that the
    # `all` protocol can rank them; the `seen` protocol restricts candidates to training entities, as run_earl does.
    factory = CoreTriplesFactory.create(mapped_triples=torch.as_tensor(ds.train, dtype=torch.long),
                                        num_entities=ds.num_entities, num_relations=ds.num_relations,
                                        create_inverse_triples=kind == "nodepiece")
    loss = NSSALoss(margin=optim.margin, adversarial_temperature=optim.adversarial_temperature)
    if kind == "rotate":
        # Entities drawn from U(0, 1) as in PyKEEN's own sun2019 RotatE configs: PyKEEN's RotatE scores with the L2
        # norm of h*r - t (the original uses the sum of complex moduli), and with its default Xavier init every
        # distance starts far below the margin, where the loss barely moves (valid MRR stayed at chance for 150
        # steps on CoDEx-S).
        model = RotatE(triples_factory=factory, embedding_dim=dim, entity_initializer="uniform", loss=loss,
                       random_seed=seed)
        return model, factory, {"dim": dim}
    if kind == "nodepiece":
        assert spec is not None and width % 2 == 0, "NodePiece needs a spec and an even real width"
        anchors = {"selection": "MixtureAnchorSelection", "searcher": _seeded_anchor_searcher(seed),
                   "selection_kwargs": {"selections": ["Degree", "PageRank", "Random"], "ratios": [0.4, 0.4, 0.2],
                                        "selections_kwargs": [None, None, {"random_seed": seed}],
                                        "num_anchors": spec.anchors}}
        model = NodePiece(
            triples_factory=factory, embedding_dim=width, interaction="rotate", aggregation="mlp",
            entity_initializer="xavier_uniform_", relation_initializer="init_phases",
            relation_constrainer="complex_normalize", tokenizers=["AnchorTokenizer", "RelationTokenizer"],
            num_tokens=[spec.anchor_tokens, spec.relation_tokens], tokenizers_kwargs=[anchors, {}], loss=loss,
            random_seed=seed)
        return model, factory, {"dim": width // 2, "real_width": width, **asdict(spec)}
    raise ValueError(f"kind must be 'rotate' or 'nodepiece', not {kind!r}")


@torch.no_grad()
def pykeen_rotate_ranks(model: torch.nn.Module, triples: np.ndarray, known: KnownAnswers, num_candidates: int, *,
                        batch_size: int = 256) -> dict[str, np.ndarray]:
    """Filtered realistic ranks (tail and head) under a PyKEEN model with the RotatE interaction (RotatE, NodePiece).

    PyKEEN scores -||h o r - t||_2 over complex vectors: tails from the query q = h o r, heads from q = t o conj(r),
    or, for a model trained on inverse triples, as tails of (t, r_inv). Its evaluator materialises the (batch,
    entities, dim) differences to do so, 100 s per 3,000 FB15k-237 validation triples on 2 cores, which would
    spend most of a PyKEEN run's budget on validation. The same distances as one product per batch,
    ||q - x||^2 = ||q||^2 + ||x||^2 - 2 <q, x> over the real views (float64, against cancellation), give the same
    ranks; tests check the metrics against PyKEEN's RankBasedEvaluator. The first `num_candidates` entities
    compete, with every other true answer in `known` filtered out.
    """
    from pykeen.utils import ensure_complex

    model.eval()
    entities, relations, _ = model._get_representations(h=None, r=None, t=None, mode=None)
    entities, relations = ensure_complex(entities, relations)

    def real(x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(x).flatten(-2).double()

    # Entities sharing a vector (NodePiece gives one to entities with the same tokens) must tie exactly, as in PyKEEN's
    # evaluator, but a matmul may round the same row differently at different columns: score each distinct row once
    # and spread the scores with `which`. Without shared rows (RotatE) that gather would only copy, so it is skipped.
    candidates = real(entities[:num_candidates])
    distinct, which = torch.unique(candidates, dim=0, return_inverse=True)
    if len(distinct) < len(candidates):
        candidates = distinct
    else:
        which = slice(None)
    candidates_sq = (candidates**2).sum(1)
    ranks: dict[str, list[torch.Tensor]] = {"tail": [], "head": []}
    for start in range(0, len(triples), batch_size):
        batch = triples[start : start + batch_size]
        h, r, t = (torch.as_tensor(batch[:, i], dtype=torch.long) for i in range(3))
        hr = model._prepare_batch(batch=torch.stack([h, r], 1), index_relation=1)  # 2r for inverse-triple models
        queries = {"tail": entities[hr[:, 0]] * relations[hr[:, 1]]}
        if model.use_inverse_triples:
            tr_inv = model._prepare_inverse_batch(batch=model._prepare_batch(torch.stack([r, t], 1), 0), index_relation=0)
            queries["head"] = entities[tr_inv[:, 0]] * relations[tr_inv[:, 1]]
        else:
            queries["head"] = entities[t] * torch.conj(relations[r])
        for predict, anchor, target in (("tail", batch[:, 0], t), ("head", batch[:, 2], h)):
            q = real(queries[predict])
            dist_sq = ((q**2).sum(1, keepdim=True) + candidates_sq[None, :] - 2 * q @ candidates.T)[:, which]
            filtered = torch.from_numpy(known.mask(anchor, batch[:, 1], side=predict, num_candidates=num_candidates))
            ranks[predict].append(realistic_ranks(dist_sq, target, filtered))
    return {k: (torch.cat(v).numpy() if v else np.zeros(0)) for k, v in ranks.items()}



def pykeen_version() -> str:
    from importlib.metadata import version

    return version("pykeen")
