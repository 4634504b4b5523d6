"""The model registry: which bundles the service serves, and the one way a bundle reaches models/."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import filecmp
import json
import os
import shutil
import struct
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from earl_service.bundle.format import BundleLimits, shown_metrics
from earl_service.errors import BundleError, TenantQuotaError, TripleFileError, UnknownModelError
from earl_service.service.home import ServiceHome
from earl_service.service.housekeeping import remove
from earl_service.service.locks import file_lock
from earl_service.service.records import ModelRecord, new_id
from earl_service.service.store import JobStore
from earl_service.service.tenants import DEFAULT_TENANT, Quota

if TYPE_CHECKING:
    from earl_service.bundle.model_io import Bundle


@dataclass(frozen=True)
class ModelVersion:
    """One bundle a model has had: `number` counts from 1 (the first publish); each extend adds the next."""

    number: int
    path: Path
    sha256: str
    bytes: int
    created: float  # when this version was placed
    latest: bool


class ModelRegistry:
    """Registered models of one service home.

    Every write to a model (publish, extend, delete) holds the model's file lock (locks.py), so writes from every
    thread and process sharing the home run one at a time, and a delete waits for an extend in flight. A bundle is
    verified first, then moved in by one os.replace as the model's next version, models/<id>/v<N>.safetensors,
    never rewritten afterwards; the record names the latest, and earlier versions stay until the model is deleted.
    A pending marker lies beside a version from before the move until it is recorded, so that a kill in between
    leaves nothing that housekeeping cannot tell from a model.
    """

    def __init__(self, home: ServiceHome, store: JobStore, *, limits: BundleLimits | None = None) -> None:
        self.home = home
        self.store = store
        self.limits = limits  # for bundles from outside (publish with rebuild): the server's largest model

    def get(self, model_id: str, *, tenant: str | None = None) -> ModelRecord:
        """The model's record; UnknownModelError (with close ids) if none is registered under `model_id`, or when
        `tenant` is given and does not own it: another tenant's model is unknown to it, and so are its ids."""
        record = self.store.get_model(model_id)
        if record is None or (tenant is not None and record.owner != tenant):
            ids = [m.id for m in self.store.list_models(owner=tenant)]
            raise UnknownModelError(model_id, difflib.get_close_matches(model_id, ids, n=3, cutoff=0.6))
        return record

    def bundle_path(self, record: ModelRecord) -> Path:
        return self.home.root / record.path

    def versions(self, model_id: str, *, tenant: str | None = None) -> list[ModelVersion]:
        """Every version of the model still on disk, oldest first; the last one is the latest."""
        record = self.get(model_id, tenant=tenant)
        found = []
        for number in range(1, version_number(record) + 1):
            try:
                found.append(self._version(record, number))
            except FileNotFoundError:  # removed by a delete since the record was read
                continue
        return found

    def version(self, model_id: str, number: int | None = None, *, tenant: str | None = None) -> ModelVersion:
        """Version `number` of the model, the latest when None; UnknownModelError if it has no such version."""
        record = self.get(model_id, tenant=tenant)
        latest = version_number(record)
        try:
            if number is None or number <= latest:
                return self._version(record, latest if number is None else number)
        except FileNotFoundError:
            pass
        raise UnknownModelError(f"{model_id} version {number}", [f"{model_id} version {latest}"])

    def publish(self, model_id: str, staged: Path, *, job_id: str | None = None, created: float | None = None,
                rebuild: bool = False, owner: str = DEFAULT_TENANT, quota: Quota | None = None) -> ModelRecord:
        """Verify the bundle at `staged` (inside the home), then place it as the model's next version and record it
        as `owner`'s, within `quota` (TenantQuotaError past it, and nothing placed).

        `rebuild` (for bundles from outside) also rebuilds every embedding once: see `verify_bundle`.
        """
        bundle = verify_bundle(staged, rebuild=rebuild, limits=self.limits if rebuild else None)
        with self._locked(model_id):
            previous = self.store.get_model(model_id)  # a worker that publishes a job twice makes a new version
            return self._place(model_id, staged, bundle, previous=previous, job_id=job_id, created=created,
                               owner=owner, quota=quota)

    def upload(self, source: BinaryIO, *, shown_name: str, owner: str = DEFAULT_TENANT,
               quota: Quota | None = None) -> ModelRecord:
        """Register the bundle read from `source` under a new id as `owner`'s; a BundleError names `shown_name`, not
        our path. Within `quota`: checked before the bundle is verified (its file's size), and again with the
        record. A file identical to a registered version is linked to it, not copied (`_place`)."""
        model_id = new_id()
        staged = self.home.staging_path(f"{model_id}.bundle")
        try:
            with staged.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            if quota is not None:
                self._check_room(owner, quota, staged.stat().st_size)
            return self.publish(model_id, staged, rebuild=True, owner=owner, quota=quota)
        except BundleError as exc:
            raise BundleError(str(exc).replace(str(staged), shown_name)) from None
        finally:
            staged.unlink(missing_ok=True)

    def _check_room(self, owner: str, quota: Quota, adding: int) -> None:
        """TenantQuotaError early, before a costly check, when `owner` has no room for one more model of `adding`
        bytes (the store checks again, with the insert)."""
        usage = self.store.tenant_usage(owner)
        if quota.max_models is not None and usage.models >= quota.max_models:
            raise TenantQuotaError(owner, "models", usage.models, 1, quota.max_models)
        if quota.max_bytes is not None and usage.bytes + adding > quota.max_bytes:
            raise TenantQuotaError(owner, "bytes", usage.bytes, adding, quota.max_bytes)

    def extend(self, model_id: str, triples: Path, *, shown_name: str, tenant: str | None = None,
               quota: Quota | None = None) -> ModelRecord:
        """Add the triple file `triples` (new entities allowed) to a model's graph without retraining.

        The result becomes the model's next version once it passed the checks an upload passes (rebuilt
        embeddings included); the id, creation time and owner stay. A result with the same content as the latest
        version (triples the graph already holds) is no new version: the record is returned as it was. Within
        the owner's `quota` (TenantQuotaError). A TripleFileError names `shown_name`.
        """
        with self._locked(model_id):
            record = self.get(model_id, tenant=tenant)  # under the lock: a model deleted meanwhile stays deleted
            staged = self.home.staging_path(f"{model_id}.extended")
            try:
                bundle = extended_bundle(self.bundle_path(record), triples, staged, shown_name=shown_name)
                if bundle.sha256 == record.sha256:
                    return record
                return self._place(model_id, staged, bundle, previous=record, job_id=record.job_id,
                                   created=record.created, owner=record.owner, quota=quota)
            finally:
                staged.unlink(missing_ok=True)

    def delete(self, model_id: str, *, tenant: str | None = None) -> ModelRecord:
        """Unregister the model and remove what was derived from it: every version, and the run and the uploads of
        the job that trained it (the job itself stays, its model_id cleared by the store). Returns the record."""
        with self._locked(model_id):
            record = self.get(model_id, tenant=tenant)
            trash = self._set_aside(model_id)
            try:
                self.store.delete_model(model_id)
            except BaseException:
                self._put_back(trash)
                raise
            derived = [trash]
            if record.job_id:
                derived += [self.home.run_dir(record.job_id), self.home.upload_dir(record.job_id)]
            for path in derived:
                remove(path)  # a failure is logged: the record is gone, the delete stands
        return record

    def _place(self, model_id: str, staged: Path, bundle: Bundle, *, previous: ModelRecord | None,
               job_id: str | None, created: float | None, owner: str, quota: Quota | None = None) -> ModelRecord:
        """Under the model's lock: move the verified bundle at `staged` in as the next version, then record it
        (within `quota`: past it, the version is taken out again and TenantQuotaError raised)."""
        final = self.home.version_path(model_id, 1 if previous is None else version_number(previous) + 1)
        # Described before the move: a bundle whose record cannot be built never reaches models/.
        held = sum(p.stat().st_size for p in self.home.model_dir(model_id).glob("v*.safetensors"))
        record = dataclasses.replace(describe(bundle, model_id, self.home.relative(final), job_id=job_id,
                                              created=time.time() if created is None else created),
                                     owner=owner, stored=held + staged.stat().st_size)
        final.parent.mkdir(parents=True, exist_ok=True)
        pending = self.home.pending_path(model_id, version_number(record))
        pending.touch()  # a kill before the record leaves it: housekeeping.sweep_unrecorded removes the version
        try:
            if (twin := self._identical(record, staged)) is not None:
                os.link(twin, final)  # versions are never rewritten: one file serves both
            else:
                os.replace(staged, final)
            self.store.add_model(record, quota=quota)
        except BaseException:
            final.unlink(missing_ok=True)  # not a version until it is recorded
            pending.unlink(missing_ok=True)
            if previous is None:  # a first version refused (a quota, the store): no empty folder left behind
                with contextlib.suppress(OSError):
                    final.parent.rmdir()
            raise
        finally:
            pending.unlink(missing_ok=True)
        return record

    def _identical(self, record: ModelRecord, staged: Path) -> Path | None:
        """A registered model's latest version whose file is byte for byte `staged` (the same payload checksum,
        size and bytes), on the same file system: the new version is a hard link to it instead of a copy. Issue 56:
        10 uploads of one bundle stored 10 copies."""
        size = staged.stat().st_size
        for other in self.store.list_models():
            path = self.bundle_path(other)
            try:
                same = other.sha256 == record.sha256 and path.stat().st_size == size and \
                    path.stat().st_dev == staged.stat().st_dev and filecmp.cmp(path, staged, shallow=False)
            except OSError:  # deleted meanwhile
                continue
            if same:
                return path
        return None

    def _set_aside(self, model_id: str) -> Path:
        """Move the model's files into a hidden folder (one rename each), so that a store failure can put them
        back and a crash leaves only staging for housekeeping, never a half-deleted model."""
        trash = self.home.trash_path(model_id)
        trash.mkdir()
        for path in (self.home.model_dir(model_id), self.home.legacy_model_path(model_id)):
            if path.exists():
                os.rename(path, trash / path.name)
        return trash

    def _put_back(self, trash: Path) -> None:
        for path in trash.iterdir():
            os.rename(path, self.home.models / path.name)
        trash.rmdir()

    def _version(self, record: ModelRecord, number: int) -> ModelVersion:
        """FileNotFoundError for an earlier version that is not on disk; the latest comes from the record."""
        if number == version_number(record):
            path = self.bundle_path(record)
            placed = path.stat().st_mtime if path.is_file() else record.created  # gone: the download says 410
            return ModelVersion(number, path, record.sha256, record.bytes, placed, latest=True)
        path = self._version_file(record.id, number)
        stat = path.stat()
        return ModelVersion(number, path, payload_sha256(path), stat.st_size, stat.st_mtime, latest=False)

    def _version_file(self, model_id: str, number: int) -> Path:
        path = self.home.version_path(model_id, number)
        legacy = self.home.legacy_model_path(model_id)
        return legacy if number == 1 and not path.exists() and legacy.exists() else path

    def _locked(self, model_id: str) -> AbstractContextManager[None]:
        return file_lock(self.home.lock_path(model_id))


