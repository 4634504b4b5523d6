"""`earl import` of LibKGE checkpoints. LibKGE does not install here: each fixture is torch.save'd as
TrainingJob.save_to writes it ({"model": (state_dict, meta), "config": a kge.config.Config, "dataset": ...}) with a
stand-in class pickled under kge.config.Config, beside `index<TAB>id` maps; each score is the model's `score_emb`
written out below."""

import json
import sys
import types

import numpy as np
import pytest
import torch
from conftest import assert_source_scores

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.errors import ModelImportError
from earl_service.imports import detect, read_model
from earl_service.serve.predictor import LinkPredictor

N, R, DIM = 30, 4, 16
rng = np.random.default_rng(11)
GRAPH = np.stack([rng.integers(0, N, 60), rng.integers(0, R, 60), rng.integers(0, N, 60)], axis=1)
TEST = np.stack([rng.integers(0, N, 20), rng.integers(0, R, 20), rng.integers(0, N, 20)], axis=1)


class Config:
    """What kge.config.Config pickles: its attributes."""

    def __init__(self, options):
        self.options, self.folder, self.log_folder = options, "/tmp/job", None


@pytest.fixture
def kge_config(monkeypatch):
    module = types.ModuleType("kge.config")
    module.Config = Config
    monkeypatch.setattr(Config, "__module__", "kge.config")
    monkeypatch.setitem(sys.modules, "kge", types.ModuleType("kge"))
    monkeypatch.setitem(sys.modules, "kge.config", module)


def transe(p):
    return lambda e, r: lambda s, rel, o: -np.linalg.norm(e[s] + r[rel] - e[o], ord=p, axis=-1)


def distmult(e, r):
    return lambda s, rel, o: (e[s] * r[rel] * e[o]).sum(-1)


def complex_(e, r):
    def score(s, rel, o):  # s_all * r_all * o_all
        (pr, pi), (ore, oi) = np.split(r[rel], 2, -1), np.split(e[o], 2, -1)
        s_all = np.concatenate([e[s], e[s]], -1)
        r_all = np.concatenate([pr, r[rel], -pi], -1)
        o_all = np.concatenate([e[o], oi, ore], -1)
        return (s_all * o_all * r_all).sum(-1)
    return score


def rotate(p):
    def build(e, r):
        def score(s, rel, o):
            (sr, si), (ore, oi) = np.split(e[s], 2, -1), np.split(e[o], 2, -1)
            pr, pi = np.cos(r[rel]), np.sin(r[rel])
            diff = np.sqrt((sr * pr - si * pi - ore) ** 2 + (sr * pi + si * pr - oi) ** 2)
            return -np.linalg.norm(diff, ord=p, axis=-1)
        return score
    return build


MODELS = {"transe-1": (transe(1), "transe-l1"), "transe-2": (transe(2), "transe-l2"),
          "distmult": (distmult, "distmult"), "complex": (complex_, "complex"),
          "rotate-1": (rotate(1), "rotate"), "rotate-2": (rotate(2), "rotate-l2")}


