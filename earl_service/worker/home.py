"""The service home: the one folder the API and the workers share, and where each thing lies in it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .records import new_id
from .store import JobStore, open_store

SUBFOLDERS = ("uploads", "runs", "models")


@dataclass(frozen=True)
class ServiceHome:
    """EARL_HOME (`earl serve --home`), laid out as

        uploads/<job id>/train.txt (+ valid, test, relations.en.json)   a job's files, written by the API
        uploads/.<name>.<random><suffix>                                 an upload while it is checked
        runs/<job id>/                                                   a training run: checkpoints, metrics.json
        models/<model id>.safetensors                                    complete, verified bundles only
        earl.sqlite3                                                     the job store, unless EARL_STORE names another
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

    def run_dir(self, job_id: str) -> Path:
        return self.root / "runs" / job_id

    def model_path(self, model_id: str) -> Path:
        return self.root / "models" / f"{model_id}.safetensors"

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


__all__ = ["SUBFOLDERS", "ServiceHome"]
