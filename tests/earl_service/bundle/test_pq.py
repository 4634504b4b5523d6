"""Product-quantized bundles: the three decoders agree, exact bytes, round trips, fine-tuning, damaged files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from conftest import codex_s_path

from earl_service.bundle.codebooks import decode_table
from earl_service.bundle.format import write_safetensors
from earl_service.bundle.model_io import bundle_from_model, load_bundle
from earl_service.bundle.precision import Int8, Precision, ProductQuantized
from earl_service.bundle.sizes import BundleSizes, padded_metrics, save_exact
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.data.vocab import Vocab
from earl_service.device import reader as edge
from earl_service.errors import BundleError
from earl_service.model.graph import choose_reserved
from earl_service.model.modules import build_model
from earl_service.train.finetune import RELATIVE_LR, FineTune, Gather, fine_tune, rates
from earl_service.train.loop import BUNDLE, train
from earl_service.train.loss import loss_fn
from earl_service.train.run import load_run

TRAIN = TrainConfig(steps=60, batch_size=512, negatives=32, lr=3e-3, eval_every=0, progress=False, threads=1)


@pytest.fixture(scope="module")
def rotate_run(tmp_path_factory):
    """RotatE dim 16 on CoDEx-S, trained briefly: 2034 entity rows, enough for 256-centroid codebooks to pay."""
    out = tmp_path_factory.mktemp("pq_run")
    ds = load_dataset(codex_s_path())
    train(ds, ModelConfig(model="rotate", dim=16), TRAIN, out, final_eval=False)
    return out, ds


@pytest.fixture(scope="module")
def pq_bundle(rotate_run, tmp_path_factory):
    out, _ = rotate_run
    bundle = load_bundle(out / BUNDLE)
    tables = ProductQuantized(8).encode_tables(bundle.config, bundle.params)
    path = bundle.save(tmp_path_factory.mktemp("pq") / "pq8.safetensors", precision="pq:8", pq_tables=tables)
    return path, bundle, tables


def test_torch_numpy_and_faiss_decode_alike(pq_bundle):
    import faiss

    _, bundle, tables = pq_bundle
    codes, books = tables["entities"]
    assert codes.shape == (2034, 8) and codes.dtype == np.uint8 and books.shape == (8, 256, 4)
    numpy_rows = decode_table(codes, books)
    torch_rows = Gather(codes, books)().detach().numpy()
    pq = faiss.ProductQuantizer(32, 8, 8)
    faiss.copy_array_to_vector(books.astype(np.float32).ravel(), pq.centroids)
    faiss_rows = pq.decode(codes)
    np.testing.assert_array_equal(numpy_rows, torch_rows)
    np.testing.assert_array_equal(numpy_rows, faiss_rows)
    # and the codes are the nearest fp16 centroids: faiss encodes the decoded rows back to the same codes
    np.testing.assert_array_equal(pq.compute_codes(faiss_rows), codes)


def test_round_trip_keeps_the_decoded_tables_and_predictions(pq_bundle):
    path, bundle, tables = pq_bundle
    back = load_bundle(path)
    assert back.precision == "pq:8"
    expected = ProductQuantized.stored_values(bundle.params, tables)
    np.testing.assert_array_equal(back.params["entities"], expected["entities"])
    np.testing.assert_array_equal(back.params["relations"], expected["relations"])  # int8 as the fallback
    np.testing.assert_array_equal(edge.load(path).entity_embeddings, back.entity_embeddings().numpy())
    # what the service ranks: the same top-10 from the file as from the values it was written from
    from earl_service.serve.predictor import LinkPredictor

    before = LinkPredictor.from_bundle(replace(bundle, params=expected, _cache={}), index="exact")
    after = LinkPredictor.from_bundle(back, index="exact")
    for h, r, _ in bundle.triples[:20]:
        head, rel = bundle.entities.name(int(h)), bundle.relations.name(int(r))
        assert after.predict_tails(head, rel, 10) == before.predict_tails(head, rel, 10)


def test_the_edge_reader_decodes_pq_without_torch_or_faiss(pq_bundle, tmp_path):
    from test_bundle import EDGE_SCRIPT

    path, bundle, _ = pq_bundle
    queries = [(bundle.entities.name(int(h)), bundle.relations.name(int(r))) for h, r, _ in bundle.triples[:5]]
    result = subprocess.run([sys.executable, "-c", EDGE_SCRIPT, str(path), json.dumps(queries),
                             str(tmp_path / "emb.npy"), "false"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "emb.npy"), load_bundle(path).entity_embeddings().numpy())


def test_pq_takes_fewer_bytes_than_int8(rotate_run, tmp_path):
    out, _ = rotate_run
    bundle = load_bundle(out / BUNDLE)
    int8 = bundle.save(tmp_path / "int8.safetensors", precision="int8", coding="plain").stat().st_size
    pq = bundle.save(tmp_path / "pq.safetensors", precision="pq", coding="plain")  # M chosen: 4 floats a code
    assert load_bundle(pq).precision == "pq:8" and pq.stat().st_size < 0.75 * int8


def _random_bundle(ds, sizes: BundleSizes, model: str, dim: int):
    config = sizes.config(model, dim)
    n = ds.num_train_entities
    reserved = choose_reserved(n, config.reserved_ratio, config.seed) if model == "earl" else torch.zeros(0).long()
    net = build_model(config, n, ds.num_relations, reserved)
    return bundle_from_model(net, config, Vocab(ds.entities.names[:n]), ds.relations, ds.train, labels=ds.labels)


@pytest.mark.parametrize(("model", "dim", "precisions"), [
    ("rotate", 16, ["pq:4", "pq:8", "pq:16", "pq:32"]),  # pq:32 (one float a code) pays nowhere: int8 by name
    ("rotate", 20, ["pq:5", "pq:10", "pq:20"]),
    ("earl", 16, ["pq:4", "pq:8", "pq:16"]),  # half the entities reserved: the reserved table is coded
])
def test_predicted_bytes_equal_the_written_file(tmp_path, model, dim, precisions):
    ds = load_dataset(codex_s_path())
    sizes = BundleSizes(ds, base=ModelConfig(reserved_ratio=0.5))
    bundle = _random_bundle(ds, sizes, model, dim)
    bundle.metrics = padded_metrics({"valid": {"mrr": 0.25}})
    coded = 0
    for precision in precisions:
        path = save_exact(bundle, tmp_path / "b.safetensors", precision=precision, metrics={"valid": {"mrr": 0.25}},
                          expected=sizes.bytes(model, dim, precision))
        coded += sizes.pq_codes(model, dim, precision)
        assert path.stat().st_size == sizes.bytes(model, dim, precision)
        assert load_bundle(path).precision == precision
    assert coded >= 2  # the cases above do code tables


def test_max_pq_dim_is_the_largest_that_fits():
    ds = load_dataset(codex_s_path())
    sizes = BundleSizes(ds)
    budget = sizes.bytes("rotate", 40, "pq:20")  # 4 floats a code
    assert sizes.max_pq_dim("rotate", 4, budget) == 40
    assert sizes.bytes("rotate", 42, "pq:21") > budget
    assert sizes.max_pq_dim("rotate", 8, budget) > 40  # fewer code bytes a row: more dims for the bytes


def _sample_loss(run, ds, seed: int = 0) -> float:
    """The training loss over a fixed sample of triples and negatives (train.loss_fn, no gradient)."""
    gen = torch.Generator().manual_seed(seed)
    batch = torch.as_tensor(ds.train[torch.randperm(len(ds.train), generator=gen)[:4096].numpy()])
    heads = torch.randint(0, ds.num_train_entities, (len(batch), 64), generator=gen)
    tails = torch.randint(0, ds.num_train_entities, (len(batch), 64), generator=gen)
    with torch.no_grad():
        ent, rel = run.model(run.graph)
        return float(loss_fn(run.scorer, ent, rel, batch, heads, tails, 1.0))


def test_fine_tuning_lowers_the_loss_and_moves_only_centroids(rotate_run):
    out, ds = rotate_run
    bundle = load_bundle(out / BUNDLE)
    run = load_run(out, ds, device="cpu")
    tables = ProductQuantized(4).encode_tables(bundle.config, bundle.params)  # 8 floats a code: coarse, room to recover
    run.model.load_state_dict({k: torch.from_numpy(v) for k, v in ProductQuantized.stored_values(bundle.params, tables).items()})
    before = _sample_loss(run, ds)
    tuned, info = fine_tune(run, bundle.params, tables, TRAIN, FineTune(steps=40, seconds=600))
    after = _sample_loss(run, ds)
    assert len(info.losses) == 40 and after < before
    np.testing.assert_array_equal(tuned["entities"][0], tables["entities"][0])  # the codes stay
    assert not np.array_equal(tuned["entities"][1], tables["entities"][1])
    np.testing.assert_array_equal(run.model.entities.detach().numpy(), decode_table(*tuned["entities"]))
    assert all(p.requires_grad for p in run.model.parameters())  # the run is left trainable as it was


def test_a_tables_codebooks_fine_tune_at_a_rate_relative_to_their_size(rotate_run, monkeypatch):
    """Adam moves a value by about its rate a step: a per-entity table's codebooks train at RELATIVE_LR x their
    rms (a table 10x smaller, a rate 10x lower); EARL's tables keep the recipe's rate, and FineTune.lr sets every
    table's. The optimizer fine_tune builds gets those rates."""
    out, ds = rotate_run
    bundle = load_bundle(out / BUNDLE)
    tables = ProductQuantized(4).encode_tables(bundle.config, bundle.params)
    codes, books = tables["entities"]
    rms = float(np.sqrt(np.mean(np.square(books.astype(np.float64)))))
    assert rates(tables, TRAIN) == {"entities": pytest.approx(RELATIVE_LR * rms)}
    small = {"entities": (codes, (books.astype(np.float32) / 10).astype(np.float16))}
    assert rates(small, TRAIN)["entities"] == pytest.approx(RELATIVE_LR * rms / 10, rel=1e-3)
    assert rates({"reserved_embeddings": (codes, books)}, TRAIN) == {"reserved_embeddings": TRAIN.lr}

    built, real = [], torch.optim.Adam

    def spy(groups, **kwargs):
        optimizer = real(groups, **kwargs)
        built.append([g["lr"] for g in optimizer.param_groups])
        return optimizer

    monkeypatch.setattr(torch.optim, "Adam", spy)
    run = load_run(out, ds, device="cpu")
    fine_tune(run, bundle.params, small, TRAIN, FineTune(steps=2, seconds=600))
    fine_tune(run, bundle.params, small, TRAIN, FineTune(steps=2, seconds=600, lr=0.5))
    assert built == [[pytest.approx(RELATIVE_LR * rms / 10, rel=1e-3)], [0.5]]


