"""LinkPredictor: the index path returns exactly the brute-force top-k, both directions; names are checked."""

import numpy as np
import pytest

from earl_service.bundle.model_io import load_bundle
from earl_service.data.vocab import Vocab
from earl_service.errors import ConfigError, UnknownEntityError, UnknownRelationError
from earl_service.serve.predictor import LinkPredictor


@pytest.fixture(scope="module")
def bundle(codex_bundle):
    return load_bundle(codex_bundle)


@pytest.fixture(scope="module")
def predictor(bundle):
    return LinkPredictor.from_bundle(bundle, index="flat")


def _queries(bundle, count, seed=0):
    rng = np.random.default_rng(seed)
    names, rels = bundle.entities.names, bundle.relations.names
    picked = bundle.triples[rng.choice(len(bundle.triples), count, replace=False)]
    return [(names[h], rels[r], names[t]) for h, r, t in picked]


@pytest.mark.parametrize("exclude_known", [True, False])
def test_flat_index_equals_brute_force_both_directions(bundle, predictor, exclude_known):
    for head, relation, tail in _queries(bundle, 150):
        for k in (1, 10):
            assert predictor.predict_tails(head, relation, k, exclude_known=exclude_known) == \
                predictor.brute_force_tails(head, relation, k, exclude_known=exclude_known)
            assert predictor.predict_heads(tail, relation, k, exclude_known=exclude_known) == \
                predictor.brute_force_heads(tail, relation, k, exclude_known=exclude_known)


@pytest.mark.parametrize("rotations", [1, 2])
def test_range_search_certificate_is_exact(bundle, monkeypatch, rotations):
    """A shortlist of only k (+ known answers) rarely certifies itself; the flat index then range-searches every
    entity whose L1 proxy could beat the k-th distance, and the answer still equals brute force."""
    import earl_service.serve.index as index_module

    monkeypatch.setattr(index_module, "shortlist_size", lambda k, excluded=0: k + excluded)
    predictor = LinkPredictor.from_bundle(bundle, index="flat", flat_rotations=rotations)
    assert predictor.rotations == rotations
    ranged = []
    search = predictor.index.range_search
    monkeypatch.setattr(predictor.index, "range_search",
                        lambda lifted, radius: ranged.append(radius) or search(lifted, radius))
    for head, relation, tail in _queries(bundle, 60, seed=7):
        for k in (1, 10):
            assert predictor.predict_tails(head, relation, k) == predictor.brute_force_tails(head, relation, k)
            assert predictor.predict_heads(tail, relation, k) == predictor.brute_force_heads(tail, relation, k)
    assert len(ranged) > 100  # the path under test really ran


def test_flat_index_times_both_proxies_and_keeps_one(predictor):
    """The flat index measured P = 1 and P = 2 on the graph's own queries and kept the faster (module doc)."""
    assert set(predictor.calibration_ms) == {1, 2} and all(ms > 0 for ms in predictor.calibration_ms.values())
    assert predictor.rotations == min(predictor.calibration_ms, key=predictor.calibration_ms.get)


@pytest.mark.parametrize("options", [{"index": "hnsw"}, {"index": "flat", "flat_rotations": 2}, {"index": "exact"}])
def test_no_calibration_sample_when_nothing_is_timed(bundle, monkeypatch, options):
    """The 48 calibration queries are only built when the flat index times its two proxies."""
    def refuse(self, triples):
        raise AssertionError("calibration sample built")

    monkeypatch.setattr(LinkPredictor, "_calibration_sample", refuse)
    assert LinkPredictor.from_bundle(bundle, **options).calibration_ms == {}


def test_scores_are_rotate_scores(bundle, predictor):
    """score = gamma - sum_i |h_i r_i - t_i|, as the training scorer computes it."""
    import torch

    head, relation, _ = _queries(bundle, 1, seed=3)[0]
    ent, rel = bundle.entity_embeddings(), bundle.relation_embeddings()
    h, r = bundle.entities.id(head), bundle.relations.id(relation)
    for tail, score in predictor.predict_tails(head, relation, 5):
        t = bundle.entities.id(tail)
        expected = float(bundle.scorer.score(ent[h][None], rel[r][None], ent[t][None]))
        assert score == pytest.approx(expected, abs=1e-4)
        # The head direction scores the same triple identically (|h o r - t| = |h - conj(r) o t|).
        heads = dict(predictor.predict_heads(tail, relation, len(bundle.entities), exclude_known=False))
        assert heads[head] == pytest.approx(score, abs=1e-4)
    assert torch.is_tensor(ent)


def test_exclude_known_drops_exactly_the_known_answers(bundle, predictor):
    head, relation, _ = _queries(bundle, 1, seed=5)[0]
    known = set(predictor.known_answers("tail", head, relation))
    assert known
    everything = predictor.predict_tails(head, relation, len(bundle.entities), exclude_known=False)
    filtered = predictor.predict_tails(head, relation, len(bundle.entities))
    assert [p for p in everything if p[0] not in known] == filtered
    assert len(filtered) == len(bundle.entities) - len(known)


