"""Tests for earl_service.data.dataset: triple files, vocabularies and dataset folders."""

from __future__ import annotations

import gzip
import hashlib
import pickle
from pathlib import Path

import numpy as np
import pytest

from earl_service.data import triples
from earl_service.data.dataset import load_dataset, load_triples_file
from earl_service.data.readers import text
from earl_service.data.triples import count_triples, read_table, read_triples
from earl_service.data.vocab import Vocab
from earl_service.errors import (
    DatasetError,
    EarlError,
    TripleFileError,
    TripleLimitError,
    UnknownEntityError,
    UnknownRelationError,
)

SHARED_DATASETS = Path(__file__).resolve().parents[3].parent / "shared" / "datasets"


def write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def read_error(path: Path, **kwargs) -> TripleFileError:
    with pytest.raises(TripleFileError) as info:
        read_triples(path, **kwargs)
    return info.value


# --- read_triples: accepted formats -------------------------------------------------------------------------


def test_reads_tsv_in_order(tmp_path):
    path = write(tmp_path / "train.txt", "a\tr1\tb\nb\tr2\tc\n")
    assert read_triples(path) == ([("a", "r1", "b"), ("b", "r2", "c")], 0)


def test_csv_uses_commas_and_quoted_fields(tmp_path):
    path = write(tmp_path / "train.csv", 'a,r,"Paris, France"\n"x y", r2 ,b\n')
    assert read_triples(path)[0] == [("a", "r", "Paris, France"), ("x y", "r2", "b")]


def test_gzip_tsv_and_csv(tmp_path):
    write(tmp_path / "t.tsv.gz", gzip.compress(b"a\tr\tb\n"))
    write(tmp_path / "t.csv.gz", gzip.compress(b'a,r,"b,c"\n'))
    assert read_triples(tmp_path / "t.tsv.gz")[0] == [("a", "r", "b")]
    assert read_triples(tmp_path / "t.csv.gz")[0] == [("a", "r", "b,c")]


def test_crlf_bom_blank_lines_and_whitespace(tmp_path):
    content = "\ufeff a \tr\t b\r\n\r\n  \t \nc\tr\td\r\n\n\n   \n"
    path = write(tmp_path / "train.txt", content)
    assert read_triples(path) == ([("a", "r", "b"), ("c", "r", "d")], 0)


def test_unicode_names(tmp_path):
    path = write(tmp_path / "train.txt", "São Paulo\tlocated_in\tBrasil\n東京\tr\t日本\n")
    assert read_triples(path)[0] == [("São Paulo", "located_in", "Brasil"), ("東京", "r", "日本")]


def test_duplicates_dropped_and_counted(tmp_path):
    path = write(tmp_path / "train.txt", "a\tr\tb\nb\tr\tc\na\tr\tb\n a\tr\tb \nb\tr\ta\n")
    triples, dropped = read_triples(path)
    assert triples == [("a", "r", "b"), ("b", "r", "c"), ("b", "r", "a")]
    assert dropped == 2


# --- read_triples: errors name the file and line ------------------------------------------------------------


def test_wrong_column_count_names_line(tmp_path):
    path = write(tmp_path / "train.txt", "a\tr\tb\nb\tr\tc\nc\td\n")
    err = read_error(path)
    assert (err.line, err.path) == (3, str(path))
    assert str(err) == f"{path}, line 3: expected 3 columns (head, relation, tail) separated by tabs, found 2"


def test_too_many_columns_and_space_separated_hint(tmp_path):
    assert "found 4" in str(read_error(write(tmp_path / "a.txt", "a\tr\tb\tx\n")))
    err = read_error(write(tmp_path / "b.txt", "a\tr\tb\n" * 70 + "c r d\n"))  # tabs, by the first lines
    assert err.line == 71 and "separated by spaces" in str(err)


def test_csv_wrong_column_count(tmp_path):
    err = read_error(write(tmp_path / "train.csv", "a,r,b\n\na,b\n"))
    assert err.line == 3 and "separated by commas, found 2" in str(err)


