"""The WordNet builder on a few real-format data lines (no wordnet-base needed): ids, relations, labels, errors."""

import json
import re

import numpy as np
import pytest

from earl_service.data.dataset import load_dataset
from earl_service.data.wordnet import build_graph, main, split
from earl_service.errors import ConfigError, DatasetError

LICENSE = ("  1 This software and database is being provided to you, the LICENSEE, by  \n"
           "  2 Princeton University under the following license.  By obtaining, using  \n")
# WordNet 3.0 lines (Debian's wordnet-base), their pointers cut down to these synsets and p_cnt set to match. Offset
# 00001740 is a synset in three files; "acid" has w_cnt 0c (hex: 12 words); breathing <-> breathe is two lexical
# pointers each way (words 1 and 3 of breathe) and so one triple each way; able -> ability is a semantic and a
# lexical pointer of different symbols (two triples).
DATA = {
    "data.noun": [
        "00001740 03 n 01 entity 0 002 ~ 00001930 n 0000 ~ 02675657 n 0000 | that which is perceived or known or "
        "inferred to have its own distinct existence (living or nonliving)",
        "00001930 03 n 01 physical_entity 0 001 @ 00001740 n 0000 | an entity that has physical existence",
        "00831191 04 n 01 breathing 0 003 @ 00001930 n 0000 + 00001740 v 0101 + 00001740 v 0103 | the bodily process "
        "of inhalation and exhalation",
        "02675657 06 n 0c acid 0 back_breaker 0 battery-acid 0 dose 1 dot 0 Elvis 0 loony_toons 0 "
        "Lucy_in_the_sky_with_diamonds 0 pane 2 superman 0 window_pane 0 Zen 0 001 @ 00001740 n 0000 | street name "
        "for lysergic acid diethylamide",
        "05616246 09 n 01 ability 0 001 = 00001740 a 0000 | the quality of being able to perform",
    ],
    "data.verb": [
        "00001740 29 v 04 breathe 0 take_a_breath 0 respire 0 suspire 3 003 + 00831191 n 0101 + 00831191 n 0301 "
        "$ 00002325 v 0000 02 + 02 00 + 08 00 | draw air into, and expel out of, the lungs",
        "00002325 29 v 01 respire 1 001 $ 00001740 v 0000 01 + 02 00 | undergo the biomedical and metabolic "
        "processes of respiration",
    ],
    "data.adj": [
        "00001740 00 a 01 able 0 003 = 05616246 n 0000 + 05616246 n 0101 ! 00002098 a 0101 | (usually followed by "
        "`to') having the necessary means or skill or know-how or authority to do something",
        "00002098 00 a 01 unable 0 001 ! 00001740 a 0101 | (usually followed by `to') not having the necessary means",
        "00024619 00 s 02 used_to(p) 0 wont_to(p) 0 001 & 00001740 a 0000 | in the habit; \"I am used to "
        "hitchhiking\"",
    ],
    "data.adv": [
        "00185172 02 r 04 competently 0 aptly 0 ably 0 capably 0 001 \\ 00001740 a 0301 | with competence; in a "
        "competent capable manner",
    ],
}
TRIPLES = {
    ("00001740-n", "_hyponym", "00001930-n"), ("00001740-n", "_hyponym", "02675657-n"),
    ("00001930-n", "_hypernym", "00001740-n"), ("00831191-n", "_hypernym", "00001930-n"),
    ("00831191-n", "_derivationally_related_form", "00001740-v"), ("02675657-n", "_hypernym", "00001740-n"),
    ("05616246-n", "_attribute", "00001740-a"),
    ("00001740-v", "_derivationally_related_form", "00831191-n"), ("00001740-v", "_verb_group", "00002325-v"),
    ("00002325-v", "_verb_group", "00001740-v"),
    ("00001740-a", "_attribute", "05616246-n"), ("00001740-a", "_derivationally_related_form", "05616246-n"),
    ("00001740-a", "_antonym", "00002098-a"), ("00002098-a", "_antonym", "00001740-a"),
    ("00024619-a", "_similar_to", "00001740-a"), ("00185172-r", "_pertainym", "00001740-a"),
}


