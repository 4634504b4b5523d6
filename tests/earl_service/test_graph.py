"""Graph features against brute-force definitions."""

import numpy as np
import pytest
import torch
from conftest import random_triples

from earl_service.graph import build_graph, choose_reserved, nearest_reserved, relational_features


def brute_features(triples, n, num_rel):
    f = np.zeros((n, 2 * num_rel))
    for h, r, t in triples:
        f[h, r] += 1
        f[t, num_rel + r] += 1
    return f


def test_relational_features_match_counts(small_graph_triples):
    f = relational_features(small_graph_triples, 30, 4).to_dense().numpy()
    np.testing.assert_array_equal(f, brute_features(small_graph_triples, 30, 4))


def test_nearest_reserved_matches_brute_force(small_graph_triples):
    feats = relational_features(small_graph_triples, 30, 4)
    reserved = choose_reserved(30, 0.3, seed=1)
    # A tiny block size forces many blocks: the chunked path must agree with the one-shot brute force.
    ids, weights = nearest_reserved(feats, reserved, 3, 0.2, max_block_elements=20)
    f = brute_features(small_graph_triples, 30, 4)
    norm = np.linalg.norm(f, axis=1, keepdims=True)
    unit = np.divide(f, norm, out=np.zeros_like(f), where=norm > 0)
    sim = unit @ unit[reserved.numpy()].T  # (N, N_res)
    for e in range(29):  # the last entity is isolated: all similarities tie at 0
        expected = np.sort(sim[e])[::-1][:3]
        got = sim[e, ids[e].numpy()]
        np.testing.assert_allclose(got, expected, atol=1e-6)
        soft = np.exp(expected / 0.2) / np.exp(expected / 0.2).sum()
        np.testing.assert_allclose(weights[e].numpy(), soft, atol=1e-5)
    np.testing.assert_allclose(weights[29].numpy(), np.full(3, 1 / 3), atol=1e-6)


def test_message_matrix_rows_are_means(small_graph_triples):
    reserved = choose_reserved(30, 0.2, seed=0)
    g = build_graph(small_graph_triples, 30, 4, reserved, k=2)
    dense = g.message.mat.to_dense()
    n = 30
    # The neighbour blocks (out, in) and the relation blocks each sum to 1 per entity with edges, 0 without;
    # the self column is always 1.
    ent = dense[:, : 3 * n].reshape(n, n, 3)
    assert torch.allclose(ent[..., 2].diagonal(), torch.ones(n))
    nbr = ent[..., 0].sum(1) + ent[..., 1].sum(1)
    rel = g.conrel.mat.to_dense().sum(1)
    has_edges = g.degree > 0
    assert dense.shape == (n, 3 * n)
    assert torch.allclose(nbr[has_edges], torch.ones(int(has_edges.sum())))
    assert torch.allclose(rel, nbr)
    assert not has_edges[29]
    # The transpose really is the transpose.
    assert torch.equal(g.message.mat_t.to_dense(), dense.T)
    # ConRel input: relation-end means.
    f = brute_features(small_graph_triples, n, 4)
    deg = f.sum(1, keepdims=True)
    expected = np.divide(f, deg, out=np.zeros_like(f), where=deg > 0)
    np.testing.assert_allclose(g.conrel.mat.to_dense().numpy(), expected, atol=1e-6)


def test_reserved_choice_is_seeded_and_ten_percent():
    a, b = choose_reserved(14505, 0.1, 0), choose_reserved(14505, 0.1, 0)
    assert torch.equal(a, b) and a.numel() == 1450 and a.unique().numel() == 1450
    assert not torch.equal(a, choose_reserved(14505, 0.1, 1))


@pytest.mark.parametrize("case", ["ties", "few-reserved", "tiny-blocks", "codex", "synthetic"])
def test_fast_nearest_reserved_equals_the_exhaustive_search(case, small_graph_triples):
    """Deduplication, slot-restricted float32 screening and the float64 fallback pick exactly the neighbours
    (and weights) of the exhaustive float64 search, ties included."""
    from conftest import codex_s_path

    from earl_service.core.knn import nearest_reserved_exhaustive
    from earl_service.data import load_dataset
    from earl_service.graph import _sparse_rows
    from earl_service.synthetic import SyntheticConfig, generate

    k, ratio, block = 10, 0.2, 1 << 24
    if case == "ties":  # 5 relations, low degrees: many identical and proportional feature vectors
        triples, n, num_rel = random_triples(600, 5, 900, seed=2), 600, 5
    elif case == "few-reserved":  # fewer reserved than k + 8: no screening, k clipped
        triples, n, num_rel, ratio = small_graph_triples, 30, 4, 0.3
    elif case == "tiny-blocks":
        triples, n, num_rel, block = random_triples(300, 6, 1200, seed=5), 300, 6, 50
    elif case == "codex":
        ds = load_dataset(codex_s_path())
        triples, n, num_rel = ds.train, ds.num_train_entities, ds.num_relations
    else:
        kg = generate(SyntheticConfig(entities=5000, relations=40, valid=0, test=0))
        triples, n, num_rel, ratio = kg.train, 5000, 40, 0.1
    feats = relational_features(triples, n, num_rel)
    reserved = choose_reserved(n, ratio, seed=3)
    fast = nearest_reserved(feats, reserved, k, 0.2, max_block_elements=block)
    slow = nearest_reserved_exhaustive(_sparse_rows(feats), reserved.numpy(), k, 0.2)
    assert torch.equal(fast[0], torch.from_numpy(slow[0]))
    assert torch.equal(fast[1], torch.from_numpy(slow[1]))