def test_empty_field_names_which(tmp_path):
    err = read_error(write(tmp_path / "train.txt", "a\tr\tb\nc\t \td\n"))
    assert err.line == 2 and "line 2: empty relation field" in str(err)
    err = read_error(write(tmp_path / "t2.txt", "\tr\tb\n"))
    assert err.line == 1 and "empty head field" in str(err)


def test_invalid_utf8_names_line_of_bad_byte(tmp_path):
    path = write(tmp_path / "train.txt", b"a\tr\tb\nc\tr\td\ne\tr\tf\ng\tr\t\xe9t\xe9\n")
    err = read_error(path)
    assert err.line == 4 and "line 4: not valid UTF-8" in str(err)


def test_nul_byte_is_binary(tmp_path):
    err = read_error(write(tmp_path / "train.txt", b"a\tr\tb\nc\tr\x00\td\n"))
    assert err.line == 2 and "NUL byte" in str(err)


def test_utf16_file_rejected(tmp_path):
    err = read_error(write(tmp_path / "train.txt", "a\tr\tb\n".encode("utf-16")))
    assert "UTF-16" in str(err)


@pytest.mark.parametrize("content", ["", "   \n\n \t \r\n", "\ufeff"])
def test_empty_or_blank_file(tmp_path, content):
    err = read_error(write(tmp_path / "train.txt", content))
    assert err.line is None and ", line" not in str(err) and "empty" in str(err)


def test_missing_file(tmp_path):
    err = read_error(tmp_path / "nope.txt")
    assert "cannot read" in str(err) and isinstance(err, EarlError)


def test_gzip_bomb_guard(tmp_path):
    path = write(tmp_path / "train.txt.gz", gzip.compress(b"a\tr\tb\n" * 10_000))
    err = read_error(path, max_bytes=1000)
    assert "decompresses to more than" in str(err)
    assert len(read_triples(path, max_bytes=100_000)[0]) == 1


def test_corrupt_gzip(tmp_path):
    err = read_error(write(tmp_path / "train.txt", b"\x1f\x8b" + b"not gzip at all"))
    assert "gzip" in str(err)


def test_error_pickles(tmp_path):
    err = pickle.loads(pickle.dumps(TripleFileError("x.txt", 3, "bad")))
    assert (str(err), err.line, err.reason) == ("x.txt, line 3: bad", 3, "bad")
    err = pickle.loads(pickle.dumps(UnknownEntityError("Pariss", ["Paris"])))
    assert str(err) == "unknown entity 'Pariss'; did you mean 'Paris'?"


# --- read_table: streaming ---------------------------------------------------------------------------------


def test_read_table_ids_and_names(tmp_path):
    path = write(tmp_path / "train.txt", "a\tr1\tb\nb\tr2\tc\na\tr1\tb\nc\tr1\ta\n")
    table = read_table(path)
    assert (table.entities, table.relations, table.duplicates, len(table)) == (["a", "b", "c"], ["r1", "r2"], 1, 3)
    assert table.ids.dtype == np.int64 and table.ids.tolist() == [[0, 0, 1], [1, 1, 2], [2, 0, 0]]
    assert table.triples() == read_triples(path)[0]


MESSY = {  # every accepted oddity at once: BOM, CRLF, blank lines, padding, duplicates far apart, non-ASCII
    "train.txt": "\ufeff a \tr\t b\r\n\r\n  \t \nSão Paulo\tin\t日本\r\n" + "x\tr\ty\n" * 9 + " a\tr\tb \n\n",
    "train.csv": '\ufeffa,r,"Paris, France"\r\n\n"multi\nline",r, b \r\n' + "x,r,y\n" * 9 + 'a, r ,"Paris, France"\n',
}


