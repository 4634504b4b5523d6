"""core.rotate: the numpy RotatE query and distance equal the torch scorer's twins; blocks and ties are exact."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from earl_service.config import ModelConfig
from earl_service.core import rotate
from earl_service.model.modules import RotatE


@pytest.mark.parametrize("inverse", [False, True])
def test_numpy_core_equals_the_torch_scorer(inverse):
    """The twins: model.RotatE (torch, for autograd) and core.rotate (numpy) on the same random inputs."""
    config = ModelConfig(dim=12, gamma=9.0, epsilon=2.0)
    scorer = RotatE(config)
    scale = rotate.phase_scale(gamma=config.gamma, epsilon=config.epsilon, dim=config.dim)
    assert scale == pytest.approx(scorer.phase_scale, rel=1e-15)
    assert config.phase_scale == scale  # the config's scale is core.rotate's, not a second formula
    rng = np.random.default_rng(0)
    bound = config.embedding_range
    entities = rng.uniform(-bound, bound, (300, 2 * config.dim)).astype(np.float32)  # (N, 2d)
    relations = rng.uniform(-bound, bound, (40, config.dim)).astype(np.float32)  # (B, d)
    anchors = entities[:40]
    queries = rotate.query(anchors, relations, scale=scale, inverse=inverse)  # (B, 2d)
    twin = scorer.rotate(torch.from_numpy(anchors), torch.from_numpy(relations), inverse=inverse)
    np.testing.assert_allclose(queries, twin.numpy(), rtol=1e-5, atol=1e-6)
    for q in queries[:5]:
        torch_dist = scorer.distance(torch.from_numpy(q)[None], torch.from_numpy(entities)).numpy()  # (N,)
        np.testing.assert_allclose(rotate.distances(q, entities), torch_dist, rtol=1e-5, atol=1e-5)


def test_one_row_query_equals_the_batched_query():
    rng = np.random.default_rng(1)
    entities, relations = rng.normal(size=(6, 8)).astype(np.float32), rng.normal(size=(6, 4)).astype(np.float32)
    batched = rotate.query(entities, relations, scale=0.7, inverse=True)
    for i in range(6):
        np.testing.assert_array_equal(rotate.query(entities[i], relations[i], scale=0.7, inverse=True), batched[i])


def test_distances_over_blocks_and_id_subsets(monkeypatch):
    """Blocking bounds memory only: the same distances whatever the block size, for all rows or a subset."""
    rng = np.random.default_rng(2)
    dim = 5
    entities = rng.normal(size=(103, 2 * dim)).astype(np.float32)
    query = rng.normal(size=2 * dim).astype(np.float32)
    z = entities.astype(np.float64) - query
    expected = np.sqrt(z[:, :dim] ** 2 + z[:, dim:] ** 2).sum(1)  # sum_i |q_i - e_i| over complex coordinates
    whole = rotate.distances(query, entities)
    monkeypatch.setattr(rotate, "BLOCK_ROWS", 10)
    ids = rng.permutation(103)[:37]
    np.testing.assert_allclose(whole, expected, rtol=1e-5)
    np.testing.assert_array_equal(rotate.distances(query, entities), whole)
    np.testing.assert_array_equal(rotate.distances(query, entities, ids), whole[ids])


def test_top_k_orders_by_distance_then_id_and_drops_excluded():
    ids = np.array([7, 3, 9, 1, 5])
    dist = np.array([0.5, 0.2, 0.2, 0.9, 0.1], dtype=np.float32)
    top_ids, top_dist = rotate.top_k(ids, dist, 3)
    assert top_ids.tolist() == [5, 3, 9] and top_dist.tolist() == pytest.approx([0.1, 0.2, 0.2])
    assert rotate.top_k(ids, dist, 10, excluded=np.array([5, 9]))[0].tolist() == [3, 7, 1]


def test_the_core_imports_neither_torch_nor_faiss():
    code = ("import sys; import earl_service.core.rotate, earl_service.core.known; "
            "print(sorted(m for m in ('torch', 'faiss', 'scipy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_realistic_rank_equals_the_evaluators_twin():
    """core.rotate.realistic_rank (numpy, one query) and evaluate.realistic_ranks (torch, a batch) on ties and
    filters: the hand example of test_evaluate plus random distances with many ties."""
    from earl_service.train.evaluate import realistic_ranks

    dist = np.array([1.0, 2.0, 2.0, 2.0, 5.0, 0.5], dtype=np.float32)
    assert rotate.realistic_rank(dist, 1) == 4.0
    assert rotate.realistic_rank(dist, 1, excluded=np.array([5, 2])) == 2.5
    rng = np.random.default_rng(0)
    for _ in range(50):
        dist = rng.integers(0, 5, 30).astype(np.float32)  # many ties
        target, excluded = int(rng.integers(30)), rng.choice(30, 6, replace=False)
        filtered = torch.zeros(1, 30, dtype=torch.bool)
        filtered[0, excluded] = True
        twin = realistic_ranks(torch.from_numpy(dist)[None], torch.tensor([target]), filtered).item()
        assert rotate.realistic_rank(dist, target, excluded=excluded) == twin
