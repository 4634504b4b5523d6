"""Tests for earl_service.data.readers: formats told by content, delimiters, headers, column orders, RDF and tables."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest

from earl_service.config import DataConfig
from earl_service.data.dataset import Dataset, load_dataset
from earl_service.data.triples import read_table, read_triples
from earl_service.errors import ConfigError, DatasetError, TripleFileError

TRIPLES = [("a", "r1", "b"), ("b", "r2", "c"), ("c", "r1", "a")]


def write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def lines(triples, sep: str) -> str:
    return "".join(sep.join(t) + "\n" for t in triples)


# --- delimited text -----------------------------------------------------------------------------------------


def test_header_csv_is_skipped_with_a_notice(tmp_path, caplog):
    path = write(tmp_path / "train.csv", "head,relation,tail\n" + lines(TRIPLES, ","))
    with caplog.at_level(logging.INFO, logger="earl_service.data.readers"):
        table = read_table(path)
    assert table.triples() == TRIPLES and table.report.header_line == 1
    assert "line 1 is a header (head, relation, tail); skipped" in caplog.text


def test_header_can_be_forced_either_way(tmp_path):
    path = write(tmp_path / "train.csv", "head,relation,tail\n" + lines(TRIPLES, ","))
    assert read_triples(path, data=DataConfig(header=False))[0] == [("head", "relation", "tail"), *TRIPLES]
    odd = write(tmp_path / "odd.csv", "from_node,kind,to_node\n" + lines(TRIPLES, ","))  # names not recognised
    assert read_triples(odd)[0][0] == ("from_node", "kind", "to_node")
    assert read_triples(odd, data=DataConfig(header=True))[0] == TRIPLES


def test_header_names_give_the_column_order(tmp_path):
    path = write(tmp_path / "train.csv", "subject,object,predicate\n" + lines([(h, t, r) for h, r, t in TRIPLES], ","))
    assert read_triples(path)[0] == TRIPLES


@pytest.mark.parametrize("sep", [";", "|", "\t", " ", "  \t "])
def test_delimiters_are_sniffed(tmp_path, sep):
    assert read_triples(write(tmp_path / "train.txt", lines(TRIPLES, sep)))[0] == TRIPLES


def test_semicolon_csv_with_quotes(tmp_path):
    path = write(tmp_path / "train.csv", 'a;r;"Paris; France"\n"x y";r2;b\n')
    table = read_table(path)
    assert table.triples() == [("a", "r", "Paris; France"), ("x y", "r2", "b")]
    assert table.report.format == "text (semicolons)"


def test_tab_separated_file_named_csv(tmp_path):
    path = write(tmp_path / "train.csv", lines([("New York", "in", "United States"), *TRIPLES], "\t"))
    assert read_triples(path)[0] == [("New York", "in", "United States"), *TRIPLES]


def test_gzip_named_txt(tmp_path):
    path = write(tmp_path / "train.txt", gzip.compress(lines(TRIPLES, "\t").encode()))
    assert read_triples(path)[0] == TRIPLES
    plain = write(tmp_path / "plain.txt.gz", lines(TRIPLES, ","))  # a .gz name on a plain file
    assert read_triples(plain)[0] == TRIPLES


@pytest.mark.parametrize("sep", ["\t", ","])
def test_columns_h_t_r(tmp_path, sep):
    path = write(tmp_path / "train.txt", lines([(h, t, r) for h, r, t in TRIPLES], sep))
    assert read_triples(path, data=DataConfig(columns="h,t,r"))[0] == TRIPLES
    # Rows "a,b,r1" read as relation, head, tail: (b, a, r1).
    assert read_triples(path, data=DataConfig(columns="r,h,t"))[0] == [(t, h, r) for h, r, t in TRIPLES]


def test_columns_must_be_an_order_of_h_r_t():
    with pytest.raises(ConfigError, match="columns must be one of"):
        DataConfig(columns="h,h,t")


def test_a_bad_line_names_the_delimiter_it_was_read_with(tmp_path):
    err = _error(write(tmp_path / "train.txt", lines(TRIPLES, ";") + "a;b\n"))
    assert err.line == 4 and "separated by semicolons, found 2" in str(err)


def test_load_dataset_takes_the_data_config(tmp_path):
    folder = tmp_path / "kg"
    folder.mkdir()
    write(folder / "train.csv", "h,t,r\n" + lines([(h, t, r) for h, r, t in TRIPLES], ","))
    write(folder / "valid.tsv.gz", gzip.compress(b"a\tr2\tc\n"))
    ds = load_dataset(folder)
    assert ds.relations.names == ["r1", "r2"] and ds.stats["train"]["header_line"] == 1
    assert ds.stats["valid"]["format"] == "tsv" and len(ds.valid) == 1


def _error(path: Path, **kwargs) -> TripleFileError:
    with pytest.raises(TripleFileError) as info:
        read_table(path, **kwargs)
    return info.value


# --- RDF ----------------------------------------------------------------------------------------------------

EX = "http://example.org/"
NT = f"""# a comment
<{EX}a> <{EX}knows> <{EX}b> .
<{EX}a> <http://www.w3.org/2000/01/rdf-schema#label> "Alice"@en .
<{EX}b> <http://www.w3.org/2004/02/skos/core#prefLabel> "Bob" .
<{EX}b> <{EX}age> "42"^^<http://www.w3.org/2001/XMLSchema#integer> .
_:n1 <{EX}knows> <{EX}a> .
<{EX}b> <{EX}knows> _:n1 .
"""


def test_n_triples_literals_dropped_blank_nodes_stable_labels_kept(tmp_path):
    pytest.importorskip("rdflib")
    path = write(tmp_path / "train.nt", NT)
    table = read_table(path)
    triples = table.triples()
    blank = triples[1][0]
    assert blank.startswith("_:") and triples == [(f"{EX}a", f"{EX}knows", f"{EX}b"), (blank, f"{EX}knows", f"{EX}a"),
                                                  (f"{EX}b", f"{EX}knows", blank)]
    assert table.report.literals_dropped == 3 and table.report.format == "N-Triples"
    assert table.report.labels == {f"{EX}a": "Alice", f"{EX}b": "Bob"}
    assert read_table(path).triples()[1][0] == blank  # the same id on every read
    other = write(tmp_path / "valid.nt", NT)
    assert read_table(other).triples()[1][0] != blank  # blank nodes are local to their file


def test_n_triples_gzipped_and_in_a_dataset(tmp_path):
    pytest.importorskip("rdflib")
    folder = tmp_path / "kg"
    folder.mkdir()
    write(folder / "train.nt.gz", gzip.compress(NT.encode()))
    ds = load_dataset(folder)
    assert ds.stats["train"]["literals_dropped"] == 3 and len(ds.train) == 3
    assert ds.labels.entities == {f"{EX}a": "Alice", f"{EX}b": "Bob"} and ds.stats["labels"]["entities"] == 2
    assert not load_dataset(folder, labels=False).labels


def test_rdf_labels_fill_in_where_the_label_files_give_none(tmp_path):
    """One Dataset.labels: a label file beside the triples wins; RDF labels the rest, predicates included."""
    pytest.importorskip("rdflib")
    folder = tmp_path / "kg"
    folder.mkdir()
    write(folder / "train.nt", NT + f'<{EX}knows> <http://www.w3.org/2000/01/rdf-schema#label> "knows" .\n')
    write(folder / "entities.tsv", f"{EX}a\tAlice Liddell\n")
    labels = load_dataset(folder).labels
    assert labels.entities == {f"{EX}a": "Alice Liddell", f"{EX}b": "Bob"}
    assert labels.relations == {f"{EX}knows": "knows"}


def test_n_quads_graph_names_ignored(tmp_path):
    pytest.importorskip("rdflib")
    path = write(tmp_path / "train.nq", f'<{EX}a> <{EX}r> <{EX}b> <{EX}g1> .\n<{EX}b> <{EX}r> <{EX}c> <{EX}g2> .\n'
                                        f'<{EX}c> <{EX}name> "C" <{EX}g1> .\n')
    table = read_table(path)
    assert table.report.format == "N-Quads" and table.report.literals_dropped == 1
    assert table.triples() == [(f"{EX}a", f"{EX}r", f"{EX}b"), (f"{EX}b", f"{EX}r", f"{EX}c")]


def test_turtle_with_labels_and_blank_nodes(tmp_path):
    pytest.importorskip("rdflib")
    ttl = f"""@prefix ex: <{EX}> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
