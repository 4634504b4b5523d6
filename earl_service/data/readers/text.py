"""Delimited triple files (tab, comma, semicolon, pipe or whitespace), plain or gzip, streamed a chunk at a time."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import logging
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import chain, islice, repeat
from pathlib import Path

import numpy as np

from earl_service.config import DataConfig
from earl_service.data.readers.report import Batch, ReadReport, Triple, size_text
from earl_service.errors import TripleFileError

log = logging.getLogger("earl_service.data.readers")

GZIP_MAGIC = b"\x1f\x8b"
# Far above any real line; it stops a file without line breaks (a gzip of one endless "line") from being held whole.
MAX_LINE_BYTES = 16 * 2**20
_CHUNK = 1 << 20
_BATCH = 1 << 16  # records per batch on the record-by-record paths
_SAMPLE_LINES = 64  # lines the delimiter and header are guessed from
_FIELDS = ("head", "relation", "tail")
DELIMITERS = {"\t": "tabs", ",": "commas", ";": "semicolons", "|": "pipes", " ": "whitespace"}  # " ": any run of it
# Header cells naming a column's role; a first row of three distinct roles is a header.
ROLES = {
    "head": ("head", "h", "subject", "s", "sub", "source", "src", "from", "head_id", "subject_id"),
    "relation": ("relation", "r", "rel", "predicate", "p", "pred", "property", "relation_id", "edge", "type"),
    "tail": ("tail", "t", "object", "o", "obj", "target", "dst", "to", "tail_id", "object_id"),
}
_ROLE_OF = {name: role for role, names in ROLES.items() for name in names}


def blocks(path: Path, max_bytes: int) -> Iterator[bytes]:
    """The file's bytes about _CHUNK at a time, decompressed if it starts with gzip's magic bytes (whatever its
    name), with a guard against gzip bombs."""
    try:
        with path.open("rb") as raw:
            gz = raw.read(2) == GZIP_MAGIC
            raw.seek(0)
            with gzip.GzipFile(fileobj=raw) if gz else nullcontext(raw) as f:
                total = 0
                while block := f.read(_CHUNK):
                    total += len(block)
                    if gz and total > max_bytes:
                        raise TripleFileError(
                            path, None, f"decompresses to more than {size_text(max_bytes)} (max_bytes={max_bytes}); "
                            "refusing to read it (possible gzip bomb)")
                    yield block
    except (OSError, EOFError, zlib.error) as e:
        if isinstance(e, OSError) and e.strerror:  # the OS failed to open or read it
            raise TripleFileError(path, None, f"cannot read file: {e.strerror}") from e
        raise TripleFileError(path, None, f"not a valid gzip file: {e}") from e


def head_bytes(path: Path, max_bytes: int, n: int = 4096) -> bytes:
    """The first ``n`` bytes of the file's content (decompressed)."""
    out = b""
    for block in blocks(path, max_bytes):
        out += block
        if len(out) >= n:
            break
    return out[:n]


def _decode(path: Path, data: bytes, first_line: int) -> str:
    """``data`` (whole lines, the first numbered ``first_line``) as text; a NUL byte or bad UTF-8 names its line."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise TripleFileError(path, first_line + data.count(b"\n", 0, nul), "contains a NUL byte; looks like a "
                              "binary file, not a text file of triples")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        column = e.start - data.rfind(b"\n", 0, e.start)
        raise TripleFileError(path, first_line + data.count(b"\n", 0, e.start), f"not valid UTF-8 (byte "
                              f"0x{data[e.start]:02x} at byte column {column}); save the file as UTF-8") from None


def _unmarked(path: Path, start: bytes) -> bytes:
    """The file's first lines without a UTF-8 byte-order mark; a UTF-16 one is refused."""
    if start.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise TripleFileError(path, None, "is encoded as UTF-16; save it as UTF-8")
    return start.removeprefix(codecs.BOM_UTF8)


