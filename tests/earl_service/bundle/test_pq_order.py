"""pq tables coded in pairs order (whole complex numbers a code): the decoders, the server, fine-tuning and the exact
bytes agree with the contiguous coding's, and a manifest naming an order it cannot have is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import codex_s_path
from test_pq import TRAIN

from earl_service.bundle.codebooks import decode_table, encode_table, order_columns, pairable
from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.precision import ProductQuantized
from earl_service.bundle.sizes import BundleSizes, save_exact
from earl_service.config import ModelConfig
from earl_service.data.dataset import load_dataset
from earl_service.device import reader as edge
from earl_service.errors import BundleError
from earl_service.train.finetune import FineTune, fine_tune
from earl_service.train.loop import BUNDLE, train
from earl_service.train.run import load_run

PAIRS = {"entities": "pairs"}


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    """RotatE d16 on CoDEx-S briefly trained, its entity table coded at pq:8 in pairs order (4 numbers, 2 complex
    coordinates a code), written at the bytes the size model predicts."""
    out = tmp_path_factory.mktemp("pairs_run")
    ds = load_dataset(codex_s_path())
    train(ds, ModelConfig(model="rotate", dim=16), TRAIN, out, final_eval=False)
    bundle = load_bundle(out / BUNDLE)
    tables = ProductQuantized(8).encode_tables(bundle.config, bundle.params, orders=PAIRS)
    expected = BundleSizes(ds).bytes("rotate", 16, "pq:8")
    path = save_exact(bundle, out / "pairs.safetensors", precision="pq:8", metrics={"note": "pairs"},
                      expected=expected, pq_tables=tables, pq_orders=PAIRS)
    return out, ds, bundle, tables, path


def test_pairs_order_codes_whole_complex_numbers():
    columns = order_columns(8, "pairs")
    np.testing.assert_array_equal(columns, [0, 4, 1, 5, 2, 6, 3, 7])  # [re_0, im_0, re_1, im_1, ...] of [re | im]
    assert order_columns(8, "contiguous") is None
    assert pairable(32, 8) and pairable(32, 16) and not pairable(32, 32) and not pairable(30, 10)
    with pytest.raises(ValueError, match="not one of"):
        order_columns(8, "diagonal")


def test_a_paired_table_decodes_to_its_rows_in_their_own_order():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(600, 8)).astype(np.float32)
    table[:, 4:] = table[:, :4] * 0.5  # im tied to re: pairs see it within a code, contiguous codes never
    codes, books = encode_table(table, 2, order="pairs", iterations=5)
    decoded = decode_table(codes, books, order_columns(8, "pairs"))
    plain = decode_table(*encode_table(table, 2, iterations=5))
    paired_error, plain_error = (float(((d - table) ** 2).sum() / (table ** 2).sum()) for d in (decoded, plain))
    assert paired_error < plain_error  # the same bytes, decoded back in [re | im] order, closer to the rows


def test_a_paired_file_has_the_predicted_bytes_and_reads_back_alike_everywhere(paired):
    _, ds, bundle, tables, path = paired
    back = load_bundle(path)
    expected = ProductQuantized.stored_values(bundle.params, tables, PAIRS)
    np.testing.assert_array_equal(back.params["entities"], expected["entities"])
    assert not np.array_equal(expected["entities"], ProductQuantized.stored_values(bundle.params, tables)["entities"])
    assert back.metrics["note"] == "pairs" and path.stat().st_size == BundleSizes(ds).bytes("rotate", 16, "pq:8")
    np.testing.assert_array_equal(edge.load(path).entity_embeddings, back.entity_embeddings().numpy())
    lazy = load_bundle(path, keep_codes=True)
    np.testing.assert_array_equal(lazy.entity_embeddings().numpy(), back.entity_embeddings().numpy())


def test_the_server_ranks_a_paired_file_from_its_codes_as_from_its_floats(paired):
    from earl_service.serve.predictor import LinkPredictor

    _, _, bundle, _, path = paired
    floats = LinkPredictor.from_bundle(load_bundle(path), index="exact")
    codes = LinkPredictor.from_bundle(load_bundle(path, keep_codes=True))
    assert codes.table.kind == "pq" and codes.table.columns is not None  # scanned and re-ranked from its codes
    for h, r, _ in bundle.triples[:20]:
        head, rel = bundle.entities.name(int(h)), bundle.relations.name(int(r))
        assert codes.predict_tails(head, rel, 10) == floats.predict_tails(head, rel, 10)


def test_the_edge_reader_answers_from_a_paired_file(paired, tmp_path):
    from test_bundle import EDGE_SCRIPT

    _, _, bundle, _, path = paired
    queries = [(bundle.entities.name(int(h)), bundle.relations.name(int(r))) for h, r, _ in bundle.triples[:5]]
    result = subprocess.run([sys.executable, "-c", EDGE_SCRIPT, str(path), json.dumps(queries),
                             str(tmp_path / "emb.npy"), "false"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "emb.npy"), load_bundle(path).entity_embeddings().numpy())


def test_fine_tuning_a_paired_table_keeps_its_order(paired):
    out, ds, bundle, tables, _ = paired
    run = load_run(out, ds)
    tuned, budget = fine_tune(run, bundle.params, tables, replace(TRAIN, lr=1e-2), FineTune(steps=5), PAIRS)
    assert len(budget.losses) == 5
    np.testing.assert_array_equal(tuned["entities"][0], tables["entities"][0])  # the codes stay
    # the model holds what the tuned tables decode to in pairs order
    decoded = ProductQuantized.stored_values(bundle.params, tuned, PAIRS)["entities"]
    np.testing.assert_allclose(run.model.state_dict()["entities"].numpy(), decoded, rtol=0, atol=1e-6)


def _write_with(manifest_change, paired, tmp_path):
    _, _, bundle, tables, path = paired
    tensors, meta = load_bundle(path).to_tensors("pq:8", "plain", pq_tables=tables, pq_orders=PAIRS)
    from earl_service.bundle.format import write_safetensors

    manifest = json.loads(meta["pq_manifest"])
    manifest_change(manifest)
    dst = tmp_path / "bad.safetensors"
    write_safetensors(dst, tensors, {**meta, "pq_manifest": json.dumps(manifest)})
    return dst


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["entities"].__setitem__(3, "diagonal"), "order 'diagonal' is not one of"),
    (lambda m: m["entities"].append("pairs"), "is not \\[rows, width, codes"),
    (lambda m: m["entities"].__setitem__(3, 7), "order '7' is not one of"),
])
@pytest.mark.parametrize("reader", [load_bundle, edge.load], ids=["service", "edge"])
def test_a_manifest_naming_an_unknown_order_is_refused(paired, tmp_path, change, message, reader):
    with pytest.raises(BundleError, match=message):
        reader(_write_with(change, paired, tmp_path))


def test_contiguous_files_are_written_as_before(paired):
    _, _, bundle, tables, _ = paired
    _, meta = bundle.to_tensors("pq:8", "plain", pq_tables=tables)
    assert json.loads(meta["pq_manifest"]) == {"entities": [2034, 32, 8]}  # no order: readers before it read it
