"""RDF triple files through rdflib (the `rdf` extra): N-Triples and N-Quads line by line, Turtle as a whole graph.

IRIs are the ids; a blank node gets ``_:`` + a hash of the file's name and its label (stable across runs);
triples with a literal object are dropped and counted, and rdfs:label / skos:prefLabel literals become entity
labels. N-Quads' graph names are ignored: every quad is a triple of the one graph.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.data.readers.report import Batch, ReadReport, Triple
from earl_service.data.readers.text import blocks, text_chunks
from earl_service.errors import DatasetError, TripleFileError

_BATCH = 1 << 16
LABEL_PREDICATES = ("http://www.w3.org/2000/01/rdf-schema#label", "http://www.w3.org/2004/02/skos/core#prefLabel")
# A first statement line of N-Triples or N-Quads: an IRI or blank node, an IRI, then anything up to the final dot.
_STATEMENT = re.compile(r"^\s*(<[^>\s]*>|_:\S+)\s+<[^>\s]*>\s+.+\.\s*$")
_TURTLE_START = re.compile(r"^\s*(@prefix|@base|prefix\s|base\s)", re.IGNORECASE)
# The common statement, three IRIs without escapes, read without rdflib (several times faster); any other line,
# and any line with a backslash, goes through rdflib's parser.
_IRI = r"<([^<>\s\\\"{}|^`:]+:[^<>\s\\\"{}|^`]*)>"  # an absolute IRI (a scheme, a colon) without escapes
_PLAIN = re.compile(rf"{_IRI}[ \t]+{_IRI}[ \t]+{_IRI}[ \t]*\.[ \t]*\r?")


def rdflib_module() -> Any:
    try:
        import rdflib
    except ImportError:  # a DatasetError: the command line and the API say it as they say any bad input
        raise DatasetError("reading RDF (N-Triples, N-Quads, Turtle) needs rdflib: "
                           "pip install 'earl-service[rdf]'") from None
    return rdflib


def sniff(sample: str) -> str | None:
    """"nt", "nq" or "ttl" if the first statement of ``sample`` is one, else None (a delimited file)."""
    for line in sample.split("\n"):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if _TURTLE_START.match(stripped):
            return "ttl"
        if not _STATEMENT.match(stripped):
            return None
        return "nq" if _terms(stripped) == 4 else "nt"
    return None


def _terms(line: str) -> int:
    """How many terms the statement ``line`` holds (3 for N-Triples, 4 for N-Quads), literals as one."""
    rest = re.sub(r'"(?:[^"\\]|\\.)*"(@[A-Za-z0-9-]+|\^\^<[^>]*>)?', '"L"', line.rstrip().removesuffix("."))
    return len(rest.split())


class _StableBNodes(dict):
    """rdflib's blank-node context (label -> id), answering every label with a hash of file name and label."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.prefix = f"{path.name}\0"

    def get(self, label: str, default: Any = None) -> str:
        return hashlib.sha256((self.prefix + label).encode()).hexdigest()[:16]


class _Collector:
    """The sink both line parsers feed: keeps the last statement as names, counts literals, collects labels."""

    def __init__(self, rdflib: Any, report: ReadReport) -> None:
        self.rdflib, self.report = rdflib, report
        self.last: Triple | None = None
        self.default_context = self
        self._weak_labels: set[str] = set()  # labels in a language other than English, replaced by an English one

    def get_context(self, _graph: Any) -> _Collector:
        return self

    def add(self, triple: tuple[Any, Any, Any]) -> None:
        self.triple(*triple)

    def triple(self, s: Any, p: Any, o: Any) -> None:
        if isinstance(o, self.rdflib.Literal):
            self.report.literals_dropped += 1
            self.last = None
            if str(p) in LABEL_PREDICATES:
                self._label(name(self.rdflib, s), o)
            return
        self.last = (name(self.rdflib, s), str(p), name(self.rdflib, o))

    def _label(self, entity: str, literal: Any) -> None:
        english = literal.language is None or literal.language.lower().startswith("en")
        labels = self.report.labels
        if entity not in labels or (english and entity in self._weak_labels):
            labels[entity] = str(literal)
            (self._weak_labels.discard if english else self._weak_labels.add)(entity)


