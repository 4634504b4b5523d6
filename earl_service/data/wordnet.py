"""WordNet 3.0 in full as a knowledge graph (~117k synsets), read from its database files and split by seed.

    python -m earl_service.data.wordnet --out data/wordnet-full    # reads /usr/share/wordnet (Debian's wordnet-base)

The files are wndb(5WN)'s data.noun, data.verb, data.adj and data.adv. One entity per synset, one relation per
pointer symbol (wninput(5WN)), named as WN18 / WN18RR name them where they have a name (RELATIONS).
- Entity ids are ``<offset>-<pos>`` (``02084071-n``, Open Multilingual Wordnet's form): WN18RR's 8-digit offset
  plus the part of speech, because an offset is a byte position in one data file and the same number recurs in
  another (00001740 is `entity` in data.noun, `able` in data.adj, `breathe` in data.verb). Adjective satellites
  (ss_type s) live in data.adj and take ``-a``. Offsets are those of the files read: Debian's wordnet-base is
  rebuilt with grind and its offsets leave Princeton's (so WN18RR's) from about 00613393 in data.verb and
  01686439 in data.adj; 35,268 of WN18RR's 40,943 ids name the same synset there, every noun among them.
- A lexical pointer (source/target not 0000) relates one word of a synset to one word of another; it is kept as a
  triple between the two synsets, so it and a semantic pointer of the same symbol between them make one triple.
- Every pointer is kept, inverses included (WordNet stores both `_hypernym` and `_hyponym`, as WN18 did and
  WN18RR did not), so a held-out triple's inverse is often in train (97% of the test split's); `--no-inverses`
  leaves out the relations WN18RR removed (INVERSES), for a split that measures link prediction.
- Triples are deduplicated, shuffled by `seed`, and valid/test taken out where their entities and relation keep a
  triple in train (earl_service.data.splits, the rule of earl_service.data.synthetic).
- The folder gets train.tsv, valid.tsv, test.tsv (head<TAB>relation<TAB>tail), entities.tsv (id<TAB>first
  word<TAB>gloss, as WN18RR's is), relations.tsv (name<TAB>label) and stats.json (source files, counts, command).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from earl_service.atomic import replacing, write_json
from earl_service.data.splits import take_out, unique_triples
from earl_service.errors import ConfigError, DatasetError, EarlError
from earl_service.provenance import file_sha256, git_commit
from earl_service.version import __version__

DEFAULT_DIR = Path("/usr/share/wordnet")
POS_FILES = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}
SS_TYPES = {"n": ("n",), "v": ("v",), "a": ("a", "s"), "r": ("r",)}
# wninput(5WN)'s pointer symbols. "\" is "pertains to noun" from an adjective and "derived from adjective" from an
# adverb: one symbol, so one relation.
RELATIONS = {
    "@": "_hypernym", "~": "_hyponym", "@i": "_instance_hypernym", "~i": "_instance_hyponym",
    "#m": "_member_holonym", "%m": "_member_meronym", "#p": "_part_of", "%p": "_has_part",
    "#s": "_substance_holonym", "%s": "_substance_meronym",
    ";c": "_synset_domain_topic_of", "-c": "_member_of_domain_topic",
    ";r": "_synset_domain_region_of", "-r": "_member_of_domain_region",
    ";u": "_synset_domain_usage_of", "-u": "_member_of_domain_usage",
    "!": "_antonym", "=": "_attribute", "+": "_derivationally_related_form", "^": "_also_see",
    "&": "_similar_to", "$": "_verb_group", "*": "_entailment", ">": "_cause", "<": "_participle_of_verb",
    "\\": "_pertainym",
}
# The relations WN18RR removed as inverses of another (Dettmers et al. 2018), each with the one it inverts; the
# symmetric ones (_derivationally_related_form, _similar_to, _verb_group, _also_see, _antonym) stay, as there.
INVERSES = {
    "_hyponym": "_hypernym", "_instance_hyponym": "_instance_hypernym", "_member_holonym": "_member_meronym",
    "_part_of": "_has_part", "_substance_holonym": "_substance_meronym",
    "_member_of_domain_topic": "_synset_domain_topic_of", "_synset_domain_region_of": "_member_of_domain_region",
    "_synset_domain_usage_of": "_member_of_domain_usage",
}
_MARKER = re.compile(r"\((a|p|ip)\)$")  # an adjective's syntactic marker, "galore(ip)"


@dataclass(frozen=True)
class Synset:
    """One data line: its entity id, first word (spaces for underscores), gloss, ``(symbol, target id)`` pointers,
    and how many of them are lexical (between words)."""

    id: str
    label: str
    gloss: str
    pointers: tuple[tuple[str, str], ...]
    lexical: int


@dataclass
class WordNetGraph:
    """The synsets that take part in a triple, the relations used, and distinct integer triples."""

    entities: list[str]
    labels: list[str]
    glosses: list[str]
    relations: list[str]  # names, RELATIONS' order
    triples: np.ndarray  # (E, 3) int64, ids into entities / relations, file order
    stats: dict  # what was read: synsets, pointers (lexical, semantic), duplicates dropped


def parse_line(text: str, pos: str) -> Synset:
    """A data.<pos> line as a Synset; ValueError saying which field is wrong."""
    head, bar, gloss = text.partition("|")
    if not bar:
        raise ValueError("no '|' before the gloss")
    fields = head.split()
    if len(fields) < 7:
        raise ValueError(f"{len(fields)} fields before '|'; expected synset_offset lex_filenum ss_type w_cnt word "
                         "lex_id [word lex_id...] p_cnt [ptr...]")
    offset, _, ss_type, w_cnt = fields[:4]
    _offset(offset, "synset_offset")
    if ss_type not in SS_TYPES[pos]:
        raise ValueError(f"ss_type {ss_type!r} in {POS_FILES[pos]}; expected {' or '.join(SS_TYPES[pos])}")
    words = _number(w_cnt, "w_cnt", 16, 2)
    at = 4 + 2 * words
    if words < 1 or len(fields) <= at:
        raise ValueError(f"w_cnt {w_cnt} (hex: {words} words) leaves no p_cnt before '|'")
    count = _number(fields[at], "p_cnt", 10, 3)
    raw = fields[at + 1 : at + 1 + 4 * count]
    if len(raw) < 4 * count:
        raise ValueError(f"p_cnt {count} but {len(raw) // 4} pointers before '|'")
    pointers = [_pointer(raw[i : i + 4], words) for i in range(0, len(raw), 4)]
    _frames(fields[at + 1 + 4 * count :], pos)
    label = _MARKER.sub("", fields[4]).replace("_", " ")
    return Synset(f"{offset}-{pos}", label, " ".join(gloss.split()), tuple((s, t) for s, t, _ in pointers),
                  sum(lexical for _, _, lexical in pointers))


def _offset(text: str, field: str) -> str:
    if len(text) != 8 or not text.isdigit():
        raise ValueError(f"{field} {text!r} is not 8 decimal digits")
    return text


def _number(text: str, field: str, base: int, digits: int) -> int:
    allowed = "0123456789abcdefABCDEF" if base == 16 else "0123456789"  # int() would also take "0x1", "+1", "1_0"
    if len(text) != digits or text.strip(allowed):
        kind = "hexadecimal" if base == 16 else "decimal"
        raise ValueError(f"{field} {text!r} is not a {digits}-digit {kind} number")
    return int(text, base)


def _pointer(fields: list[str], words: int) -> tuple[str, str, bool]:
    """``pointer_symbol synset_offset pos source/target`` as (symbol, target id, lexical)."""
    symbol, offset, pos, source_target = fields
    if symbol not in RELATIONS:
        raise ValueError(f"unknown pointer symbol {symbol!r}; wninput(5WN) has {' '.join(RELATIONS)}")
    _offset(offset, f"the target offset of a {symbol!r} pointer")
    if pos not in ("n", "v", "a", "s", "r"):
        raise ValueError(f"the target pos {pos!r} of a {symbol!r} pointer is not one of n v a s r")
    source = _number(source_target, "source/target", 16, 4) >> 8
    if source > words:
        raise ValueError(f"source/target {source_target} names word {source} of a synset of {words} words")
    return symbol, f"{offset}-{'a' if pos == 's' else pos}", source_target != "0000"


def _frames(rest: list[str], pos: str) -> None:
    """data.verb's ``f_cnt + f_num w_num [+ f_num w_num...]`` between the pointers and '|'; nothing elsewhere."""
    if not rest:
        return
    if pos != "v":
        raise ValueError(f"{len(rest)} fields after the pointers ({' '.join(rest[:3])} ...); p_cnt too small?")
    frames = _number(rest[0], "f_cnt", 10, 2)
    if len(rest) != 1 + 3 * frames or any(plus != "+" for plus in rest[1::3]):
        raise ValueError(f"f_cnt {frames} but the frames read {' '.join(rest[1:])!r}; expected '+ f_num w_num' "
                         "for each")


