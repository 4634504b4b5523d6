"""The bundle: exact rebuild, integrity checks, precisions, the torch-free edge reader, and extension."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import codex_s_path

from earl_service import edge
from earl_service.bundle import export_bundle, load_bundle
from earl_service.bundle_format import pack_graph, unpack_graph
from earl_service.cli import main
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data import load_dataset
from earl_service.errors import BundleError
from earl_service.train import BUNDLE, load_run, train


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    ds = load_dataset(codex_s_path())
    train(ds, ModelConfig(dim=16), TrainConfig(steps=40, batch_size=512, negatives=32, lr=3e-3, eval_every=20,
                                               progress=False), out)
    return out, ds


def test_graph_packing_round_trip():
    rng = np.random.default_rng(0)
    triples = np.stack([rng.integers(0, 300, 1000), rng.integers(0, 7, 1000), rng.integers(0, 300, 1000)], 1)
    back = unpack_graph(pack_graph(triples, 300, 7))
    assert sorted(map(tuple, back.tolist())) == sorted(map(tuple, triples.tolist()))


def test_rebuild_equals_trained_model(trained_run):
    out, ds = trained_run
    run = load_run(out, ds, device="cpu")
    with torch.no_grad():
        ent, rel = run.model(run.graph)
    bundle = load_bundle(out / BUNDLE)
    assert bundle.entity_embeddings().shape == (2034, 32) and bundle.entity_embeddings().dtype == torch.float32
    torch.testing.assert_close(bundle.entity_embeddings(), ent, rtol=0, atol=1e-5)
    torch.testing.assert_close(bundle.relation_embeddings(), rel, rtol=0, atol=1e-5)
    assert bundle.trainable_parameters == json.loads((out / "metrics.json").read_text())["trainable_parameters"]
    assert bundle.metrics["test"]["mrr"] > 0


def _corrupt(src: Path, dst: Path, how: str) -> Path:
    data = bytearray(src.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "flipped":
        data[-100] ^= 0xFF
    elif how == "empty":
        data = bytearray()
    elif how == "garbage":
        data = bytearray(b"\x89PNG not a bundle at all" * 10)
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("how", ["truncated", "flipped", "empty", "garbage"])
def test_damaged_bundles_are_refused(trained_run, tmp_path, how):
    out, _ = trained_run
    with pytest.raises(BundleError):
        load_bundle(_corrupt(out / BUNDLE, tmp_path / "bad.safetensors", how))


def test_foreign_and_newer_files_are_refused(trained_run, tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(BundleError, match="not an EARL bundle"):
        load_bundle(tmp_path / "foreign.safetensors")
    out, _ = trained_run
    b = load_bundle(out / BUNDLE)
    tensors, meta = b.to_tensors()
    meta["format_version"] = "99"
    from earl_service.bundle_format import write_safetensors

    write_safetensors(tmp_path / "newer.safetensors", tensors, meta)
    with pytest.raises(BundleError, match="newer"):
        load_bundle(tmp_path / "newer.safetensors")
    # Consistent checksum but a tensor whose shape the config does not imply.
    tensors["param.relations"] = tensors["param.relations"][:-1]
    write_safetensors(tmp_path / "shape.safetensors", tensors, {k: v for k, v in meta.items() if k != "format_version"}
                      | {"format_version": "1"})
    with pytest.raises(BundleError, match="shape"):
        load_bundle(tmp_path / "shape.safetensors")


@pytest.mark.parametrize("precision,atol,saved", [("fp16", 5e-3, 0.45), ("int8", 5e-2, 0.6)])
def test_lower_precisions(trained_run, tmp_path, precision, atol, saved):
    out, _ = trained_run
    path = export_bundle(out, tmp_path / f"{precision}.safetensors", precision=precision)
    full, small = load_bundle(out / BUNDLE), load_bundle(path)
    assert small.precision == precision
    # fp16 saves 2 of every 4 parameter bytes, int8 about 3 (less the per-row scales).
    assert full.num_bytes - small.num_bytes > saved * 4 * full.trainable_parameters
    err = (small.entity_embeddings() - full.entity_embeddings()).abs().max().item()
    assert err < atol


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_weight_coding_is_lossless_and_smaller(trained_run, tmp_path, precision):
    out, _ = trained_run
    plain = export_bundle(out, tmp_path / "plain.safetensors", precision=precision, coding="plain")
    coded = export_bundle(out, tmp_path / "coded.safetensors", precision=precision, coding="planes-xz")
    a, b = load_bundle(plain), load_bundle(coded)
    assert set(a.params) == set(b.params)
    for name, value in a.params.items():
        np.testing.assert_array_equal(b.params[name], value)  # bit for bit after decoding
    assert b.num_bytes < a.num_bytes
    from safetensors import safe_open

    with safe_open(str(coded), "np") as f:
        assert not any(k.startswith("param.") for k in f.keys()) and f.metadata()["format_version"] == "2"
    with safe_open(str(plain), "np") as f:
        assert f.metadata()["format_version"] == "1"  # readable by version-1 readers
    default = export_bundle(out, tmp_path / "default.safetensors", precision=precision)
    assert load_bundle(default).num_bytes == (a.num_bytes if precision == "fp32" else b.num_bytes)


def test_damaged_coded_weights_are_refused(trained_run, tmp_path):
    """Checksums consistent, content wrong: a flipped byte in the xz stream, a manifest that lies about sizes,
    an unknown coding. Each is a BundleError, never a crash or a silently wrong model."""
    from earl_service.bundle_format import write_safetensors

    out, _ = trained_run
    tensors, meta = load_bundle(out / BUNDLE).to_tensors("fp16")
    blob = tensors["weights.packed"].copy()
    blob[len(blob) // 2] ^= 0xFF
    manifest = json.loads(meta["weights_manifest"])
    manifest[0][2] = [x * 2 for x in manifest[0][2]]
    cases = {"flipped": ({**tensors, "weights.packed": blob}, meta),
             "lying manifest": (tensors, {**meta, "weights_manifest": json.dumps(manifest)}),
             "bad dtype": (tensors, {**meta, "weights_manifest": meta["weights_manifest"].replace("float16", "object")}),
             "unknown coding": (tensors, {**meta, "weights_coding": "zstd"})}
    for name, (t, m) in cases.items():
        write_safetensors(tmp_path / "x.safetensors", t, m)
        with pytest.raises(BundleError):
            load_bundle(tmp_path / "x.safetensors")
            pytest.fail(name)


def test_info_cli(trained_run, capsys):
    out, _ = trained_run
    assert main(["info", str(out / BUNDLE)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["precision"] == "fp32" and info["entities"] == 2034 and info["relations"] == 42
    assert info["triples"] == 32888 and info["bytes"] == (out / BUNDLE).stat().st_size
    assert "test" in info["metrics"] and info["weights_coding"] == "plain"


EDGE_SCRIPT = """
import builtins, json, sys
real_import = builtins.__import__
def guarded(name, *args, **kwargs):
    if name.split(".")[0] in ("torch", "faiss"):
        raise ImportError("blocked: " + name)
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
from earl_service import edge
m = edge.load(sys.argv[1])
queries = json.loads(sys.argv[2])
out = {"tails": [m.predict_tails(h, r, 10) for h, r in queries], "heads": [m.predict_heads(t, r, 10) for t, r in queries],
       "scipy": edge._sparse is not None}
