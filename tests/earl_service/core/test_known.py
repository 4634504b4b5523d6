"""core.known: each query's answers and the batch mask agree with a plain scan of the triples."""

import numpy as np

from earl_service.core.known import KnownAnswers


def _random_graph(seed=0, n=30, num_rel=4, edges=200):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(n, size=edges), rng.integers(num_rel, size=edges), rng.integers(n, size=edges)], 1)


def test_answers_equal_a_scan_of_the_triples():
    triples = _random_graph()
    known = KnownAnswers(triples, 4)
    h, r, t = triples.T
    for anchor in range(30):
        for relation in range(4):
            tails = sorted(set(t[(h == anchor) & (r == relation)].tolist()))
            heads = sorted(set(h[(t == anchor) & (r == relation)].tolist()))
            assert known.answers("tail", anchor, relation).tolist() == tails
            assert known.answers("head", anchor, relation).tolist() == heads


def test_mask_rows_are_the_answers():
    triples = _random_graph(seed=1)
    known = KnownAnswers(triples, 4)
    rng = np.random.default_rng(2)
    anchors, relations = rng.integers(30, size=25), rng.integers(4, size=25)
    for side in ("tail", "head"):
        mask = known.mask(anchors, relations, side=side, num_candidates=20)  # answers >= 20 fall outside
        assert mask.shape == (25, 20) and mask.dtype == bool
        for row, a, r in zip(mask, anchors, relations, strict=True):
            answers = known.answers(side, int(a), int(r))
            assert np.flatnonzero(row).tolist() == answers[answers < 20].tolist()


def test_an_empty_graph_has_no_answers():
    known = KnownAnswers(np.zeros((0, 3), dtype=np.int64), 2)
    assert known.answers("tail", 0, 1).tolist() == []
    assert not known.mask(np.array([0, 1]), np.array([1, 0]), side="head", num_candidates=3).any()


def test_rebuilt_from_its_pairs_it_answers_the_same():
    """What the device reader's cache stores (the sorted pairs) gives back the same index, and the graph as a
    set: distinct triples sorted by head, relation and tail."""
    triples = _random_graph(seed=3)
    known = KnownAnswers(triples, 4)
    again = KnownAnswers.from_pairs(4, known.pairs())
    for side in ("tail", "head"):
        for anchor in range(30):
            for relation in range(4):
                assert again.answers(side, anchor, relation).tolist() == known.answers(side, anchor, relation).tolist()
    assert again.triples().tolist() == [list(row) for row in sorted({tuple(row) for row in triples.tolist()})]
    assert KnownAnswers(np.zeros((0, 3), dtype=np.int64), 2).triples().shape == (0, 3)


def test_compact_answers_equal_the_int64_ones_in_narrower_dtypes():
    triples = _random_graph(seed=3)
    known = KnownAnswers(triples, 4)
    compact = known.compact(30)
    assert {a.dtype for side in compact.pairs().values() for a in side} == {np.dtype(np.uint16)}
    assert compact.nbytes == known.nbytes // 4
    for anchor in range(30):
        for relation in range(4):
            for side in ("tail", "head"):
                assert compact.answers(side, anchor, relation).tolist() == known.answers(side, anchor, relation).tolist()
    np.testing.assert_array_equal(compact.triples(), known.triples())
    assert compact.triples().dtype == np.int64
    wide = KnownAnswers(np.array([[70_000, 1, 3]]), 2).compact(70_001)
    assert [a.dtype for a in wide.pairs()["tail"]] == [np.uint32, np.uint32]
    assert wide.answers("head", 3, 1).tolist() == [70_000]
