"""`earl import` of LibKGE checkpoints. LibKGE does not install here: each fixture is torch.save'd as
TrainingJob.save_to writes it ({"model": (state_dict, meta), "config": a kge.config.Config, "dataset": ...}) with a
stand-in class pickled under kge.config.Config, beside `index<TAB>id` maps; each score is the model's `score_emb`
written out below."""

import sys
import types

import numpy as np
import pytest
import torch
from conftest import assert_source_scores

from earl_service.cli.main import main
from earl_service.errors import ModelImportError
from earl_service.imports import detect, read_model

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


def checkpoint(folder, name, *, options=None, ids_inside=False):
    model, _, norm = name.partition("-")
    folder.mkdir(parents=True, exist_ok=True)
    entities = rng.normal(size=(N, DIM)).astype(np.float32)
    relations = rng.uniform(-np.pi, np.pi, (R, DIM // 2 if model == "rotate" else DIM)).astype(np.float32)
    state = {"_entity_embedder._embeddings.weight": torch.from_numpy(entities),
             "_relation_embedder._embeddings.weight": torch.from_numpy(relations)}
    options = options or {"model": model, model: {"l_norm": float(norm or 1)}}
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


def test_a_packaged_checkpoint_holds_its_ids(tmp_path, kge_config):
    checkpoint(tmp_path / "job", "distmult", ids_inside=True)
    imported = read_model(tmp_path / "job" / "checkpoint_best.pt")
    assert imported.entity_names[:2] == ["/m/0", "/m/1"] and "dataset.meta" in imported.files["entity_names"]


@pytest.mark.parametrize(("options", "message"), [
    ({"model": "reciprocal_relations_model", "reciprocal_relations_model": {"base_model": {"type": "conve"}}},
     "reciprocal_relations_model .base conve."),
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
