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


def test_every_torch_caller_gets_the_core_answer(small_graph_triples):
    """build_graph, graph.nearest_reserved and the sampled-training index all read the one numpy search."""
    from earl_service.graph import build_graph, choose_reserved, nearest_reserved, relational_features
    from earl_service.sampling import NeighborIndex

    reserved = choose_reserved(30, 0.3, seed=1)
    ids, weights = knn.nearest_reserved(knn.relational_features(small_graph_triples, 30, 4), reserved.numpy(), 3, 0.2)
    graph = build_graph(small_graph_triples, 30, 4, reserved, k=3)
    index = NeighborIndex(small_graph_triples, 30, 4, reserved, k=3)
    direct = nearest_reserved(relational_features(small_graph_triples, 30, 4), reserved, 3, 0.2)
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
