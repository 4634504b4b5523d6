"""An imported model's FAISS flat index of its own metric answers exactly what the exact scan does; its HNSW graph,
on request, nearly always."""

from __future__ import annotations

import numpy as np
import pytest

from earl_service.core import scorers
from earl_service.data.vocab import Vocab
from earl_service.serve import metric as metric_module
from earl_service.serve.predictor import LinkPredictor

N, R, D = 3000, 5, 12


def predictor(kind: str, entities: np.ndarray, relations: np.ndarray, triples: np.ndarray, **kwargs) -> LinkPredictor:
    return LinkPredictor(entities, relations, Vocab([f"e{i}" for i in range(len(entities))]),
                         Vocab([f"r{i}" for i in range(R)]), triples, gamma=0.0, epsilon=2.0, model=kind, **kwargs)


def tables(kind: str, seed: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clustered rows (answers crowd together, as trained ones do), some duplicated (ties), and a graph."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, 2 * D))
    entities = (centres[rng.integers(20, size=N)] + 0.3 * rng.normal(size=(N, 2 * D))) * scale
    entities[-50:] = entities[:50]  # tied twins
    width = scorers.SCORERS[kind].relation_width(D)
    relations = rng.uniform(-np.pi, np.pi, (R, width)) if kind == "rotate-l2" else rng.normal(size=(R, width))
    triples = np.stack([rng.integers(N, size=4000), rng.integers(R, size=4000), rng.integers(N, size=4000)], 1)
    return entities.astype(np.float32), relations.astype(np.float32), triples


def assert_answers_exact(served: LinkPredictor, *, queries: int) -> None:
    """`queries` random (entity, relation) pairs: the index's top 1, 10 and 60 tails and heads (known answers left
    out, and tails with them) equal the exact scan's."""
    rng = np.random.default_rng(1)
    for h, r in zip(rng.integers(N, size=queries), rng.integers(R, size=queries), strict=True):
        for k in (1, 10, 60):
            head, rel = f"e{h}", f"r{r}"
            assert served.predict_tails(head, rel, k) == served.brute_force_tails(head, rel, k)
            assert served.predict_heads(head, rel, k) == served.brute_force_heads(head, rel, k)
            assert served.predict_tails(head, rel, k, exclude_known=False) == served.brute_force_tails(
                head, rel, k, exclude_known=False)


@pytest.mark.parametrize("scale", [1.0, 1e3], ids=["unit", "large"])
@pytest.mark.parametrize("kind", scorers.IMPORTED)
def test_the_index_answers_as_the_exact_scan(kind, scale):
    entities, relations, triples = tables(kind, 0, scale)
    served = predictor(kind, entities, relations, triples)
    assert served.index_kind == "metric-flat" and served.index is not None
    assert served.index.index_bytes == 0  # the table is held once: the index's own rows
    assert_answers_exact(served, queries=40)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_the_table_is_the_index_rows_held_once_and_outlives_the_predictor(kind):
    """FAISS copies what it indexes; the predictor reads its rows there and drops its own floats, and an array of
    those rows keeps the index (its memory) alive after the predictor is gone. HNSW over a dot product indexes
    lifted rows, not the table, so it holds both."""
    import gc

    for scorer in ("transe-l1", "distmult"):
        entities, relations, triples = tables(scorer, 0, 1.0)
        served = predictor(scorer, entities, relations, triples, index=kind)
        rows = served.table.dense()
        np.testing.assert_array_equal(rows, entities)
        if kind == "hnsw" and scorer == "distmult":  # the graph indexes lifted rows: the table is a second copy
            assert rows is entities and served.index.index_bytes == len(entities) * (entities.shape[1] + 1) * 4
            continue
        assert served.index.index_bytes == 0 and not np.shares_memory(rows, entities) and not rows.flags.writeable
        kept = rows[:3].copy()
        del served
        gc.collect()
        np.testing.assert_array_equal(rows[:3], kept)  # the index's memory lives on with the array over it
        np.testing.assert_array_equal(rows, entities)


def test_an_uncertified_shortlist_widens_and_exact_builds_no_index(monkeypatch):
    """With a margin so wide that no shortlist certifies, every query widens to the whole table and still
    answers exactly; index="exact" holds no copy of the table."""
    entities, relations, triples = tables("complex", 2, 1.0)
    monkeypatch.setattr(metric_module, "MARGIN", 10.0)
    served = predictor("complex", entities, relations, triples)
    widened = []
    real = served.index.search
    monkeypatch.setattr(served.index, "search", lambda q, size: widened.append(size) or real(q, size))
    assert served.predict_tails("e7", "r1", 10) == served.brute_force_tails("e7", "r1", 10)
    assert widened and max(widened) < N and widened == sorted(widened)  # tried, widened, then scanned everything
    assert predictor("complex", entities, relations, triples, index="exact").index is None


@pytest.mark.parametrize("kind", scorers.IMPORTED)
def test_on_request_an_hnsw_graph_of_the_metric_answers_nearly_all(kind):
    """index="hnsw" builds an HNSW graph of the scorer's metric: approximate, so its top-10s are held to the exact
    scan's on most queries (recall); "auto" keeps the exact flat index whatever the size."""
    entities, relations, triples = tables(kind, 3, 1.0)
    served = predictor(kind, entities, relations, triples, index="hnsw")
    assert served.index_kind == "metric-hnsw"
    rng = np.random.default_rng(4)
    found = wanted = 0
    for h, r in zip(rng.integers(N, size=40), rng.integers(R, size=40), strict=True):
        got = {e for e, _ in served.predict_tails(f"e{h}", f"r{r}", 10)}
        want = {e for e, _ in served.brute_force_tails(f"e{h}", f"r{r}", 10)}
        found, wanted = found + len(got & want), wanted + len(want)
    assert found / wanted >= 0.95, found / wanted
    assert predictor(kind, entities, relations, triples, hnsw_threshold=1000).index_kind == "metric-flat"


def pq_table(seed: int, m: int, scale: float):
    """A pq table: clustered fp16 codebooks, codes with tied duplicate rows."""
    from earl_service.serve.tables import PQTable

    rng = np.random.default_rng(seed)
    sub = 2 * D // m
    books = (rng.normal(size=(m, 1, sub)) + 0.3 * rng.normal(size=(m, 256, sub))) * scale
    codes = rng.integers(0, 256, (N, m), dtype=np.uint8)
    codes[-50:] = codes[:50]  # tied twins
    return PQTable(codes, books.astype(np.float16))


@pytest.mark.parametrize("m", [6, 24], ids=["sub4", "sub1"])
@pytest.mark.parametrize("scale", [1.0, 1e3], ids=["unit", "large"])
@pytest.mark.parametrize("kind", scorers.IMPORTED)
def test_a_pq_table_is_scanned_on_its_codes_as_the_exact_scan(kind, scale, m):
    """Served from its codes by the scorer's own metric: no copy of the table, answers equal to the exact scan of the
    decoded rows (known answers excluded or not, k up to 60)."""
    _, relations, triples = tables(kind, 0, 1.0)
    table = pq_table(3, m, scale)
    served = predictor(kind, table, relations, triples)
    assert served.index_kind == "metric-codes" and served.index is not None and served.index.index_bytes == 0
    assert_answers_exact(served, queries=25)
    query = served.query_vector("tail", 0, 1)
    ids, _ = served.index.certified_shortlist(query, 10, np.zeros(0, np.int64))
    assert len(ids) < N // 4  # certified from a shortlist, not by scoring every row
    assert predictor(kind, table, relations, triples, index="exact").index is None


def test_a_codes_scan_that_cannot_certify_widens_to_every_row(monkeypatch):
    table = pq_table(4, 6, 1.0)
    _, relations, triples = tables("transe-l1", 0, 1.0)
    monkeypatch.setattr(metric_module, "MARGIN", 10.0)
    served = predictor("transe-l1", table, relations, triples)
    sizes = []
    real = served.index.adc.search
    monkeypatch.setattr(served.index.adc, "search", lambda t, codes, size: sizes.append(size) or real(t, codes, size))
    assert served.predict_tails("e7", "r1", 10) == served.brute_force_tails("e7", "r1", 10)
    assert sizes and sizes[-1] < N and sizes == sorted(sizes)  # widened each time, then the whole table exactly


def test_a_dot_product_whose_terms_cancel_is_certified_by_their_size():
    """Codebook entries of ~10^4 in pairs that a query of +-1 cancels: the products round as their size, not as their
    sum's, so a rounding bound from the lookup table's values certified wrong top-ks (a reviewer's adversarial case)."""
    from earl_service.serve.metric import MetricCodes
    from earl_service.serve.tables import PQTable

    rng = np.random.default_rng(2)
    for trial in range(12):
        m, sub = [(2, 8), (2, 16), (4, 8), (1, 16)][trial % 4]
        books = np.repeat(rng.uniform(30000, 65000, (m, 256, sub // 2)), 2, axis=2).astype(np.float16)
        query = np.where(np.arange(m * sub) % 2 == 0, 1 + rng.uniform(0, 2e-6, m * sub), -1).astype(np.float32)
        table = PQTable(rng.integers(0, 256, (30000, m), dtype=np.uint8), books)
        scan = MetricCodes(table, scorers.SCORERS["distmult"])
        exact = np.sort(scorers.SCORERS["distmult"].distances(query, table))
        for k in (1, 10, 60):
            _, dist = scan.certified_shortlist(query, k, np.zeros(0, np.int64))
            np.testing.assert_array_equal(np.sort(dist)[:k], exact[:k])