def name(rdflib: Any, term: Any) -> str:
    """An IRI as itself, a blank node as ``_:`` + its (already stable) id."""
    return f"_:{term}" if isinstance(term, rdflib.BNode) else str(term)


def line_records(path: Path, max_bytes: int, report: ReadReport, kind: str) -> Iterator[tuple[int, Triple]]:
    """``(line_number, triple)`` for every statement of an N-Triples (``kind`` "nt") or N-Quads ("nq") file whose
    object is not a literal; streamed a chunk of lines at a time."""
    rdflib = rdflib_module()
    from rdflib.plugins.parsers.nquads import NQuadsParser
    from rdflib.plugins.parsers.ntriples import ParseError, W3CNTriplesParser

    sink = _Collector(rdflib, report)
    parser = (NQuadsParser if kind == "nq" else W3CNTriplesParser)(sink)
    context = _StableBNodes(path)
    what = "N-Quads" if kind == "nq" else "N-Triples"
    plain = _PLAIN.fullmatch if kind == "nt" else lambda _: None
    for first, text in text_chunks(path, max_bytes):
        for lineno, line in enumerate(text.split("\n"), first):
            if (match := plain(line)) is not None:
                yield lineno, (match[1], match[2], match[3])
                continue
            parser.line = line.rstrip("\r")
            sink.last = None
            try:
                parser.parseline(bnode_context=context)
            except ParseError as exc:
                raise TripleFileError(path, lineno, f"not valid {what}: {str(exc)[:200]}") from None
            if sink.last is not None:
                yield lineno, sink.last


def _turtle_graph(path: Path, max_bytes: int) -> Any:
    """The whole file parsed by rdflib (Turtle cannot be read a line at a time), blank nodes renamed canonically."""
    rdflib = rdflib_module()
    from rdflib.compare import to_canonical_graph

    data = b"".join(blocks(path, max_bytes))
    graph = rdflib.Graph()
    try:
        graph.parse(data=data, format="turtle")
    except Exception as exc:  # rdflib's BadSyntax and the errors its term constructors raise
        line = getattr(exc, "lines", None)
        why = getattr(exc, "_why", None) or str(exc).split("\n")[0]
        raise TripleFileError(path, None if line is None else line + 1, f"not valid Turtle: {why}") from None
    if any(isinstance(term, rdflib.BNode) for triple in graph for term in triple):
        graph = to_canonical_graph(graph)  # rdflib names blank nodes at random; canonical names are stable
    return graph


def turtle_records(path: Path, max_bytes: int, report: ReadReport) -> Iterator[tuple[None, Triple]]:
    rdflib = rdflib_module()
    sink = _Collector(rdflib, report)
    stable = _StableBNodes(path)
    for s, p, o in _turtle_graph(path, max_bytes):
        s, o = (rdflib.BNode(stable.get(str(t))) if isinstance(t, rdflib.BNode) else t for t in (s, o))
        sink.last = None
        sink.triple(s, p, o)
        if sink.last is not None:
            yield None, sink.last


def records(path: Path, max_bytes: int, report: ReadReport, kind: str) -> Iterator[tuple[int | None, Triple]]:
    if kind == "ttl":
        return turtle_records(path, max_bytes, report)
    return line_records(path, max_bytes, report, kind)


def batches(path: Path, max_bytes: int, report: ReadReport, kind: str) -> Iterator[Batch]:
    report.format = {"nt": "N-Triples", "nq": "N-Quads", "ttl": "Turtle"}[kind]
    triples = (triple for _, triple in records(path, max_bytes, report, kind))
    while batch := list(islice(triples, _BATCH)):
        yield [n for triple in batch for n in triple], np.ones(len(batch), dtype=np.int64)
