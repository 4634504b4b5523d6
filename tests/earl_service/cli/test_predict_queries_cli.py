"""`earl predict --queries FILE` answers as one `earl predict` per line; a bad line stops with its file and line
before anything is printed."""

from __future__ import annotations

import io
import json
import sys

import pytest

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main


@pytest.fixture(scope="module")
def names(codex_bundle):
    bundle = load_bundle(codex_bundle)
    return [(bundle.entities.names[h], bundle.relations.names[r], bundle.entities.names[t])
            for h, r, t in bundle.triples[7::997][:4]]


def query_file(tmp_path, names) -> tuple:
    """A query file in every form (blank lines, comments and spaces around fields too) and the one-query argv of
    each of its queries, in order."""
    lines, argvs = ["# tails, heads", ""], []
    for head, relation, tail in names:
        lines += [f"{head}\t{relation}", f" ? \t{relation}\t{tail}", f"{head}\t{relation}\t?"]
        argvs += [["--head", head, "--relation", relation], ["--tail", tail, "--relation", relation],
                  ["--head", head, "--relation", relation]]
    path = tmp_path / "queries.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path, argvs


def run(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def test_queries_answer_as_one_predict_per_line(codex_bundle, names, tmp_path, capsys):
    path, argvs = query_file(tmp_path, names)
    got = [json.loads(line) for line in run(capsys, "predict", codex_bundle, "--queries", path, "-k", 5,
                                            "--json").splitlines()]
    want = [json.loads(run(capsys, "predict", codex_bundle, *argv, "-k", 5, "--json")) for argv in argvs]
    assert got == want and len(got) == 3 * len(names)
    table = run(capsys, "predict", codex_bundle, "--queries", path, "--include-known")
    assert table == "\n".join(run(capsys, "predict", codex_bundle, *argv, "--include-known") for argv in argvs)


def test_queries_from_standard_input(codex_bundle, names, tmp_path, capsys, monkeypatch):
    path, argvs = query_file(tmp_path, names)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    got = run(capsys, "predict", codex_bundle, "--queries", "-", "--json").splitlines()
    assert [json.loads(line) for line in got] == [json.loads(run(capsys, "predict", codex_bundle, *argv, "--json"))
                                                  for argv in argvs]


@pytest.mark.parametrize(("line", "message"), [
    ("{head}", "1 tab-separated fields; give HEAD<TAB>RELATION, HEAD<TAB>RELATION<TAB>? or ?<TAB>RELATION<TAB>TAIL"),
    ("{head}\t{relation}\t{tail}\tx", "4 tab-separated fields"),
    ("{head}\t{relation}\t{tail}", "exactly one of head and tail must be '?'"),
    ("?\t{relation}", "exactly one of head and tail must be '?'"),
    ("{head}\t\t?", "the relation (second field) is missing"),
    ("\t{relation}\t?", "an empty field"),
    ("nope\t{relation}", "unknown entity 'nope'"),
    ("?\tnope\t{tail}", "unknown relation 'nope'"),
])
def test_a_bad_line_names_the_file_and_line(codex_bundle, names, tmp_path, capsys, line, message):
    head, relation, tail = names[0]
    path = tmp_path / "bad.tsv"
    path.write_text(f"# first\n{head}\t{relation}\n\n{line.format(head=head, relation=relation, tail=tail)}\n")
    assert main(["predict", str(codex_bundle), "--queries", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing answered before the bad line was found
    assert err.startswith(f"earl: error: {path}, line 4: ") and message in err


def test_a_query_file_that_is_not_text_or_empty(codex_bundle, tmp_path, capsys):
    path = tmp_path / "q.tsv"
    path.write_bytes(b"# nothing\n\n")
    assert main(["predict", str(codex_bundle), "--queries", str(path)]) == 2
    assert f"earl: error: {path}: no queries" in capsys.readouterr().err
    path.write_bytes(b"a\tb\n\xff\tb\n")
    assert main(["predict", str(codex_bundle), "--queries", str(path)]) == 2
    assert f"earl: error: {path}, line 2: not UTF-8 text" in capsys.readouterr().err
    assert main(["predict", str(codex_bundle), "--queries", str(tmp_path / "missing.tsv")]) == 2
    assert "cannot read the query file" in capsys.readouterr().err


def test_queries_exclude_head_tail_and_relation(codex_bundle, names, tmp_path, capsys):
    path, _ = query_file(tmp_path, names)
    head, relation, _ = names[0]
    with pytest.raises(SystemExit):  # argparse: --queries, --head and --tail are exclusive
        main(["predict", str(codex_bundle), "--queries", str(path), "--head", head])
    assert main(["predict", str(codex_bundle), "--queries", str(path), "--relation", relation]) == 2
    assert "--relation goes on each line of the --queries file" in capsys.readouterr().err
    assert main(["predict", str(codex_bundle), "--head", head]) == 2
    assert "--relation is required with --head or --tail" in capsys.readouterr().err
