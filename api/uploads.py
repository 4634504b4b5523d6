"""Saving uploaded files under the service home and checking them before anything is queued."""

from __future__ import annotations

import shutil
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi import UploadFile

from earl_service.config import DataConfig
from earl_service.data.dataset import SPLIT_SUFFIXES
from earl_service.data.labels import FILE_NAMES, Kind, check_label_file, is_json
from earl_service.data.triples import DEFAULT_MAX_BYTES, TripleTable, count_triples, read_table
from earl_service.errors import TripleFileError, TripleLimitError
from earl_service.service.home import ServiceHome

from .schemas import MAX_NAME_CHARS  # a name longer than a query may give could never be asked about

LABEL_FIELDS: dict[str, Kind] = {"entity_labels": "entities", "relation_labels": "relations"}  # form field: kind
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


def check_triples(path: Path, shown_name: str | None, *, max_unpacked_bytes: int = DEFAULT_MAX_BYTES,
                  max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES, data: DataConfig | None = None) -> dict[str, int]:
    """count_triples on the saved file (a .gz at most `max_unpacked_bytes` unpacked); returns its counts.

    The reader streams and keeps one 64-bit fingerprint per distinct triple, no names, so memory follows the
    distinct triples (at most `max_triples`, EARL_MAX_UPLOAD_TRIPLES), not the upload's (or its unpacked) size.
    A TripleFileError names the client's file, not the server path; so does a too-long name (_check_names).
    """
    shown = shown_name or path.name
    with _named_as(shown):
        counts = count_triples(path, max_bytes=max_unpacked_bytes, max_triples=max_triples, data=data)
    _check_names(shown, counts.longest_name)
    return {"triples": counts.triples, "duplicates_dropped": counts.duplicates}


def check_table(path: Path, shown_name: str | None, *, max_unpacked_bytes: int = DEFAULT_MAX_BYTES,
                max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES, data: DataConfig | None = None) -> TripleTable:
    """check_triples' checks while reading the file whole (read_table, which keeps every name): for a split the
    request needs as a graph (a compress job's train file, whose packed bytes bound the budget)."""
    shown = shown_name or path.name
    with _named_as(shown):
        table = read_table(path, max_bytes=max_unpacked_bytes, max_triples=max_triples, data=data)
    _check_names(shown, table.longest_name())
    return table


def save_labels(upload: UploadFile, folder: Path, kind: Kind) -> tuple[Path, int]:
    """A label file (TSV or CoDEx-style JSON, by content) streamed into `folder` under the name the dataset reader
    looks for (entities.tsv, relations.en.json, ...), checked as it will be read: (its path, labels in it). A
    LabelFileError names the client's file and line."""
    tsv, json_name = FILE_NAMES[kind][0], FILE_NAMES[kind][1]
    staged = save_upload(upload, folder / f".{tsv}.upload")
    try:
        json_file = is_json(staged)
    except UnicodeError:  # UTF-16: check_label_file names the problem
        json_file = False
    dest = staged.rename(folder / (json_name if json_file else tsv))
    return dest, check_label_file(dest, shown=upload.filename or tsv)


def save_job_files(home: ServiceHome, job_id: str, uploads: dict[str, UploadFile | None],
                   labels: dict[str, UploadFile | None] | None = None, *,
                   max_unpacked_bytes: int = DEFAULT_MAX_BYTES, max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES,
                   whole: Collection[str] = (), data: DataConfig | None = None,
                   ) -> tuple[dict[str, str], dict[str, dict[str, int]], dict[str, TripleTable]]:
    """Save train/valid/test as HOME/uploads/<job>/<split><suffix>, checked; paths returned relative to HOME,
    with each split's counts (triples kept, duplicates dropped) and, for the splits named in `whole`, the table
    read in that same one pass (check_table). `data` (the job's header and column order) reads them as the worker
    will. Label files (`labels` by LABEL_FIELDS name) go beside them where load_dataset's folder reader looks,
    counted as {"labels": n} under their field's name.

    On a bad file the job's upload folder is removed and the TripleFileError (or DatasetError) propagates.
    """
    folder = home.upload_dir(job_id)
    files: dict[str, str] = {}
    counts: dict[str, dict[str, int]] = {}
    tables: dict[str, TripleTable] = {}
    try:
        for name, upload in (labels or {}).items():
            if upload is not None:
                path, count = save_labels(upload, folder, LABEL_FIELDS[name])
                counts[name] = {"labels": count}
                files[name] = home.relative(path)
        for split, upload in uploads.items():
            if upload is None:
                continue
            path = save_upload(upload, folder / f"{split}{split_suffix(upload.filename)}")
            if split in whole:
                tables[split] = check_table(path, upload.filename, max_unpacked_bytes=max_unpacked_bytes,
                                            max_triples=max_triples, data=data)
                counts[split] = {"triples": len(tables[split]), "duplicates_dropped": tables[split].duplicates}
            else:
                counts[split] = check_triples(path, upload.filename, max_unpacked_bytes=max_unpacked_bytes,
                                              max_triples=max_triples, data=data)
            files[split] = home.relative(path)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return files, counts, tables


@contextmanager
def staged_triples(upload: UploadFile, home: ServiceHome, name: str, *,
                   max_unpacked_bytes: int = DEFAULT_MAX_BYTES, max_triples: int = DEFAULT_MAX_UPLOAD_TRIPLES,
                   ) -> Iterator[Path]:
    """The uploaded triple file in the home's staging area, checked (check_triples); removed afterwards."""
    path = home.staging_path(name, split_suffix(upload.filename))  # the suffix is the reader's cue (.gz, .csv)
    try:
        save_upload(upload, path)
        check_triples(path, upload.filename, max_unpacked_bytes=max_unpacked_bytes, max_triples=max_triples)
        yield path
    finally:
        path.unlink(missing_ok=True)