def write_wordnet(folder, data=DATA):
    folder.mkdir(exist_ok=True)
    for name, lines in data.items():
        (folder / name).write_text(LICENSE + "".join(f"{line}  \n" for line in lines), encoding="ascii")
    return folder


def with_line(name: str, index: int, line: str) -> dict:
    """DATA with line `index` of `name` replaced (or appended, index len(...))."""
    data = {k: list(v) for k, v in DATA.items()}
    data[name][index:index + 1] = [line]
    return data


def named(graph) -> set[tuple[str, str, str]]:
    return {(graph.entities[h], graph.relations[r], graph.entities[t]) for h, r, t in graph.triples.tolist()}


def test_every_pointer_becomes_a_triple_between_synsets_deduplicated(tmp_path):
    graph = build_graph(write_wordnet(tmp_path / "wn"))
    assert named(graph) == TRIPLES
    assert len(graph.triples) == len(TRIPLES)  # distinct rows
    assert graph.relations == ["_hypernym", "_hyponym", "_antonym", "_attribute", "_derivationally_related_form",
                               "_similar_to", "_verb_group", "_pertainym"]  # RELATIONS' order, only those used
    assert graph.entities[:3] == ["00001740-n", "00001930-n", "00831191-n"]  # file order
    assert {"00001740-n", "00001740-v", "00001740-a"} <= set(graph.entities)
    assert graph.stats == {"synsets": 11, "synsets_without_pointers": 0, "pointers": 18, "lexical_pointers": 8,
                           "semantic_pointers": 10, "duplicates_dropped": 2}


def test_labels_are_the_first_word_without_its_marker_and_the_gloss(tmp_path):
    graph = build_graph(write_wordnet(tmp_path / "wn"))
    labels = dict(zip(graph.entities, zip(graph.labels, graph.glosses, strict=True), strict=True))
    assert labels["00001930-n"] == ("physical entity", "an entity that has physical existence")
    assert labels["02675657-n"] == ("acid", "street name for lysergic acid diethylamide")
    assert labels["00024619-a"] == ("used to", 'in the habit; "I am used to hitchhiking"')


def test_a_synset_without_pointers_is_left_out(tmp_path):
    data = with_line("data.adv", 1, "00001740 02 r 01 a_cappella 0 000 | without musical accompaniment")
    graph = build_graph(write_wordnet(tmp_path / "wn", data))
    assert "00001740-r" not in graph.entities and graph.stats["synsets_without_pointers"] == 1
    assert named(graph) == TRIPLES


def test_the_folder_loads_with_labels_and_every_held_out_name_in_train(tmp_path):
    out = tmp_path / "out"
    assert main(["--wordnet-dir", str(write_wordnet(tmp_path / "wn")), "--out", str(out), "--valid", "2",
                 "--test", "2", "--seed", "1"]) == 0
    ds = load_dataset(out)
    assert (ds.num_entities, ds.num_train_entities, ds.num_relations) == (11, 11, 8)
    assert (len(ds.train), len(ds.valid), len(ds.test)) == (12, 2, 2)
    assert {k: v["new_entities"] + v["unknown_relation_dropped"] for k, v in ds.stats.items() if k != "labels"} == {
        "train": 11, "valid": 0, "test": 0}
    rows = np.concatenate([ds.train, ds.valid, ds.test])
    assert {(ds.entities.names[h], ds.relations.names[r], ds.entities.names[t]) for h, r, t in rows.tolist()} == TRIPLES
    assert ds.stats["labels"] == {"entities": 11, "relations": 8, "ignored": 0}
    assert ds.labels.entities["00001740-v"] == "breathe" and ds.labels.relations["_verb_group"] == "verb group"
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["entities"], stats["triples"], stats["train"], stats["valid"], stats["test"]) == (11, 16, 12, 2, 2)
    assert stats["command"].endswith("--seed 1") and set(stats["source"]["files"]) == set(DATA)


def test_the_split_is_fixed_by_the_seed(tmp_path):
    graph = build_graph(write_wordnet(tmp_path / "wn"))
    first, again = (split(graph, valid=2, test=2, seed=0) for _ in range(2))
    assert all(np.array_equal(first[k], again[k]) for k in first)
    others = [split(graph, valid=2, test=2, seed=s)["valid"] for s in range(1, 6)]
    assert any(not np.array_equal(first["valid"], v) for v in others)
    with pytest.raises(ConfigError, match="can be held out"):
        split(graph, valid=10, test=10, seed=0)


