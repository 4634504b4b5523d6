"""ProxyIndex: the lifted-L1 sandwich, certified shortlists equal to an exhaustive scan, calibration as a choice."""

import numpy as np
import pytest

from earl_service.core import rotate
from earl_service.serve.index import ProxyIndex, calibrate, lift, proxy_bounds, shortlist_size


def _clustered(n=3000, dim=8, seed=0):
    """Entities around n/50 centres (distances concentrate: the range search has work to do)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-1, 1, (n // 50, 2 * dim))
    return (centres[rng.integers(len(centres), size=n)] + 0.3 * rng.standard_normal((n, 2 * dim))).astype(np.float32)


def _sample(entities, count=12, seed=1):
    """(query, excluded) pairs: queries near random entities, a few ids to drop."""
    rng = np.random.default_rng(seed)
    queries = entities[rng.integers(len(entities), size=count)] + 0.1 * rng.standard_normal((count, entities.shape[1]))
    return [(q.astype(np.float32), np.sort(rng.choice(len(entities), 3, replace=False))) for q in queries]


@pytest.mark.parametrize("rotations", [1, 2, 4])
def test_lifted_l1_brackets_the_rotate_distance(rotations):
    """D <= L1(lift(q) - lift(e)) <= ratio * D for random complex vectors (the shortlist certificate)."""
    rng = np.random.default_rng(0)
    dim = 8
    q, e = rng.normal(size=(2, 500, 2 * dim)).astype(np.float32)
    z = q - e
    exact = np.sqrt(z[:, :dim] ** 2 + z[:, dim:] ** 2).sum(1)
    proxy = np.abs(lift(q, dim, rotations) - lift(e, dim, rotations)).sum(1)
    g_min, g_max = proxy_bounds(rotations)
    assert np.all(proxy >= exact * (1 - 1e-5)) and np.all(proxy <= exact * g_max / g_min * (1 + 1e-5))



@pytest.mark.parametrize("rotations", [1, 2])
def test_flat_certified_shortlist_holds_the_exact_top_k(rotations):
    entities = _clustered()
    index = ProxyIndex.build(entities, kind="flat", flat_rotations=rotations)
    assert (index.kind, index.rotations, index.calibration_ms) == ("flat", rotations, {})
    everything = np.arange(len(entities))
    for query, excluded in _sample(entities, 30):
        for k in (1, 10):
            ids, dist = index.certified_shortlist(query, k, excluded)
            np.testing.assert_array_equal(dist, rotate.distances(query, entities, ids))
            expected = rotate.top_k(everything, rotate.distances(query, entities), k, excluded=excluded)[0]
            assert rotate.top_k(ids, dist, k, excluded=excluded)[0].tolist() == expected.tolist()


def test_calibrate_returns_the_faster_proxy_and_leaves_the_candidates_alone():
    entities = _clustered()
    candidates = {p: ProxyIndex.build(entities, kind="flat", flat_rotations=p) for p in (1, 2)}
    before = {p: (c.rotations, c.faiss_index, c.calibration_ms) for p, c in candidates.items()}
    best, timings = calibrate(candidates, _sample(entities))
    assert set(timings) == {1, 2} and all(ms > 0 for ms in timings.values())
    assert best == min(timings, key=timings.get)
    assert {p: (c.rotations, c.faiss_index, c.calibration_ms) for p, c in candidates.items()} == before
    assert calibrate({2: candidates[2], 1: candidates[1]}, []) == (2, {})  # nothing to time: the first
    small = _clustered(n=shortlist_size(10), seed=3)
    tiny = {p: ProxyIndex.build(small, kind="flat", flat_rotations=p) for p in (1, 2)}
    assert calibrate(tiny, _sample(small)) == (1, {})  # every query scans the whole graph: nothing to choose


def test_a_sample_maker_is_called_only_when_something_is_timed():
    """A callable sample is built lazily: not for one candidate or a graph no larger than a shortlist."""
    entities, calls = _clustered(), []

    def make():
        calls.append(1)
        return _sample(entities)

    candidates = {p: ProxyIndex.build(entities, kind="flat", flat_rotations=p) for p in (1, 2)}
    assert calibrate({1: candidates[1]}, make) == (1, {}) and calls == []
    small = _clustered(n=shortlist_size(10), seed=3)
    tiny = {p: ProxyIndex.build(small, kind="flat", flat_rotations=p) for p in (1, 2)}
    assert calibrate(tiny, make) == (1, {}) and calls == []
    assert set(calibrate(candidates, make)[1]) == {1, 2} and calls == [1]
    assert calibrate(candidates, list) == (1, {})  # a maker that makes no queries: nothing to time


def test_build_keeps_the_calibrated_choice():
    entities = _clustered()
    index = ProxyIndex.build(entities, kind="flat", sample=_sample(entities))
    assert set(index.calibration_ms) == {1, 2}
    assert index.rotations == min(index.calibration_ms, key=index.calibration_ms.get)
    assert index.ratio == pytest.approx(np.divide(*proxy_bounds(index.rotations)[::-1]))


def test_hnsw_index_agrees_with_the_exhaustive_scan_on_most_queries():
    entities = _clustered(n=2000)
    index = ProxyIndex.build(entities, kind="hnsw")
    assert (index.kind, index.rotations) == ("hnsw", 2)
    same = 0
    everything = np.arange(len(entities))
    for query, excluded in _sample(entities, 40):
        ids, dist = index.certified_shortlist(query, 10, excluded)
        expected = rotate.top_k(everything, rotate.distances(query, entities), 10, excluded=excluded)[0]
        same += rotate.top_k(ids, dist, 10, excluded=excluded)[0].tolist() == expected.tolist()
    assert same >= 36


def test_a_failing_gpu_index_falls_back_to_the_exact_cpu_index(monkeypatch, caplog):
    """FAISS reports a GPU but cannot use it (driver, memory): the CPU flat index answers, with a warning."""
    import faiss

    import earl_service.serve.index as index_module

    def no_gpu(resources, device, index):
        raise RuntimeError("no CUDA device")

    monkeypatch.setattr(index_module, "gpu_count", lambda: 1)
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)  # CPU builds lack both symbols
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", no_gpu, raising=False)
    index = ProxyIndex.build(_clustered(n=500), kind="auto", hnsw_threshold=100)  # a GPU keeps "auto" flat
    assert index.kind == "flat"
    assert "GPU index failed (no CUDA device)" in caplog.text


class _CappedIndex:
    """A CPU flat index that refuses k past GPU_MAX_K as faiss's GPU indexes do (no GPU on CI)."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def search(self, x, k):
        from earl_service.serve.index import GPU_MAX_K

        self.asked.append(k)
        if k > GPU_MAX_K:
            raise RuntimeError(f"k {k} > GPU_MAX_SELECTION_K")
        return self.inner.search(x, k)