def text_chunks(path: Path, max_bytes: int) -> Iterator[tuple[int, str]]:
    """``(number of its first line, text)`` for runs of whole lines of about _CHUNK bytes: the file, streamed.

    Only one chunk (or one unfinished line, at most MAX_LINE_BYTES) is held at a time.
    """
    lineno, pending, pending_len = 1, [b""], 0
    for block in blocks(path, max_bytes):
        cut = block.rfind(b"\n") + 1
        if not cut:  # still inside one line
            pending.append(block)
            pending_len += len(block)
            if pending_len > MAX_LINE_BYTES:
                raise TripleFileError(path, lineno, f"no line break in {size_text(MAX_LINE_BYTES)}; expected one "
                                      "head, relation, tail per line")
            continue
        data = b"".join((*pending, block[:cut]))
        pending, pending_len = [block[cut:]], len(block) - cut
        yield lineno, _decode(path, _unmarked(path, data) if lineno == 1 else data, lineno)
        lineno += data.count(b"\n")
    if pending_len:
        data = b"".join(pending)
        yield lineno, _decode(path, _unmarked(path, data) if lineno == 1 else data, lineno)


# ---------------------------------------------------------------- what the first lines say: delimiter, header


@dataclass(frozen=True)
class Layout:
    """How a delimited file's rows read: the delimiter, the header line to skip (0: none) and where head,
    relation and tail stand in a row."""

    delimiter: str
    header_line: int
    order: tuple[int, int, int]  # positions of (head, relation, tail)

    @property
    def separated_by(self) -> str:
        return DELIMITERS[self.delimiter]


def _split(text: str, delimiter: str) -> list[list[str]]:
    """The non-blank rows of ``text`` (whole lines) split by ``delimiter``; quoted fields for , ; and |."""
    if delimiter == "\t":
        return [line.split("\t") for line in text.splitlines() if line.strip()]
    if delimiter == " ":
        return [line.split() for line in text.splitlines() if line.strip()]
    try:
        rows = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, skipinitialspace=True)
        return [row for row in rows if row and (len(row) > 1 or row[0].strip())]
    except csv.Error:
        return []


def _delimiter(sample: str) -> str:
    """The delimiter under which the most sample rows have three fields; tab first among equals.

    Whitespace only where no character delimiter gives a single three-field row: in a tab- or comma-separated
    file, names with spaces stay whole and a row missing a field is an error, not a re-split into three words.
    """
    scores = {d: sum(len(row) == 3 for row in _split(sample, d)) for d in DELIMITERS if d != " "}
    best = max(scores, key=lambda d: scores[d])  # max keeps the first of equals: DELIMITERS' order
    return best if scores[best] else " "


def _roles(row: list[str]) -> tuple[int, int, int] | None:
    """The positions of (head, relation, tail) if ``row`` is a header naming all three, else None."""
    roles = [_ROLE_OF.get(cell.strip().strip('"').casefold().replace(" ", "_")) for cell in row]
    if len(row) != 3 or None in roles or len(set(roles)) != 3:
        return None
    return roles.index("head"), roles.index("relation"), roles.index("tail")


def _first_row(sample: str, first_line: int, delimiter: str) -> tuple[int, list[str]] | None:
    for offset, line in enumerate(sample.split("\n")):
        if line.strip():
            rows = _split(line, delimiter)
            return first_line + offset, rows[0] if rows else []
    return None


def sniff_layout(path: Path, sample: str, data: DataConfig) -> Layout:
    """The file's layout from its first lines (``sample``, starting at line 1) and the user's overrides."""
    delimiter = _delimiter(sample)
    first = _first_row(sample, 1, delimiter)
    roles = _roles(first[1]) if first else None
    header = data.header if data.header is not None else roles is not None
    order = data.order
    if header and first and roles and data.columns == DataConfig.columns:  # the header says where each column is
        order = roles
    if header and first:
        log.info("%s: line %d is a header (%s); skipped%s", path, first[0], ", ".join(first[1]),
                 "" if data.header else " (--no-header reads it as a triple)")
    return Layout(delimiter, first[0] if header and first else 0, order)


