"""Saving uploaded files under the service home and checking them before anything is queued."""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi import UploadFile

from earl_service.bundle_format import METADATA_LIMITS, parse_json
from earl_service.config import DataConfig
from earl_service.data import (
    DEFAULT_MAX_BYTES,
    SPLIT_SUFFIXES,
    TripleTable,
    count_triples,
    read_table,
    relation_labels,
)
from earl_service.errors import DatasetError, TripleFileError, TripleLimitError
from earl_service.worker.home import ServiceHome

LABELS_MAX_BYTES = 8 * 2**20
MAX_NAME_CHARS = 1000  # as the /predict query parameters
DEFAULT_MAX_UPLOAD_TRIPLES = 10_000_000  # as Settings.max_upload_triples (EARL_MAX_UPLOAD_TRIPLES)


def split_suffix(filename: str | None) -> str:
    """The upload's triple-file suffix (.txt, .nt.gz, .parquet, ...), kept so the saved file reads as it was
    named (the reader goes by content; a name only settles Turtle of full IRIs); .txt for any other name."""
    name = (filename or "").lower()
    return next((s for s in sorted(SPLIT_SUFFIXES, key=len, reverse=True) if name.endswith(s)), ".txt")


def save_upload(upload: UploadFile, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    upload.file.seek(0)
    with dest.open("wb") as out:
        shutil.copyfileobj(upload.file, out, 1 << 20)
    return dest


@contextmanager
def _named_as(shown: str) -> Iterator[None]:
    """A reader's TripleFileError about the saved file, reworded to name the client's file, not the server path."""
    try:
        yield
    except TripleLimitError as exc:
        raise TripleFileError(shown, None, f"has more than {exc.limit:,} distinct triples; uploads are limited "
                                           f"to {exc.limit:,} per file (EARL_MAX_UPLOAD_TRIPLES)") from None
    except TripleFileError as exc:
        raise TripleFileError(shown, exc.line, exc.reason, unit=exc.unit) from None


def _check_names(shown: str, longest_name: int) -> None:
    """Names longer than MAX_NAME_CHARS are refused: /predict could never ask about them, and one 10 MB "entity"
    is a mistake, not a graph."""
    if longest_name > MAX_NAME_CHARS:
        raise TripleFileError(shown, None, f"a name is {longest_name:,} characters long; entity and relation names "
                                           f"are limited to {MAX_NAME_CHARS:,} (is a separator missing?)")


def check_triples(path: Path, shown_name: str | None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                  max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES, data: DataConfig | None = None) -> dict[str, int]:
    """count_triples on the saved file (a .gz at most `max_bytes` unpacked); returns its counts.

    The reader streams and keeps one 64-bit fingerprint per distinct triple, no names, so memory follows the
    distinct triples (at most `max_triples`, EARL_MAX_UPLOAD_TRIPLES), not the upload's (or its unpacked) size.
    A TripleFileError names the client's file, not the server path; so does a too-long name (_check_names).
    """
    shown = shown_name or path.name
    with _named_as(shown):
        counts = count_triples(path, max_bytes=max_bytes, max_triples=max_triples, data=data)
    _check_names(shown, counts.longest_name)
    return {"triples": counts.triples, "duplicates_dropped": counts.duplicates}


def check_table(path: Path, shown_name: str | None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES, data: DataConfig | None = None) -> TripleTable:
    """check_triples' checks while reading the file whole (read_table, which keeps every name): for a split the
    request needs as a graph (a compress job's train file, whose packed bytes bound the budget)."""
    shown = shown_name or path.name
    with _named_as(shown):
        table = read_table(path, max_bytes=max_bytes, max_triples=max_triples, data=data)
    _check_names(shown, table.longest_name())
    return table


def save_labels(upload: UploadFile, dest: Path) -> Path:
    """A relation-label JSON object (what data.relation_labels reads) saved as `dest` (relations.en.json);
    DatasetError with the reason if it is not one, or if its labels would not fit in a bundle."""
    upload.file.seek(0)
    raw = upload.file.read(LABELS_MAX_BYTES + 1)
    if len(raw) > LABELS_MAX_BYTES:
        raise DatasetError(f"relation_labels: larger than {LABELS_MAX_BYTES // 2**20} MiB")
    try:
        labels = parse_json(raw.decode("utf-8-sig"), "relation_labels", object, nonfinite_as_null=True)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DatasetError(f"relation_labels: not a UTF-8 JSON document ({exc})") from None
    if not isinstance(labels, dict):
        raise DatasetError('relation_labels: expected a JSON object such as {"P27": "country of citizenship"}')
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(raw)
    # The trained bundle carries the labels relation_labels keeps; refuse now what its publishing would refuse.
    kept, limit = len(json.dumps(relation_labels(dest.parent))), METADATA_LIMITS["relation_labels"]
    if kept > limit:
        dest.unlink()
        raise DatasetError(f"relation_labels: its labels take {kept:,} bytes, more than a bundle may carry "
                           f"({limit:,}, bundle_format.METADATA_LIMITS)")
    return dest


def save_job_files(home: ServiceHome, job_id: str, uploads: dict[str, UploadFile | None],
                   labels: UploadFile | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                   max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES, whole: Collection[str] = (),
                   data: DataConfig | None = None,
                   ) -> tuple[dict[str, str], dict[str, dict[str, int]], dict[str, TripleTable]]:
    """Save train/valid/test as HOME/uploads/<job>/<split><suffix>, checked; paths returned relative to HOME,
    with each split's counts (triples kept, duplicates dropped) and, for the splits named in `whole`, the table
    read in that same one pass (check_table). `data` (the job's header and column order) reads them as the worker
    will. Relation labels, if given, go to relations.en.json beside them
    (where load_dataset's folder reader looks).

    On a bad file the job's upload folder is removed and the TripleFileError (or DatasetError) propagates.
    """
    folder = home.upload_dir(job_id)
    files: dict[str, str] = {}
    counts: dict[str, dict[str, int]] = {}
    tables: dict[str, TripleTable] = {}
    try:
        if labels is not None:
            files["relation_labels"] = home.relative(save_labels(labels, folder / "relations.en.json"))
        for split, upload in uploads.items():
            if upload is None:
                continue
            path = save_upload(upload, folder / f"{split}{split_suffix(upload.filename)}")
            if split in whole:
                tables[split] = check_table(path, upload.filename, max_bytes=max_bytes, max_triples=max_triples,
                                            data=data)
                counts[split] = {"triples": len(tables[split]), "duplicates_dropped": tables[split].duplicates}
            else:
                counts[split] = check_triples(path, upload.filename, max_bytes=max_bytes, max_triples=max_triples,
                                              data=data)
            files[split] = home.relative(path)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return files, counts, tables


@contextmanager
def staged_triples(upload: UploadFile, home: ServiceHome, name: str, *,
                   max_bytes: int = DEFAULT_MAX_BYTES, max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES,
                   ) -> Iterator[Path]:
    """The uploaded triple file in the home's staging area, checked (check_triples); removed afterwards."""
    path = home.staging_path(name, split_suffix(upload.filename))  # the suffix is the reader's cue (.gz, .csv)
    try:
        save_upload(upload, path)
        check_triples(path, upload.filename, max_bytes=max_bytes, max_triples=max_triples)
        yield path
    finally:
        path.unlink(missing_ok=True)
