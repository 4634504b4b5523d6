"""`earl predict --queries FILE`: many queries, one load. The file holds one query a line, tab-separated:

    HEAD<TAB>RELATION            tails of (HEAD, RELATION, ?)
    HEAD<TAB>RELATION<TAB>?      the same, as three columns
    ?<TAB>RELATION<TAB>TAIL      heads of (?, RELATION, TAIL)

Blank lines and lines starting with `#` are skipped; fields lose surrounding spaces; names are ids or labels that
name one, as for --head and --tail. The whole file is read, and every name looked up, before the first answer, so
a bad line stops the command with its file and line number and nothing printed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from earl_service.errors import AmbiguousNameError, QueryFileError, UnknownEntityError, UnknownRelationError

if TYPE_CHECKING:
    from earl_service.serve.predictor import LinkPredictor

WILDCARD = "?"
FORMS = "HEAD<TAB>RELATION, HEAD<TAB>RELATION<TAB>? or ?<TAB>RELATION<TAB>TAIL"


@dataclass(frozen=True)
class Query:
    """One line of a query file: exactly one of `head` (tails wanted) and `tail` (heads wanted)."""

    line: int
    relation: str
    head: str | None = None
    tail: str | None = None


def read_queries(path: str) -> list[Query]:
    """Every query of the file at `path` (`-`: standard input), in file order; QueryFileError names the line of the
    first one that is not one of the three forms."""
    try:
        if path == "-":
            text = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                text = f.read()
    except OSError as exc:
        raise QueryFileError(path, None, f"cannot read the query file: {exc.strerror or exc}") from None
    queries = [_parse(source(path), number, line) for number, line in _lines(source(path), text)]
    if not queries:
        raise QueryFileError(source(path), None, f"no queries: give one a line, {FORMS}")
    return queries


def source(path: str) -> str:
    """How errors name the query file."""
    return "<stdin>" if path == "-" else path


def _lines(path: str, data: bytes) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of every line that is not blank or a comment."""
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise QueryFileError(path, number, "not UTF-8 text") from None
        if line.strip() and not line.lstrip().startswith("#"):
            yield number, line


def _parse(path: str, number: int, line: str) -> Query:
    fields = [f.strip() for f in line.split("\t")]
    if len(fields) == 2:
        fields.append(WILDCARD)
    if len(fields) != 3:
        raise QueryFileError(path, number, f"{len(fields)} tab-separated fields; give {FORMS}")
    head, relation, tail = fields
    if not relation or relation == WILDCARD:
        raise QueryFileError(path, number, "the relation (second field) is missing")
    if (head == WILDCARD) == (tail == WILDCARD):
        raise QueryFileError(path, number, f"exactly one of head and tail must be {WILDCARD!r}; give {FORMS}")
    if not head or not tail:
        raise QueryFileError(path, number, f"an empty field; give {FORMS}")
    if tail == WILDCARD:
        return Query(number, relation, head=head)
    return Query(number, relation, tail=tail)


def check_names(predictor: LinkPredictor, queries: list[Query], path: str) -> None:
    """Look every name up before answering: an unknown or ambiguous one stops with its line."""
    for q in queries:
        try:
            predictor.entity_id(q.head if q.head is not None else q.tail or "")
            predictor.relation_id(q.relation)
        except (UnknownEntityError, UnknownRelationError, AmbiguousNameError) as exc:
            raise QueryFileError(source(path), q.line, str(exc)) from None


def answers(predictor: LinkPredictor, queries: list[Query], *, k: int, exclude_known: bool,
            ) -> Iterator[dict[str, Any]]:
    """Each query's answer as LinkPredictor.answer gives it (what `earl predict --json` prints for one), in order."""
    for q in queries:
        yield predictor.answer(q.relation, head=q.head, tail=q.tail, k=k, exclude_known=exclude_known)
