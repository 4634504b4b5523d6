"""core.scorers: each scorer's distance is minus its library's score formula (written here in float64 complex numbers),
a head query ranks as the tail query does, and RotatE is core.rotate's."""

import numpy as np
import pytest

from earl_service.core import rotate, scorers
from earl_service.core.known import KnownAnswers

D = 6


def _complex(x):
    return x[..., :D].astype(np.float64) + 1j * x[..., D:].astype(np.float64)


# Each imported scorer's score of (h, r, t), the library's formula (pykeen/nn/modules.py), in float64.
FORMULAS = {
    "transe-l1": lambda h, r, t: -np.abs(h + r - t).sum(-1),
    "transe-l2": lambda h, r, t: -np.sqrt(((h + r - t) ** 2).sum(-1)),
    "distmult": lambda h, r, t: (h * r * t).sum(-1),
    "complex": lambda h, r, t: np.real((_complex(h) * _complex(r) * np.conj(_complex(t))).sum(-1)),
    "rotate-l2": lambda h, r, t: -np.sqrt((np.abs(_complex(h) * np.exp(1j * r.astype(np.float64)) - _complex(t)) ** 2)
                                          .sum(-1)),
}


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(0)
    entities = rng.normal(size=(50, 2 * D)).astype(np.float32)
    wide = rng.normal(size=(4, 2 * D)).astype(np.float32)
    phases = rng.uniform(-np.pi, np.pi, (4, D)).astype(np.float32)
    return entities, wide, phases


@pytest.mark.parametrize("name", scorers.IMPORTED)
def test_distance_is_minus_the_library_score(tables, name):
    entities, wide, phases = tables
    scorer = scorers.SCORERS[name]
    relations = phases if scorer.phases else wide
    assert relations.shape[1] == scorer.relation_width(D)
    for r in range(4):
        for h in (0, 7, 31):
            want = FORMULAS[name](entities[h].astype(np.float64), relations[r].astype(np.float64),
                                  entities.astype(np.float64))  # (N,) scores of (h, r, every t)
            tails = scorers.SCORERS[name].distances(scorer.query(entities[h], relations[r]), entities)
            np.testing.assert_allclose(-tails, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
            assert [scorer.score(d) for d in tails[:3]] == pytest.approx(-tails[:3].astype(np.float64))
            want = FORMULAS[name](entities.astype(np.float64), relations[r].astype(np.float64),
                                  entities[h].astype(np.float64))  # (N,) scores of (every h, r, t=h)
            heads = scorer.distances(scorer.query(entities[h], relations[r], inverse=True), entities)
            np.testing.assert_allclose(-heads, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_rotate_is_the_core_rotate():
    rng = np.random.default_rng(1)
    entities = rng.normal(size=(40, 2 * D)).astype(np.float32)
    relations = rng.normal(size=(3, D)).astype(np.float32)
    scorer = scorers.scorer("earl", gamma=9.0, epsilon=2.0, dim=D)
    assert scorers.scorer("rotate", gamma=9.0, epsilon=2.0, dim=D) == scorer
    scale = rotate.phase_scale(gamma=9.0, epsilon=2.0, dim=D)
    for inverse in (False, True):
        query = scorer.query(entities[3], relations[1], inverse=inverse)
        np.testing.assert_array_equal(query, rotate.query(entities[3], relations[1], scale=scale, inverse=inverse))
        np.testing.assert_array_equal(scorer.distances(query, entities), rotate.distances(query, entities))
    assert scorer.score(1.5) == 9.0 - 1.5
    np.testing.assert_allclose(scorer.relation_table(relations), relations * scale, rtol=1e-6)


@pytest.mark.parametrize("name", scorers.IMPORTED)
def test_blocks_and_id_subsets_change_nothing(tables, monkeypatch, name):
    entities, wide, phases = tables
    scorer = scorers.SCORERS[name]
    query = scorer.query(entities[2], (phases if scorer.phases else wide)[0])
    whole = scorer.distances(query, entities)
    monkeypatch.setattr(rotate, "BLOCK_ROWS", 7)
    ids = np.random.default_rng(3).permutation(50)[:23]
    np.testing.assert_array_equal(scorer.distances(query, entities), whole)
    np.testing.assert_array_equal(scorer.distances(query, entities, ids), whole[ids])


@pytest.mark.parametrize("name", scorers.IMPORTED)
@pytest.mark.parametrize("blocks", [(16_384, 256), (7, 3)], ids=["whole", "blocks-of-7-rows-3-queries"])
def test_filtered_ranks_are_the_realistic_rank_of_each_query(tables, name, blocks, monkeypatch):
    """Ranked block by block, queries in batches, the ranks are those of one exact pass per query, known answers
    and ties (duplicated rows) included."""
    entities, wide, phases = tables
    entities = np.concatenate([entities, entities[:5]])  # rows 50-54 tie with 0-4
    monkeypatch.setattr(scorers, "RANK_BLOCK_ROWS", blocks[0])
    monkeypatch.setattr(scorers, "RANK_QUERIES", blocks[1])
    rng = np.random.default_rng(4)
    triples = np.stack([rng.integers(55, size=40), rng.integers(4, size=40), rng.integers(55, size=40)], 1)
    triples[:3, 2] = [0, 1, 52]  # targets with a tied twin
    known = KnownAnswers(triples, 4)
    scorer = scorers.SCORERS[name]
    relations = phases if scorer.phases else wide
    for side in ("tail", "head"):
        ranks = scorers.filtered_ranks(scorer, entities, relations, triples[:10], known, side=side)
        for (h, r, t), rank in zip(triples[:10], ranks, strict=True):
            anchor, target = (h, t) if side == "tail" else (t, h)
            dist = scorer.distances(scorer.query(entities[anchor], relations[r], inverse=side == "head"), entities)
            assert rank == rotate.realistic_rank(dist, target, excluded=known.answers(side, anchor, r))
        assert side == "head" or ranks[:3].min() >= 1.5  # each target's twin ties with it


def test_fits_float32_bounds_every_scorer():
    big = np.full((3, 2 * D), 1e13, dtype=np.float32)
    small = np.ones((3, 2 * D), dtype=np.float32)
    for name in ("distmult", "complex"):
        assert not scorers.fits_float32(scorers.SCORERS[name], big, big)[0]  # |h r t| ~ 1e39
        assert scorers.fits_float32(scorers.SCORERS[name], small, small)[0]
    assert scorers.fits_float32(scorers.SCORERS["transe-l2"], big, big)[0]  # (3e13)^2 * 12 < 3.4e38
    assert not scorers.fits_float32(scorers.SCORERS["transe-l2"], big * 1e6, big)[0]
