"""Entity and relation labels: read from the files beside the triples (TSV or CoDEx-style JSON), errors by line."""

from __future__ import annotations

import codecs
import json
import logging
import os
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from earl_service.errors import LabelFileError
from earl_service.safe_json import parse_json

log = logging.getLogger(__name__)

# Labels are for people: a name of a thing, not its description (which the label readers leave out of bundles).
MAX_LABEL_CHARS = 1000
MAX_LABEL_BYTES = 4 * MAX_LABEL_CHARS  # UTF-8

PathLike = str | os.PathLike[str]
Kind = Literal["entities", "relations"]
KINDS: tuple[Kind, ...] = ("entities", "relations")
# Where read_labels looks, first found wins: the benchmarks' TSV, then CoDEx's JSON (relations.en.json).
FILE_NAMES = {kind: (f"{kind}.tsv", f"{kind}.en.json", f"{kind}.json") for kind in KINDS}
MAX_LINE_BYTES = 1 << 20  # a TSV line with its description; far above WordNet's longest gloss (5 KB)
# A JSON label file is parsed whole (several times its size in memory), so its size is bounded; TSV streams.
MAX_JSON_BYTES = 64 << 20


@dataclass(frozen=True)
class Labels:
    """Readable labels by entity and relation id (only ids with one); descriptions are not kept (see docs).

    ``ignored`` counts the labels read for ids that are not in the graph (left out).
    """

    entities: dict[str, str] = field(default_factory=dict)
    relations: dict[str, str] = field(default_factory=dict)
    ignored: int = 0

    def __bool__(self) -> bool:
        return bool(self.entities or self.relations)

    def stats(self) -> dict[str, int]:
        return {"entities": len(self.entities), "relations": len(self.relations), "ignored": self.ignored}


def label_file(folder: PathLike, kind: Kind) -> Path | None:
    """The label file of `kind` in `folder` (FILE_NAMES, first found), or None."""
    found = [p for p in (Path(folder) / name for name in FILE_NAMES[kind]) if p.is_file()]
    if len(found) > 1:
        log.warning("%s: several %s label files; using %s", folder, kind, found[0].name)
    return found[0] if found else None


def read_labels(folder: PathLike, *, entities: Container[str], relations: Container[str]) -> Labels:
    """The labels beside a dataset's triples, for the ids in `entities` and `relations` (the rest are counted
    in ``ignored``); Labels() when the folder holds no label file. LabelFileError for a malformed one."""
    kept: dict[Kind, dict[str, str]] = {}
    ignored = 0
    for kind, known in zip(KINDS, (entities, relations), strict=True):
        path = label_file(folder, kind)
        kept[kind], skipped = read_label_file(path, keep=known) if path else ({}, 0)
        ignored += skipped
    labels = Labels(kept["entities"], kept["relations"], ignored)
    if labels or ignored:
        log.info("%s: labels for %d entities and %d relations; %d labels for ids not in the graph ignored",
                 folder, len(labels.entities), len(labels.relations), ignored)
    return labels


def read_label_file(path: PathLike, *, keep: Container[str] | None = None,
                    shown: str | None = None) -> tuple[dict[str, str], int]:
    """``({id: label}, ignored)`` from a label file, TSV or JSON by its content (JSON starts with ``{``): only
    ids in `keep` (all when None) are kept, the others counted. Errors name `shown` (default: the path)."""
    path = Path(path)
    labels: dict[str, str] = {}
    lines: dict[str, int] = {}  # id -> line of its label, for the error about a repeated id
    ignored = 0
    for line, name, label in iter_label_file(path, shown=shown):
        if name in lines:
            raise LabelFileError(shown or path, line, f"id {name!r} already has a label (line {lines[name]})")
        lines[name] = line
        if keep is not None and name not in keep:
            ignored += 1
        elif label:
            labels[name] = label
    return labels, ignored


def check_label_file(path: PathLike, *, shown: str | None = None) -> int:
    """Read a label file as read_label_file would (same errors) and count its labels, keeping only a 64-bit
    fingerprint per id (a repeated id is found by them, then named by a second read): for uploads of any size."""
    fingerprints = np.fromiter((hash(name) for _, name, _ in iter_label_file(path, shown=shown)), dtype=np.int64)
    if len(np.unique(fingerprints)) != len(fingerprints):
        read_label_file(path, shown=shown)  # raises at the repeated id, naming its lines
    return len(fingerprints)


