"""The synthetic graph's ceiling: ranks under the generator's own odds, against a brute-force ranking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from earl_service.data.synthetic import SyntheticConfig, generate, latent, oracle_ranks
from earl_service.train.evaluate import realistic_ranks

CONFIG = SyntheticConfig(entities=3000, relations=20, types=6, valid=200, test=200, seed=1)


@pytest.fixture(scope="module")
def graph():
    return generate(CONFIG), latent(CONFIG, np.random.default_rng(CONFIG.seed))


def brute_force(kg, drawn, triples: np.ndarray, typed: bool) -> dict[str, np.ndarray]:
    """Every entity scored by the generator's odds, ranked as evaluate ranks distances."""
    known = {tuple(t) for t in np.concatenate([kg.train, kg.valid, kg.test]).tolist()}
    rank_of = np.argsort(drawn.rel_perm)
    out = {"tail": [], "head": []}
    for h, r, t in triples.tolist():
        for side, types, answer in (("tail", drawn.tail_type, t), ("head", drawn.head_type, h)):
            kind = types[rank_of[r]]
            chance = (drawn.entity_type == kind) if typed else np.ones(kg.num_entities, dtype=bool)
            dist = torch.from_numpy(np.where(chance, -drawn.weight, np.inf))[None]
            filtered = torch.zeros_like(dist, dtype=torch.bool)
            for e in range(kg.num_entities):
                if e != answer and ((h, r, e) if side == "tail" else (e, r, t)) in known:
                    filtered[0, e] = True
            out[side].append(float(realistic_ranks(dist, torch.tensor([answer]), filtered)[0]))
    return {side: np.array(values) for side, values in out.items()}


@pytest.mark.parametrize("typed", [True, False])
def test_oracle_ranks_match_a_brute_force_ranking(graph, typed):
    kg, drawn = graph
    triples = kg.test[:25].copy()
    other = np.flatnonzero(drawn.entity_type != drawn.entity_type[triples[0, 2]])[0]
    triples[1, 2] = other  # an answer outside the relation's tail type: tied behind every entity inside it
    ours = oracle_ranks(kg, drawn, triples, typed=typed)
    expected = brute_force(kg, drawn, triples, typed)
    for side in ("tail", "head"):
        np.testing.assert_allclose(ours[side], expected[side])


def test_the_typed_order_ranks_above_popularity_alone_and_chance(graph):
    kg, drawn = graph
    typed, popular = (oracle_ranks(kg, drawn, kg.test, typed=t) for t in (True, False))
    mrr = {name: float(np.mean(1 / np.concatenate([r["tail"], r["head"]]))) for name, r in
           (("typed", typed), ("popular", popular))}
    assert mrr["typed"] > mrr["popular"] > 5 * np.log(kg.num_entities) / kg.num_entities  # chance: ~ ln N / N


def test_equal_popularities_tie_as_evaluate_ties_equal_distances(graph):
    """Popularities rounded so that many answers share one: each tie counts half, as realistic_ranks counts it."""
    import dataclasses

    kg, drawn = graph
    coarse = dataclasses.replace(drawn, weight=np.round(drawn.weight * 50) / 50)
    triples = kg.test[:25]
    ours, expected = oracle_ranks(kg, coarse, triples), brute_force(kg, coarse, triples, typed=True)
    assert len(np.unique(coarse.weight)) < 60  # ties everywhere
    for side in ("tail", "head"):
        np.testing.assert_allclose(ours[side], expected[side])
