"""`earl import` of PyTorch-BigGraph checkpoints. PBG does not install here: each fixture is written in the
documented layout (config.json, model.v<N>.h5 with `model/relations/<i>/operator/rhs/<param>`, embeddings_<type>_
<part>.v<N>.h5 with `embeddings`, entity_names_<type>_<part>.json); each score is comparator(u, operator(v)) as
MultiRelationEmbedder.forward computes it, written out below. Where h5py is not installed (it is not in this
project's venv: the `pbg` extra) the HDF5 files are an in-memory stand-in with h5py's interface; with h5py they are
real files."""

import json

import numpy as np
import pytest
from conftest import assert_source_scores

from earl_service.cli.main import main
from earl_service.errors import ModelImportError
from earl_service.imports import detect, from_pbg, read_model

N, R, DIM = 30, 4, 16
rng = np.random.default_rng(13)
GRAPH = np.stack([rng.integers(0, N, 60), rng.integers(0, R, 60), rng.integers(0, N, 60)], axis=1)
TEST = np.stack([rng.integers(0, N, 20), rng.integers(0, R, 20), rng.integers(0, N, 20)], axis=1)

try:
    import h5py
except ImportError:
    h5py = None


class FakeH5(dict):
    """h5py.File's interface over {dataset path: array}: `in`, [path], visititems, a context manager."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __contains__(self, key):
        return any(k == key or k.startswith(key + "/") for k in self.keys())

    def __getitem__(self, key):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return FakeH5({k[len(key) + 1 :]: v for k, v in self.items() if k.startswith(key + "/")})

    def visititems(self, visit):
        for name, value in self.items():
            visit(name, value)


@pytest.fixture
def h5_files(monkeypatch):
    """path -> datasets written so far; from_pbg opens them (real files when h5py is installed)."""
    files: dict = {}
    if h5py is None:
        monkeypatch.setattr(from_pbg, "open_h5", lambda path: FakeH5(files[str(path)]))
    return files


def write_h5(files, path, datasets):
    if h5py is None:
        files[str(path)] = datasets
        path.write_bytes(b"")
        return
    with h5py.File(path, "w") as hf:
        for name, value in datasets.items():
            hf.create_dataset(name, data=value)


def pbg_checkpoint(folder, files, operator, comparator, *, dynamic=False, parts=1, global_emb=True, max_norm=None):
    folder.mkdir(parents=True, exist_ok=True)
    entities = rng.normal(size=(N, DIM)).astype(np.float32)
    glob = rng.normal(size=DIM).astype(np.float32) if global_emb else None
    size = DIM // 2 if operator == "complex_diagonal" else DIM
    ops = {}
    for i in range(R if not dynamic else 1):
        for side in ("lhs", "rhs") if dynamic else ("rhs",):  # static relations have no lhs operator
            prefix = f"model/relations/{i}/operator/{side}/"
            shape = (R, size) if dynamic else (size,)
            names = {"translation": ["translation"], "diagonal": ["diagonal"], "complex_diagonal": ["real", "imag"],
                     "none": []}[operator]
            for name in names:
                key = prefix + (name + "s" if dynamic and name in ("translation", "diagonal") else name)
                ops[key] = rng.normal(size=shape).astype(np.float32)
    if glob is not None:
        ops["model/entities/all/global_embedding"] = glob
    relations = [{"name": f"rel{i}", "lhs": "all", "rhs": "all", "operator": operator} for i in range(
        1 if dynamic else R)]
    config = {"entities": {"all": {"num_partitions": parts}}, "relations": relations, "dimension": DIM,
              "comparator": comparator, "bias": False, "global_emb": global_emb, "dynamic_relations": dynamic,
              "max_norm": max_norm, "entity_path": str(folder / "data")}
    (folder / "config.json").write_text(json.dumps(config))
    write_h5(files, folder / "model.v7.h5", ops)
    (folder / "checkpoint_version.txt").write_text("7\n")
    for part, rows in enumerate(np.array_split(np.arange(N), parts)):
        write_h5(files, folder / f"embeddings_all_{part}.v7.h5", {"embeddings": entities[rows]})
        (folder / f"entity_names_all_{part}.json").write_text(json.dumps([f"n{i}" for i in rows]))
    if dynamic:
        (folder / "data").mkdir()
        (folder / "data" / "dynamic_rel_names.json").write_text(json.dumps([f"rel{i}" for i in range(R)]))
    return entities, glob, ops


def reference(entities, glob, ops, operator, comparator, *, dynamic=False, max_norm=None, side="rhs"):
    """score(u, r, v) = comparator(u, f_r(v)), f_r the `side` operator: the global embedding added, rows renormalised
    to max_norm first. With dynamic relations PBG ranks heads u' by c(u', h_r(v)) (side "rhs") and tails v' by
    c(g_r(u), v') (side "lhs": call the score with u and v swapped)."""
    e = entities.copy()
    if max_norm:
        norms = np.linalg.norm(e, axis=1, keepdims=True)
        e = e * np.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    e = e + (glob if glob is not None else 0)

    def param(rel, name):
        if dynamic:
            key = f"model/relations/0/operator/{side}/{name + 's' if name in ('translation', 'diagonal') else name}"
            return ops[key][rel]
        return np.stack([ops[f"model/relations/{i}/operator/{side}/{name}"] for i in range(R)])[rel]

    def score(h, rel, t):
        u, v = e[h], e[t]
        if operator == "translation":
            w = v + param(rel, "translation")
        elif operator == "diagonal":
            w = v * param(rel, "diagonal")
        elif operator == "complex_diagonal":
            re, im, c_re, c_im = v[..., : DIM // 2], v[..., DIM // 2 :], param(rel, "real"), param(rel, "imag")
            w = np.concatenate([re * c_re - im * c_im, re * c_im + im * c_re], -1)
        else:
            w = v
        return (u * w).sum(-1) if comparator == "dot" else -np.sqrt(((u - w) ** 2).sum(-1))
    return score


CASES = {"translation-l2": ("translation", "l2", "transe-l2"), "none-l2": ("none", "l2", "transe-l2"),
         "diagonal-dot": ("diagonal", "dot", "distmult"), "none-dot": ("none", "dot", "distmult"),
         "complex_diagonal-dot": ("complex_diagonal", "dot", "complex")}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", list(CASES))
def test_scores_and_ranks_are_pbgs(tmp_path, h5_files, case, dynamic):
    operator, comparator, kind = CASES[case]
    entities, glob, ops = pbg_checkpoint(tmp_path / "ckpt", h5_files, operator, comparator, dynamic=dynamic,
                                         parts=2 if dynamic else 1, max_norm=3.0 if dynamic else None)
    (tmp_path / "graph.txt").write_text("".join(f"n{h}\trel{r}\tn{t}\n" for h, r, t in GRAPH))
    assert detect(tmp_path / "ckpt") == "pbg"
    assert main(["import", str(tmp_path / "ckpt"), "--graph", str(tmp_path / "graph.txt"),
                 "--out", str(tmp_path / "b.safetensors")]) == 0
    assert read_model(tmp_path / "ckpt").model == kind
    score = reference(entities, glob, ops, operator, comparator, dynamic=dynamic,
                      max_norm=3.0 if dynamic else None)
    if not dynamic:
        assert_source_scores(tmp_path / "b.safetensors", score, TEST, GRAPH)
        return
    tail = reference(entities, glob, ops, operator, comparator, dynamic=True, max_norm=3.0, side="lhs")
    assert read_model(tmp_path / "ckpt").reciprocal
    assert_source_scores(tmp_path / "b.safetensors", lambda u, r, v: tail(v, r, u), TEST, GRAPH, head_score=score)


@pytest.mark.parametrize(("change", "message"), [
    ({"comparator": "cos"}, "translation \\+ cos have no scorer here"),
    ({"comparator": "squared_l2"}, "translation \\+ squared_l2 have no scorer here"),
    ({"bias": True}, "bias is on"),
    ({"entities": {"a": {}, "b": {}}}, "2 entity types .a, b."),
    ({"entities": {"all": {"featurized": True}}}, "entity type 'all' is featurized"),
])
def test_what_maps_onto_no_scorer_is_refused(tmp_path, h5_files, change, message):
    pbg_checkpoint(tmp_path / "ckpt", h5_files, "translation", "l2")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelImportError, match=message):
        read_model(tmp_path / "ckpt")


def test_missing_parts_name_the_file(tmp_path, h5_files):
    pbg_checkpoint(tmp_path / "ckpt", h5_files, "diagonal", "dot")
    (tmp_path / "ckpt" / "entity_names_all_0.json").write_text('["a", "b"]')
    with pytest.raises(ModelImportError, match="embeddings_all_0.v7.h5: 30 rows of 16 floats, but the name files "
                                               "hold 2 names"):
        read_model(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "entity_names_all_0.json").unlink()
    with pytest.raises(ModelImportError, match="no entity_names_all_0.json here nor in the config's entity_path"):
        read_model(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "checkpoint_version.txt").write_text("9")
    with pytest.raises(ModelImportError, match=r"checkpoint_version.txt: version '9', but the folder holds"):
        read_model(tmp_path / "ckpt")