import numpy as np
np.save(sys.argv[3], m.entity_embeddings)
print(json.dumps(out))
"""


@pytest.mark.parametrize("precision,scipy", [("fp32", True), ("fp32", False), ("fp16", True)])
def test_edge_reader_without_torch(trained_run, tmp_path, precision, scipy, monkeypatch):
    """fp32: plain tensors; fp16: weights byte-plane + xz coded (the default for the small bundles); with and
    without the optional scipy sparse products."""
    if not scipy:
        monkeypatch.setenv("EARL_EDGE_NO_SCIPY", "1")
    out, ds = trained_run
    path = out / BUNDLE if precision == "fp32" else export_bundle(out, tmp_path / "b.safetensors", precision=precision)
    bundle = load_bundle(path)
    queries = [(ds.entities.name(int(h)), ds.relations.name(int(r))) for h, r, _ in ds.test[:15]]
    result = subprocess.run([sys.executable, "-c", EDGE_SCRIPT, str(path), json.dumps(queries),
                             str(tmp_path / "emb.npy")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["scipy"] == scipy  # the path under test really ran (scipy is a dev dependency)
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), bundle.entity_embeddings().numpy(), atol=1e-4)
    # The same top-10 as the torch path (in-process edge model fed torch's embeddings ranks identically).
    ent, rel = bundle.entity_embeddings(), bundle.relation_embeddings()
    scorer = bundle.scorer
    for (h, r), tails in zip(queries, got["tails"]):
        q = scorer.rotate(ent[bundle.entities.id(h)][None], rel[bundle.relations.id(r)][None])
        score = scorer.gamma - scorer.distance(q, ent)
        known = bundle.triples[(bundle.triples[:, 0] == bundle.entities.id(h)) & (bundle.triples[:, 1] ==
                                                                                    bundle.relations.id(r)), 2]
        score[torch.as_tensor(known, dtype=torch.long)] = -float("inf")
        expected = [bundle.entities.name(int(i)) for i in torch.topk(score, 10).indices]
        assert [name for name, _ in tails] == expected
    assert all(len(x) == 10 for x in got["heads"])


def test_extend_embeds_new_entities_without_parameter_changes(trained_run, tmp_path):
    out, ds = trained_run
    bundle = load_bundle(out / BUNDLE)
    names = ds.entities.names
    new_file = tmp_path / "new.tsv"
    new_file.write_text(
        f"NEW_1\t{ds.relations.name(0)}\t{names[0]}\n{names[1]}\t{ds.relations.name(1)}\tNEW_1\n"
        f"NEW_2\t{ds.relations.name(2)}\tNEW_1\n"
    )
    assert main(["extend", str(out / BUNDLE), "--triples", str(new_file), "--out", str(tmp_path / "x.safetensors")]) == 0
    bigger = load_bundle(tmp_path / "x.safetensors")
    assert len(bigger.entities) == len(bundle.entities) + 2
    assert len(bigger.triples) == len(bundle.triples) + 3
    assert bigger.trainable_parameters == bundle.trainable_parameters
    for name, value in bundle.params.items():
        np.testing.assert_array_equal(bigger.params[name], value)
    ent = bigger.entity_embeddings()
    new_id = bigger.entities.id("NEW_1")
    assert torch.isfinite(ent[new_id]).all() and ent[new_id].abs().sum() > 0
    # The edge reader embeds the extended graph identically.
    np.testing.assert_allclose(edge.load(tmp_path / "x.safetensors").entity_embeddings, ent.numpy(), atol=1e-4)
    # A relation the model never saw is refused with the file and line.
    bad = tmp_path / "bad.tsv"
    bad.write_text(f"NEW_3\tno_such_relation\t{names[0]}\n")
    assert main(["extend", str(out / BUNDLE), "--triples", str(bad), "--out", str(tmp_path / "y.safetensors")]) == 2


def test_decompression_bomb_inside_a_bundle_is_refused(trained_run, tmp_path):
    import lzma

    from earl_service.bundle_format import write_safetensors

    out, _ = trained_run
    tensors, meta = load_bundle(out / BUNDLE).to_tensors()
    tensors["vocab.entities"] = np.frombuffer(lzma.compress(b"\0" * (200 << 20), preset=9), dtype=np.uint8)
    write_safetensors(tmp_path / "bomb.safetensors", tensors, meta)
    with pytest.raises(BundleError, match="bomb"):
        load_bundle(tmp_path / "bomb.safetensors")