ex:a ex:knows ex:b ; rdfs:label "Alice"@en, "Alicia"@es .
ex:b rdfs:label "Bob" ; ex:knows [ ex:knows ex:a ] .
"""
    path = write(tmp_path / "train.ttl", ttl)
    table = read_table(path)
    assert table.report.format == "Turtle" and table.report.labels == {f"{EX}a": "Alice", f"{EX}b": "Bob"}
    assert table.report.literals_dropped == 3
    triples = sorted(table.triples())
    assert len(triples) == 3 and (f"{EX}a", f"{EX}knows", f"{EX}b") in triples
    blank = next(t[0] for t in triples if t[0].startswith("_:"))
    assert sorted(read_table(path).triples()) == triples and (f"{EX}b", f"{EX}knows", blank) in triples


def test_rdf_errors_name_file_and_line(tmp_path):
    pytest.importorskip("rdflib")
    err = _error(write(tmp_path / "train.nt", f"<{EX}a> <{EX}r> <{EX}b> .\n<{EX}a> <{EX}r> .\n"))
    assert err.line == 2 and "not valid N-Triples" in str(err) and "train.nt, line 2" in str(err)
    err = _error(write(tmp_path / "bad.ttl", f"@prefix ex: <{EX}> .\nex:a ex:r ex:b .\nex:a ex:r .\n"))
    assert err.line == 3 and "not valid Turtle" in str(err)


# --- Parquet, Arrow, DataFrames -----------------------------------------------------------------------------


def test_parquet_by_name_and_by_order(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    heads, rels, tails = (list(x) for x in zip(*TRIPLES, strict=True))
    named = tmp_path / "train.parquet"
    pq.write_table(pa.table({"tail": tails, "head": heads, "relation": rels}), named, row_group_size=2)
    table = read_table(named)
    assert table.triples() == TRIPLES and table.report.format == "Parquet"
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": heads, "y": tails, "z": rels}), plain)
    assert read_triples(plain, data=DataConfig(columns="h,t,r"))[0] == TRIPLES
    ints = tmp_path / "ints.parquet"  # integer ids are read as their text
    pq.write_table(pa.table({"h": [1, 2], "r": [7, 7], "t": [2, 3]}), ints)
    assert read_triples(ints)[0] == [("1", "7", "2"), ("2", "7", "3")]


def test_parquet_gzipped_named_anything(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    source = tmp_path / "src.parquet"
    pq.write_table(pa.table({"head": ["a"], "relation": ["r"], "tail": ["b"]}), source)
    path = write(tmp_path / "train.txt", gzip.compress(source.read_bytes()))
    assert read_triples(path)[0] == [("a", "r", "b")]


def test_parquet_errors_name_the_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"head": ["a", "b", "c"], "relation": ["r", None, "r"], "tail": ["b", "c", "d"]}), path,
                   row_group_size=1)
    err = _error(path)
    assert (err.line, err.unit) == (2, "row") and str(err) == f"{path}, row 2: empty relation value"
    err = _error(write(tmp_path / "cut.parquet", path.read_bytes()[:-20]))
    assert err.line is None and "cut.parquet" in str(err)


def test_dataset_from_dataframe_arrow_and_tuples():
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    frame = pd.DataFrame(TRIPLES, columns=["subject", "predicate", "object"])
    ds = Dataset.from_triples(frame, valid=pa.table({"s": ["a"], "p": ["r2"], "o": ["c"]}),
                              test=[("c", "r2", "new")])
    assert ds.entities.names == ["a", "b", "c", "new"] and ds.relations.names == ["r1", "r2"]
    assert ds.train.tolist() == [[0, 0, 1], [1, 1, 2], [2, 0, 0]] and ds.num_train_entities == 3
    assert ds.valid.tolist() == [[0, 1, 2]] and ds.stats["test"]["new_entities"] == 1
    chosen = Dataset.from_triples(pd.DataFrame({"x": ["b"], "y": ["a"], "z": ["r"]}), columns=("y", "z", "x"))
    assert chosen.entities.names == ["a", "b"]


def test_dataset_from_triples_errors_name_split_and_row():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"head": ["a", "b"], "relation": ["r", "r"], "tail": ["b", None]})
    with pytest.raises(TripleFileError, match=r"<train DataFrame>, row 2: empty tail value"):
        Dataset.from_triples(frame)
    with pytest.raises(TripleFileError, match=r"<valid list>, row 2: expected \(head, relation, tail\)"):
        Dataset.from_triples([("a", "r", "b")], valid=[("a", "r", "b"), ("a", "r")])
    with pytest.raises(TripleFileError, match="columns must name 3"):
        Dataset.from_triples(frame, columns=("head", "relation", "nope"))


def test_dataset_from_triples_reads_paths_too(tmp_path):
    path = write(tmp_path / "train.csv", lines(TRIPLES, ","))
    assert Dataset.from_triples(str(path)).train.shape == (3, 3)


def test_plain_n_triples_lines_read_as_rdflib_reads_them(tmp_path):
    """Plain `<iri> <iri> <iri> .` lines skip rdflib; escaped or odd ones go through it: the same triples."""
    rdflib = pytest.importorskip("rdflib")
    text = (f"<{EX}a> <{EX}r> <{EX}b> .\n<{EX}b>\t<{EX}r>  <{EX}c>.\r\n  <{EX}c> <{EX}r> <{EX}d> . # note\n"
            f"<{EX}caf\\u00E9> <{EX}r> <{EX}a> .\n")
    path = write(tmp_path / "train.nt", text)
    graph = rdflib.Graph().parse(data=text, format="nt")
    assert sorted(read_triples(path)[0]) == sorted((str(s), str(p), str(o)) for s, p, o in graph)
    assert (f"{EX}café", f"{EX}r", f"{EX}a") in read_triples(path)[0]


def test_without_the_extra_a_clear_error_says_which_to_install(tmp_path, monkeypatch, capsys):
    import builtins

    from earl_service.cli.main import main

    real_import = builtins.__import__

    def no_rdflib(name, *args, **kwargs):
        if name.split(".")[0] in ("rdflib", "pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rdflib)
    (tmp_path / "kg").mkdir()
    write(tmp_path / "kg" / "train.nt", NT)
    assert main(["train", str(tmp_path / "kg"), "--out", str(tmp_path / "run"), "--steps", "1"]) == 2
    assert "needs rdflib: pip install 'earl-service[rdf]'" in capsys.readouterr().err
    with pytest.raises(DatasetError, match=r"earl-service\[parquet\]"):
        Dataset.from_triples(_FakeFrame())


class _FakeFrame:
    iloc = None  # looks like a DataFrame to from_triples
