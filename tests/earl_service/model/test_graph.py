"""Graph features against brute-force definitions."""

import numpy as np
import torch

from earl_service.model.graph import build_graph, choose_reserved


def brute_features(triples, n, num_rel):
    f = np.zeros((n, 2 * num_rel))
    for h, r, t in triples:
        f[h, r] += 1
        f[t, num_rel + r] += 1
    return f


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
