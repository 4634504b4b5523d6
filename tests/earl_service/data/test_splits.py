"""Held-out splits of integer triples: what comes out never names an entity or relation that train lacks."""

import numpy as np

from earl_service.data.splits import take_out, unique_triples


def test_unique_triples_keeps_the_first_of_each_in_order():
    triples = np.array([[0, 1, 2], [2, 0, 1], [0, 1, 2], [1, 1, 0], [2, 0, 1]])
    np.testing.assert_array_equal(unique_triples(triples, 3, 2), [[0, 1, 2], [2, 0, 1], [1, 1, 0]])


def test_take_out_keeps_every_entity_and_relation_in_train():
    rng = np.random.default_rng(0)
    triples = unique_triples(np.stack([rng.integers(0, 60, 400), rng.integers(0, 9, 400), rng.integers(0, 60, 400)],
                                      1), 60, 9)
    triples = np.concatenate([triples, [[3, 9, 4]]])  # relation 9 occurs once, last: the first one scanned
    kept, removed = take_out(triples, 150, 60, 10)
    assert len(removed) == 150 and len(kept) + len(removed) == len(triples)
    assert set(np.unique(removed[:, [0, 2]])) <= set(np.unique(kept[:, [0, 2]]))
    assert set(removed[:, 1]) <= set(kept[:, 1])
    assert 9 in kept[:, 1] and not (removed[:, 0] == removed[:, 2]).any()


def test_take_out_gives_fewer_when_no_more_qualify():
    triples = np.array([[0, 0, 1], [1, 0, 2], [2, 1, 0]])  # each entity twice, relation 1 once
    kept, removed = take_out(triples, 3, 3, 2)
    np.testing.assert_array_equal(removed, [[1, 0, 2]])  # then entities 1 and 2 are down to one triple each
    np.testing.assert_array_equal(kept, [[0, 0, 1], [2, 1, 0]])