@pytest.mark.parametrize("name", MESSY)
def test_small_chunks_read_the_same(tmp_path, monkeypatch, name):
    """Chunk boundaries fall inside lines, CRLF pairs, UTF-8 sequences and quoted CSV fields: same result."""
    path = write(tmp_path / name, MESSY[name])
    whole = read_triples(path)
    for chunk in (1, 2, 3, 7):
        monkeypatch.setattr(text, "_CHUNK", chunk)
        assert read_triples(path) == whole
    assert whole[1] == 9


@pytest.mark.parametrize("content,line,fragment", [
    (b"a\tr\tb\n" * 8 + b"c\td\n", 9, "expected 3 columns"),
    (b"a\tr\tb\n" * 6 + b"c\tr\x00\td\n", 7, "NUL byte"),
    (b"a\tr\tb\n" * 7 + b"g\tr\t\xe9t\xe9\n", 8, "(byte 0xe9 at byte column 5)"),
    (b"a\tr\tb\n" * 5 + b"a\tr\tb\n\n\t\tb\n", 8, "empty head field"),
])
def test_errors_past_the_first_chunk_name_their_line(tmp_path, monkeypatch, content, line, fragment):
    monkeypatch.setattr(text, "_CHUNK", 10)
    err = read_error(write(tmp_path / "train.txt", content))
    assert err.line == line and fragment in str(err)


def test_line_without_a_break_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(text, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(text, "_CHUNK", 100)
    err = read_error(write(tmp_path / "train.txt.gz", gzip.compress(b"a\tr\tb\n" + b"x" * 5000)))
    assert err.line == 2 and "no line break in 1000 bytes" in str(err)


def test_csv_of_empty_fields_has_no_triples(tmp_path):
    err = read_error(write(tmp_path / "train.csv", ',,\n"","",""\n'))
    assert err.line is None and "has no triples" in str(err)


def test_bulk_and_line_by_line_parsing_agree(tmp_path):
    """Clean chunks are split in bulk; padded ones line by line: the same table either way."""
    clean = "".join(f"e{i % 7}\tr{i % 3}\te{i % 5}\n" for i in range(60))
    padded = clean.replace("\t", " \t").replace("\n", "\u00a0\r\n")  # a no-break space is stripped too
    a, b = read_table(write(tmp_path / "a.txt", clean)), read_table(write(tmp_path / "b.txt", padded))
    assert (a.entities, a.relations, a.ids.tolist(), a.duplicates) == (b.entities, b.relations, b.ids.tolist(),
                                                                       b.duplicates)
    inner = read_triples(write(tmp_path / "c.txt", "New\u00a0York\tr\tx y\ne\u200dz\tr\tb\n"))[0]
    assert inner == [("New\u00a0York", "r", "x y"), ("e\u200dz", "r", "b")]  # inner whitespace is kept


def test_keys_widen_as_the_vocabulary_grows(tmp_path, monkeypatch):
    """Packed keys start narrow here, so every new power of two of entities re-keys what is kept."""
    path = write(tmp_path / "train.txt", "".join(f"e{i % 37}\tr{i % 5}\te{i * 7 % 41}\n" for i in range(400)))
    expected = read_table(path)
    monkeypatch.setattr(triples, "_ENTITY_BITS", 1)
    monkeypatch.setattr(text, "_CHUNK", 64)
    table = read_table(path)
    assert (table.entities, table.ids.tolist(), table.duplicates) == (expected.entities, expected.ids.tolist(),
                                                                      expected.duplicates)
    with pytest.raises(TripleFileError, match="too many distinct names to index"):
        triples._key_bits(path, 2**27 + 1, 1024)  # 27 + 27 + 10 bits: more than one int64 holds


# --- count_triples: the upload check's reader ---------------------------------------------------------------


@pytest.mark.parametrize("name", MESSY)
def test_count_triples_counts_as_read_table_reads(tmp_path, monkeypatch, name):
    path = write(tmp_path / name, MESSY[name])
    table = read_table(path)
    for chunk in (3, 1 << 20):
        monkeypatch.setattr(text, "_CHUNK", chunk)
        counts = count_triples(path)
        assert (counts.triples, counts.duplicates) == (len(table), table.duplicates)
        assert counts.longest_name == max(map(len, table.entities + table.relations))


@pytest.mark.parametrize("content", ["a\tr\tb\nc\td\n", "a\tr\tb\n\t\tb\n", b"a\tr\tb\n\xe9\tr\tb\n", "", " \n"])
def test_count_triples_refuses_as_read_table(tmp_path, content):
    path = write(tmp_path / "train.txt", content)
    expected = read_error(path)
    with pytest.raises(TripleFileError) as info:
        count_triples(path)
    assert (str(info.value), info.value.line) == (str(expected), expected.line)


def test_count_triples_stops_at_its_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(text, "_CHUNK", 64)
    path = write(tmp_path / "train.txt", "".join(f"e{i}\tr\te{i + 1}\n" for i in range(100)) + "bad line\n")
    with pytest.raises(TripleLimitError) as info:
        count_triples(path, max_triples=10)  # refused before the bad line is reached
    assert info.value.limit == 10 and str(info.value) == f"{path}: has more than 10 distinct triples (max_triples=10)"
    assert isinstance(info.value, TripleFileError)
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)
    with pytest.raises(TripleFileError, match="line 101: expected 3 columns"):
        count_triples(path, max_triples=100)