def _sampled(chunks: Iterator[tuple[int, str]]) -> tuple[str, Iterator[tuple[int, str]]]:
    """The first _SAMPLE_LINES lines (or fewer) of the streamed text, and the stream again, from its start."""
    taken: list[tuple[int, str]] = []
    lines = 0
    for chunk in chunks:
        taken.append(chunk)
        lines += chunk[1].count("\n")
        if lines >= _SAMPLE_LINES:
            break
    text = "".join(t for _, t in taken)
    sample = "\n".join(text.split("\n", _SAMPLE_LINES)[:_SAMPLE_LINES])
    return sample, chain(taken, chunks)


# ---------------------------------------------------------------- rows into triples


class BadRow(ValueError):
    """A malformed row; whoever knows its line number turns it into a TripleFileError."""


_SPACES = re.compile(r"\s+")


def fields(parts: list[str], layout: Layout) -> Triple | None:
    """The stripped ``(head, relation, tail)`` of a row split into fields, None for a blank row."""
    if len(parts) == 3:
        h, r, t = (parts[i].strip() for i in layout.order)
        if h and r and t:
            return h, r, t
        if not (h or r or t):
            return None
        missing = next(f for f, v in zip(_FIELDS, (h, r, t), strict=True) if not v)
        raise BadRow(f"empty {missing} field")
    if not any(p.strip() for p in parts):
        return None
    spaces = len(parts) == 1 and len(_SPACES.split(parts[0].strip())) == 3
    hint = " (the fields seem to be separated by spaces)" if spaces else ""
    raise BadRow(f"expected 3 columns (head, relation, tail) separated by {layout.separated_by}, found "
                 f"{len(parts)}{hint}")


def _lines(chunks: Iterable[tuple[int, str]], header_line: int) -> Iterator[tuple[int, list[str]]]:
    for first, text in chunks:
        for lineno, line in enumerate(text.split("\n"), first):
            if lineno != header_line:
                yield lineno, line.split("\t")


def _whitespace_rows(chunks: Iterable[tuple[int, str]], header_line: int) -> Iterator[tuple[int, list[str]]]:
    for first, text in chunks:
        for lineno, line in enumerate(text.split("\n"), first):
            if lineno != header_line:
                yield lineno, line.split()


def _csv_rows(path: Path, chunks: Iterable[tuple[int, str]], layout: Layout) -> Iterator[tuple[int, list[str]]]:
    # Chunks end at "\n", so splitting each on its own yields the lines of the whole text, "\r" endings included.
    lines = (line for _, text in chunks for line in io.StringIO(text, newline=""))
    reader = csv.reader(lines, delimiter=layout.delimiter, skipinitialspace=True)
    try:
        for row in reader:
            if reader.line_num != layout.header_line:
                yield reader.line_num, row
    except csv.Error as e:
        raise TripleFileError(path, reader.line_num, f"malformed CSV: {e}") from None


def _rows(path: Path, chunks: Iterable[tuple[int, str]], layout: Layout) -> Iterator[tuple[int, list[str]]]:
    if layout.delimiter == "\t":
        return _lines(chunks, layout.header_line)
    if layout.delimiter == " ":
        return _whitespace_rows(chunks, layout.header_line)
    return _csv_rows(path, chunks, layout)


def _checked(path: Path, rows: Iterable[tuple[int, list[str]]], layout: Layout) -> Iterator[tuple[int, Triple]]:
    for lineno, parts in rows:
        try:
            triple = fields(parts, layout)
        except BadRow as e:
            raise TripleFileError(path, lineno, str(e)) from None
        if triple:
            yield lineno, triple