def checkpoint(folder, name, *, options=None, ids_inside=False, reciprocal=False, prefix=""):
    """A checkpoint of model `name` ("rotate-2": l_norm 2); `reciprocal`: wrapped in a reciprocal_relations_model
    (2R relation rows) whose tables sit under `prefix` (its own names and `_base_model.`'s, or the latter alone)."""
    model, _, norm = name.partition("-")
    folder.mkdir(parents=True, exist_ok=True)
    entities = rng.normal(size=(N, DIM)).astype(np.float32)
    rows = 2 * R if reciprocal else R
    relations = rng.uniform(-np.pi, np.pi, (rows, DIM // 2 if model == "rotate" else DIM)).astype(np.float32)
    state = {}
    for at in (prefix, "") if reciprocal and not prefix else (prefix,):
        state |= {f"{at}_entity_embedder._embeddings.weight": torch.from_numpy(entities),
                  f"{at}_relation_embedder._embeddings.weight": torch.from_numpy(relations)}
    options = options or {"model": model, model: {"l_norm": float(norm or 1)}}
    if reciprocal:  # LibKGE's layout: the base's options beside the wrapper's `base_model.type`
        options = {**options, "model": "reciprocal_relations_model",
                   "reciprocal_relations_model": {"base_model": {"type": model}}}
    dataset = {"num_entities": N, "num_relations": R}
    if ids_inside:
        dataset["meta"] = {"entity_ids": [f"/m/{i}" for i in range(N)], "relation_ids": [f"/r/{i}" for i in range(R)]}
    torch.save({"type": "train", "epoch": 3, "valid_trace": [{"mrr": 0.2}], "model": (state, {}),
                "config": Config(options), "dataset": dataset, "job_id": "x"}, folder / "checkpoint_best.pt")
    if not ids_inside:
        (folder / "entity_ids.del").write_text("".join(f"{i}\t/m/{i}\n" for i in range(N)))
        (folder / "relation_ids.del").write_text("".join(f"{i}\t/r/{i}\n" for i in range(R)))
    return entities, relations


@pytest.mark.parametrize("name", list(MODELS))
def test_scores_and_ranks_are_libkges(tmp_path, kge_config, name):
    entities, relations = checkpoint(tmp_path / "job", name)
    (tmp_path / "graph.txt").write_text("".join(f"/m/{h}\t/r/{r}\t/m/{t}\n" for h, r, t in GRAPH))
    assert detect(tmp_path / "job") == "libkge" and detect(tmp_path / "job" / "checkpoint_best.pt") == "libkge"
    assert main(["import", str(tmp_path / "job"), "--graph", str(tmp_path / "graph.txt"),
                 "--out", str(tmp_path / "b.safetensors")]) == 0
    formula, kind = MODELS[name]
    assert read_model(tmp_path / "job").model == kind
    assert_source_scores(tmp_path / "b.safetensors", formula(entities, relations), TEST, GRAPH)


@pytest.mark.parametrize("prefix", ["", "_base_model."], ids=["both-names", "base-names"])
@pytest.mark.parametrize("name", list(MODELS))
def test_reciprocal_relations_score_heads_through_the_inverse_relations(tmp_path, kge_config, name, prefix):
    """ReciprocalRelationsModel: score_sp(s, p) is the base's, score_po(p, o) the base's score_sp(o, p + R); the
    bundle keeps all 2R relation rows, and its edge reader, ranks and server answer heads through rows R..2R-1."""
    entities, relations = checkpoint(tmp_path / "job", name, reciprocal=True, prefix=prefix)
    (tmp_path / "graph.txt").write_text("".join(f"/m/{h}\t/r/{r}\t/m/{t}\n" for h, r, t in GRAPH))
    assert main(["import", str(tmp_path / "job"), "--graph", str(tmp_path / "graph.txt"),
                 "--out", str(tmp_path / "b.safetensors")]) == 0
    formula, kind = MODELS[name]
    base = formula(entities, relations)
    imported = read_model(tmp_path / "job")
    assert imported.model == kind and imported.reciprocal and imported.source["reciprocal"]
    assert_source_scores(tmp_path / "b.safetensors", base, TEST, GRAPH, head_score=lambda s, rel, o: base(o, rel + R, s))
    bundle = load_bundle(tmp_path / "b.safetensors")
    assert bundle.config.reciprocal and bundle.params["relations"].shape[0] == 2 * R
    _, r, t = (int(x) for x in TEST[0])
    best = np.argsort(-base(t, r + R, np.arange(N)), kind="stable")[:3]  # the tails of (t, r_reciprocal, ?)
    for index in ("exact", "auto"):  # every entity scored; the FAISS shortlist and its exact re-rank
        served = LinkPredictor.from_bundle(bundle, index=index)
        got = served.predict_heads(f"/m/{t}", f"/r/{r}", k=3, exclude_known=False)
        assert [name for name, _ in got] == [f"/m/{i}" for i in best], index


def test_a_reciprocal_model_with_a_relation_table_of_r_rows_is_refused(tmp_path, kge_config):
    checkpoint(tmp_path / "job", "distmult", reciprocal=True)
    state = torch.load(tmp_path / "job" / "checkpoint_best.pt", weights_only=False)
    for key in list(state["model"][0]):
        if "_relation_embedder" in key:
            state["model"][0][key] = state["model"][0][key][:R]
    torch.save(state, tmp_path / "job" / "checkpoint_best.pt")
    with pytest.raises(ModelImportError, match="has 4 rows but .* holds 4 relation names: two rows per reciprocal"):
        read_model(tmp_path / "job").checked()


def test_a_packaged_checkpoint_holds_its_ids(tmp_path, kge_config):
    checkpoint(tmp_path / "job", "distmult", ids_inside=True)
    imported = read_model(tmp_path / "job" / "checkpoint_best.pt")
    assert imported.entity_names[:2] == ["/m/0", "/m/1"] and "dataset.meta" in imported.files["entity_names"]


@pytest.mark.parametrize(("options", "message"), [
    ({"model": "reciprocal_relations_model", "reciprocal_relations_model": {"base_model": {"type": "conve"}}},
     "LibKGE model 'conve' inside a reciprocal_relations_model has no scorer"),
    ({"model": "reciprocal_relations_model", "reciprocal_relations_model": {"base_model": {}}},
     "a reciprocal_relations_model without base_model.type"),
    ({"model": "transe", "transe": {"l_norm": 3.0}}, "LibKGE model 'transe' with l_norm 3 has no scorer"),
    ({"model": "rescal"}, "LibKGE model 'rescal' has no scorer"),
])
def test_models_without_a_scorer_are_refused(tmp_path, kge_config, options, message):
    checkpoint(tmp_path / "job", "distmult", options=options)
    with pytest.raises(ModelImportError, match=message):
        read_model(tmp_path / "job")


def test_code_in_a_checkpoint_is_not_run(tmp_path, kge_config):
    torch.save({"model": ({}, {}), "config": types.SimpleNamespace(options={})}, tmp_path / "checkpoint_best.pt")
    with pytest.raises(ModelImportError, match="not a LibKGE checkpoint torch reads with weights_only=True"):
        read_model(tmp_path)
    (tmp_path / "checkpoint_best.pt").unlink()
    checkpoint(tmp_path, "distmult")
    (tmp_path / "relation_ids.del").unlink()
    with pytest.raises(ModelImportError, match="no relation_ids.del beside it"):
        read_model(tmp_path / "checkpoint_best.pt")


@pytest.mark.parametrize("fmt", ["npy", "parquet"])
def test_a_reciprocal_model_exports_its_inverse_rows_and_imports_back(tmp_path, kge_config, capsys, fmt):
    """`earl export` lists the 2R rows as r..., r_reciprocal... and marks meta.json; `earl import --format arrays`
    reads that back as the same reciprocal model."""
    entities, relations = checkpoint(tmp_path / "job", "complex", reciprocal=True)
    assert main(["import", str(tmp_path / "job"), "--out", str(tmp_path / "b.safetensors")]) == 0
    assert main(["export", str(tmp_path / "b.safetensors"), "--format", fmt, "--out", str(tmp_path / "t")]) == 0
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["reciprocal"] is True and meta["relations"] == R and "r_reciprocal, e)" in meta["head_queries"]
    if fmt == "npy":
        names = (tmp_path / "t" / "relation_ids.txt").read_text().split()
        assert names == [f"/r/{i}" for i in range(R)] + [f"/r/{i}_reciprocal" for i in range(R)]
    capsys.readouterr()
    assert main(["import", str(tmp_path / "t"), "--scorer", "complex", "--out", str(tmp_path / "c.safetensors")]) == 0
    back = load_bundle(tmp_path / "c.safetensors")
    assert back.config.reciprocal and back.relations.names == [f"/r/{i}" for i in range(R)]
    base = complex_(entities, relations)
    assert_source_scores(tmp_path / "c.safetensors", base, TEST, np.zeros((0, 3), dtype=np.int64),
                         head_score=lambda s, rel, o: base(o, rel + R, s))
    if fmt == "npy":  # names that are not r..., r_reciprocal...
        (tmp_path / "t" / "relation_ids.txt").write_text("".join(f"/r/{i}\n" for i in range(2 * R)))
        with pytest.raises(ModelImportError, match="meta.json marks reciprocal relations"):
            read_model(tmp_path / "t", scorer="complex")


def test_reciprocal_relations_are_an_imported_models_only():
    """EARL trains none; a trained model's header is as before (no `reciprocal` key unless set)."""
    from earl_service.config import ModelConfig
    from earl_service.errors import ConfigError

    with pytest.raises(ConfigError, match="EARL has none"):
        ModelConfig(model="earl", reciprocal=True)
    assert "reciprocal" not in ModelConfig().to_dict()
    assert ModelConfig.from_dict(ModelConfig(model="complex", reciprocal=True).to_dict()).reciprocal
