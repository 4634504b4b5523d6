"""`earl import --format arrays`: tables and names with a named scorer become a bundle whose answers are the scorer's
formula over those tables in both readers; `earl export --format npy` imports back; bad input is an error that names
the file. Needs no pykeen."""

import json
import re

import numpy as np
import pytest
from conftest import codex_s_path, write_arrays
from safetensors.numpy import save_file

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.core import scorers
from earl_service.device import load
from earl_service.errors import ConfigError
from earl_service.imports import from_arrays, read_model
from earl_service.serve.predictor import LinkPredictor

N, R, D = 300, 4, 8
SHAPES = {"transe-l1": 2 * D, "transe-l2": 2 * D, "distmult": 2 * D, "complex": 2 * D, "rotate-l2": D, "rotate": D}


def arrays(folder, scorer, *, width=2 * D, seed=0):
    """A folder of random tables for `scorer`: rotations get phases (d a row), the others 2d floats."""
    return write_arrays(folder, entities=N, relations=R, width=width, phases=SHAPES[scorer] == D, seed=seed)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


@pytest.mark.parametrize("scorer", list(SHAPES))
def test_answers_are_the_scorers_formula_in_both_readers(tmp_path, capsys, scorer):
    """Top-10 tails and heads, known answers left out, are the nearest rows by the scorer over the arrays as
    written (rotate's phases in radians), the same in the device reader and the torch-side one."""
    entities, relations = arrays(tmp_path / "src", scorer)
    graph = tmp_path / "graph.txt"
    graph.write_text("e0\tr1\te5\ne0\tr1\te9\ne7\tr2\te0\n")
    code, printed = run(capsys, "import", tmp_path / "src", "--scorer", scorer, "--graph", graph,
                        "--out", tmp_path / "b.safetensors")
    assert code == 0 and printed["model"] == scorer and printed["triples"] == 3 and printed["dim"] == D
    edge = load(tmp_path / "b.safetensors")
    torch_side = LinkPredictor.from_bundle(load_bundle(tmp_path / "b.safetensors"))
    assert torch_side.index_kind in (("codes-flat", "flat") if scorer == "rotate" else ("metric-flat",))
    reference = scorers.RotatE(scale=1.0, gamma=10.0) if scorer == "rotate" else scorers.SCORERS[scorer]
    for side, known in (("tail", {5, 9}), ("head", set())):
        dist = reference.distances(reference.query(entities[0], relations[1], inverse=side == "head"), entities)
        order = [i for i in np.lexsort((np.arange(N), dist)) if i not in known][:10]
        got = (edge.predict_tails if side == "tail" else edge.predict_heads)("e0", "r1", 10)
        assert [e for e, _ in got] == [f"e{i}" for i in order]
        assert [s for _, s in got] == pytest.approx([reference.score(dist[i]) for i in order], rel=1e-5, abs=1e-5)
        assert got == (torch_side.predict_tails if side == "tail" else torch_side.predict_heads)("e0", "r1", 10)
    assert edge.score("e0", "r1", "e5")["known"] and not edge.score("e0", "r1", "e6")["known"]


@pytest.mark.parametrize("fmt", ["npy", "parquet"])
def test_exported_tables_import_back_with_the_same_answers(codex_bundle, reference, tmp_path, capsys, fmt):
    """An EARL bundle's rebuilt embeddings, exported as npy or Parquet (relation phases in radians), import as a
    RotatE bundle (--graph: the dataset's train file) that answers as the EARL bundle did."""
    assert main(["export", str(codex_bundle), "--format", fmt, "--out", str(tmp_path / "npy")]) == 0
    capsys.readouterr()
    code, printed = run(capsys, "import", tmp_path / "npy", "--scorer", "rotate", "--graph", codex_s_path(),
                        "--out", tmp_path / "b.safetensors")
    assert code == 0 and printed["triples"] == len(load_bundle(codex_bundle).triples)
    imported = load(tmp_path / "b.safetensors")
    bundle = load_bundle(codex_bundle)
    for h, r, t in bundle.triples[:: len(bundle.triples) // 10][:10]:
        head, relation, tail = bundle.entities.names[h], bundle.relations.names[r], bundle.entities.names[t]
        for got, want in ((imported.predict_tails(head, relation, 5), reference.brute_force_tails(head, relation, 5)),
                          (imported.predict_heads(tail, relation, 5), reference.brute_force_heads(tail, relation, 5))):
            assert [e for e, _ in got] == [e for e, _ in want]
            assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)


