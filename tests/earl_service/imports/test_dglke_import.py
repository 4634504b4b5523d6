"""`earl import` of DGL-KE save folders. DGL-KE does not install here: each fixture is written in the documented
layout (np.save'd `<dataset>_<model>_entity.npy` / `_relation.npy`, config.json as vars(args), `id<TAB>name` maps),
and each score is DGL-KE's score_fun.py formula written out below, gamma 0 as its inference uses."""

import json

import numpy as np
import pytest
from conftest import assert_source_scores

from earl_service.cli.main import main
from earl_service.errors import ModelImportError
from earl_service.imports import detect, read_model

N, R, HIDDEN, GAMMA = 30, 4, 8, 12.0
rng = np.random.default_rng(5)
GRAPH = np.stack([rng.integers(0, N, 60), rng.integers(0, R, 60), rng.integers(0, N, 60)], axis=1)
TEST = np.stack([rng.integers(0, N, 20), rng.integers(0, R, 20), rng.integers(0, N, 20)], axis=1)


def chunk(x):
    return np.split(x, 2, axis=-1)


def transe(p):
    return lambda e, r: lambda h, rel, t: -np.linalg.norm(e[h] + r[rel] - e[t], ord=p, axis=-1)


def distmult(e, r):
    return lambda h, rel, t: (e[h] * r[rel] * e[t]).sum(-1)


def complex_(e, r):
    def score(h, rel, t):  # ComplExScore.edge_func, term by term
        (rh, ih), (rt, it), (rr, ir) = chunk(e[h]), chunk(e[t]), chunk(r[rel])
        return (rh * rt * rr + ih * it * rr + rh * it * ir - ih * rt * ir).sum(-1)
    return score


def rotate(e, r):
    emb_init = (GAMMA + 2.0) / HIDDEN

    def score(h, rel, t):  # RotatEScore.edge_func: phase = rel / (emb_init / pi), the sum of complex moduli
        (rh, ih), (rt, it) = chunk(e[h]), chunk(e[t])
        phase = r[rel] / (emb_init / np.pi)
        re, im = rh * np.cos(phase) - ih * np.sin(phase) - rt, rh * np.sin(phase) + ih * np.cos(phase) - it
        return -np.sqrt(re**2 + im**2).sum(-1)
    return score


MODELS = {"TransE_l1": (transe(1), False, "transe-l1"), "TransE_l2": (transe(2), False, "transe-l2"),
          "DistMult": (distmult, False, "distmult"), "ComplEx": (complex_, False, "complex"),
          "RotatE": (rotate, True, "rotate")}


def dglke_folder(folder, model, *, names="entities.tsv"):
    """A DGL-KE save folder for `model`: tables as KEModel.save_emb writes them, config.json, id maps."""
    folder.mkdir(parents=True, exist_ok=True)
    double_ent = MODELS[model][1] or model == "ComplEx"
    entities = rng.normal(size=(N, 2 * HIDDEN if double_ent else HIDDEN)).astype(np.float32)
    width = HIDDEN if model == "RotatE" else entities.shape[1]
    relations = rng.uniform(-1, 1, (R, width)).astype(np.float32)
    np.save(folder / f"FB15k_{model}_entity.npy", entities)
    np.save(folder / f"FB15k_{model}_relation.npy", relations)
    (folder / "config.json").write_text(json.dumps({
        "model_name": model, "dataset": "FB15k", "hidden_dim": HIDDEN, "gamma": GAMMA, "double_ent": double_ent,
        "double_rel": model == "ComplEx", "emp_file": names, "rmap_file": "relations.tsv"}))
    order = rng.permutation(N)  # an id map lists ids in any order
    (folder / names).write_text("".join(f"{i}\t/m/e{i}\n" for i in order))
    (folder / "relations.tsv").write_text("".join(f"{i}\t/r/{i}\n" for i in range(R)))
    return entities, relations


@pytest.mark.parametrize("model", list(MODELS))
def test_scores_and_ranks_are_dglkes(tmp_path, model):
    entities, relations = dglke_folder(tmp_path / "ckpt", model)
    (tmp_path / "graph.txt").write_text("".join(f"/m/e{h}\t/r/{r}\t/m/e{t}\n" for h, r, t in GRAPH))
    assert detect(tmp_path / "ckpt") == "dglke"
    assert main(["import", str(tmp_path / "ckpt"), "--graph", str(tmp_path / "graph.txt"),
                 "--out", str(tmp_path / "b.safetensors")]) == 0
    formula, _, kind = MODELS[model]
    assert read_model(tmp_path / "ckpt").model == kind
    assert_source_scores(tmp_path / "b.safetensors", formula(entities, relations), TEST, GRAPH)


def test_the_built_in_datasets_dict_maps(tmp_path):
    dglke_folder(tmp_path / "ckpt", "DistMult", names="entities.dict")
    imported = read_model(tmp_path / "ckpt")
    assert imported.entity_names == [f"/m/e{i}" for i in range(N)]


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: (f / "config.json").write_text('{"model_name": "TransR", "dataset": "FB15k", "hidden_dim": 8, '
                                              '"gamma": 1}'), "model_name 'TransR' has no scorer"),
    (lambda f: (f / "FB15k_RotatE_relation.npy").unlink(), "FB15k_RotatE_relation.npy: missing"),
    (lambda f: (f / "relations.tsv").unlink(), "no relations.tsv"),
    (lambda f: (f / "config.json").write_text("{"), "config.json: not DGL-KE's config.json"),
    (lambda f: np.save(f / "FB15k_RotatE_relation.npy", np.zeros((R, 2 * HIDDEN), np.float32)),
     "RotatE relation rows of .16.. floats"),
])
def test_bad_folders_name_the_file(tmp_path, damage, message):
    dglke_folder(tmp_path / "ckpt", "RotatE")
    damage(tmp_path / "ckpt")
    with pytest.raises(ModelImportError, match=message):
        read_model(tmp_path / "ckpt", fmt="dglke")
