"""The model registry: list, inspect, download (ETag), delete, upload a bundle, extend with triples."""

from __future__ import annotations

import difflib
import os
import threading
from pathlib import Path

from fastapi import APIRouter, Header, HTTPException, Response, UploadFile
from fastapi.responses import FileResponse

from earl_service.errors import BundleError, TripleFileError
from earl_service.worker.loop import model_path, record_for
from earl_service.worker.records import ModelRecord, new_id
from earl_service.worker.store import JobStore

from ..deps import CacheDep, ModelId, SettingsDep, StoreDep
from ..schemas import ModelDetail, ModelOut
from ..uploads import check_triples, save_upload, split_suffix

router = APIRouter(prefix="/models", tags=["models"])
_extend_locks: dict[str, threading.Lock] = {}  # one extension at a time per model (in this process)
_locks_guard = threading.Lock()


def model_not_found(model_id: str, store: JobStore) -> HTTPException:
    ids = [m.id for m in store.list_models()]
    close = difflib.get_close_matches(model_id, ids, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return HTTPException(404, {"message": f"model {model_id!r} not found{hint}", "kind": "model",
                               "name": model_id, "suggestions": close})


def get_record(model_id: str, store: JobStore) -> ModelRecord:
    record = store.get_model(model_id)
    if record is None:
        raise model_not_found(model_id, store)
    return record


@router.get("", response_model=list[ModelOut])
def list_models(store: StoreDep) -> list[ModelOut]:
    return [ModelOut(**m.to_dict()) for m in store.list_models()]


@router.get("/{model_id}", response_model=ModelDetail)
def get_model(model_id: ModelId, store: StoreDep) -> ModelDetail:
    return ModelDetail(**get_record(model_id, store).to_dict())


@router.get("/{model_id}/bundle", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}}, 304: {"description": "unchanged"}})
def download_bundle(model_id: ModelId, settings: SettingsDep, store: StoreDep,
                    if_none_match: str | None = Header(None)) -> Response:
    """The safetensors bundle; ETag is its payload sha256, so If-None-Match answers 304 when unchanged."""
    record = get_record(model_id, store)
    etag = f'"{record.sha256}"'
    if if_none_match and etag in [t.strip().removeprefix("W/") for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    path = settings.home / record.path
    if not path.is_file():
        raise HTTPException(410, f"model {model_id} is registered but its bundle file is gone")
    return FileResponse(path, media_type="application/octet-stream", filename=f"{model_id}.safetensors",
                        headers={"ETag": etag})


@router.delete("/{model_id}", status_code=204)
def delete_model(model_id: ModelId, settings: SettingsDep, store: StoreDep, cache: CacheDep) -> Response:
    record = get_record(model_id, store)
    store.delete_model(model_id)
    cache.invalidate(model_id)
    (settings.home / record.path).unlink(missing_ok=True)
    return Response(status_code=204)


def staging_path(home: Path, name: str, suffix: str = ".tmp") -> Path:
    """Where an upload waits while it is checked: HOME/uploads/, never models/, which holds only complete bundles
    (a file reaches models/ by one os.replace, so a crash mid-write never leaves a partial bundle there)."""
    return home / "uploads" / f".{name}.{new_id()[:8]}{suffix}"


@router.post("", status_code=201, response_model=ModelDetail)
def upload_model(bundle: UploadFile, settings: SettingsDep, store: StoreDep) -> ModelDetail:
    """Register an existing bundle file; it is verified by load_bundle (422 with the reason if refused)."""
    model_id = new_id()
    final = model_path(settings.home, model_id)
    tmp = staging_path(settings.home, f"{model_id}.bundle")
    try:
        save_upload(bundle, tmp)
        try:
            record = record_for(model_id, tmp, settings.home, rebuild=True)
        except BundleError as exc:
            raise HTTPException(422, str(exc).replace(str(tmp), bundle.filename or "upload")) from None
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    record.path = str(final.relative_to(settings.home))
    store.add_model(record)
    return ModelDetail(**record.to_dict())


@router.post("/{model_id}/triples", response_model=ModelDetail)
def extend_model(model_id: ModelId, triples: UploadFile, settings: SettingsDep, store: StoreDep,
                 cache: CacheDep) -> ModelDetail:
    """Add triples (new entities allowed) to a model's graph without retraining; the id stays the same."""
    from earl_service.bundle import load_bundle

    with _lock_for(model_id):
        record = get_record(model_id, store)
        path = settings.home / record.path
        upload = staging_path(settings.home, f"{model_id}.triples", split_suffix(triples.filename))  # reader's cue
        tmp = staging_path(settings.home, f"{model_id}.extended")
        try:
            save_upload(triples, upload)
            check_triples(upload, triples.filename, max_bytes=settings.max_unpacked_bytes)
            try:
                extended = load_bundle(path).extend(upload)
            except TripleFileError as exc:  # e.g. an unknown relation, reported at its line
                raise TripleFileError(triples.filename or "upload", exc.line, exc.reason) from None
            extended.save(tmp)
            os.replace(tmp, path)
        except (TripleFileError, BundleError) as exc:
            raise HTTPException(422, str(exc)) from None
        finally:
            upload.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
        updated = record_for(model_id, path, settings.home, job_id=record.job_id)
        updated.created = record.created
        store.add_model(updated)
        cache.invalidate(model_id)
    return ModelDetail(**updated.to_dict())


def _lock_for(model_id: str) -> threading.Lock:
    with _locks_guard:
        return _extend_locks.setdefault(model_id, threading.Lock())


__all__ = ["get_record", "model_not_found", "router"]