def test_an_imported_bundle_exports_its_own_layout(tmp_path, capsys):
    entities, relations = arrays(tmp_path / "src", "complex")
    assert main(["import", str(tmp_path / "src"), "--scorer", "complex", "--out", str(tmp_path / "b.safetensors")]) == 0
    assert main(["export", str(tmp_path / "b.safetensors"), "--format", "npy", "--out", str(tmp_path / "npy")]) == 0
    capsys.readouterr()
    np.testing.assert_array_equal(np.load(tmp_path / "npy" / "relation_embeddings.npy"), relations)
    meta = json.loads((tmp_path / "npy" / "meta.json").read_text())
    assert meta["model"] == "complex" and meta["score"].startswith("Re(sum_i h_i * r_i * conj(t_i))")
    assert main(["import", str(tmp_path / "npy"), "--scorer", "complex", "--out", str(tmp_path / "c.safetensors")]) == 0
    np.testing.assert_array_equal(load_bundle(tmp_path / "c.safetensors").params["entities"], entities)


def test_odd_real_widths_get_a_zero_column_that_changes_no_score(tmp_path):
    """Up to float32 summation order: the padded rows sum in other SIMD lanes."""
    entities, relations = arrays(tmp_path / "src", "transe-l2", width=2 * D - 1)
    imported = read_model(tmp_path / "src", scorer="transe-l2")
    assert imported.entities.shape == (N, 2 * D) and not imported.entities[:, -1].any()
    scorer = scorers.SCORERS["transe-l2"]
    np.testing.assert_allclose(scorer.distances(scorer.query(imported.entities[3], imported.relations[1]),
                                                imported.entities),
                               scorer.distances(scorer.query(entities[3], relations[1]), entities), rtol=1e-6)


def test_safetensors_tables_and_numbered_names(tmp_path):
    rng = np.random.default_rng(1)
    (tmp_path / "src").mkdir()
    save_file({"entity_embeddings": rng.normal(size=(N, 2 * D)).astype(np.float32),
               "relation_embeddings": rng.normal(size=(R, 2 * D)).astype(np.float64)},
              tmp_path / "src" / "embeddings.safetensors")
    order = rng.permutation(N)  # DGL-KE's `row<TAB>name`, any order, after a header
    (tmp_path / "src" / "entities.tsv").write_text("id\tname\n" + "".join(f"{i}\tent {i}\n" for i in order))
    (tmp_path / "src" / "relation_ids.txt").write_text("".join(f"r{i}\n" for i in range(R)))
    imported = read_model(tmp_path / "src", scorer="distmult")
    assert imported.entity_names == [f"ent {i}" for i in range(N)] and imported.relations.dtype == np.float32