@pytest.mark.parametrize("excluded_count", [5, 2500])
def test_the_gpu_index_never_asks_past_its_k_cap_and_stays_exact(excluded_count):
    """A shortlist that would need more than faiss-gpu returns (here: 2,500 known answers to drop) is answered by
    the exact scan; a small one by the index. Both equal the exhaustive top-k."""
    from earl_service.serve.index import GPU_MAX_K, _flat_index

    entities = _clustered(n=6000)
    rotations = 2
    capped = _CappedIndex(_flat_index(lift(entities, entities.shape[1] // 2, rotations)))
    index = ProxyIndex(entities, capped, kind="gpu-flat", rotations=rotations)
    rng = np.random.default_rng(3)
    query = entities[7] + 0.1 * rng.standard_normal(entities.shape[1]).astype(np.float32)
    excluded = np.sort(rng.choice(len(entities), excluded_count, replace=False))
    ids, dist = index.certified_shortlist(query, 10, excluded)
    expected = rotate.top_k(np.arange(len(entities)), rotate.distances(query, entities), 10, excluded=excluded)[0]
    assert rotate.top_k(ids, dist, 10, excluded=excluded)[0].tolist() == expected.tolist()
    assert capped.asked == [] if excluded_count > GPU_MAX_K else 0 < max(capped.asked) <= GPU_MAX_K


def test_a_predictors_resident_bytes_count_its_tables_index_and_names():
    from earl_service.data.vocab import Vocab
    from earl_service.serve.predictor import LinkPredictor

    rng = np.random.default_rng(0)
    n, r, dim = 3000, 5, 16
    entities = rng.normal(size=(n, 2 * dim)).astype(np.float32)
    triples = np.stack([rng.integers(n, size=500), rng.integers(r, size=500), rng.integers(n, size=500)], 1)
    names = Vocab([f"e{i}" for i in range(n)])
    exact = LinkPredictor(entities, rng.normal(size=(r, dim)).astype(np.float32), names,
                          Vocab([f"r{i}" for i in range(r)]), triples, gamma=9.0, epsilon=2.0, index="exact")
    flat = LinkPredictor(entities, exact.relation_embeddings, names, exact.relations, triples, gamma=9.0, epsilon=2.0,
                         index="flat")
    tables = entities.nbytes + exact.relation_embeddings.nbytes
    assert tables < exact.resident_bytes < tables + 500 * 4 * 8 + (n + r) * 80
    lifted = n * 2 * dim * flat.index.rotations * 4
    assert flat.resident_bytes - exact.resident_bytes == flat.index.index_bytes == lifted
