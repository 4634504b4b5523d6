"""Saving uploaded files under the service home and checking them before anything is queued."""

from __future__ import annotations

import shutil
from pathlib import Path

from fastapi import UploadFile

from earl_service.data import SPLIT_SUFFIXES, read_triples
from earl_service.errors import TripleFileError


def split_suffix(filename: str | None) -> str:
    """The upload's triple-file suffix (.txt, .tsv.gz, .csv, ...) so the reader parses it the same way."""
    name = (filename or "").lower()
    return next((s for s in sorted(SPLIT_SUFFIXES, key=len, reverse=True) if name.endswith(s)), ".txt")


def save_upload(upload: UploadFile, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    upload.file.seek(0)
    with dest.open("wb") as out:
        shutil.copyfileobj(upload.file, out, 1 << 20)
    return dest


def check_triples(path: Path, shown_name: str | None) -> None:
    """read_triples on the saved file; a TripleFileError names the client's file, not the server path."""
    try:
        read_triples(path)
    except TripleFileError as exc:
        raise TripleFileError(shown_name or path.name, exc.line, exc.reason) from None


def save_job_files(home: Path, job_id: str, uploads: dict[str, UploadFile | None]) -> dict[str, str]:
    """Save train/valid/test as HOME/uploads/<job>/<split><suffix>, checked; paths returned relative to HOME.

    On a bad file the job's upload folder is removed and the TripleFileError propagates.
    """
    folder = home / "uploads" / job_id
    files: dict[str, str] = {}
    try:
        for split, upload in uploads.items():
            if upload is None:
                continue
            path = save_upload(upload, folder / f"{split}{split_suffix(upload.filename)}")
            check_triples(path, upload.filename)
            files[split] = str(path.relative_to(home))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return files
