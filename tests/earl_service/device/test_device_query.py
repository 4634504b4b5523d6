"""edge.EdgeModel's queries: the same top-k as LinkPredictor's exact path, known answers from the shared index."""

import numpy as np
import pytest

from earl_service.data.vocab import Vocab
from earl_service.device.reader import EdgeModel
from earl_service.errors import ConfigError
from earl_service.serve.predictor import LinkPredictor


@pytest.fixture(scope="module")
def twins():
    rng = np.random.default_rng(0)
    n, num_rel, dim = 60, 3, 6
    ent = rng.uniform(-1, 1, (n, 2 * dim)).astype(np.float32)
    rel = rng.uniform(-1, 1, (num_rel, dim)).astype(np.float32)
    triples = np.stack([rng.integers(n, size=150), rng.integers(num_rel, size=150), rng.integers(n, size=150)], 1)
    entities, relations = Vocab([f"e{i}" for i in range(n)]), Vocab(["a", "b", "c"], kind="relation")
    config = {"dim": dim, "gamma": 6.0, "epsilon": 2.0}
    edge = EdgeModel(config, entities, relations, ent, rel, triples, {})
    library = LinkPredictor(ent, rel, entities, relations, triples, gamma=6.0, epsilon=2.0, index="exact")
    return edge, library, triples


@pytest.mark.parametrize("exclude_known", [True, False])
def test_edge_answers_equal_the_library_exact_path(twins, exclude_known):
    edge, library, triples = twins
    for h, r, t in triples[:30]:
        head, relation, tail = f"e{h}", "abc"[r], f"e{t}"
        for k in (1, 7, 60):
            assert edge.predict_tails(head, relation, k, exclude_known=exclude_known) == \
                library.brute_force_tails(head, relation, k, exclude_known=exclude_known)
            assert edge.predict_heads(tail, relation, k, exclude_known=exclude_known) == \
                library.brute_force_heads(tail, relation, k, exclude_known=exclude_known)


def test_edge_drops_exactly_the_known_answers(twins):
    edge, _, triples = twins
    h, r, _ = triples[0]
    known = {f"e{t}" for hh, rr, t in triples if (hh, rr) == (h, r)}
    everything = edge.predict_tails(f"e{h}", "abc"[r], 60, exclude_known=False)
    assert [p for p in everything if p[0] not in known] == edge.predict_tails(f"e{h}", "abc"[r], 60)


def test_k_below_one_is_a_config_error(twins):
    edge, library, _ = twins
    with pytest.raises(ConfigError, match="k must be >= 1"):
        edge.predict_tails("e0", "a", 0)
    with pytest.raises(ConfigError, match="k must be >= 1"):
        library.predict_heads("e0", "a", 0)
