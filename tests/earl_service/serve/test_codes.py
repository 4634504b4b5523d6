"""Serving from codes: the ADC scan sums the L1 table exactly, and a predictor over a bundle's fp32 or int8 rows
(their pair codes) or pq codes answers exactly what brute force over the decoded table answers, on trained and on
random tables."""

import numpy as np
import pytest
from conftest import codex_s_path

from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.precision import Int8
from earl_service.config import ModelConfig, TrainConfig
from earl_service.core import rotate
from earl_service.data.dataset import load_dataset
from earl_service.serve import codes as codes_module
from earl_service.serve.codes import CodesIndex, lookup_table, modulus_table
from earl_service.serve.predictor import LinkPredictor
from earl_service.serve.tables import DenseTable, Int8Table, PQTable
from earl_service.train.loop import BUNDLE, train

TRAIN = TrainConfig(steps=60, batch_size=512, negatives=32, lr=3e-3, eval_every=0, progress=False, threads=1)


@pytest.fixture(scope="module")
def rotate_bundles(tmp_path_factory):
    """RotatE dim 16 on CoDEx-S trained briefly, saved at fp32, int8 and pq:8 (2,034 entities)."""
    out = tmp_path_factory.mktemp("codes_run")
    train(load_dataset(codex_s_path()), ModelConfig(model="rotate", dim=16), TRAIN, out, final_eval=False)
    bundle = load_bundle(out / BUNDLE)
    return {p: load_bundle(bundle.save(out / f"{p}.safetensors", precision=p)) for p in ("fp32", "int8", "pq:8")}