def read_synsets(folder: Path) -> Iterator[tuple[str, int, Synset]]:
    """``(file, line, synset)`` for every data line of the four files, license lines (two spaces) skipped."""
    missing = [name for name in POS_FILES.values() if not (folder / name).is_file()]
    if not folder.is_dir() or missing:
        what = "folder not found" if not folder.is_dir() else f"no {', '.join(missing)} in the folder"
        raise DatasetError(f"WordNet {what}: {folder}; install Debian's wordnet-base (/usr/share/wordnet) or give "
                           f"--wordnet-dir the folder holding {', '.join(POS_FILES.values())}")
    for pos, name in POS_FILES.items():
        path = folder / name
        with path.open("rb") as f:
            for line, raw in enumerate(f, 1):
                if raw.startswith(b"  ") or not raw.strip():
                    continue
                try:
                    yield str(path), line, parse_line(raw.decode("utf-8"), pos)
                except UnicodeDecodeError as exc:
                    raise DatasetError(f"{path}, line {line}: not UTF-8 (byte 0x{raw[exc.start]:02x})") from None
                except ValueError as exc:
                    raise DatasetError(f"{path}, line {line}: {exc}") from None


def build_graph(folder: str | Path, *, inverses: bool = True) -> WordNetGraph:
    """Every pointer of the data files as a triple between synsets, deduplicated (inverses=False: but those of
    INVERSES' relations); DatasetError naming the file and line of a malformed line, a synset defined twice, or a
    pointer to a synset no line defines."""
    synsets: list[Synset] = []
    where: dict[str, tuple[str, int]] = {}
    for path, line, synset in read_synsets(Path(folder)):
        if synset.id in where:
            raise DatasetError(f"{path}, line {line}: synset {synset.id} again (first on line {where[synset.id][1]})")
        where[synset.id] = path, line
        synsets.append(synset)
    symbols = {symbol for s in synsets for symbol, _ in s.pointers}
    if not symbols:
        raise DatasetError(f"no pointers in the data files of {folder}: no triples to make")
    index = {s.id: i for i, s in enumerate(synsets)}
    used = [name for symbol, name in RELATIONS.items() if symbol in symbols]
    relation = {symbol: used.index(name) for symbol, name in RELATIONS.items() if name in used}
    rows = np.empty((sum(len(s.pointers) for s in synsets), 3), dtype=np.int64)
    at = 0
    for s in synsets:
        for symbol, target in s.pointers:
            if target not in index:
                path, line = where[s.id]
                raise DatasetError(f"{path}, line {line}: a {symbol!r} pointer to {target}, which no data line "
                                   "defines")
            rows[at] = index[s.id], relation[symbol], index[target]
            at += 1
    lexical = sum(s.lexical for s in synsets)
    if inverses:
        return _kept(synsets, used, rows, lexical=lexical)
    kept = [name for name in used if name not in INVERSES]
    renumber = np.array([kept.index(name) if name in kept else -1 for name in used], dtype=np.int64)
    rows = rows[renumber[rows[:, 1]] >= 0]
    rows[:, 1] = renumber[rows[:, 1]]
    return _kept(synsets, kept, rows, lexical=lexical, read=at)