def test_read_table_stops_at_the_same_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(text, "_CHUNK", 64)
    path = write(tmp_path / "train.txt", "".join(f"e{i}\tr\te{i + 1}\n" for i in range(100)) + "bad line\n")
    with pytest.raises(TripleLimitError) as info:
        read_table(path, max_triples=10)  # refused before the bad line is reached
    assert str(info.value) == f"{path}: has more than 10 distinct triples (max_triples=10)"
    table = read_table(write(tmp_path / "ok.txt", "a\tlong_relation\tb\na\tlong_relation\tb\n"), max_triples=1)
    assert len(table) == 1 and table.longest_name() == len("long_relation")


# --- Vocab --------------------------------------------------------------------------------------------------


def test_vocab_lookups():
    vocab = Vocab(["Paris", "London", "Berlin"])
    assert len(vocab) == 3 and vocab.names == ["Paris", "London", "Berlin"]
    assert vocab.id("London") == 1 and vocab.name(2) == "Berlin"
    assert vocab.ids(["Berlin", "Paris"]).tolist() == [2, 0]
    assert vocab.ids(["Berlin"]).dtype == np.int64
    assert "Paris" in vocab and "Rome" not in vocab
    with pytest.raises(IndexError):
        vocab.name(3)
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(["a", "b", "a"])


def test_vocab_unknown_name_errors_suggest():
    vocab = Vocab(["Paris", "London", "Berlin"])
    with pytest.raises(UnknownEntityError) as info:
        vocab.id("Pariss")
    assert str(info.value) == "unknown entity 'Pariss'; did you mean 'Paris'?"
    assert isinstance(info.value, KeyError) and info.value.suggestions == ["Paris"]
    with pytest.raises(UnknownRelationError, match="unknown relation 'capital'"):
        Vocab(["capital_of"], kind="relation").ids(["capital"])


def test_vocab_suggest_large():
    names = [f"/m/0{i:05x}" for i in range(40_000)] + ["Barack_Obama", "Michelle_Obama"]
    vocab = Vocab(names)
    assert vocab.suggest("Barak_Obama")[0] == "Barack_Obama"
    assert vocab.suggest("barack_obama")[0] == "Barack_Obama"
    assert vocab.suggest("xarack_Obama")[0] == "Barack_Obama"  # first-letter typo: found via suffix order
    assert vocab.suggest("/m/001234x")[0] == "/m/001234"
    assert vocab.suggest("zzzzzzzzzzzzzzz") == []


# --- load_dataset -------------------------------------------------------------------------------------------


