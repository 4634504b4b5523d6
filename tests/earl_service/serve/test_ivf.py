"""The IVF over codes: recall@10 against brute force on the decoded table, and its cache beside the bundle (read
back on the next load, replaced when the bundle changes, rebuilt when unreadable)."""

import numpy as np
import pytest

from earl_service.bundle.codebooks import encode_table
from earl_service.core import rotate
from earl_service.serve import ivf as ivf_module
from earl_service.serve.ivf import CodesIVF, cache_file
from earl_service.serve.tables import PQTable

NONE = np.zeros(0, dtype=np.int64)


@pytest.fixture(scope="module")
def clustered():
    """A pq:8 table of 20,000 rows around 400 centres (dim 16), and queries near rows."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((400, 32)).astype(np.float32)
    rows = (centres[rng.integers(0, 400, 20_000)] + 0.3 * rng.standard_normal((20_000, 32))).astype(np.float32)
    codes, books = encode_table(rows, 8, iterations=5)
    table = PQTable(codes, books)
    decoded = table.dense()
    queries = decoded[rng.integers(0, 20_000, 100)] + 0.1 * rng.standard_normal((100, 32)).astype(np.float32)
    return table, decoded, queries


@pytest.fixture
def small_lists(monkeypatch):
    monkeypatch.setattr(ivf_module, "LIST_SIZE", 200)  # 100 lists, 24 probed: most of the table is never scanned


def test_recall_at_10_against_brute_force(clustered, small_lists):
    table, decoded, queries = clustered
    index = CodesIVF.build(table)
    assert index.nlist == 100
    assert table.position is not None and index.codes is table.codes  # one copy, list by list
    np.testing.assert_array_equal(table.dense(), decoded)  # rows still decode by id
    hits = 0
    for query in queries:
        ids, dist = index.certified_shortlist(query, 10, NONE)
        got = rotate.top_k(ids, dist, 10)[0]
        want = rotate.top_k(np.arange(len(table)), rotate.distances(query, decoded), 10)[0]
        hits += len(set(got.tolist()) & set(want.tolist()))
        np.testing.assert_allclose(dist, rotate.distances(query, decoded, ids), rtol=1e-6)  # exact re-rank
    assert hits / (10 * len(queries)) >= 0.999


def test_recall_at_10_over_an_int8_tables_complex_codes(clustered, small_lists):
    """An int8 table's lists scan its complex-pair codes (ratio 1, serve/codes.py): the same recall bar, exact
    re-rank, and the codes held once, in list order."""
    from earl_service.bundle.precision import Int8
    from earl_service.serve.tables import Int8Table

    _, decoded, queries = clustered
    stored = Int8().encode("x", decoded)
    table = Int8Table(stored["x"], stored["x.scale"])
    rows = table.dense()
    index = CodesIVF.build(table)
    assert index.ratio == 1 and index.codes is table.proxy_codes().codes and index.codes.shape == (len(rows), 16)
    hits = 0
    for query in queries:
        ids, dist = index.certified_shortlist(query, 10, NONE)
        want = rotate.top_k(np.arange(len(rows)), rotate.distances(query, rows), 10)[0]
        hits += len(set(rotate.top_k(ids, dist, 10)[0].tolist()) & set(want.tolist()))
        np.testing.assert_allclose(dist, rotate.distances(query, rows, ids), rtol=1e-6)
    assert hits / (10 * len(queries)) >= 0.999


def test_the_index_is_read_back_from_beside_the_bundle(clustered, small_lists, tmp_path, monkeypatch):
    table, _, queries = clustered
    bundle = tmp_path / "v1.safetensors"
    first = CodesIVF.build(table, cache=cache_file(bundle, "a" * 64))
    assert cache_file(bundle, "a" * 64).exists()
    monkeypatch.setattr(ivf_module, "_build_lists", lambda *a: pytest.fail("rebuilt although cached"))
    again = CodesIVF.build(table, cache=cache_file(bundle, "a" * 64))
    for query in queries[:10]:
        np.testing.assert_array_equal(again.certified_shortlist(query, 10, NONE)[0],
                                      first.certified_shortlist(query, 10, NONE)[0])


def test_a_replaced_bundle_gets_a_new_index_and_the_old_one_goes(clustered, small_lists, tmp_path):
    table, _, _ = clustered
    bundle = tmp_path / "v1.safetensors"
    CodesIVF.build(table, cache=cache_file(bundle, "a" * 64))
    CodesIVF.build(table, cache=cache_file(bundle, "b" * 64))
    assert sorted(p.name for p in tmp_path.iterdir()) == [cache_file(bundle, "b" * 64).name]


def test_an_unreadable_or_mismatched_cache_is_rebuilt(clustered, small_lists, tmp_path):
    table, _, _ = clustered
    path = cache_file(tmp_path / "v1.safetensors", "c" * 64)
    path.write_bytes(b"not an index")
    assert CodesIVF.build(table, cache=path).num_entities == len(table)
    other = PQTable(table.codes[:5000], table.codebooks.astype(np.float16))
    assert CodesIVF.build(other, cache=path).num_entities == 5000  # the 20,000-row index on disk does not fit it
