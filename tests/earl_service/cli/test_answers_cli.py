"""`earl predict`, `earl score`, `earl export --format npy|tsv|parquet` and `earl evaluate --per-relation`: the
same answers as the library, tables that read back to the rebuilt embeddings, clear errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, codex_s_path

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.answers import predictions_table
from earl_service.cli.main import main
from earl_service.data.packed import PackedVocab
from earl_service.device import reader as edge
from earl_service.device.tables import export_tables
from earl_service.errors import ConfigError


@pytest.fixture(scope="module")
def query(codex_bundle):
    bundle = load_bundle(codex_bundle)
    h, r, t = bundle.triples[11]
    return bundle.entities.names[h], bundle.relations.names[r], bundle.entities.names[t]


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("reader", ["edge", "torch"])
def test_predict_json_equals_the_library(codex_bundle, reference, query, capsys, reader):
    head, relation, tail = query
    got = run_json(capsys, "predict", str(codex_bundle), "--head", head, "--relation", relation, "-k", "7", "--json",
                   "--reader", reader)
    want = reference.brute_force_tails(head, relation, 7)
    assert [p["entity"] for p in got["predictions"]] == [e for e, _ in want]
    assert [p["score"] for p in got["predictions"]] == pytest.approx([s for _, s in want], abs=1e-4)
    got = run_json(capsys, "predict", str(codex_bundle.parent / "run"), "--tail", tail, "--relation", relation,
                   "--include-known", "--json", "--reader", reader)  # a run directory works too
    assert [p["entity"] for p in got["predictions"]] == \
        [e for e, _ in reference.brute_force_heads(tail, relation, 10, exclude_known=False)]


def test_predict_prints_a_table_by_default(codex_bundle, reference, query, capsys):
    """CoDEx-S's bundle has no entity labels: no empty label column."""
    head, relation, _ = query
    assert main(["predict", str(codex_bundle), "--head", head, "--relation", relation, "-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"tails of ({head}, {relation}") and lines[1].split() == ["rank", "entity", "score"]
    want = reference.brute_force_tails(head, relation, 3)
    assert [line.split()[:2] for line in lines[2:]] == [[str(i), e] for i, (e, _) in enumerate(want, 1)]


def test_the_table_shows_every_field_the_predictor_gives():
    """Fields beyond entity and score (labels) become columns, in the order they first appear."""
    found = {"direction": "head", "head": None, "relation": "P27", "relation_label": "citizenship", "tail": "Q1",
             "predictions": [{"entity": "Q2", "score": 1.5, "label": "Two"}, {"entity": "Q30", "score": 1.25}]}
    lines = predictions_table(found).splitlines()
    assert lines[0] == "heads of (?, P27 (citizenship), Q1)"
    assert predictions_table({**found, "tail_label": "One"}).startswith("heads of (?, P27 (citizenship), Q1 (One))")
    assert lines[1].split() == ["rank", "entity", "score", "label"]
    assert lines[2].split() == ["1", "Q2", "1.5", "Two"] and lines[3].split() == ["2", "Q30", "1.25"]


def test_score_equals_the_library(codex_bundle, reference, query, capsys):
    got = run_json(capsys, "score", str(codex_bundle), *query, "--json")
    want = reference.score(*query)
    assert got["known"] is True
    # The numpy rebuild equals torch's within float32 rounding, which can make or break a near tie: half a place.
    assert [got["tail_rank"], got["head_rank"]] == pytest.approx([want["tail_rank"], want["head_rank"]], abs=0.5)
    assert got["score"] == pytest.approx(want["score"], abs=1e-4)
    assert main(["score", str(codex_bundle), *query]) == 0
    text = capsys.readouterr().out
    assert "tail_rank" in text and "distance" in text


@pytest.mark.parametrize("reader", ["edge", "torch"])
def test_predict_and_score_take_labels_and_show_them(codex_bundle, query, tmp_path, capsys, reader):
    """Names resolve through the bundle's labels and the answers carry them, as over HTTP (LinkPredictor.answer)."""
    head, relation, tail = query
    bundle = load_bundle(codex_bundle)
    bundle.entity_labels = {head: "The Head", tail: "The Tail"}
    path = bundle.save(tmp_path / "labelled.safetensors")
    got = run_json(capsys, "predict", str(path), "--head", "the head", "--relation", relation, "--include-known",
                   "-k", str(len(bundle.entities)), "--json", "--reader", reader)
    assert (got["head"], got["head_label"], got["tail"], got["tail_label"]) == (head, "The Head", None, None)
    assert got["relation_label"] == bundle.relation_labels[relation]
    labels = {p["entity"]: p["label"] for p in got["predictions"]}
    assert labels[tail] == "The Tail" and sum(label is not None for label in labels.values()) == 2
    scored = run_json(capsys, "score", str(path), "The Head", relation, "The Tail", "--json", "--reader", reader)
    assert (scored["head"], scored["head_label"], scored["tail"], scored["tail_label"]) == (head, "The Head", tail,
                                                                                            "The Tail")
    assert main(["predict", str(path), "--tail", "The Tail", "--relation", relation, "--reader", reader,
                 "--include-known", "-k", str(len(bundle.entities))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"heads of (?, {relation} ({bundle.relation_labels[relation]}), {tail} (The Tail))"
    assert lines[1].split() == ["rank", "entity", "label", "score"]
    assert any(line.split()[1:4] == [head, "The", "Head"] for line in lines[2:])


@pytest.mark.parametrize("argv", [["predict", "--head", "nope", "--relation", "{rel}"],
                                  ["score", "{head}", "{rel}", "nope"]])
def test_unknown_entity_is_a_clear_error(codex_bundle, query, capsys, argv):
    head, relation, _ = query
    argv = [a.format(head=head, rel=relation) for a in argv]
    assert main([argv[0], str(codex_bundle), *argv[1:]]) == 2
    assert "earl: error: unknown entity 'nope'" in capsys.readouterr().err


def test_missing_bundle_and_bad_anchor(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "x.safetensors"), "--head", "a", "--relation", "r"]) == 2
    assert "no such bundle file" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: --head and --tail are exclusive
        main(["predict", str(tmp_path), "--head", "a", "--tail", "b", "--relation", "r"])


@pytest.fixture(scope="module")
def model(codex_bundle):
    return edge.load(codex_bundle)


def test_export_npy_reads_back(codex_bundle, model, tmp_path, capsys):
    out = tmp_path / "npy"
    printed = run_json(capsys, "export", str(codex_bundle), "--format", "npy", "--out", str(out))
    assert sorted(printed["files"]) == sorted(str(out / n) for n in (
        "entity_embeddings.npy", "relation_phases.npy", "entity_ids.txt", "relation_ids.txt", "meta.json"))
    np.testing.assert_array_equal(np.load(out / "entity_embeddings.npy"), model.entity_embeddings)
    np.testing.assert_allclose(np.load(out / "relation_phases.npy"), model.relation_embeddings * model.phase_scale,
                               rtol=1e-6)
    assert (out / "entity_ids.txt").read_text().splitlines() == model.entities.names
    assert (out / "relation_ids.txt").read_text().splitlines() == model.relations.names
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dim"] == model.dim and meta["gamma"] == model.gamma and meta["entities"] == len(model.entities)


def test_exported_tables_reproduce_the_scores(model, tmp_path):
    """What another tool computes from the tsv (gamma - sum |h * exp(i phase) - t|) is the predictor's score."""
    export_tables(model, tmp_path, fmt="tsv")
    ent_rows = [line.split("\t") for line in (tmp_path / "entities.tsv").read_text().splitlines()]
    rel_rows = [line.split("\t") for line in (tmp_path / "relations.tsv").read_text().splitlines()]
    d = model.dim
    assert ent_rows[0][:2] == ["id", "re_0"] and len(ent_rows[0]) == 1 + 2 * d and rel_rows[0][1] == "phase_0"
    entities = {row[0]: np.array(row[1:], dtype=np.float32) for row in ent_rows[1:]}
    phases = {row[0]: np.array(row[1:], dtype=np.float32) for row in rel_rows[1:]}
    assert list(entities) == model.entities.names
    np.testing.assert_array_equal(np.stack(list(entities.values())), model.entity_embeddings)  # %.9g round-trips
    head, relation = model.entities.names[0], model.relations.names[0]
    for tail, score in model.predict_tails(head, relation, 5, exclude_known=False):
        h, t = entities[head], entities[tail]
        rotated = (h[:d] + 1j * h[d:]) * np.exp(1j * phases[relation].astype(np.float64))
        assert model.gamma - np.abs(rotated - (t[:d] + 1j * t[d:])).sum() == pytest.approx(score, abs=1e-4)


def test_export_parquet(model, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is in the dev extra; CI has it")
    export_tables(model, tmp_path, fmt="parquet")
    table = pq.read_table(tmp_path / "entities.parquet")
    assert table.column("id").to_pylist() == model.entities.names
    np.testing.assert_array_equal(np.array(table.column("embedding").to_pylist(), dtype=np.float32),
                                  model.entity_embeddings)
    relations = pq.read_table(tmp_path / "relations.parquet")
    assert relations.column("id").to_pylist() == model.relations.names
    assert len(relations.column("phase")[0]) == model.dim


def test_export_parquet_without_pyarrow_says_what_to_install(model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(ConfigError, match=r"--format parquet needs pyarrow: pip install 'earl-service\[parquet\]'"):
        export_tables(model, tmp_path, fmt="parquet")


def test_ids_with_tabs_need_parquet(model, tmp_path, monkeypatch):
    names = list(model.entities.names)
    monkeypatch.setattr(model, "entities", PackedVocab([names[0] + "\tx", *names[1:]]))
    with pytest.raises(ConfigError, match="holds a tab or line break; use --format parquet"):
        export_tables(model, tmp_path, fmt="tsv")


def test_evaluate_per_relation(codex_bundle, capsys):
    """Each relation's metrics cover its own triples; pooled back by count they give the overall metrics."""
    got = run_json(capsys, "evaluate", str(codex_bundle.parent / "run"), str(codex_s_path()), "--split", "valid",
                   "--per-relation", "--device", "cpu")
    per = got["per_relation"]
    assert len(per) > 5 and sum(m["count"] for m in per.values()) == got["count"]
    assert sum(m["mrr"] * m["count"] for m in per.values()) / got["count"] == pytest.approx(got["mrr"])
    assert all(m["tail"]["count"] == m["head"]["count"] == m["count"] // 2 for m in per.values())
    assert "per_relation" not in run_json(capsys, "evaluate", str(codex_bundle.parent / "run"), str(codex_s_path()),
                                          "--split", "valid", "--device", "cpu")


def test_evaluate_limit_ranks_the_same_subset_each_time(codex_bundle, capsys):
    """--limit N: a fixed random N of the split (both directions counted), the same on every call."""
    args = ("evaluate", str(codex_bundle.parent / "run"), str(codex_s_path()), "--split", "valid", "--device", "cpu")
    some = run_json(capsys, *args, "--limit", "100")
    assert some["count"] == 200 < run_json(capsys, *args)["count"]
    assert run_json(capsys, *args, "--limit", "100") == some


def test_predict_runs_without_torch(codex_bundle, query):
    """`earl predict` and `earl export --format npy` with torch, faiss and scipy made unimportable: the edge path
    loads none of them."""
    head, relation, _ = query
    code = ("import sys; [sys.modules.__setitem__(m, None) for m in ('torch', 'faiss', 'scipy')]\n"
            "from earl_service.cli.main import main\n"
            f"assert main(['predict', {str(codex_bundle)!r}, '--head', {head!r}, '--relation', {relation!r}]) == 0\n"
            f"assert main(['export', {str(codex_bundle)!r}, '--format', 'npy', '--out', {str(codex_bundle.parent)!r}"
            " + '/tables']) == 0\n"
            "print('loaded:', sorted(m for m in ('torch', 'faiss', 'scipy') if sys.modules.get(m)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"tails of ({head}") and "loaded: []" in result.stdout
