"""Bundles without their graph (RotatE, `--known-answers none`): bytes as predicted, the graph's bytes spent on
weights, answers that say no known fact was left out, and EARL refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import codex_s_path

from earl_service.bundle.model_io import bundle_from_model, load_bundle
from earl_service.bundle.sizes import BundleSizes, save_exact
from earl_service.config import ModelConfig
from earl_service.data.dataset import load_dataset
from earl_service.data.vocab import Vocab
from earl_service.errors import BundleError
from earl_service.model.modules import build_model
from earl_service.serve.predictor import LinkPredictor


@pytest.fixture(scope="module")
def codex():
    return load_dataset(codex_s_path())


def _rotate(ds, dim: int):
    config = ModelConfig(model="rotate", dim=dim)
    net = build_model(config, ds.num_train_entities, ds.num_relations, torch.zeros(0, dtype=torch.long))
    return bundle_from_model(net, config, Vocab(ds.entities.names[: ds.num_train_entities]), ds.relations,
                             ds.train, labels=ds.labels)


@pytest.mark.parametrize("precision", ["fp32", "int8", "pq:8"])
def test_graphless_bytes_are_predicted_exactly_and_buy_dims(codex, tmp_path, precision):
    full, graphless = BundleSizes(codex), BundleSizes(codex, graphless=("rotate",))
    bundle = _rotate(codex, 16).without_graph()
    path = save_exact(bundle, tmp_path / "b.safetensors", precision=precision, metrics={"valid": {"mrr": 0.3}},
                      expected=graphless.bytes("rotate", 16, precision))
    assert path.stat().st_size == graphless.bytes("rotate", 16, precision)
    saved = full.bytes("rotate", 16, precision) - graphless.bytes("rotate", 16, precision)
    graph = full.fixed_bytes() - graphless.fixed_bytes("rotate")
    assert graph > 10_000 and abs(saved - graph) <= 64  # CoDEx-S's graph, ~36 kB; header lengths differ a little
    budget = full.bytes("rotate", 16, precision)
    assert graphless.max_dim("rotate", precision, budget) > full.max_dim("rotate", precision, budget)
    back = load_bundle(path)
    assert not back.has_graph and len(back.triples) == 0 and back.precision == precision
    assert graphless.bytes("earl", 16, "int8") == full.bytes("earl", 16, "int8")  # EARL keeps its graph


def test_earl_keeps_its_graph(codex):
    earl = BundleSizes(codex).untrained(ModelConfig(model="earl", dim=16))
    with pytest.raises(BundleError, match="needs its graph"):
        earl.without_graph()


def test_a_graphless_bundle_answers_and_says_it_left_nothing_out(codex, tmp_path):
    bundle = _rotate(codex, 16)
    path = bundle.without_graph().save(tmp_path / "g.safetensors")
    with_graph = LinkPredictor.from_bundle(bundle, index="exact")
    without = LinkPredictor.from_bundle(load_bundle(path), index="exact")
    h, r, t = (int(x) for x in codex.train[0])
    head, relation = codex.entities.names[h], codex.relations.names[r]
    kept = with_graph.answer(relation, head=head, k=codex.num_train_entities)
    plain = without.answer(relation, head=head, k=codex.num_train_entities)
    assert kept["exclude_known"] and not plain["exclude_known"]
    answers = [p["entity"] for p in plain["predictions"]]
    assert codex.entities.names[t] in answers  # a known fact is answered, not left out
    assert codex.entities.names[t] not in [p["entity"] for p in kept["predictions"]]
    np.testing.assert_array_equal(without.entity_embeddings, with_graph.entity_embeddings)


def test_export_no_graph_cli(codex, tmp_path, capsys):
    from earl_service.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    _rotate(codex, 16).save(run / "bundle.safetensors")
    assert main(["export", str(run), "--out", str(tmp_path / "g.safetensors"), "--no-graph"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["graph"] is False and not load_bundle(tmp_path / "g.safetensors").has_graph
    assert main(["info", str(tmp_path / "g.safetensors")]) == 0
    assert json.loads(capsys.readouterr().out)["graph"] is False


def test_a_bundle_writing_another_bundles_fixed_parts_writes_the_same_file(codex, tmp_path):
    """Compress packs the graph, vocabularies and labels once for every candidate (with_fixed_parts): the file
    is byte for byte what the bundle would write packing its own."""
    first, second = _rotate(codex, 16), _rotate(codex, 24)
    parts = first.fixed_parts()
    shared = second.with_fixed_parts(parts)
    assert shared.fixed_parts() is parts
    own = second.save(tmp_path / "own.safetensors", precision="int8")
    borrowed = shared.save(tmp_path / "borrowed.safetensors", precision="int8")
    a, b = load_bundle(own), load_bundle(borrowed)  # the files' creation times differ: compare what they hold
    assert a.num_bytes == b.num_bytes
    np.testing.assert_array_equal(a.triples, b.triples)
    assert a.entities.names == b.entities.names and a.entity_labels == b.entity_labels
