"""`earl import` of GraphVite pickles, read without GraphVite or easydict. GraphVite does not install here: each
fixture is pickled as ApplicationMixin.save_model writes it (an EasyDict {graph: {entity2id, relation2id}, solver:
{entity_embeddings, relation_embeddings}}), and each score is knowledge_graph.h's `forward` written out below on
the interleaved rows, margin 0."""

import os
import pickle
import sys
import types

import numpy as np
import pytest
from conftest import assert_source_scores

from earl_service.cli.main import main
from earl_service.errors import ModelImportError
from earl_service.imports import detect, read_model

N, R, DIM = 30, 4, 16
rng = np.random.default_rng(7)
GRAPH = np.stack([rng.integers(0, N, 60), rng.integers(0, R, 60), rng.integers(0, N, 60)], axis=1)
TEST = np.stack([rng.integers(0, N, 20), rng.integers(0, R, 20), rng.integers(0, N, 20)], axis=1)


class EasyDict(dict):
    """easydict.EasyDict as pickled: items that are attributes too."""

    def __init__(self, **items):
        super().__init__(**items)
        self.__dict__.update(items)


@pytest.fixture
def easydict(monkeypatch):
    module = types.ModuleType("easydict")
    module.EasyDict = EasyDict
    monkeypatch.setattr(EasyDict, "__module__", "easydict")
    monkeypatch.setitem(sys.modules, "easydict", module)


def transe(e, r):
    return lambda h, rel, t: -np.abs(e[h] + r[rel] - e[t]).sum(-1)


def distmult(e, r):
    return lambda h, rel, t: (e[h] * r[rel] * e[t]).sum(-1)


def complex_(e, r):
    def score(h, rel, t):  # h_re = head[2i], h_im = head[2i + 1]
        hr, hi, tr, ti, rr, ri = e[h][..., 0::2], e[h][..., 1::2], e[t][..., 0::2], e[t][..., 1::2], \
            r[rel][..., 0::2], r[rel][..., 1::2]
        return ((hr * rr - hi * ri) * tr + (hr * ri + hi * rr) * ti).sum(-1)
    return score


def rotate(e, r):
    def score(h, rel, t):  # phase = relation[i] for i < dim / 2
        hr, hi, tr, ti = e[h][..., 0::2], e[h][..., 1::2], e[t][..., 0::2], e[t][..., 1::2]
        phase = r[rel][..., : DIM // 2]
        re, im = hr * np.cos(phase) - hi * np.sin(phase) - tr, hr * np.sin(phase) + hi * np.cos(phase) - ti
        return -np.sqrt(re**2 + im**2).sum(-1)
    return score


MODELS = {"TransE": (transe, "transe-l1"), "DistMult": (distmult, "distmult"), "ComplEx": (complex_, "complex"),
          "RotatE": (rotate, "rotate")}


def graphvite_pickle(path, model, *, named=True):
    entities = rng.normal(size=(N, DIM)).astype(np.float32)
    relations = rng.uniform(-np.pi, np.pi, (R, DIM)).astype(np.float32)
    order = rng.permutation(N)
    graph = EasyDict(entity2id={f"Q{i}": int(i) for i in order}, relation2id={f"P{i}": i for i in range(R)},
                     id2entity=[f"Q{i}" for i in range(N)])
    solver = EasyDict(entity_embeddings=entities, relation_embeddings=relations, **({"model": model} if named else {}))
    path.write_bytes(pickle.dumps(EasyDict(graph=graph, solver=solver), protocol=pickle.HIGHEST_PROTOCOL))
    return entities, relations


@pytest.mark.parametrize("model", list(MODELS))
def test_scores_and_ranks_are_graphvites(tmp_path, easydict, model):
    entities, relations = graphvite_pickle(tmp_path / f"{model.lower()}_fb.pkl", model)
    (tmp_path / "graph.txt").write_text("".join(f"Q{h}\tP{r}\tQ{t}\n" for h, r, t in GRAPH))
    assert detect(tmp_path / f"{model.lower()}_fb.pkl") == "graphvite"
    assert main(["import", str(tmp_path / f"{model.lower()}_fb.pkl"), "--graph", str(tmp_path / "graph.txt"),
                 "--out", str(tmp_path / "b.safetensors")]) == 0
    formula, kind = MODELS[model]
    assert read_model(tmp_path / f"{model.lower()}_fb.pkl").model == kind
    assert_source_scores(tmp_path / "b.safetensors", formula(entities, relations), TEST, GRAPH)


def test_the_model_comes_from_the_file_name_or_scorer(tmp_path, easydict):
    graphvite_pickle(tmp_path / "complex_wikidata5m.pkl", "ComplEx", named=False)
    assert read_model(tmp_path / "complex_wikidata5m.pkl").model == "complex"
    (tmp_path / "complex_wikidata5m.pkl").rename(tmp_path / "model.pkl")
    with pytest.raises(ModelImportError, match="GraphVite model 'model.pkl' has no scorer here; name the model"):
        read_model(tmp_path / "model.pkl")
    assert read_model(tmp_path / "model.pkl", scorer="complex").model == "complex"


class Evil:
    def __reduce__(self):
        return os.system, ("echo pwned",)


def test_a_pickle_that_would_run_code_is_refused(tmp_path, capfd):
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"graph": Evil()}))
    with pytest.raises(ModelImportError, match=r"evil.pkl: the pickle asks for (posix|nt)\.system, which is not read"):
        read_model(tmp_path / "evil.pkl")
    assert "pwned" not in capfd.readouterr().out


def test_bad_pickles_name_the_file(tmp_path, easydict):
    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    with pytest.raises(ModelImportError, match="junk.pkl: not a pickle that can be read"):
        read_model(tmp_path / "junk.pkl")
    (tmp_path / "empty.pkl").write_bytes(pickle.dumps({"solver": {}}))
    with pytest.raises(ModelImportError, match="empty.pkl: no `graph` record"):
        read_model(tmp_path / "empty.pkl", scorer="distmult")
    graphvite_pickle(tmp_path / "quate_x.pkl", "QuatE")
    with pytest.raises(ModelImportError, match="GraphVite model 'QuatE' has no scorer here"):
        read_model(tmp_path / "quate_x.pkl")