def _opened(path: Path, max_bytes: int, data: DataConfig) -> tuple[Layout, Iterator[tuple[int, str]]]:
    sample, chunks = _sampled(text_chunks(path, max_bytes))
    return sniff_layout(path, sample, data), chunks


def records(path: Path, max_bytes: int, data: DataConfig) -> Iterator[tuple[int, Triple]]:
    """``(line_number, (head, relation, tail))`` for every non-blank line, streaming and validating."""
    layout, chunks = _opened(path, max_bytes, data)
    return _checked(path, _rows(path, chunks, layout), layout)


# ---------------------------------------------------------------- the fast path: tab-separated, in bulk


def _bulk_fields(lines: list[str]) -> list[str] | None:
    """The fields of distinct non-blank TSV lines, head, relation, tail, head, ...; None unless every line is three
    tab-separated fields without whitespace (the line-by-line parser then strips, validates and reports)."""
    if set(map(str.count, lines, repeat("\t"))) != {2}:
        return None
    joined = "\t".join(lines)
    parts = joined.split("\t")
    # Printable and space-free means no whitespace at all (every other whitespace character is unprintable).
    clean = all(parts) and " " not in joined and "".join(parts).isprintable()
    return parts if clean else None


def _line_fields(path: Path, first: int, lines: list[str], seen: Counter, layout: Layout) -> Batch:
    """The ``(fields, counts)`` of a chunk parsed line by line, for padded fields, blank or malformed lines; the
    first bad line (by first appearance) is reported."""
    out: list[str] = []
    counts: list[int] = []
    for line, count in seen.items():  # in order of first appearance
        try:
            triple = fields(line.split("\t"), layout)
        except BadRow as e:
            raise TripleFileError(path, first + lines.index(line), str(e)) from None
        if triple:
            out.extend(triple)
            counts.append(count)
    return out, np.array(counts, dtype=np.int64)


def _reordered(flat: list[str], order: tuple[int, int, int]) -> list[str]:
    if order == (0, 1, 2):
        return flat
    out = flat.copy()
    for role, column in enumerate(order):
        out[role::3] = flat[column::3]
    return out


def _tsv_batches(path: Path, chunks: Iterable[tuple[int, str]], layout: Layout) -> Iterator[Batch]:
    """Per chunk, ``(fields, counts)``: its distinct lines' triples as a flat list of names and how often each line
    occurs, so a line repeated within a chunk is parsed once, whatever its count."""
    for first, text in chunks:
        if "\r" in text:  # CRLF: the "\r" would be stripped from the tail anyway; line numbers stay the same
            text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        if first <= layout.header_line < first + len(lines):
            lines[layout.header_line - first] = ""
        seen = Counter(lines)
        seen.pop("", None)
        flat = _bulk_fields(list(seen))
        if flat is None:
            yield _line_fields(path, first, lines, seen, layout)
        else:
            yield _reordered(flat, layout.order), np.fromiter(seen.values(), dtype=np.int64, count=len(seen))


def batches(path: Path, max_bytes: int, data: DataConfig, report: ReadReport) -> Iterator[Batch]:
    """The file's triples as ``(fields, counts)`` batches (see _tsv_batches); other delimiters go record by record."""
    layout, chunks = _opened(path, max_bytes, data)
    report.format = "tsv" if layout.delimiter == "\t" else f"text ({layout.separated_by})"
    report.header_line = layout.header_line or None
    if layout.delimiter == "\t":
        yield from _tsv_batches(path, chunks, layout)
        return
    triples = (triple for _, triple in _checked(path, _rows(path, chunks, layout), layout))
    while batch := list(islice(triples, _BATCH)):
        yield [name for triple in batch for name in triple], np.ones(len(batch), dtype=np.int64)


def is_blank(path: Path, max_bytes: int) -> bool:
    return all(not text.strip() for _, text in text_chunks(path, max_bytes))