@pytest.mark.parametrize(("name", "index", "line", "message"), [
    ("data.noun", 1, "00001930 03 n 01 physical_entity 0 002 @ 00001740 n 0000 | an entity", "p_cnt 2 but 1 pointers"),
    ("data.noun", 3, "02675657 06 n 12 acid 0 dose 1 001 @ 00001740 n 0000 | street name", "leaves no p_cnt"),
    ("data.noun", 1, "00001930 03 n 01 physical_entity 0 001 @ 00001740 n 0000 an entity", "no '|'"),
    ("data.noun", 1, "00001930 03 n 01 physical_entity 0 001 ?? 00001740 n 0000 | an entity", "unknown pointer symbol"),
    ("data.noun", 1, "00001930 03 n 01 physical_entity 0 001 @ 00001740 n 0x00 | an entity", "source/target '0x00'"),
    ("data.noun", 1, "00001930 03 n 01 physical_entity 0 001 + 00001740 v 0201 | an entity", "names word 2 of"),
    ("data.noun", 1, "00001930 03 v 01 physical_entity 0 001 @ 00001740 n 0000 | an entity", "ss_type 'v'"),
    ("data.adj", 1, "00002098 00 a 01 unable 0 001 ! 00001740 a 0101 01 + 02 00 | not able", "fields after"),
    ("data.verb", 1, "00002325 29 v 01 respire 1 001 $ 00001740 v 0000 02 + 02 00 | undergo", "f_cnt 2"),
    ("data.adv", 0, "00185172 02 r 01 ably 0 001 \\ 00009999 a 0101 | with competence", "no data line defines"),
    ("data.adv", 1, "00001930 02 r 01 physical_entity | a gloss", "fields before '|'"),
])
def test_a_malformed_line_is_named_by_file_and_line(tmp_path, capsys, name, index, line, message):
    folder = write_wordnet(tmp_path / "wn", with_line(name, index, line))
    where = f"{folder / name}, line {index + 3}: "  # after the two license lines
    with pytest.raises(DatasetError) as caught:
        build_graph(folder)
    assert str(caught.value).startswith(where) and message in str(caught.value)
    assert main(["--wordnet-dir", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m earl_service.data.wordnet: error: " + where) and "Traceback" not in err


def test_a_synset_defined_twice_is_refused(tmp_path):
    folder = write_wordnet(tmp_path / "wn", with_line("data.verb", 2, DATA["data.verb"][1]))
    with pytest.raises(DatasetError, match=r"data\.verb, line 5: synset 00002325-v again \(first on line 4\)"):
        build_graph(folder)


def test_a_missing_folder_or_file_is_named(tmp_path, capsys):
    with pytest.raises(DatasetError, match=f"WordNet folder not found: {re.escape(str(tmp_path / 'none'))};.*wordnet-base"):
        build_graph(tmp_path / "none")
    folder = write_wordnet(tmp_path / "wn")
    (folder / "data.adv").unlink()
    with pytest.raises(DatasetError, match="no data.adv in the folder"):
        build_graph(folder)
    assert main(["--wordnet-dir", str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2
    assert "WordNet folder not found" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_no_inverses_leaves_out_the_relations_wn18rr_removed(tmp_path, capsys):
    graph = build_graph(write_wordnet(tmp_path / "wn"), inverses=False)
    assert named(graph) == {t for t in TRIPLES if t[1] != "_hyponym"}  # symmetric relations stay, as in WN18RR
    assert "_hyponym" not in graph.relations and "_hypernym" in graph.relations
    assert graph.stats["pointers"] == 18 and graph.stats["inverse_pointers_dropped"] == 2
    assert main(["--wordnet-dir", str(tmp_path / "wn"), "--out", str(tmp_path / "out"), "--no-inverses",
                 "--valid", "1", "--test", "1"]) == 0
    held = load_dataset(tmp_path / "out")
    assert "_hyponym" not in held.relations.names
