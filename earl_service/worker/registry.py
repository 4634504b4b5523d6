"""The model registry: which bundles the service serves, and the one way a bundle reaches models/."""

from __future__ import annotations

import difflib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..errors import BundleError, TripleFileError, UnknownModelError
from .home import ServiceHome
from .records import ModelRecord, new_id
from .store import JobStore

if TYPE_CHECKING:
    from ..bundle import Bundle


class ModelRegistry:
    """Registered models of one service home. A bundle is verified first, reaches models/ by one os.replace
    (staged in the same home, so the rename is atomic), and is then recorded in the store. Extensions of one
    model run one at a time (a lock per model, in this process)."""

    def __init__(self, home: ServiceHome, store: JobStore) -> None:
        self.home = home
        self.store = store
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def get(self, model_id: str) -> ModelRecord:
        """The model's record; UnknownModelError (with close ids) if none is registered under `model_id`."""
        record = self.store.get_model(model_id)
        if record is None:
            ids = [m.id for m in self.store.list_models()]
            raise UnknownModelError(model_id, difflib.get_close_matches(model_id, ids, n=3, cutoff=0.6))
        return record

    def bundle_path(self, record: ModelRecord) -> Path:
        return self.home.root / record.path

    def publish(self, model_id: str, staged: Path, *, job_id: str | None = None, created: float | None = None,
                rebuild: bool = False) -> ModelRecord:
        """Verify the bundle at `staged` (inside the home), move it to models/<model_id>.safetensors, record it.

        `rebuild` (for bundles from outside) also rebuilds every embedding once: see `verify_bundle`.
        """
        bundle = verify_bundle(staged, rebuild=rebuild)
        final = self.home.model_path(model_id)
        record = describe(bundle, model_id, self.home.relative(final), job_id=job_id,
                          created=time.time() if created is None else created)
        os.replace(staged, final)
        self.store.add_model(record)
        return record

    def upload(self, source: BinaryIO, *, shown_name: str) -> ModelRecord:
        """Register the bundle read from `source` under a new id; a BundleError names `shown_name`, not our path."""
        model_id = new_id()
        staged = self.home.staging_path(f"{model_id}.bundle")
        try:
            with staged.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            return self.publish(model_id, staged, rebuild=True)
        except BundleError as exc:
            raise BundleError(str(exc).replace(str(staged), shown_name)) from None
        except BaseException:  # all or nothing: a file that reached models/ but not the store goes (a new id's)
            self.home.model_path(model_id).unlink(missing_ok=True)
            raise
        finally:
            staged.unlink(missing_ok=True)

    def extend(self, model_id: str, triples: Path, *, shown_name: str) -> ModelRecord:
        """Add the triple file `triples` (new entities allowed) to a model's graph without retraining.

        The id and creation time stay; the bundle is replaced. A TripleFileError names `shown_name`.
        """
        from ..bundle import load_bundle

        with self._lock_for(model_id):
            record = self.get(model_id)
            try:
                extended = load_bundle(self.bundle_path(record)).extend(triples)
            except TripleFileError as exc:  # e.g. an unknown relation, reported at its line
                raise TripleFileError(shown_name, exc.line, exc.reason) from None
            staged = self.home.staging_path(f"{model_id}.extended")
            try:
                extended.save(staged)
                return self.publish(model_id, staged, job_id=record.job_id, created=record.created)
            finally:
                staged.unlink(missing_ok=True)

    def delete(self, model_id: str) -> ModelRecord:
        """Unregister the model, then remove its bundle file; returns the record it had."""
        record = self.get(model_id)
        self.store.delete_model(model_id)
        self.bundle_path(record).unlink(missing_ok=True)
        return record

    def _lock_for(self, model_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(model_id, threading.Lock())


def verify_bundle(path: Path, *, rebuild: bool = False) -> Bundle:
    """load_bundle's checks; with `rebuild`, every embedding is also rebuilt once, so a file that passes the format
    checks but cannot be served (NaN or overflowing embeddings) is refused now, not at its first query."""
    from ..bundle import load_bundle
    from ..core.decode import check_embeddings

    bundle = load_bundle(path)
    if rebuild:
        try:
            entities, relations = bundle.entity_embeddings().numpy(), bundle.relation_embeddings().numpy()
        except Exception as exc:  # noqa: BLE001 - whatever the encoder trips on, the file is the cause
            raise BundleError(f"{path}: its encoder cannot rebuild the embeddings ({type(exc).__name__}: {exc})"
                              ) from None
        check_embeddings(bundle.config, entities, relations, source=str(path))
    return bundle


def describe(bundle: Bundle, model_id: str, path: str, *, job_id: str | None, created: float) -> ModelRecord:
    """The registry entry of `bundle`, stored at `path` (relative to the home)."""
    return ModelRecord(id=model_id, path=path, sha256=bundle.sha256, bytes=bundle.num_bytes,
                       config=bundle.config.to_dict(), metrics=bundle.metrics, created=created,
                       parameters=bundle.trainable_parameters, precision=bundle.precision,
                       entities=len(bundle.entities), relations=len(bundle.relations), job_id=job_id)


__all__ = ["ModelRegistry", "describe", "verify_bundle"]