def make_dataset(folder: Path) -> Path:
    folder.mkdir()
    write(folder / "train.txt", "a\tr1\tb\nb\tr2\tc\nc\tr1\ta\nb\tr2\tc\n")
    write(folder / "valid.tsv", "a\tr1\tx\ny\tr2\tb\n")
    write(folder / "test.csv.gz", gzip.compress(b"z,r1,a\nx,r3,a\nb,r1,c\n"))
    return folder


def test_load_dataset(tmp_path):
    ds = load_dataset(make_dataset(tmp_path / "kg"))
    assert ds.entities.names == ["a", "b", "c", "x", "y", "z"]
    assert ds.relations.names == ["r1", "r2"]
    assert (ds.num_train_entities, ds.num_entities, ds.num_relations) == (3, 6, 2)
    assert ds.train.dtype == np.int64 and ds.train.tolist() == [[0, 0, 1], [1, 1, 2], [2, 0, 0]]
    assert ds.valid.tolist() == [[0, 0, 3], [4, 1, 1]]
    assert ds.test.tolist() == [[5, 0, 0], [1, 0, 2]]  # x r3 a dropped: r3 is not in train
    assert ds.stats["train"]["duplicates_dropped"] == 1
    assert ds.stats["test"]["unknown_relation_dropped"] == 1
    assert ds.stats["test"]["triples"] == 2 and ds.stats["test"]["triples_read"] == 3
    assert [ds.stats[s]["new_entities"] for s in ("train", "valid", "test")] == [3, 2, 1]
    assert ds.seen_mask(ds.valid).tolist() == [False, False]
    assert ds.seen_mask(ds.test).tolist() == [False, True]
    assert ds.seen_mask(ds.train).all()
    assert ds.split("test") is ds.test


def test_entity_ids_follow_name_order_whatever_the_file_order(tmp_path):
    rows = ["e10\tr\te9", "Q100\tr\tQ42", "e9\tr\tb", "a7\tr\ta07"]
    for n, order in enumerate((rows, rows[::-1])):
        folder = tmp_path / f"kg{n}"
        folder.mkdir()
        write(folder / "train.txt", "\n".join(order) + "\n")
        write(folder / "valid.txt", "e2\tr\tzz\naa\tr\te9\n")
        ds = load_dataset(folder)
        # digit runs by value, then code points ("Q" < "a"), then the name itself where values tie ("a07", "a7")
        assert ds.entities.names == ["Q42", "Q100", "a07", "a7", "b", "e9", "e10", "aa", "e2", "zz"]
        assert ds.num_train_entities == 7  # entities first seen in valid come after train's, in name order too
        names = ds.entities.names
        assert {f"{names[h]}\tr\t{names[t]}" for h, _, t in ds.train.tolist()} == set(rows)


def test_entities_only_in_dropped_triples_get_no_id(tmp_path):
    folder = tmp_path / "kg"
    folder.mkdir()
    write(folder / "train.txt", "a\tr1\tb\n")
    write(folder / "test.txt", "q\tr9\ta\nb\tr1\tz\nq\tr9\ta\n")
    ds = load_dataset(folder)
    assert ds.entities.names == ["a", "b", "z"] and ds.test.tolist() == [[1, 0, 2]]
    sha256 = hashlib.sha256((folder / "test.txt").read_bytes()).hexdigest()
    assert ds.stats["test"] == {"file": str(folder / "test.txt"), "format": "tsv", "sha256": sha256, "triples_read": 3,
                                "duplicates_dropped": 1, "unknown_relation_dropped": 1, "triples": 1,
                                "new_entities": 1}


def test_unknown_relation_dropped_is_logged(tmp_path, caplog):
    folder = make_dataset(tmp_path / "kg")
    with caplog.at_level("WARNING", logger="earl_service.data.dataset"):
        load_dataset(folder)
    assert "dropped 1 triples whose relation is not in train" in caplog.text and "'r3'" in caplog.text


def test_missing_split(tmp_path):
    folder = tmp_path / "kg"
    folder.mkdir()
    write(folder / "train.txt.gz", gzip.compress(b"a\tr\tb\n"))
    ds = load_dataset(folder)
    assert ds.valid is None and ds.test is None and len(ds.train) == 1
    with pytest.raises(DatasetError, match="no valid split"):
        ds.split("valid")
    with pytest.raises(DatasetError, match="unknown split"):
        ds.split("dev")