def test_pq_precision_spelling():
    parse = Precision.parse
    assert parse("pq") == ProductQuantized(0) and parse("pq:12") == ProductQuantized(12) and parse("int8") == Int8()
    for bad in ("pq:0", "pq:x", "pq:-3", "pq:", "pq:1e3"):
        with pytest.raises(ValueError, match="pq:M"):
            parse(bad)
    assert ProductQuantized(8).plan("rotate", 16, {"entities": (100, 32)}) == {}  # 100 rows: codebooks outweigh int8


# ---------------------------------------------------------------- damaged pq bundles: both readers refuse them


def _edit(change):
    def make(path, dst, tables):
        tensors, meta = load_bundle(path).to_tensors("pq:8", "plain", pq_tables=tables)
        write_safetensors(dst, *change(dict(tensors), dict(meta)))
    return make


def _manifest(change):
    def edit(t, m):
        manifest = json.loads(m["pq_manifest"])
        change(manifest)
        return t, {**m, "pq_manifest": json.dumps(manifest)}
    return _edit(edit)


def _tensor(name, change):
    return _edit(lambda t, m: ({**t, name: change(t[name])}, m))


DAMAGED = {
    "codes of another dtype": (_tensor("pq.entities.codes", lambda c: c.astype(np.int16)), "codes are int16"),
    "codes missing a row": (_tensor("pq.entities.codes", lambda c: c[:-1]), "codes are uint8 (2033, 8)"),
    "codes missing": (_edit(lambda t, m: ({k: v for k, v in t.items() if k != "pq.entities.codes"}, m)),
                      "codes are missing"),
    "codebooks of 128 centroids": (_tensor("pq.entities.codebooks", lambda b: b[:, :128]),
                                   "codebooks are float16 (8, 128, 4)"),
    "codebooks in fp32": (_tensor("pq.entities.codebooks", lambda b: b.astype(np.float32)), "codebooks are float32"),
    "codebooks infinite": (_tensor("pq.entities.codebooks", lambda b: b * np.float16(np.inf)), "is not finite"),
    "manifest missing": (_edit(lambda t, m: (t, {k: v for k, v in m.items() if k != "pq_manifest"})),
                         "no pq_manifest"),
    "manifest a list": (_edit(lambda t, m: (t, {**m, "pq_manifest": "[]"})), "pq manifest must be a JSON object"),
    "manifest with a string count": (_manifest(lambda d: d.__setitem__("entities", [2034, 32, "8"])),
                                     "pq manifest is malformed"),
    "manifest with a negative count": (_manifest(lambda d: d.__setitem__("entities", [2034, -32, 8])),
                                       "pq manifest is malformed"),
    "manifest lying about rows": (_manifest(lambda d: d.__setitem__("entities", [4068, 32, 8])),
                                  "its manifest implies uint8 (4068, 8)"),
    "manifest and tensors agreeing on too many rows": (
        _edit(lambda t, m: ({**t, "pq.entities.codes": np.zeros((4068, 8), np.uint8)},
                            {**m, "pq_manifest": json.dumps({"entities": [4068, 32, 8]})})),
        "has shape (4068, 32) in its coded weights, the config implies (2034, 32)"),
    "codes that do not divide the width": (_manifest(lambda d: d.__setitem__("entities", [2034, 32, 7])),
                                           "codes must divide the width"),
    "a table the config does not use": (
        _edit(lambda t, m: ({**t, "pq.extra.codes": t["pq.entities.codes"],
                             "pq.extra.codebooks": t["pq.entities.codebooks"]},
                            {**m, "pq_manifest": json.dumps({**json.loads(m["pq_manifest"]),
                                                             "extra": [2034, 32, 8]})})),
        "does not use: ['extra']"),
    "a pq tensor outside the manifest": (_edit(lambda t, m: ({**t, "pq.x.codes": np.zeros(3, np.uint8)}, m)),
                                         "its manifest does not declare: ['pq.x.codes']"),
    "a coded table also stored plain": (_edit(lambda t, m: ({**t, "param.entities": np.zeros((2034, 32), np.float32)},
                                                            m)), "both product-quantized and not"),
    "other code counts than the precision": (_edit(lambda t, m: (t, {**m, "precision": "pq:16"})),
                                             "are not what pq:16 codes"),
    "a table pq:8 codes stored as int8": (
        _edit(lambda t, m: ({**{k: v for k, v in t.items() if not k.startswith("pq.")},
                             "param.entities": np.zeros((2034, 32), np.int8),
                             "param.entities.scale": np.ones(2034, np.float32)}, {**m, "pq_manifest": "{}"})),
        "are not what pq:8 codes"),
    "pq:M not dividing the width": (_edit(lambda t, m: (t, {**m, "precision": "pq:7"})), "needs M dividing"),
    "precision pq:x": (_edit(lambda t, m: (t, {**m, "precision": "pq:x"})), "write pq:M"),
    "pq tables in an int8 bundle": (_edit(lambda t, m: (t, {**m, "precision": "int8"})),
                                    "holds product-quantized tables but its precision is int8"),
}


