"""The bundle: exact rebuild, integrity checks, precisions, the torch-free edge reader, and extension."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, codex_s_path

from earl_service.bundle.decode import expected_shapes
from earl_service.bundle.format import pack_graph, pack_strings, unpack_graph, unpack_strings, write_safetensors
from earl_service.bundle.model_io import export_bundle, load_bundle
from earl_service.cli.main import main
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.device import reader as edge
from earl_service.errors import BundleError
from earl_service.train.loop import BUNDLE, train
from earl_service.train.run import load_run

sys.path.insert(0, str(REPO / "bench"))
from harness import hostile  # noqa: E402 - the hostile bundles of issue 34 (bench/harness/hostile.py)


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


# ---------------------------------------------------------------- damaged bundles: both readers refuse them


def _bytes(change):
    """Damage to the file's bytes."""
    return lambda src, dst: dst.write_bytes(change(src.read_bytes()))


def _parts(change, precision="fp32", coding=None):
    """A well-formed file (consistent checksum) whose tensors and metadata `change(tensors, meta)` edits."""
    def make(src, dst):
        tensors, meta = load_bundle(src).to_tensors(precision, coding)
        write_safetensors(dst, *change(dict(tensors), dict(meta)))
    return make


def _flip(data: bytes, at: int) -> bytes:
    data = bytearray(data)
    data[at] ^= 0xFF
    return bytes(data)


def _config(**changes):
    return lambda t, m: (t, {**m, "config": json.dumps({**json.loads(m["config"]), **changes})})


def _tensor(name, change):
    return lambda t, m: ({**t, name: change(t[name])}, m)


def _without(name):
    return lambda t, m: ({k: v for k, v in t.items() if k != name}, {k: v for k, v in m.items() if k != name})


def _manifest(change):
    def edit(t, m):
        manifest = json.loads(m["weights_manifest"])
        change(manifest)
        return t, {**m, "weights_manifest": json.dumps(manifest)}
    return edit


def _lying_manifest(manifest):
    manifest[0][2] = [x * 2 for x in manifest[0][2]]


def _foreign(src, dst):
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(3, np.float32)}, str(dst))


def _vocab_bomb(t, m):
    import lzma

    return {**t, "vocab.entities": np.frombuffer(lzma.compress(b"\0" * (200 << 20), preset=9), dtype=np.uint8)}, m


def _names(name, change):
    return _tensor(name, lambda blob: pack_strings(change(unpack_strings(blob))))


def _rotate(change):
    """Damage to a RotatE bundle's bytes (the source bundle is EARL; this one is made aside, untrained)."""
    return lambda src, dst: dst.write_bytes(change(hostile.source_bundle("rotate")))


def _honest_manifest(**config):
    """A config claiming `config`, and a weight manifest declaring exactly what that config implies."""
    def edit(t, m):
        cfg = ModelConfig.from_dict({**json.loads(m["config"]), **config})
        sizes = (len(unpack_strings(t["vocab.entities"])), len(unpack_strings(t["vocab.relations"])),
                 len(t["buffer.reserved"]))
        manifest = [[f"param.{n}", "float16", list(shape)] for n, shape in expected_shapes(cfg, *sizes).items()]
        return t, {**m, "config": json.dumps(cfg.to_dict()), "weights_manifest": json.dumps(manifest)}
    return edit


def _int8_vector(t, m):
    """A bias stored as int8 with a scale per value: dequantizing would broadcast it to a square matrix."""
    name = "param.combine.0.bias"
    return {**t, name: np.ones(len(t[name]), np.int8), name + ".scale": np.ones(len(t[name]), np.float32)}, m


