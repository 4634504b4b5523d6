"""What every reader yields and reports: batches of triples, and what it found on the way (format, header, labels)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from earl_service.errors import TripleFileError

Triple = tuple[str, str, str]
# A batch: names flat (head0, relation0, tail0, head1, ...) and how often each triple occurred, shape (n,).
Batch = tuple[list[str], np.ndarray]


@dataclass
class ReadReport:
    """What a reader found besides the triples: the format it read, a header line it skipped, literal objects it
    dropped (RDF) and entity labels (RDF rdfs:label / skos:prefLabel, id -> label); ``sha256`` is filled by
    whoever needs it (load_dataset: the file's, for a run's provenance)."""

    format: str = ""
    header_line: int | None = None
    literals_dropped: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    sha256: str | None = None


def size_text(n: int) -> str:
    """``n`` bytes for a message: 512 bytes, 1.5 KiB, 16 MiB, 2 GiB."""
    if n < 1024:
        return f"{n} bytes"
    exp = min(3, (n.bit_length() - 1) // 10)
    return f"{n / 1024**exp:.4g} {('KiB', 'MiB', 'GiB')[exp - 1]}"


def row_error(where: str | Path, exc: ValueError) -> TripleFileError:
    """A table reader's ValueError as a TripleFileError naming ``where`` and, for "row N: reason", the row."""
    text = str(exc)
    number, _, reason = text.removeprefix("row ").partition(": ")
    if text.startswith("row ") and number.isdigit():
        return TripleFileError(where, int(number), reason, unit="row")
    return TripleFileError(where, None, text)