@pytest.fixture(scope="module")
def damaged(pq_bundle, tmp_path_factory):
    path, _, tables = pq_bundle
    folder = tmp_path_factory.mktemp("pq_damaged")
    paths = {}
    for i, (name, (make, _)) in enumerate(DAMAGED.items()):
        paths[name] = folder / f"{i}.safetensors"
        make(path, paths[name], tables)
    return paths


@pytest.mark.parametrize("reader", [load_bundle, partial(load_bundle, keep_codes=True), edge.load],
                         ids=["load_bundle", "load_bundle-keep-codes", "edge.load"])
@pytest.mark.parametrize("case", DAMAGED)
def test_damaged_pq_bundles_are_refused_by_both_readers(damaged, case, reader):
    with pytest.raises(BundleError, match=re.escape(DAMAGED[case][1])):
        reader(damaged[case])


def test_a_damaged_pq_upload_is_422(damaged, tmp_path):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings

    with TestClient(create_app(Settings(home=tmp_path, api_token="t"))) as client:
        for case in ("codes missing a row", "manifest lying about rows", "codebooks infinite"):
            r = client.post("/models", files={"bundle": ("pq.safetensors", damaged[case].read_bytes())},
                            headers={"Authorization": "Bearer t"})
            assert r.status_code == 422, (case, r.text)
            assert DAMAGED[case][1] in r.json()["detail"]