def test_unknown_names_raise_with_suggestions(bundle, predictor):
    head, relation, _ = _queries(bundle, 1)[0]
    with pytest.raises(UnknownEntityError) as err:
        predictor.predict_tails(head + "x", relation)
    assert head in err.value.suggestions
    with pytest.raises(UnknownRelationError) as err:
        predictor.predict_heads(head, relation.lower())
    assert relation in err.value.suggestions
    with pytest.raises(ValueError):
        predictor.predict_tails(head, relation, 0)


def test_hnsw_index_agrees_on_most_queries(bundle):
    """HNSW is approximate; on CoDEx-S it still returns the exact top-10 for nearly every query."""
    hnsw = LinkPredictor.from_bundle(bundle, index="hnsw")
    assert hnsw.index_kind == "hnsw"
    queries = _queries(bundle, 100, seed=1)
    same = sum(hnsw.predict_tails(h, r) == hnsw.brute_force_tails(h, r) for h, r, _ in queries)
    assert same >= 90


def test_from_arrays_small_graph_scores_everything():
    """A graph smaller than the shortlist is scored exhaustively; results are still names, best first."""
    rng = np.random.default_rng(0)
    ent = rng.uniform(-1, 1, (20, 8)).astype(np.float32)
    rel = rng.uniform(-1, 1, (2, 4)).astype(np.float32)
    pred = LinkPredictor(ent, rel, Vocab([f"e{i}" for i in range(20)]), Vocab(["a", "b"], kind="relation"),
                         np.array([[0, 0, 1]]), gamma=6.0, epsilon=2.0)
    out = pred.predict_tails("e0", "a", 5)
    assert len(out) == 5 and "e1" not in dict(out)
    assert [s for _, s in out] == sorted((s for _, s in out), reverse=True)
    assert out == pred.brute_force_tails("e0", "a", 5)
    with pytest.raises(ValueError, match="columns"):
        LinkPredictor(ent[:, :6], rel, Vocab([f"e{i}" for i in range(20)]), Vocab(["a", "b"], kind="relation"),
                      np.zeros((0, 3)), gamma=6.0, epsilon=2.0)
    with pytest.raises(ConfigError, match="entity rows"):
        LinkPredictor(ent[:19], rel, Vocab([f"e{i}" for i in range(20)]), Vocab(["a", "b"], kind="relation"),
                      np.zeros((0, 3)), gamma=6.0, epsilon=2.0)


def test_answer_is_the_top_k_as_json(bundle, predictor):
    head, relation, tail = _queries(bundle, 1, seed=4)[0]
    got = predictor.answer(relation, head=head, k=3)
    assert got["direction"] == "tail" and (got["head"], got["tail"], got["k"]) == (head, None, 3)
    assert [(p["entity"], p["score"]) for p in got["predictions"]] == predictor.brute_force_tails(head, relation, 3)
    got = predictor.answer(relation, tail=tail, k=2, exclude_known=False)
    assert got["direction"] == "head" and got["exclude_known"] is False
    assert [(p["entity"], p["score"]) for p in got["predictions"]] == \
        predictor.brute_force_heads(tail, relation, 2, exclude_known=False)
    for both_or_none in ({"head": head, "tail": tail}, {}):
        with pytest.raises(ConfigError, match="exactly one of head"):
            predictor.answer(relation, **both_or_none)


def test_score_is_the_rotate_score_and_rank_of_a_triple(bundle, predictor):
    """score() agrees with the top-k: a candidate's score equals its /predict score, and its unfiltered rank is
    its place in the full ranking (exclude_known=False); a known triple is reported as known."""
    head, relation, tail = _queries(bundle, 1, seed=5)[0]
    everything = predictor.brute_force_tails(head, relation, predictor.num_entities, exclude_known=False)
    candidate, score = everything[3]
    got = predictor.score(head, relation, candidate)
    assert got["score"] == pytest.approx(score, abs=1e-5) and got["distance"] == pytest.approx(predictor.gamma - score)
    known = set(predictor.known_answers("tail", head, relation))
    assert got["known"] == (candidate in known)
    better_unknown = sum(1 for e, _ in everything[:3] if e not in known)  # distinct scores: no ties in practice
    assert got["tail_rank"] == 1 + better_unknown
    assert predictor.score(head, relation, tail)["known"] is True
    assert 1 <= got["head_rank"] <= predictor.num_entities and got["entities"] == predictor.num_entities


def test_score_names_an_unknown_entity(predictor):
    with pytest.raises(UnknownEntityError, match="unknown entity 'nope'"):
        predictor.score("nope", predictor.relations.names[0], predictor.entities.names[0])