def test_missing_train_or_folder(tmp_path):
    folder = tmp_path / "kg"
    folder.mkdir()
    write(folder / "test.txt", "a\tr\tb\n")
    with pytest.raises(DatasetError, match="no train file") as info:
        load_dataset(folder)
    assert str(folder) in str(info.value) and "train.csv.gz" in str(info.value)
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(tmp_path / "absent")


def test_bad_split_file_names_file_and_line(tmp_path):
    folder = make_dataset(tmp_path / "kg")
    write(folder / "valid.tsv", "a\tr1\tb\nbroken line\n")
    with pytest.raises(TripleFileError, match=r"valid\.tsv, line 2: expected 3 columns"):
        load_dataset(folder)


# --- load_triples_file --------------------------------------------------------------------------------------


def test_load_triples_file_new_entities(tmp_path):
    entities, relations = Vocab(["a", "b"]), Vocab(["r1", "r2"], kind="relation")
    path = write(tmp_path / "extra.txt", "a\tr2\tnew1\nnew2\tr1\tnew1\nb\tr1\ta\n")
    ids, new = load_triples_file(path, entities, relations, allow_new_entities=True)
    assert new == ["new1", "new2"]
    assert ids.dtype == np.int64 and ids.tolist() == [[0, 1, 2], [3, 0, 2], [1, 0, 0]]
    assert len(entities) == 2  # the vocabulary passed in is not modified


def test_load_triples_file_errors_name_line(tmp_path):
    entities, relations = Vocab(["a", "b"]), Vocab(["born_in", "r2"], kind="relation")
    path = write(tmp_path / "extra.txt", "a\tr2\tb\n\nb\tborn_inn\ta\n")
    with pytest.raises(TripleFileError) as info:
        load_triples_file(path, entities, relations, allow_new_entities=True)
    assert info.value.line == 3
    assert "line 3: unknown relation 'born_inn'; did you mean 'born_in'?" in str(info.value)

    path = write(tmp_path / "extra2.txt", "a\tr2\tb\nb\tr2\tc\n")
    with pytest.raises(TripleFileError, match=r"line 2: unknown entity 'c'.*not allowed"):
        load_triples_file(path, entities, relations, allow_new_entities=False)


# --- real data ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not (SHARED_DATASETS / "codex-s").is_dir(), reason="shared CoDEx-S copy not available")
def test_codex_s():
    ds = load_dataset(SHARED_DATASETS / "codex-s")
    assert ds.num_train_entities == 2034 and ds.num_entities == 2034
    assert ds.num_relations == 42
    assert ds.train.shape == (32888, 3) and ds.test.shape == (1828, 3) and ds.valid.shape == (1827, 3)
    assert ds.train[:, [0, 2]].max() == 2033 and ds.train[:, 1].max() == 41
    assert ds.entities.name(int(ds.train[0, 0])) == "Q7604" and ds.relations.names[0] == "P1412"


def test_the_training_entities_are_the_datasets_own_vocabulary_when_every_entity_trains():
    """A bundle's entities: the dataset's vocabulary itself when train holds every entity (no 5M-name copy a
    compress slice), else the prefix of ids that train holds, in order."""
    from earl_service.data.dataset import Dataset

    train = np.array([[0, 0, 1], [1, 0, 2]])
    every = Dataset(entities=Vocab(["a", "b", "c"]), relations=Vocab(["r"], kind="relation"), num_train_entities=3,
                    train=train)
    assert every.train_entities() is every.entities
    some = Dataset(entities=Vocab(["a", "b", "c", "d"]), relations=Vocab(["r"], kind="relation"),
                   num_train_entities=3, train=train, valid=np.array([[0, 0, 3]]))
    assert some.train_entities().names == ["a", "b", "c"] and len(some.entities) == 4
