"""kNResEnt in numpy: relational features, the fast search against the exhaustive one, one answer for all callers."""

import numpy as np
import pytest
import torch
from conftest import random_triples

from earl_service.core import knn


def _dense(features: knn.SparseRows) -> np.ndarray:
    out = np.zeros((features.num_rows, features.width))
    out[np.repeat(np.arange(features.num_rows), np.diff(features.indptr)), features.indices] = features.values
    return out


def test_relational_features_count_relation_ends(small_graph_triples):
    features = knn.relational_features(small_graph_triples, 30, 4)
    expected = np.zeros((30, 8))
    for h, r, t in small_graph_triples:
        expected[h, r] += 1
        expected[t, 4 + r] += 1
    np.testing.assert_array_equal(_dense(features), expected)
    for i in range(30):  # CSR with ascending columns in every row
        assert np.all(np.diff(features.indices[features.indptr[i] : features.indptr[i + 1]]) > 0)


@pytest.mark.parametrize("n,num_rel,edges,ratio,block", [
    (600, 5, 900, 0.2, 1 << 24),  # low degrees over 5 relations: many identical and proportional vectors
    (30, 4, 120, 0.3, 1 << 24),  # fewer reserved than k + 8: no screening, k clipped to 9
    (300, 6, 1200, 0.2, 50),  # tiny blocks
    (2000, 30, 12000, 0.1, 1 << 24),  # screening settles most rows
])
def test_fast_search_equals_the_exhaustive_one(n, num_rel, edges, ratio, block):
    features = knn.relational_features(random_triples(n, num_rel, edges, seed=n), n, num_rel)
    reserved = np.sort(np.random.default_rng(3).choice(n, int(ratio * n), replace=False))
    ids, weights = knn.nearest_reserved(features, reserved, 10, 0.2, max_block_elements=block)
    ref_ids, ref_weights = knn.nearest_reserved_exhaustive(features, reserved, 10, 0.2)
    k = min(10, len(reserved))
    assert ids.shape == weights.shape == (n, k) and ids.dtype == np.int64 and weights.dtype == np.float32
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(weights, ref_weights)
    # The isolated last entity ties at 0 with everything: the first k reserved positions, equal weights.
    np.testing.assert_array_equal(ids[-1], np.arange(k))
    np.testing.assert_allclose(weights[-1], np.full(k, 1 / k), rtol=1e-6)


def test_no_reserved_entities_give_empty_tables(small_graph_triples):
    ids, weights = knn.nearest_reserved(knn.relational_features(small_graph_triples, 30, 4), np.zeros(0, np.int64),
                                        10, 0.2)
    assert ids.shape == weights.shape == (30, 0)


def test_nearest_reserved_matches_brute_force(small_graph_triples):
    from earl_service.model.graph import choose_reserved

    feats = knn.relational_features(small_graph_triples, 30, 4)
    reserved = choose_reserved(30, 0.3, seed=1)
    # A tiny block size forces many blocks: the chunked path must agree with the one-shot brute force.
    ids, weights = knn.nearest_reserved(feats, reserved.numpy(), 3, 0.2, max_block_elements=20)
    f = _dense(feats)  # the brute-force counts (test_relational_features_count_relation_ends)
    norm = np.linalg.norm(f, axis=1, keepdims=True)
    unit = np.divide(f, norm, out=np.zeros_like(f), where=norm > 0)
    sim = unit @ unit[reserved.numpy()].T  # (N, N_res)
    for e in range(29):  # the last entity is isolated: all similarities tie at 0
        expected = np.sort(sim[e])[::-1][:3]
        got = sim[e, ids[e]]
        np.testing.assert_allclose(got, expected, atol=1e-6)
        soft = np.exp(expected / 0.2) / np.exp(expected / 0.2).sum()
        np.testing.assert_allclose(weights[e], soft, atol=1e-5)
    np.testing.assert_allclose(weights[29], np.full(3, 1 / 3), atol=1e-6)


@pytest.mark.parametrize("case", ["ties", "few-reserved", "tiny-blocks", "codex", "synthetic"])
def test_fast_nearest_reserved_equals_the_exhaustive_search(case, small_graph_triples):
    """Deduplication, slot-restricted float32 screening and the float64 fallback pick exactly the neighbours
    (and weights) of the exhaustive float64 search, ties included."""
    from conftest import codex_s_path

    from earl_service.data.dataset import load_dataset
    from earl_service.data.synthetic import SyntheticConfig, generate
    from earl_service.model.graph import choose_reserved

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
    feats = knn.relational_features(triples, n, num_rel)
    reserved = choose_reserved(n, ratio, seed=3).numpy()
    fast = [torch.from_numpy(x) for x in knn.nearest_reserved(feats, reserved, k, 0.2, max_block_elements=block)]
    slow = knn.nearest_reserved_exhaustive(feats, reserved, k, 0.2)
    assert torch.equal(fast[0], torch.from_numpy(slow[0]))
    assert torch.equal(fast[1], torch.from_numpy(slow[1]))


def test_every_torch_caller_gets_the_core_answer(small_graph_triples):
    """build_graph, graph.knn_tables and the sampled-training index all read the one numpy search."""
    from earl_service.model.graph import build_graph, choose_reserved, knn_tables
    from earl_service.train.sampling import NeighborIndex

    reserved = choose_reserved(30, 0.3, seed=1)
    ids, weights = knn.nearest_reserved(knn.relational_features(small_graph_triples, 30, 4), reserved.numpy(), 3, 0.2)
    graph = build_graph(small_graph_triples, 30, 4, reserved, k=3)
    index = NeighborIndex(small_graph_triples, 30, 4, reserved, k=3)
    direct = knn_tables(knn.relational_features(small_graph_triples, 30, 4), reserved.numpy(), k=3, temperature=0.2)
    for got_ids, got_weights in ((graph.knn_ids, graph.knn_weights), (index.knn_ids, index.knn_weights), direct):
        assert torch.equal(got_ids, torch.from_numpy(ids)) and torch.equal(got_weights, torch.from_numpy(weights))


def test_identical_rows_are_grouped_by_their_exact_entries():
    values = np.array([0.5, 0.25, 0.5, np.nextafter(0.25, 1), 0.5, 0.25, 0.25])
    indptr = np.array([0, 2, 4, 4, 6, 6, 7])  # rows 0 and 3 equal; row 1 differs by one ulp; 2 and 4 empty
    cols = np.array([0, 3, 0, 3, 0, 3, 3])
    group, first = knn.identical_rows(indptr, cols, values)
    assert group[0] == group[3] and group[2] == group[4]
    assert len({group[0], group[1], group[2], group[5]}) == 4
    np.testing.assert_array_equal(np.sort(first), [0, 1, 2, 5])  # the lowest row of each group