def version_number(record: ModelRecord) -> int:
    """The version the record names: N for models/<id>/v<N>.safetensors; 1 for a bundle from before versions."""
    number = ServiceHome.version_of(record.id, record.path)
    return 1 if number is None else number


def extended_bundle(current: Path, triples: Path, staged: Path, *, shown_name: str) -> Bundle:
    """The bundle at `current` with the triples of `triples` added, saved to `staged` and verified there."""
    from earl_service.bundle.model_io import load_bundle

    try:
        load_bundle(current).extend(triples).save(staged)
    except TripleFileError as exc:  # e.g. an unknown relation, reported at its line
        raise TripleFileError(shown_name, exc.line, exc.reason) from None
    try:
        return verify_bundle(staged, rebuild=True)
    except BundleError as exc:
        raise BundleError(str(exc).replace(str(staged), f"the model extended by {shown_name}")) from None


def payload_sha256(path: Path) -> str:
    """The payload checksum in a bundle's safetensors header, read without the tensors (the file was verified
    when it was placed)."""
    with path.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(size))["__metadata__"]["payload_sha256"]


def verify_bundle(path: Path, *, rebuild: bool = False, limits: BundleLimits | None = None) -> Bundle:
    """load_bundle's checks (within `limits`); with `rebuild`, every embedding is also rebuilt once, so a file that
    passes the format checks but cannot be served (NaN or overflowing embeddings) is refused now, not at its first
    query."""
    from earl_service.bundle.decode import check_embeddings
    from earl_service.bundle.model_io import load_bundle

    bundle = load_bundle(path, limits=limits)
    if rebuild:
        try:
            entities, relations = bundle.entity_embeddings().numpy(), bundle.relation_embeddings().numpy()
        except Exception as exc:  # noqa: BLE001 - whatever the encoder trips on, the file is the cause
            raise BundleError(f"{path}: its encoder cannot rebuild the embeddings ({type(exc).__name__}: {exc})"
                              ) from None
        check_embeddings(bundle.config, entities, relations, source=str(path))
    return bundle


def describe(bundle: Bundle, model_id: str, path: str, *, job_id: str | None, created: float) -> ModelRecord:
    """The registry entry of `bundle`, stored at `path` (relative to the home); its metrics as shown (no padding)."""
    return ModelRecord(id=model_id, path=path, sha256=bundle.sha256, bytes=bundle.num_bytes,
                       config=bundle.config.to_dict(), metrics=shown_metrics(bundle.metrics), created=created,
                       parameters=bundle.trainable_parameters, precision=bundle.precision,
                       entities=len(bundle.entities), relations=len(bundle.relations), job_id=job_id)


__all__ = ["ModelRegistry", "ModelVersion", "describe", "extended_bundle", "verify_bundle", "version_number"]
