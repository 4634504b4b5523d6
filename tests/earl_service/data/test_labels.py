"""Labels: the files beside the triples, their errors by line, the bundle's label blobs, and hostile ones refused."""

import json
import lzma
import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import REPO

from earl_service.bundle.format import (
    MAX_LABEL_CHARS,
    BundleLimits,
    joined_strings,
    read_safetensors,
    write_safetensors,
)
from earl_service.bundle.model_io import bundle_from_model, load_bundle
from earl_service.bundle.sizes import BundleSizes, save_exact
from earl_service.cli.bundle import bundle_info
from earl_service.cli.main import main
from earl_service.config import ModelConfig
from earl_service.data.dataset import load_dataset
from earl_service.data.labels import Labels, check_label_file, read_label_file
from earl_service.device import reader as edge
from earl_service.errors import BundleError, LabelFileError
from earl_service.model.graph import choose_reserved
from earl_service.model.modules import build_model

SHARED = REPO.parent / "shared" / "datasets"
TRAIN = "a\tr\tb\nb\tr\tc\nc\ts\ta\nd\ts\tb\n"


def write(path, text: str | bytes):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.fixture
def kg(tmp_path):
    """A tiny dataset folder with TSV entity labels (one with a description, one for an id not in the graph) and
    CoDEx-style JSON relation labels."""
    write(tmp_path / "train.txt", TRAIN)
    write(tmp_path / "entities.tsv", "a\tAlpha\tthe first letter\nb\tBeta\n\nc\tGamma\nzzz\tNot in the graph\n")
    write(tmp_path / "relations.en.json", json.dumps({"r": {"label": "relates to", "description": "x"},
                                                      "s": "sees", "t": "unused"}))
    return tmp_path


def test_labels_beside_the_triples_are_read_for_the_graph_s_ids(kg):
    ds = load_dataset(kg)
    assert ds.labels.entities == {"a": "Alpha", "b": "Beta", "c": "Gamma"}  # descriptions are not kept
    assert ds.labels.relations == {"r": "relates to", "s": "sees"}
    assert ds.labels.ignored == 2 and ds.stats["labels"] == {"entities": 3, "relations": 2, "ignored": 2}
    assert not load_dataset(kg, labels=False).labels


@pytest.mark.skipif(not (SHARED / "wn18rr").is_dir(), reason="needs ../shared/datasets")
def test_the_benchmark_label_files_are_read_whole():
    labels, ignored = read_label_file(SHARED / "wn18rr" / "entities.tsv")
    assert len(labels) == 40_943 and ignored == 0 and labels["00001930"] == "physical entity"
    assert check_label_file(SHARED / "fb15k-237" / "entities.tsv") == 14_541


BAD = {
    "one field": ("a\tAlpha\nb Beta\n", 2, "expected 2 or 3 tab-separated fields"),
    "four fields": ("a\tA\tx\ty\n", 1, "found 4"),
    "empty id": ("a\tA\n\tB\n", 2, "empty id"),
    "bad UTF-8": (b"a\tA\nb\t\xff\n", 2, "not valid UTF-8"),
    "NUL byte": (b"a\tA\x00\n", 1, "NUL byte"),
    "label too long": (f"a\t{'x' * (MAX_LABEL_CHARS + 1)}\n", 1, "labels are limited"),
    "repeated id": ("a\tA\nb\tB\na\tC\n", 3, "'a' already has a label (line 1)"),
    "JSON syntax": ('{"a": "A",\n "b": }\n', 2, "not a JSON object of labels"),
    "JSON label a number": ('{"a": "A",\n "b": {"label": 3}}', 2, "the label of 'b' is not a string"),
    "JSON list": ('{"a": ["A"]}', 1, "not a string"),
}


@pytest.mark.parametrize("case", BAD)
def test_malformed_label_files_name_file_and_line(tmp_path, case):
    text, line, message = BAD[case]
    path = write(tmp_path / "entities.tsv", text)
    for read in (lambda: read_label_file(path), lambda: check_label_file(path, shown="mine.tsv")):
        with pytest.raises(LabelFileError, match=re.escape(message)) as error:
            read()
        assert error.value.line == line
    assert "mine.tsv, line" in str(error.value)


def test_a_malformed_label_file_stops_load_dataset(kg):
    write(kg / "entities.tsv", "a\tAlpha\nb\n")
    with pytest.raises(LabelFileError, match=r"entities.tsv, line 2: expected 2 or 3"):
        load_dataset(kg)


def _bundle(ds, labels=None):
    config = ModelConfig(dim=4, k=2, reserved_ratio=0.5)
    reserved = choose_reserved(ds.num_entities, 0.5, 0)
    model = build_model(config, ds.num_entities, ds.num_relations, reserved)
    return bundle_from_model(model, config, ds.entities, ds.relations, ds.train, labels=labels)