DAMAGED = {  # name: (how to make it from a good bundle, a fragment of the refusal)
    "empty": (_bytes(lambda d: b""), "too short for a safetensors header"),
    "garbage": (_bytes(lambda d: b"\x89PNG not a bundle at all" * 10), "not an EARL bundle"),
    "random bytes": (_bytes(lambda d: bytes(range(256)) * 40), "is not an EARL bundle"),
    "cut inside its header": (_bytes(lambda d: d[:100]), "is not an EARL bundle (truncated"),
    "truncated": (_bytes(lambda d: d[: len(d) // 2]), "corrupted or truncated"),
    "missing its last byte": (_bytes(lambda d: d[:-1]), "corrupted or truncated"),
    "flipped payload byte": (_bytes(lambda d: _flip(d, -100)), "does not match its SHA-256"),
    "foreign safetensors": (_foreign, "not an EARL bundle"),
    "newer format": (_parts(lambda t, m: (t, {**m, "format_version": "99"})), "newer"),
    "config missing": (_parts(_without("config")), "missing or malformed content"),
    "config not JSON": (_parts(lambda t, m: (t, {**m, "config": "{nope"})), "missing or malformed content"),
    "config a JSON list": (_parts(lambda t, m: (t, {**m, "config": "[1]"})), "missing or malformed content"),
    "config with a bad model": (_parts(_config(model="x")), "malformed content"),
    "config claims dim 10**6": (_parts(_config(dim=10**6)), "the config implies"),
    "config claims 10**9 layers": (_parts(_config(layers=10**9)), "GNN layers"),
    "metrics not JSON": (_parts(lambda t, m: (t, {**m, "metrics": "{"})), "malformed content"),
    "entity vocabulary missing": (_parts(_without("vocab.entities")), "missing or malformed content"),
    "entity vocabulary not xz": (_parts(_tensor("vocab.entities", lambda b: b[::-1].copy())), "malformed content"),
    "duplicate entity names": (_parts(_names("vocab.entities", lambda n: [n[1], *n[1:]])), "vocabulary is invalid"),
    "vocabulary bomb": (_parts(_vocab_bomb), "bomb"),
    "graph past the entity vocabulary": (_parts(_names("vocab.entities", lambda n: n[:-50])),
                                         "outside the vocabulary"),
    "graph past the relation vocabulary": (_parts(_names("vocab.relations", lambda n: n[:-5])),
                                           "outside the vocabulary"),
    "graph missing": (_parts(_without("graph.packed")), "missing or malformed content"),
    "negative reserved id": (_parts(_tensor("buffer.reserved", lambda r: -r.astype(np.int64) - 1)),
                             "reserved entity ids outside the vocabulary"),
    "reserved id past the vocabulary": (_parts(_tensor("buffer.reserved", lambda r: r.astype(np.int64) + 10**6)),
                                        "reserved entity ids outside the vocabulary"),
    "tensor of the wrong shape": (_parts(_tensor("param.relations", lambda x: x[:-1])), "shape"),
    "tensor missing": (_parts(_without("param.relations")), "'relations' has shape None"),
    "tensor the config does not use": (_parts(lambda t, m: ({**t, "param.extra": np.zeros(2, np.float32)}, m)),
                                       "does not use"),
    "int8 scales missing": (_parts(_without("param.relation_ends.scale"), "int8", "plain"), "malformed content"),
    "coded weights flipped": (_parts(_tensor("weights.packed", lambda b: np.frombuffer(_flip(b.tobytes(), len(b) // 2), np.uint8)), "fp16"),
                              "coded weights"),
    "coded weights with a lying manifest": (_parts(_manifest(_lying_manifest), "fp16"), "coded weights"),
    "coded weights of a bad dtype": (_parts(_manifest(lambda m: m[0].__setitem__(1, "object")), "fp16"),
                                     "manifest is malformed"),
    "coded weights missing": (_parts(_without("weights.packed"), "fp16"), "holds no coded weights"),
    "unknown weight coding": (_parts(lambda t, m: (t, {**m, "weights_coding": "zstd"}), "fp16"), "'zstd'"),
    # issue 34, item 1: declared sizes are checked against the config before anything is decoded
    "coded weights declaring a huge tensor": (_bytes(lambda d: hostile.weights_bomb(d, decoded_mib=32)),
                                              "in its coded weights, the config implies"),
    "coded weights past the xz ratio cap": (_parts(_honest_manifest(dim=4096), "fp16"), "refusing a possible bomb"),
    "int8 vector with a scale per value": (_parts(_int8_vector, "int8", "plain"), "malformed content"),
    # item 3: the graph's counts are checked before its edges are built
    "graph header: 2**27 edges for one entity": (_bytes(hostile.graph_bomb), "graph counts 134217728 edges"),
    "graph shorter than its header says": (_bytes(lambda d: hostile._graph(
        d, lambda n, r, e: np.array([n, r, e, 4], np.uint64).tobytes())), "the graph holds 32"),
    "graph with 3-byte counts": (_bytes(lambda d: hostile._graph(
        d, lambda n, r, e: np.array([n, r, 0, 3], np.uint64).tobytes())), "3-byte counts"),
    # item 4: a graph is a set
    "graph with repeated edges": (_bytes(lambda d: hostile.duplicate_edges(d, 1000)), "repeated edge"),
    # item 5: weights and config numbers whose scores would not be finite
    "EARL weight infinite": (_parts(_tensor("param.relations", lambda x: x + np.inf)), "is not finite"),
    "RotatE with a NaN relation row": (_rotate(hostile.with_tensor("param.relations", hostile._nan_row)),
                                       "'relations' is not finite"),
    "RotatE entity values of 1e30": (_rotate(hostile.with_tensor("param.entities", lambda x: x * 0 + 1e30)),
                                     "scores stay finite in float32 only up to"),
    "RotatE relation phases past float32": (_rotate(hostile.with_tensor("param.relations", lambda x: x * 0 + 1e38)),
                                            "past float32's range"),
    "EARL with gamma = -epsilon": (_parts(_config(gamma=-2.0, epsilon=2.0)), "gamma must be > 0"),
    "config gamma Infinity": (_parts(_config(gamma=float("inf"))), "config holds Infinity"),
    "config gamma 1e-300": (_parts(_config(gamma=1e-300, epsilon=0.0)), "phase scale that float32 cannot hold"),
    "config dim a string": (_parts(_config(dim="16")), "config dim must be a finite int"),
    "config ablation a number": (_parts(_config(no_knn=1)), "config no_knn must be a finite bool"),
    "precision unknown": (_parts(lambda t, m: (t, {**m, "precision": "fp8"})), "precision must be one of"),
    # item 6: malformed metadata is a BundleError, never a crash
    "__metadata__ a JSON list": (_bytes(hostile.with_header(lambda h: {**h, "__metadata__": [1, 2]})),
                                 "__metadata__ must be a JSON object of strings"),
    "metadata value an object": (_bytes(hostile.with_header(lambda h: {**h, "__metadata__": {
        **h["__metadata__"], "config": {"dim": 16}}})), "__metadata__ must be a JSON object of strings"),
    "header nested 100k deep": (_bytes(hostile.with_header(lambda h: hostile.NESTED.encode())), "nested more than 32"),
    "config a JSON string": (_bytes(hostile.with_metadata(config='"earl"')), "config must be a JSON object"),
    "config nested 5000 deep": (_bytes(hostile.with_metadata(config="[" * 5000 + "]" * 5000)), "nested more than 32"),
    "relation labels nested 100k deep": (_bytes(hostile.with_metadata(relation_labels=hostile.NESTED)),
                                         "relation_labels is nested more than 32"),
    "relation labels a JSON list": (_bytes(hostile.with_metadata(relation_labels="[]")),
                                    "relation_labels must be a JSON object"),
    "metrics a JSON string": (_bytes(hostile.with_metadata(metrics='"good"')), "metrics must be a JSON object"),
    "metrics nested 100 deep": (_bytes(hostile.with_metadata(metrics='{"a":' * 100 + "1" + "}" * 100)),
                                "metrics is nested more than 32"),
    # item 7: declared bounds on metadata
    "metrics of 100 KB": (_bytes(hostile.with_metadata(metrics=json.dumps({"pad": "x" * 100_000}))),
                          "'metrics' may (65,536, bundle_format.METADATA_LIMITS)"),
    "relation labels of 3 MiB": (_bytes(hostile.with_metadata(relation_labels=json.dumps({"r": "x" * 3 * 2**20}))),
                                 "METADATA_LIMITS"),
    "header of 5 MiB": (_bytes(hostile.with_metadata(notes="x" * 5 * 2**20)), "bundle_format.HEADER_LIMIT"),
}


@pytest.fixture(scope="module")
def damaged(trained_run, tmp_path_factory):
    """Every case of DAMAGED as a file, made once for both readers."""
    out, _ = trained_run
    folder = tmp_path_factory.mktemp("damaged")
    paths = {}
    for i, (name, (make, _)) in enumerate(DAMAGED.items()):
        paths[name] = folder / f"{i}.safetensors"
        make(out / BUNDLE, paths[name])
    return paths


@pytest.mark.parametrize("reader", [load_bundle, edge.load], ids=["load_bundle", "edge.load"])
@pytest.mark.parametrize("case", DAMAGED)
def test_damaged_bundles_are_refused_by_both_readers(damaged, case, reader):
    with pytest.raises(BundleError, match=re.escape(DAMAGED[case][1])):
        reader(damaged[case])


def test_metrics_nan_reads_as_null(trained_run, tmp_path):
    """Metrics are informational: a NaN a run wrote (JSON cannot carry it) reads as null, the bundle stays usable."""
    out, _ = trained_run
    bundle = load_bundle(out / BUNDLE)
    bundle.metrics = {"valid": {"mrr": float("nan")}, "steps": 3}
    assert load_bundle(bundle.save(tmp_path / "nan.safetensors")).metrics == {"valid": {"mrr": None}, "steps": 3}


def test_bundles_written_here_hold_no_repeated_edge(trained_run, tmp_path):
    """The reader refuses repeated edges, so the writer drops them; extend_with adds only new triples."""
    out, _ = trained_run
    bundle = load_bundle(out / BUNDLE)
    graph = bundle.triples
    bundle.triples = np.concatenate([graph, graph[:100]])
    assert np.array_equal(load_bundle(bundle.save(tmp_path / "twice.safetensors")).triples, graph)
    extended = load_bundle(out / BUNDLE).extend_with(graph[:100], [])
    assert np.array_equal(load_bundle(extended.save(tmp_path / "extended.safetensors")).triples, graph)


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
        assert not any(k.startswith("param.") for k in f.keys())  # noqa: SIM118 (safe_open has no __iter__) and f.metadata()["format_version"] == "2"
    with safe_open(str(plain), "np") as f:
        assert f.metadata()["format_version"] == "1"  # readable by version-1 readers
    default = export_bundle(out, tmp_path / "default.safetensors", precision=precision)
    assert load_bundle(default).num_bytes == (a.num_bytes if precision == "fp32" else b.num_bytes)


def test_damaged_coded_weights_are_refused(trained_run, tmp_path):
    """Checksums consistent, content wrong: a flipped byte in the xz stream, a manifest that lies about sizes,
    an unknown coding. Each is a BundleError, never a crash or a silently wrong model."""
    from earl_service.bundle.format import write_safetensors

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
from earl_service.device import reader as edge
m = edge.load(sys.argv[1], use_scipy=json.loads(sys.argv[4]))
queries = json.loads(sys.argv[2])
out = {"tails": [m.predict_tails(h, r, 10) for h, r in queries], "heads": [m.predict_heads(t, r, 10) for t, r in queries],
       "scipy": "scipy.sparse" in sys.modules}
import numpy as np
np.save(sys.argv[3], m.entity_embeddings)
print(json.dumps(out))
"""


@pytest.mark.parametrize("precision,scipy", [("fp32", True), ("fp32", False), ("fp16", True)])
def test_edge_reader_without_torch(trained_run, tmp_path, precision, scipy):
    """fp32: plain tensors; fp16: weights byte-plane + xz coded (the default for the small bundles); with and
    without the optional scipy sparse products."""
    out, ds = trained_run
    path = out / BUNDLE if precision == "fp32" else export_bundle(out, tmp_path / "b.safetensors", precision=precision)
    bundle = load_bundle(path)
    queries = [(ds.entities.name(int(h)), ds.relations.name(int(r))) for h, r, _ in ds.test[:15]]
    result = subprocess.run([sys.executable, "-c", EDGE_SCRIPT, str(path), json.dumps(queries),
                             str(tmp_path / "emb.npy"), json.dumps(scipy)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["scipy"] == scipy  # the path under test really ran (scipy is a dev dependency)
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), bundle.entity_embeddings().numpy(), atol=1e-4)
    # The same top-10 as the torch path (in-process edge model fed torch's embeddings ranks identically).
    ent, rel = bundle.entity_embeddings(), bundle.relation_embeddings()
    scorer = bundle.scorer
    for (h, r), tails in zip(queries, got["tails"], strict=True):
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


def test_limits_refuse_a_large_vocabulary_or_graph_while_it_decompresses():
    """BundleLimits stop the xz stream once it holds more names (or its graph header more edges) than allowed,
    before any name or edge is built; at the limit everything reads as before."""
    from earl_service.bundle.format import BundleLimits

    names = [f"e{i}" for i in range(5000)]
    assert unpack_strings(pack_strings(names), BundleLimits(max_names=5000)) == names
    with pytest.raises(BundleError, match=r"more than 4,999 names.*\(settings X\)"):
        unpack_strings(pack_strings(names), BundleLimits(max_names=4999, origin="settings X"))
    triples = np.array([[i % 50, 0, (i * 7) % 50] for i in range(2500)])
    blob = pack_graph(triples, 50, 1)
    kept = len(unpack_graph(blob))
    assert len(unpack_graph(blob, BundleLimits(max_triples=kept))) == kept
    with pytest.raises(BundleError, match=f"holds {kept:,} triples; at most {kept - 1:,}"):
        unpack_graph(blob, BundleLimits(max_triples=kept - 1))


def test_every_decoded_field_is_a_bundle_field():
    """load_bundle passes a DecodedBundle's fields to Bundle by name: each must exist there, with one type."""
    import dataclasses

    from earl_service.bundle.decode import DecodedBundle
    from earl_service.bundle.model_io import Bundle

    bundle_types = {f.name: f.type for f in dataclasses.fields(Bundle)}
    for f in dataclasses.fields(DecodedBundle):
        assert bundle_types.get(f.name) == f.type, f.name


@pytest.mark.parametrize("precision", ["fp32", "int8", "pq:8"])
def test_the_written_file_is_what_safetensors_writes(trained_run, tmp_path, precision):
    """write_safetensors writes the file itself, block by block: the same bytes as safetensors' own file but
    for the metadata's order (a hash map's in safetensors, so not even fixed from one process to the next; sorted
    here), which sets no size (bundle.sizes predicts sizes to the byte)."""
    from safetensors.numpy import load as st_load
    from safetensors.numpy import save as st_save

    from earl_service.bundle.format import read_safetensors

    bundle = load_bundle(trained_run[0] / BUNDLE)
    tensors, meta = bundle.to_tensors(precision)
    path = write_safetensors(tmp_path / "b.safetensors", tensors, {**meta, "note": 'a "quoted" é\n\x01'})
    written_meta, read, _ = read_safetensors(path)
    theirs = st_save(tensors, metadata=written_meta)
    ours = path.read_bytes()
    assert len(ours) == len(theirs) and ours[-10_000:] == theirs[-10_000:]
    layout = [[(k, v) for k, v in json.loads(b[8 : 8 + int.from_bytes(b[:8], "little")]).items()
               if k != "__metadata__"] for b in (ours, theirs)]
    assert layout[0] == layout[1]  # the tensors in safetensors' order at its offsets
    assert written_meta["note"] == 'a "quoted" é\n\x01' and list(written_meta) == sorted(written_meta)
    assert all(np.array_equal(read[k], v) for k, v in st_load(theirs).items())