def _kept(synsets: list[Synset], relations: list[str], rows: np.ndarray, *, lexical: int,
          read: int | None = None) -> WordNetGraph:
    """The graph over the synsets in some triple, numbered in file order; `read` pointers were read (default: one
    per row), of which `lexical` lexical, and those not in `rows` were inverses left out."""
    read = len(rows) if read is None else read
    triples = unique_triples(rows, len(synsets), len(relations))
    present = np.zeros(len(synsets), dtype=bool)
    present[triples[:, [0, 2]].ravel()] = True
    renumber = np.cumsum(present) - 1
    triples = np.stack([renumber[triples[:, 0]], triples[:, 1], renumber[triples[:, 2]]], 1)
    kept = [s for s, p in zip(synsets, present.tolist(), strict=True) if p]
    stats = {"synsets": len(synsets), "synsets_without_pointers": len(synsets) - len(kept), "pointers": read,
             "lexical_pointers": lexical, "semantic_pointers": read - lexical,
             "duplicates_dropped": len(rows) - len(triples),
             **({"inverse_pointers_dropped": read - len(rows)} if read != len(rows) else {})}
    return WordNetGraph([s.id for s in kept], [s.label for s in kept], [s.gloss for s in kept], relations,
                        triples, stats)


def split(graph: WordNetGraph, *, valid: int, test: int, seed: int) -> dict[str, np.ndarray]:
    """train / valid / test: the triples shuffled by `seed`, the last `valid + test` that qualify held out."""
    if valid < 0 or test < 0:
        raise ConfigError(f"--valid and --test must be >= 0 (got {valid} and {test})")
    shuffled = graph.triples[np.random.default_rng(seed).permutation(len(graph.triples))]
    train, held = take_out(shuffled, valid + test, len(graph.entities), len(graph.relations))
    if len(held) < valid + test:
        raise ConfigError(f"only {len(held):,} of the {len(graph.triples):,} triples can be held out with their "
                          f"entities and relation kept in train; asked for {valid:,} valid + {test:,} test")
    return {"train": train, "valid": held[:valid], "test": held[valid:]}


