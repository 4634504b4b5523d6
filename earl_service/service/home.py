"""The service home: the one folder the API and the workers share, and where each thing lies in it."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from earl_service.errors import ConfigError
from earl_service.service.records import new_id
from earl_service.service.store import JobStore, open_store

SUBFOLDERS = ("uploads", "runs", "models")
VERSION_FILE = re.compile(r"v(\d+)\.safetensors")  # version_path's file name; version_of reads it back
PENDING_FILE = re.compile(r"\.v(\d+)\.pending")  # pending_path's file name
REPORT_FILES = {"json": "report.json", "md": "report.md", "png": "frontier.png"}  # a compress model's evidence
SECRET_FILE = "install.secret"  # this install's random key (ServiceHome.secret)
SECRET_BYTES = 32


@dataclass(frozen=True)
class ServiceHome:
    """EARL_HOME (`earl serve --home`), laid out as

        uploads/<job id>/train.txt (+ valid, test, relations.en.json)   a job's files, written by the API
        uploads/.<name>.<random><suffix>                                 an upload while it is checked
        runs/<job id>/                                                   a training run: checkpoints, metrics.json
        models/<model id>/v<N>.safetensors                               a model's versions (each extend adds one):
                                                                         complete, verified, never rewritten
        models/<model id>/.v<N>.pending                                  while version N is placed but not yet
                                                                         recorded (housekeeping.sweep_unrecorded)
        models/<model id>/report.json, report.md, frontier.png           a compress job's report on its pick
        models/.<model id>.lock                                          held while a model is written (locks.py)
        models/<model id>.safetensors                                    version 1 of a model from before versions
        earl.sqlite3                                                     the job store, unless EARL_STORE names another
        install.secret                                                   32 random bytes, mode 0600 (`secret`)

    Hidden names ending in .tmp anywhere, and hidden entries at the top of uploads/, are staging files: a crash
    can leave them, and housekeeping.py removes them once they are old enough that no live writer can own them.
    """

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def create(self) -> ServiceHome:
        for sub in SUBFOLDERS:
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        return self

    @property
    def uploads(self) -> Path:
        return self.root / "uploads"

    def upload_dir(self, job_id: str) -> Path:
        return self.uploads / job_id

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run_dir(self, job_id: str) -> Path:
        return self.runs / job_id

    @property
    def models(self) -> Path:
        return self.root / "models"

    def model_dir(self, model_id: str) -> Path:
        return self.models / model_id

    def version_path(self, model_id: str, version: int) -> Path:
        return self.model_dir(model_id) / f"v{version}.safetensors"

    @staticmethod
    def version_of(model_id: str, path: str | os.PathLike[str]) -> int | None:
        """The inverse of version_path: N for <model id>/v<N>.safetensors (relative to the home or not), else None
        (a bundle from before versions, models/<model id>.safetensors)."""
        path = Path(path)
        match = VERSION_FILE.fullmatch(path.name)
        return int(match[1]) if match and path.parent.name == model_id else None

    def pending_path(self, model_id: str, version: int) -> Path:
        """A marker beside version `version` from before it is moved in until the store records it: a process
        killed in between leaves it, and the version with it, for housekeeping.sweep_unrecorded."""
        return self.model_dir(model_id) / f".v{version}.pending"

    @staticmethod
    def pending_version(path: str | os.PathLike[str]) -> int | None:
        """The inverse of pending_path: N for <model id>/.v<N>.pending, else None."""
        match = PENDING_FILE.fullmatch(Path(path).name)
        return int(match[1]) if match else None

    def report_path(self, model_id: str, kind: str) -> Path:
        """A compress model's report beside its versions (REPORT_FILES: json, md or png); a delete removes it."""
        return self.model_dir(model_id) / REPORT_FILES[kind]

    def legacy_model_path(self, model_id: str) -> Path:
        """Where a bundle lay before models had versions; read as version 1 where no v1.safetensors exists."""
        return self.models / f"{model_id}.safetensors"

    def lock_path(self, model_id: str) -> Path:
        return self.models / f".{model_id}.lock"

    def trash_path(self, name: str) -> Path:
        """A hidden folder in models/ for what a delete sets aside (swept as staging if a crash leaves it)."""
        return self.models / f".{name}.{new_id()[:8]}.deleted.tmp"

    def staging_path(self, name: str, suffix: str = ".tmp") -> Path:
        """Where an upload waits while it is checked: uploads/, never models/, which holds only complete bundles
        (a file reaches models/ by one os.replace, so a crash mid-write never leaves a partial bundle there)."""
        return self.uploads / f".{name}.{new_id()[:8]}{suffix}"

    def relative(self, path: str | os.PathLike[str]) -> str:
        """`path` as stored in records and shown in messages: relative to the home, never the server's layout."""
        return os.path.relpath(path, self.root)

    def store_target(self, store: str) -> str:
        """The EARL_STORE setting as open_store's argument: 'sqlite' (or '') means earl.sqlite3 in the home."""
        return str(self.root / "earl.sqlite3") if store in ("", "sqlite") else store

    def open_store(self, store: str) -> JobStore:
        return open_store(self.store_target(store))

    @property
    def secret_path(self) -> Path:
        return self.root / SECRET_FILE

    def secret(self) -> bytes:
        """This install's secret, made on first use: 32 random bytes in a file only its owner may read (0600). It
        keys the HMAC that names a job's client (api/limits.client_key), so that the name shown to every reader
        reveals neither a token nor an address and cannot be tested against guesses offline. Processes sharing
        the home may make it at once: the file is written whole beside its name and linked in, the first link
        wins and the others read that one."""
        with contextlib.suppress(FileNotFoundError):
            return _read_secret(self.secret_path)
        staged = self.root / f".{SECRET_FILE}.{new_id()[:8]}.tmp"
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(secrets.token_bytes(SECRET_BYTES))
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(staged, self.secret_path)
        finally:
            staged.unlink(missing_ok=True)
        return _read_secret(self.secret_path)


def _read_secret(path: Path) -> bytes:
    """The secret in `path`; ConfigError when it is damaged or others may read it (the owner should know)."""
    data = path.read_bytes()
    if len(data) != SECRET_BYTES:
        raise ConfigError(f"{path} holds {len(data)} bytes, not the {SECRET_BYTES} of an install secret; remove it "
                          "to make a new one (the client names of queued jobs change)")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"{path} may be read by others (mode {path.stat().st_mode & 0o777:o}); chmod 600 it")
    return data


__all__ = ["REPORT_FILES", "SECRET_FILE", "SUBFOLDERS", "ServiceHome"]
