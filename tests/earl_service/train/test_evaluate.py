"""Filtered ranking with realistic ranks for ties, on hand-made examples."""

import numpy as np
import pytest
import torch

from earl_service.train.evaluate import KnownAnswers, RankingEvaluator, realistic_ranks


def test_realistic_rank_with_ties():
    dist = torch.tensor([[1.0, 2.0, 2.0, 2.0, 5.0, 0.5]])
    filtered = torch.zeros(1, 6, dtype=torch.bool)
    # Target at column 1 (distance 2): one strictly better (0.5 and 1.0 -> two), two ties -> 1 + 2 + 2/2 = 4.
    assert realistic_ranks(dist, torch.tensor([1]), filtered).item() == 4.0
    # Filtering a better candidate and a tie: 1 + 1 + 1/2.
    filtered[0, 5] = filtered[0, 2] = True
    assert realistic_ranks(dist, torch.tensor([1]), filtered).item() == 2.5


def test_constant_scorer_gets_middle_rank():
    dist = torch.zeros(3, 11)
    ranks = realistic_ranks(dist, torch.tensor([0, 5, 10]), torch.zeros(3, 11, dtype=torch.bool))
    assert torch.equal(ranks, torch.full((3,), 6.0, dtype=torch.float64))  # (1 + 11) / 2


def test_known_answers_mask():
    triples = np.array([[0, 0, 1], [0, 0, 2], [3, 0, 1], [0, 1, 3]])
    known = KnownAnswers(triples, num_relations=2)
    tails = known.mask(np.array([0, 0]), np.array([0, 1]), side="tail", num_candidates=4)
    assert tails.tolist() == [[False, True, True, False], [False, False, False, True]]
    heads = known.mask(np.array([1]), np.array([0]), side="head", num_candidates=3)  # answer 3 is out of range
    assert heads.tolist() == [[True, False, False]]


def test_metrics():
    ev = RankingEvaluator()
    ev.update_(np.array([1.0, 2.0]))
    ev.update_(torch.tensor([4.0, 20.0]))
    m = ev.finalize()
    assert m.count == 4
    assert m.mrr == pytest.approx((1 + 0.5 + 0.25 + 0.05) / 4)
    assert m.mr == pytest.approx(27 / 4)
    assert (m.hits_at_1, m.hits_at_3, m.hits_at_10) == (0.25, 0.5, 0.75)


def test_standard_errors_of_mrr_and_hits_pool_both_directions():
    from earl_service.train.evaluate import standard_errors

    ranks = {"tail": np.array([1.0, 2.0]), "head": np.array([4.0, 20.0])}
    reciprocal, hits = np.array([1.0, 0.5, 0.25, 0.05]), np.array([1.0, 1.0, 1.0, 0.0])
    assert standard_errors(ranks) == pytest.approx({"mrr": np.std(reciprocal, ddof=1) / 2,
                                                    "hits_at_10": np.std(hits, ddof=1) / 2})
    assert standard_errors({"tail": np.array([3.0]), "head": np.zeros(0)}) == {"mrr": 0.0, "hits_at_10": 0.0}


def _ranking_setting():
    from earl_service.config import ModelConfig
    from earl_service.model.modules import RotatE

    rng = np.random.default_rng(0)
    n, d = 500, 8
    entities = torch.from_numpy(rng.normal(size=(n, 2 * d)).astype(np.float32))
    relations = torch.from_numpy(rng.uniform(-3, 3, (4, d)).astype(np.float32))
    triples = np.stack([rng.integers(n, size=90), rng.integers(4, size=90), rng.integers(n, size=90)], 1)
    return entities, relations, triples, KnownAnswers(triples, 4), RotatE(ModelConfig(model="rotate", dim=d))


def test_the_process_growth_is_handed_back_past_the_slack_only(monkeypatch):
    """rank_triples hands the allocator's free memory back after a batch only once the process has grown by more
    than 8 x batch x N bytes since ranking began (a trim after every batch cost 12% of the ranking's time); the
    ranks, written in place batch by batch, are those of batches of any size."""
    from earl_service import memory
    from earl_service.train import evaluate

    entities, relations, triples, known, scorer = _ranking_setting()
    whole = evaluate.rank_triples(entities, relations, scorer, triples, known)  # one batch of 90
    monkeypatch.setattr(evaluate, "MAX_BATCH_SCORES", 10 * len(entities))  # 9 batches of 10
    slack = 8 * 10 * len(entities) / 2**20
    readings = iter([100.0] + [100.0 + slack * (1.5 if i % 3 == 2 else 0.5) for i in range(9)])
    released: list[int] = []
    monkeypatch.setattr(memory, "current_rss_mb", lambda: next(readings))
    monkeypatch.setattr(memory, "release_free_memory", lambda: released.append(1))
    batched = evaluate.rank_triples(entities, relations, scorer, triples, known)
    assert len(released) == 3  # after the batches that left the process past the slack
    for side in ("tail", "head"):
        np.testing.assert_array_equal(batched[side], whole[side])