def write_folder(graph: WordNetGraph, splits: dict[str, np.ndarray], out: str | Path) -> Path:
    """train/valid/test.tsv, entities.tsv and relations.tsv in `out` (each replaced whole, atomic.replacing)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    names, relations = graph.entities, graph.relations
    for name, triples in splits.items():
        _write_lines(folder / f"{name}.tsv", (f"{names[h]}\t{relations[r]}\t{names[t]}\n"
                                              for h, r, t in triples.tolist()))
    _write_lines(folder / "entities.tsv", (f"{e}\t{label}\t{gloss}\n" for e, label, gloss
                                           in zip(names, graph.labels, graph.glosses, strict=True)))
    _write_lines(folder / "relations.tsv", (f"{r}\t{r.strip('_').replace('_', ' ')}\n" for r in relations))
    return folder


def _write_lines(path: Path, lines: Iterator[str]) -> None:
    with replacing(path) as tmp, tmp.open("w", encoding="utf-8", newline="\n") as f:
        f.writelines(lines)


def _stats(graph: WordNetGraph, splits: dict[str, np.ndarray], folder: Path, *, seed: int, seconds: float,
           argv: list[str]) -> dict:
    counts = {name: np.bincount(t[:, 1], minlength=len(graph.relations)).tolist() for name, t in splits.items()}
    return {
        "source": {"folder": str(folder), "files": {name: file_sha256(folder / name) for name in POS_FILES.values()}},
        "command": " ".join(["python -m earl_service.data.wordnet", *argv]),
        "library_version": __version__, "git_commit": git_commit(), "seed": seed, "seconds": round(seconds, 1),
        "entities": len(graph.entities), "relations": len(graph.relations), **graph.stats,
        "triples": len(graph.triples), **{name: len(t) for name, t in splits.items()},
        "per_relation": {r: {name: c[i] for name, c in counts.items()} for i, r in enumerate(graph.relations)},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m earl_service.data.wordnet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wordnet-dir", default=str(DEFAULT_DIR), help="folder of data.noun ... (default: %(default)s)")
    p.add_argument("--out", required=True, help="folder for train/valid/test.tsv, entities.tsv, relations.tsv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--valid", type=int, default=5_000, help="valid triples (default: %(default)s)")
    p.add_argument("--test", type=int, default=5_000, help="test triples (default: %(default)s)")
    p.add_argument("--no-inverses", action="store_true",
                   help="leave out the relations WN18RR removed as inverses of another (_hyponym, _part_of, ...): "
                        "otherwise most held-out triples have their inverse in train")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = p.parse_args(argv)
    start = time.perf_counter()
    try:
        graph = build_graph(a.wordnet_dir, inverses=not a.no_inverses)
        splits = split(graph, valid=a.valid, test=a.test, seed=a.seed)
        folder = write_folder(graph, splits, a.out)
        stats = _stats(graph, splits, Path(a.wordnet_dir), seed=a.seed, seconds=time.perf_counter() - start,
                       argv=argv)
        write_json(folder / "stats.json", stats)
    except (EarlError, OSError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{a.out}: {stats['entities']} entities, {stats['relations']} relations, {stats['train']} train, "
          f"{stats['valid']} valid, {stats['test']} test triples ({stats['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