BAD = {
    "relation width": (lambda src: np.save(src / "relation_embeddings.npy", np.zeros((R, 3), np.float32)),
                       "relation_embeddings.npy: 3 floats a relation"),
    "rows vs names": (lambda src: (src / "entities.tsv").write_text("a\nb\n"),
                      f"entity_embeddings.npy has {N} rows but .*entities.tsv holds 2 entity names"),
    "no entity table": (lambda src: (src / "entity_embeddings.npy").unlink(),
                        "no entity_embeddings.npy, and no embeddings.safetensors"),
    "no relation names": (lambda src: (src / "relations.tsv").unlink(), "no relations.tsv or relation_ids.txt"),
    "duplicate name": (lambda src: (src / "relations.tsv").write_text("a\nb\na\nc\n"),
                       "relations.tsv: duplicate relation name 'a'"),
    "a NaN": (lambda src: np.save(src / "entity_embeddings.npy", np.full((N, 2 * D), np.nan, np.float32)),
              "entity_embeddings.npy: holds NaN"),
    "not a table": (lambda src: np.save(src / "entity_embeddings.npy", np.zeros(N, np.float32)),
                    r"entity_embeddings.npy: expected a 2-D table"),
    "not npy": (lambda src: (src / "relation_embeddings.npy").write_text("hello"),
                "relation_embeddings.npy: not a .npy array"),
    "mixed names": (lambda src: (src / "relations.tsv").write_text("0\ta\nb\n2\tc\n3\td\n"),
                    r"relations.tsv, line 2: expected `row<TAB>name`"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_an_error_naming_the_file(tmp_path, capsys, case):
    arrays(tmp_path / "src", "complex")
    damage, message = BAD[case]
    damage(tmp_path / "src")
    code, err = run(capsys, "import", tmp_path / "src", "--scorer", "complex", "--out", tmp_path / "b.safetensors")
    assert code == 2 and err.startswith("earl: error: ")
    assert re.search(message, err), err
    assert not (tmp_path / "b.safetensors").exists()


def test_arguments_that_cannot_work(tmp_path, capsys):
    arrays(tmp_path / "src", "complex")
    code, err = run(capsys, "import", tmp_path / "src", "--out", tmp_path / "b.safetensors")
    assert code == 2 and "plain arrays need --scorer" in err
    code, err = run(capsys, "import", tmp_path / "nowhere", "--scorer", "complex", "--out", tmp_path / "b.safetensors")
    assert code == 2 and "nowhere: no such file or folder" in err
    code, err = run(capsys, "import", tmp_path / "src", "--format", "pykeen", "--out", tmp_path / "b.safetensors")
    assert code == 2 and "trained_model.pkl: missing" in err
    (tmp_path / "graph.txt").write_text("e0\tr1\tnobody\n")
    code, err = run(capsys, "import", tmp_path / "src", "--scorer", "complex", "--graph", tmp_path / "graph.txt",
                    "--out", tmp_path / "b.safetensors")
    assert code == 2 and "graph.txt, line 1" in err
    arrays(tmp_path / "odd", "complex", width=2 * D - 1)
    code, err = run(capsys, "import", tmp_path / "odd", "--scorer", "complex", "--out", tmp_path / "b.safetensors")
    assert code == 2 and "entity_embeddings.npy: complex entity rows hold d complex numbers" in err


def test_the_bundle_says_format_3_and_leaves_the_graph_out_on_request(tmp_path, capsys):
    from safetensors import safe_open

    arrays(tmp_path / "src", "transe-l1")
    assert main(["import", str(tmp_path / "src"), "--scorer", "transe-l1", "--no-graph", "--precision", "int8",
                 "--out", str(tmp_path / "b.safetensors")]) == 0
    with safe_open(tmp_path / "b.safetensors", "np") as f:
        assert f.metadata()["format_version"] == "3"
    edge = load(tmp_path / "b.safetensors")
    assert edge.known.num_triples == 0 and edge.answer("r0", head="e1")["exclude_known"] is False


def test_an_imported_model_is_not_trainable(tmp_path):
    import torch

    from earl_service.config import ModelConfig
    from earl_service.model.modules import build_model

    with pytest.raises(ConfigError, match="'complex' is imported"):
        build_model(ModelConfig(model="complex", dim=4), 10, 2, torch.zeros(0, dtype=torch.long))
    with pytest.raises(SystemExit):  # argparse: `earl train --model` offers what it trains
        main(["train", str(tmp_path), "--out", str(tmp_path / "run"), "--model", "complex"])


PARQUET_BAD = {
    "ragged rows": ({"id": ["a", "b", "c"], "embedding": [[1.0, 2.0], [3.0, 4.0], [5.0]]},
                    r"entities.parquet, row 3: 1 values in 'embedding', where the rows before have 2"),
    "no id column": ({"name": ["a"], "embedding": [[1.0, 2.0]]}, r"entities.parquet: no `id` column of names"),
    "two list columns": ({"id": ["a"], "x": [[1.0, 2.0]], "y": [[1.0, 2.0]]},
                         r"entities.parquet: expected one list column of floats"),
    "not parquet": (None, r"entities.parquet: not a Parquet file"),
}


@pytest.mark.parametrize("case", list(PARQUET_BAD))
def test_bad_parquet_tables_are_an_error_naming_the_file(tmp_path, capsys, case):
    """Parquet tables (entities.parquet and relations.parquet) read a batch of rows at a time; bad ones say where."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": ["r0"], "embedding": [[0.5, 0.5]]}), src / "relations.parquet")
    columns, message = PARQUET_BAD[case]
    if columns is None:
        (src / "entities.parquet").write_text("id,embedding\n")
    else:
        pq.write_table(pa.table(columns), src / "entities.parquet")
    code, err = run(capsys, "import", src, "--scorer", "distmult", "--out", tmp_path / "b.safetensors")
    assert code == 2 and re.search(message, err), err
    assert not (tmp_path / "b.safetensors").exists()


def test_parquet_float_columns_read_in_batches(tmp_path, monkeypatch):
    """Float columns beside `id` are a row's values, in order, read across several batches."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(from_arrays, "PARQUET_BATCH", 3)
    values = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"e{i}" for i in range(10)], **{f"v_{j}": values[:, j] for j in range(4)}}),
                   tmp_path / "t.parquet", row_group_size=4)
    rows, names = from_arrays.read_parquet(tmp_path / "t.parquet")
    np.testing.assert_array_equal(rows, values)
    assert names == [f"e{i}" for i in range(10)]