def iter_label_file(path: PathLike, *, shown: str | None = None) -> Iterator[tuple[int, str, str]]:
    """``(line, id, label)`` of every label in the file, TSV or JSON by content; label "" where none is given."""
    path = Path(path)
    where = shown or str(path)
    try:
        json_file = is_json(path)
    except OSError as exc:
        raise LabelFileError(where, None, f"cannot read file: {exc.strerror or exc}") from exc
    except UnicodeError:
        raise LabelFileError(where, None, "is encoded as UTF-16; save it as UTF-8") from None
    return _json_labels(path, where) if json_file else _tsv_labels(path, where)


def is_json(path: Path) -> bool:
    """Whether a label file is JSON: its first character (after a UTF-8 byte-order mark and spaces) is "{".
    UnicodeError for a UTF-16 file, OSError if it cannot be read."""
    with path.open("rb") as f:
        start = f.read(256)
    if start.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise UnicodeError("UTF-16")
    return start.removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"{")


def _tsv_labels(path: Path, where: str) -> Iterator[tuple[int, str, str]]:
    """``id<TAB>label[<TAB>description]`` per line, streamed; blank lines skipped, fields stripped."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise LabelFileError(where, lineno, f"no line break in {MAX_LINE_BYTES:,} bytes; expected "
                                                    "id<TAB>label[<TAB>description] per line")
            parts = _line_text(where, lineno, raw).split("\t")
            if len(parts) == 1 and not parts[0].strip():
                continue
            if len(parts) not in (2, 3):
                hint = " (the fields seem to be separated by spaces)" if len(parts) == 1 and " " in parts[0] else ""
                raise LabelFileError(where, lineno, f"expected 2 or 3 tab-separated fields (id, label, optional "
                                                    f"description), found {len(parts)}{hint}")
            yield lineno, _id(where, lineno, parts[0]), _label(where, lineno, parts[1])


def _line_text(where: str, lineno: int, raw: bytes) -> str:
    if lineno == 1:
        raw = raw.removeprefix(codecs.BOM_UTF8)
    if b"\0" in raw:
        raise LabelFileError(where, lineno, "contains a NUL byte; looks like a binary file, not a label file")
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise LabelFileError(where, lineno, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as "
                                            "UTF-8") from None


def _id(where: str, lineno: int | None, text: str) -> str:
    name = text.strip()
    if not name:
        raise LabelFileError(where, lineno, "empty id")
    return name


def _label(where: str, lineno: int | None, text: str) -> str:
    label = text.strip()
    if len(label) > MAX_LABEL_CHARS:
        raise LabelFileError(where, lineno, f"a label of {len(label):,} characters; labels are limited to "
                                            f"{MAX_LABEL_CHARS:,} (is the description in the label column?)")
    if "\0" in label:
        raise LabelFileError(where, lineno, "a label holds a NUL character")
    return label


def _json_labels(path: Path, where: str) -> Iterator[tuple[int, str, str]]:
    """CoDEx's ``{"Q1": {"label": "...", "description": "..."}}`` or ``{"Q1": "..."}``; a label's line is where
    its id first appears in the text."""
    if path.stat().st_size > MAX_JSON_BYTES:
        raise LabelFileError(where, None, f"a JSON label file larger than {MAX_JSON_BYTES >> 20} MiB; give the labels "
                                          "as TSV (id<TAB>label per line), which is read as it streams")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise LabelFileError(where, line, "not valid UTF-8; save the file as UTF-8") from None
    try:
        values = parse_json(text, "the label file", dict)
    except ValueError as exc:
        raise LabelFileError(where, getattr(exc, "lineno", None), f"not a JSON object of labels: {exc}") from None
    at, line = 0, 1
    for name, value in values.items():
        # Keys come in text order: each is searched for after the last, so finding every line is one pass.
        found = max(text.find(json.dumps(name, ensure_ascii=False), at), at)
        line, at = line + text.count("\n", at, found), found
        label = value.get("label", "") if isinstance(value, dict) else value
        if not isinstance(label, str):
            raise LabelFileError(where, line, f'the label of {name!r} is not a string; expected {{"id": "label"}} '
                                              'or {"id": {"label": "..."}}')
        yield line, _id(where, line, name), _label(where, line, label)