def test_both_readers_give_back_the_labels(kg, tmp_path):
    ds = load_dataset(kg)
    path = _bundle(ds, ds.labels).save(tmp_path / "b.safetensors", precision="fp16")
    _, tensors, _ = read_safetensors(path)
    assert {"labels.entities", "labels.relations"} <= set(tensors)
    loaded, model = load_bundle(path), edge.load(path)
    for got in (loaded, model):
        assert got.entity_labels == ds.labels.entities and got.relation_labels == ds.labels.relations
    assert model.entities.name(model.entity_id("Gamma")) == "c" and model.labelled([("b", 1.0)]) == [
        {"entity": "b", "label": "Beta", "score": 1.0}]
    assert model.predict_tails("Alpha", "relates to", 2) == model.predict_tails("a", "r", 2)


def test_no_labels_leaves_them_out_and_saves_their_bytes(kg, tmp_path):
    common = ["--steps", "2", "--dim", "4", "--batch-size", "4", "--negatives", "2", "--eval-every", "0",
              "--no-progress", "--no-final-eval", "--device", "cpu"]
    assert main(["train", str(kg), "--out", str(tmp_path / "with"), *common]) == 0
    assert main(["train", str(kg), "--out", str(tmp_path / "without"), "--no-labels", *common]) == 0
    with_labels, without = (read_safetensors(tmp_path / run / "bundle.safetensors") for run in ("with", "without"))
    assert "labels.entities" in with_labels[1] and not any(n.startswith("labels.") for n in without[1])
    blobs = with_labels[1]["labels.entities"].nbytes + with_labels[1]["labels.relations"].nbytes
    assert with_labels[2] - without[2] >= blobs  # the blobs plus their header entries
    assert load_bundle(tmp_path / "with" / "bundle.safetensors").entity_labels["a"] == "Alpha"
    assert bundle_info(str(tmp_path / "with" / "bundle.safetensors"))["labels"] == {"entities": 3, "relations": 2}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_predicted_bytes_are_exact_with_labels(kg, tmp_path, precision):
    ds = load_dataset(kg)
    sizes = BundleSizes(ds)
    assert sizes.fixed_bytes() > BundleSizes(replace(ds, labels=Labels())).fixed_bytes()
    config = sizes.config("earl", 4)
    trained = replace(sizes.untrained(config), params={k: np.random.default_rng(0).normal(size=v.shape).astype(
        np.float32) for k, v in sizes.untrained(config).params.items()})
    out = save_exact(trained, tmp_path / "b.safetensors", precision=precision, metrics={"mrr": 0.25},
                     expected=sizes.bytes("earl", 4, precision))
    assert load_bundle(out).entity_labels == {"a": "Alpha", "b": "Beta", "c": "Gamma"}


def _hostile(path, tmp_path, blob: bytes):
    """`path`'s bundle with its labels.entities blob replaced by xz-coded `blob`."""
    meta, tensors, _ = read_safetensors(path)
    tensors["labels.entities"] = np.frombuffer(lzma.compress(blob), dtype=np.uint8)
    meta = {k: v for k, v in meta.items() if k != "payload_sha256"}
    return write_safetensors(tmp_path / "hostile.safetensors", tensors, meta)


HOSTILE = {
    "more labels than names": (lambda n: joined_strings(["x"] * (n + 1)), None, "more entity labels than names"),
    "fewer labels than names": (lambda n: joined_strings(["x"] * (n - 1)), None, "labels for"),
    "one label of 64 MiB of zeros-free bytes": (lambda n: b"y" * (64 << 20), None, "take more than"),
    "past the server's label limit": (lambda n: joined_strings(["z" * 900] * n), 1000, "EARL_MAX_BUNDLE_LABEL_MB"),
    "a label past MAX_LABEL_CHARS": (lambda n: joined_strings(["w" * (MAX_LABEL_CHARS + 1)] + [""] * (n - 1)),
                                     None, "longer than"),
    "not UTF-8": (lambda n: b"\xff" + joined_strings([""] * n), None, "malformed labels"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_label_blobs_are_refused_by_both_readers(kg, tmp_path, case):
    make, most, message = HOSTILE[case]
    ds = load_dataset(kg)
    path = _hostile(_bundle(ds, ds.labels).save(tmp_path / "b.safetensors"), tmp_path, make(ds.num_entities))
    limits = BundleLimits(max_label_bytes=most, origin="EARL_MAX_BUNDLE_LABEL_MB") if most else None
    with pytest.raises(BundleError, match=message):
        load_bundle(path, limits=limits)
    if limits is None:
        with pytest.raises(BundleError, match=message):
            edge.load(path)


def test_bundles_from_before_labels_blobs_keep_their_relation_labels(kg, tmp_path):
    ds = load_dataset(kg)
    meta, tensors, _ = read_safetensors(_bundle(ds).save(tmp_path / "b.safetensors"))
    meta = {**meta, "relation_labels": json.dumps({"r": {"label": "old style"}})}
    meta.pop("payload_sha256")
    old = write_safetensors(tmp_path / "old.safetensors", tensors, meta)
    assert edge.load(old).relation_labels == {"r": "old style"}