def _random_tables(n=3000, width=32, seed=0):
    rng = np.random.default_rng(seed)
    pq = PQTable(rng.integers(0, 256, (n, 8), dtype=np.uint8), rng.standard_normal((8, 256, width // 8)).astype(np.float16))
    values = (rng.standard_normal((n, width)) * rng.random((n, 1))).astype(np.float32)
    stored = Int8().encode("x", values)
    return {"pq": pq, "int8": Int8Table(stored["x"], stored["x.scale"]), "fp32": DenseTable(values)}


def test_the_scan_sums_the_l1_table_of_the_decoded_rows():
    """A from FAISS (the sqrt trick) equals a pq table's L1 distance to each decoded row; an int8 table's A (moduli to
    its complex centroids) lies within each row's slack of RotatE's distance to the row itself."""
    rng = np.random.default_rng(3)
    for kind, table in _random_tables().items():
        index = CodesIndex.build(table)
        query = rng.standard_normal(table.shape[1]).astype(np.float32)
        proxy, ids = index.scan(query, len(table))
        if kind == "pq":
            np.testing.assert_allclose(proxy, np.abs(table.dense()[ids] - query).sum(1), rtol=1e-5)
        else:  # pair codes: int8 and fp32 rows
            assert index.ratio == 1 and index.codes.shape == (len(table), table.shape[1] // 2)
            exact = rotate.distances(query, table.dense(), ids)
            assert np.all(np.abs(proxy - exact) <= index.slack[ids] * (1 + 1e-5) + 1e-5)
        assert np.all(np.diff(proxy) >= 0)


@pytest.mark.parametrize("kind", ["int8", "fp32"])
def test_a_pair_coded_tables_slack_is_its_rows_distance_to_their_centroids(kind):
    """The slack the certificate subtracts is, row by row, RotatE's distance from the row to its codes' centroids:
    an upper bound on |A - D| that is exact for the query at the row's own centroids."""
    table = _random_tables()[kind]
    proxy = table.proxy_codes()
    centroids = proxy.codebooks[0][proxy.codes]  # (N, d, 2)
    decoded = np.concatenate([centroids[..., 0], centroids[..., 1]], 1)  # (N, 2d) [re | im]
    rows = table.dense()
    want = [rotate.distances(rows[i], decoded[i : i + 1])[0] for i in range(0, len(table), 97)]
    np.testing.assert_allclose(proxy.slack[:: 97], want, rtol=1e-5, atol=1e-6)


def test_the_modulus_table_is_the_distance_to_each_complex_centroid():
    rng = np.random.default_rng(4)
    centroids = rng.standard_normal((256, 2)).astype(np.float32)
    query = rng.standard_normal(12).astype(np.float32)
    expected = np.abs((query[:6] + 1j * query[6:])[:, None] - (centroids[:, 0] + 1j * centroids[:, 1])[None])
    np.testing.assert_allclose(modulus_table(query, centroids), expected, rtol=1e-5, atol=1e-6)


def test_the_lookup_table_is_the_l1_to_each_centroid():
    rng = np.random.default_rng(1)
    books = rng.standard_normal((6, 256, 3)).astype(np.float32)
    query = rng.standard_normal(18).astype(np.float32)
    expected = np.abs(query.reshape(6, 1, 3) - books).sum(-1)
    np.testing.assert_allclose(lookup_table(query, books), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["pq", "int8", "fp32"])
def test_random_tables_answer_as_brute_force_on_the_decoded_rows(kind, monkeypatch):
    """Random rows crowd their distances together, so the scan widens often (a shortlist of k + excluded
    here): the answer still equals the exhaustive scan of the decoded table."""
    monkeypatch.setattr(codes_module, "shortlist_size", lambda k, excluded=0: k + excluded)
    table = _random_tables()[kind]
    index = CodesIndex.build(table)
    decoded = table.dense()
    rng = np.random.default_rng(2)
    for i in range(60):
        query = rng.standard_normal(table.shape[1]).astype(np.float32)
        excluded = np.sort(rng.choice(len(table), 20, replace=False)) if i % 2 else np.zeros(0, dtype=np.int64)
        for k in (1, 10):
            ids, dist = index.certified_shortlist(query, k, excluded)
            got = rotate.top_k(ids, dist, k, excluded=excluded)[0]
            want = rotate.top_k(np.arange(len(table)), rotate.distances(query, decoded), k, excluded=excluded)[0]
            np.testing.assert_array_equal(got, want)


def test_tables_decode_as_the_bundle_reader_does(rotate_bundles):
    """A row of the int8 or pq table is bit for bit what load_bundle decodes; fp32 stays a dense table."""
    for precision, kind in (("int8", Int8Table), ("pq:8", PQTable)):
        bundle = rotate_bundles[precision]
        predictor = LinkPredictor.from_bundle(bundle)
        assert isinstance(predictor.table, kind) and predictor.index_kind == "codes-flat"
        np.testing.assert_array_equal(predictor.table.dense(), bundle.params["entities"])
        np.testing.assert_array_equal(predictor.table[np.array([5, 0, 5])], bundle.params["entities"][[5, 0, 5]])
        np.testing.assert_array_equal(predictor.table[7], bundle.params["entities"][7])
    assert isinstance(LinkPredictor.from_bundle(rotate_bundles["fp32"]).table, DenseTable)
    assert LinkPredictor.from_bundle(rotate_bundles["fp32"], index="flat").index_kind == "flat"
    assert isinstance(LinkPredictor.from_bundle(rotate_bundles["pq:8"], from_codes=False).table, DenseTable)


def _keeping(choice):
    """serve/index.py's calibrate made to keep `choice` ("codes" or "flat") whatever the timings."""
    from earl_service.serve import index

    def calibrate(candidates, sample):
        index.calibrate(candidates, sample)  # times them as it would
        return choice, {}
    return calibrate


@pytest.mark.parametrize("precision,keep", [("fp32", "codes"), ("fp32", "flat"), ("int8", None), ("pq:8", None)])
def test_trained_bundles_served_from_codes_answer_as_brute_force(rotate_bundles, precision, keep, monkeypatch):
    """A float table (fp32 here) is served by its pair codes or by the flat index, whichever answered the graph's
    own queries faster when it was built; the other one is not kept. Both answer as brute force."""
    from earl_service.serve import predictor as predictor_module

    if keep:
        monkeypatch.setattr(predictor_module, "calibrate", _keeping(keep))
    bundle = rotate_bundles[precision]
    predictor = LinkPredictor.from_bundle(bundle)
    if keep:
        assert predictor.index_kind == {"codes": "codes-flat", "flat": "flat"}[keep]
        assert (predictor.table._proxy is None) == (keep == "flat")
    rng = np.random.default_rng(0)
    names, rels = bundle.entities.names, bundle.relations.names
    for h, r, t in bundle.triples[rng.choice(len(bundle.triples), 100, replace=False)]:
        for k in (1, 10):
            assert predictor.predict_tails(names[h], rels[r], k) == predictor.brute_force_tails(names[h], rels[r], k)
            assert predictor.predict_heads(names[t], rels[r], k) == predictor.brute_force_heads(names[t], rels[r], k)


def test_a_coded_predictor_holds_about_its_bundles_bytes(rotate_bundles, monkeypatch):
    """Resident table bytes: pq's codes and codebooks, int8's bytes and scales, fp32's floats; an int8 or fp32 table's
    index adds its pair codes (a byte per complex coordinate), their centroids and a float of slack per row (an fp32
    table's when its pair codes are kept)."""
    from earl_service.serve import predictor as predictor_module

    monkeypatch.setattr(predictor_module, "calibrate", _keeping("codes"))
    predictors = {p: LinkPredictor.from_bundle(b) for p, b in rotate_bundles.items()}
    n, width = rotate_bundles["fp32"].params["entities"].shape
    sizes = {p: predictor.table.nbytes for p, predictor in predictors.items()}
    assert sizes == {"fp32": n * width * 4, "int8": n * width + n * 4, "pq:8": n * 8 + 8 * 256 * 4 * 4}
    pairs = n * width // 2 + 256 * 2 * 4 + n * 4
    indexes = {p: predictor.index.index_bytes for p, predictor in predictors.items()}
    assert indexes == {"fp32": pairs, "int8": pairs, "pq:8": 8 * 256 * 4 * 4}  # pq: its codebooks as float32


@pytest.mark.parametrize("precision", ["int8", "pq:8"])
def test_a_bundle_loaded_keeping_its_codes_serves_the_same(rotate_bundles, precision):
    """load_bundle(keep_codes=True) decodes no entity floats; the predictor, its answers and (on demand) the floats
    are those of the full load."""
    full = rotate_bundles[precision]
    kept = load_bundle(full.path, keep_codes=True)
    assert "entities" not in kept.params and kept.stored.keys() == full.stored.keys()
    a, b = LinkPredictor.from_bundle(full), LinkPredictor.from_bundle(kept)
    np.testing.assert_array_equal(a.table.dense(), b.table.dense())
    names, rels = full.entities.names, full.relations.names
    for h, r, t in full.triples[:20]:
        assert a.answer(rels[r], head=names[h]) == b.answer(rels[r], head=names[h])
        assert a.answer(rels[r], tail=names[t]) == b.answer(rels[r], tail=names[t])
    np.testing.assert_array_equal(kept.entity_embeddings().numpy(), full.params["entities"])


def test_an_int8_table_past_float32_is_refused_keeping_its_codes(rotate_bundles, tmp_path):
    """The range check runs on the codes: a scale that makes scores overflow, or an infinite one, is refused."""
    from earl_service.bundle.format import write_safetensors
    from earl_service.errors import BundleError

    tensors, meta = rotate_bundles["int8"].to_tensors("int8", "plain")
    for scale, message in ((1e30, "scores stay finite"), (np.inf, "not finite")):
        edited = dict(tensors)
        edited["param.entities.scale"] = np.where(np.arange(len(tensors["param.entities.scale"])) == 3, scale,
                                                  tensors["param.entities.scale"]).astype(np.float32)
        path = tmp_path / f"{scale}.safetensors"
        write_safetensors(path, edited, meta)
        for keep in (False, True):
            with pytest.raises(BundleError, match=message):
                load_bundle(path, keep_codes=keep)
