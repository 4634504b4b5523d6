"""Bundle decoding without torch: the shapes a config implies, the decoded parts, and no torch import."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import tiny_dataset

from earl_service.bundle.decode import decode, expected_shapes
from earl_service.bundle.format import read_safetensors
from earl_service.bundle.model_io import bundle_from_model
from earl_service.config import ABLATIONS, ModelConfig
from earl_service.data.labels import Labels
from earl_service.errors import BundleError
from earl_service.model.graph import choose_reserved
from earl_service.model.modules import build_model

CONFIGS = [ModelConfig(model="rotate", dim=3), ModelConfig(dim=3), ModelConfig(dim=3, layers=0),
           ModelConfig(dim=3, layers=3), ModelConfig(dim=3, reserved_ratio=0.0),
           *(ModelConfig(dim=3, **{name: True}) for name in ABLATIONS)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.model}-{c.layers}-{c.reserved_ratio}-" + "-".join(
    name for name in ABLATIONS if getattr(c, name)))
def test_expected_shapes_are_the_modules_state_dict(config):
    n, num_rel = 40, 5
    reserved = choose_reserved(n, config.reserved_ratio, 0) if config.uses_reserved else torch.zeros(0, dtype=torch.long)
    state = build_model(config, n, num_rel, reserved).state_dict()
    state.pop("reserved", None)
    expected = [(name, tuple(tensor.shape)) for name, tensor in state.items()]
    assert list(expected_shapes(config, n, num_rel, reserved.numel()).items()) == expected


def test_decode_returns_the_saved_parts(tmp_path):
    ds = tiny_dataset()
    config = ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    reserved = choose_reserved(ds.num_entities, 0.2, 0)
    model = build_model(config, ds.num_entities, ds.num_relations, reserved)
    saved = bundle_from_model(model, config, ds.entities, ds.relations, ds.train, metrics={"mrr": 0.5},
                              labels=Labels(relations={ds.relations.name(0): "zero"},
                                            entities={ds.entities.name(1): "one"}))
    meta, tensors, _ = read_safetensors(saved.save(tmp_path / "b.safetensors", precision="fp16"))
    got = decode(meta, tensors)
    assert got.config == config and got.entities.names == ds.entities.names
    assert got.relations.names == ds.relations.names and got.relation_labels == {ds.relations.name(0): "zero"}
    assert got.entity_labels == {ds.entities.name(1): "one"}
    assert got.metrics == {"mrr": 0.5} and got.precision == "fp16" and got.coding == "planes-xz"
    assert got.sha256 == meta["payload_sha256"]
    np.testing.assert_array_equal(got.reserved, reserved.numpy())
    assert sorted(map(tuple, got.triples.tolist())) == sorted(map(tuple, np.unique(ds.train, axis=0).tolist()))
    assert set(got.params) == set(saved.params)
    for name, value in saved.params.items():
        np.testing.assert_array_equal(got.params[name], value.astype(np.float16).astype(np.float32))


def test_messages_name_the_source(tmp_path):
    with pytest.raises(BundleError, match=r"^upload\.safetensors is an EARL bundle with missing or malformed"):
        decode({"format": "earl-bundle"}, {}, source="upload.safetensors")


def test_the_core_imports_no_torch():
    code = ("import sys; import earl_service.bundle.decode, earl_service.core.knn, earl_service.device.reader, "
            "earl_service.device.tables, earl_service.cli.answers, earl_service.cli.main; "
            "heavy = {'torch', 'faiss', 'scipy'} & set(sys.modules); assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