def _relative_error(table: np.ndarray, coded: tuple[np.ndarray, np.ndarray]) -> float:
    return float(((decode_table(*coded) - table) ** 2).sum() / (table ** 2).sum())


def test_a_warm_start_begins_from_the_codebooks_given(pq_bundle):
    """k-means from codebooks already fitted to the table keeps their quality in one round, where one round from
    random rows is far worse; codebooks of another layout are ignored (a cold start), never an error."""
    _, bundle, tables = pq_bundle
    pq, table = ProductQuantized(8), bundle.params["entities"]
    cold = pq.encode_tables(bundle.config, bundle.params, iterations=1)
    warm = pq.encode_tables(bundle.config, bundle.params, iterations=1, start=tables)
    fitted = _relative_error(table, tables["entities"])
    assert _relative_error(table, warm["entities"]) <= fitted * 1.01 < _relative_error(table, cold["entities"])
    other = ProductQuantized(4).encode_tables(bundle.config, bundle.params)  # (4, 256, 8) books: no fit for pq:8
    ignored = pq.encode_tables(bundle.config, bundle.params, iterations=1, start=other)
    assert np.array_equal(ignored["entities"][1], cold["entities"][1])


def test_codebooks_fit_the_rows_queries_meet(pq_bundle):
    """Rows drawn by degree: where a few rows carry the triples and the rest barely trained (a big table), codebooks
    fit on them code the busy rows finer than codebooks fit on a uniform draw; a row of degree 0 is never drawn."""
    from earl_service.bundle.codebooks import encode_table, row_weights, training_rows

    rng = np.random.default_rng(0)
    busy = rng.normal(0.0, 1.0, (5, 16)).repeat(100, 0) + rng.normal(0.0, 0.05, (500, 16))  # 5 tight clusters
    table = np.concatenate([busy, rng.uniform(-1, 1, (20_000, 16))]).astype(np.float32)
    weights = np.r_[np.full(500, 40.0), np.ones(20_000)]  # the busy rows hold half the triples
    error = {}
    for label, w in (("uniform", None), ("degree", weights)):
        codes, books = encode_table(table, 4, weights=w)
        error[label] = float(((decode_table(codes, books)[:500] - table[:500]) ** 2).sum(1).mean())
    assert error["degree"] < 0.5 * error["uniform"]
    ids = np.arange(len(table), dtype=np.float32)[:, None]
    drawn = training_rows(ids, np.r_[np.zeros(10_000), np.ones(10_500)], seed=0)
    assert len(drawn) == len(table) and drawn.min() >= 10_000
    assert training_rows(table, None, seed=0) is table and training_rows(table, np.zeros(len(table)), 0) is table
    # RotatE's rows are entities, weighed by their degree; no graph, no weights.
    _, bundle, _ = pq_bundle
    degree = np.bincount(np.r_[bundle.triples[:, 0], bundle.triples[:, 2]], minlength=len(bundle.entities))
    assert np.array_equal(bundle.row_weights()["entities"], degree)
    assert row_weights("rotate", bundle.triples[:0], len(bundle.entities)) == {}
    assert row_weights("earl", bundle.triples, len(bundle.entities)) == {}  # reserved rows: every entity's


def test_an_export_without_its_graph_fits_codebooks_by_that_graph(rotate_run, tmp_path):
    """`earl export --no-graph` leaves the graph out of the file, not out of the codebooks' fit: the same codes
    and codebooks as the export that keeps it (which compress, shipping RotatE without a graph, also writes)."""
    from earl_service.bundle.codebooks import stored_tables
    from earl_service.bundle.format import read_safetensors
    from earl_service.bundle.model_io import export_bundle

    out, _ = rotate_run
    tables = {}
    for graph in (True, False):
        path = export_bundle(out, tmp_path / f"{graph}.safetensors", precision="pq:8", graph=graph)
        tables[graph] = stored_tables(read_safetensors(path)[1])["entities"]
        assert load_bundle(path).has_graph is graph
    assert all(np.array_equal(a, b) for a, b in zip(tables[True], tables[False], strict=True))
