"""Triple readers: a file's format from its content (gzip, Parquet, RDF or delimited text), then its triples.

Every reader streams ``(fields, counts)`` batches (report.Batch) into data.py's table builder, and fills a
ReadReport on the way: the format, a skipped header line, dropped literals and entity labels (RDF). Errors are
TripleFileErrors naming the file and the line (Parquet: the row).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from earl_service.config import DataConfig
from earl_service.data.readers import columnar, rdf, text
from earl_service.data.readers.report import Batch, ReadReport, Triple

# Names a split file may have (train.nt.gz, valid.parquet, ...); the name never decides how it is read.
SPLIT_SUFFIXES = tuple(f"{s}{gz}" for s in (".txt", ".tsv", ".csv", ".nt", ".nq", ".ttl", ".parquet")
                       for gz in ("", ".gz"))
_SNIFF_BYTES = 1 << 16


def detect(path: Path, max_bytes: int) -> str:
    """"parquet", "nt", "nq", "ttl" or "text" (delimited), from the file's first bytes (decompressed); the name
    only settles what the content leaves open (Turtle of full IRIs reads as N-Triples, a garbled first
    statement of a .nt file)."""
    head = text.head_bytes(path, max_bytes, _SNIFF_BYTES)
    if head.startswith(columnar.PARQUET_MAGIC):
        return "parquet"
    suffix = Path(path.name.lower().removesuffix(".gz")).suffix
    if suffix == ".ttl":
        return "ttl"
    sample = head[: head.rfind(b"\n") + 1 or len(head)].decode("utf-8", errors="replace")
    return rdf.sniff(sample) or {".nt": "nt", ".nq": "nq"}.get(suffix, "text")


def batches(path: Path, *, max_bytes: int, data: DataConfig, report: ReadReport) -> Iterator[Batch]:
    """The file's triples as batches, in file order."""
    kind = detect(path, max_bytes)
    if kind == "parquet":
        return columnar.parquet_batches(path, max_bytes, data, report)
    if kind in ("nt", "nq", "ttl"):
        return rdf.batches(path, max_bytes, report, kind)
    return text.batches(path, max_bytes, data, report)


def records(path: Path, *, max_bytes: int, data: DataConfig) -> Iterator[tuple[int | None, Triple]]:
    """``(line or row, triple)`` one at a time, for finding where a triple is (None where unknown: Turtle)."""
    kind = detect(path, max_bytes)
    report = ReadReport()
    if kind in ("nt", "nq", "ttl"):
        return rdf.records(path, max_bytes, report, kind)
    if kind == "parquet":
        return _rows(columnar.parquet_batches(path, max_bytes, data, report))
    return text.records(path, max_bytes, data)


def _rows(batches: Iterator[Batch]) -> Iterator[tuple[int | None, Triple]]:
    row = 1
    for flat, _ in batches:
        for i in range(0, len(flat), 3):
            yield row, (flat[i], flat[i + 1], flat[i + 2])
            row += 1


def is_blank(path: Path, max_bytes: int) -> bool:
    """Whether the file holds nothing but whitespace (for "is empty" rather than "has no triples")."""
    return detect(path, max_bytes) == "text" and text.is_blank(path, max_bytes)


__all__ = ["SPLIT_SUFFIXES", "Batch", "ReadReport", "Triple", "batches", "detect", "is_blank", "records"]
