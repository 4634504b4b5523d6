"""The model registry: list, inspect, download (ETag, any version), delete, upload a bundle, extend with triples."""

from __future__ import annotations

from fastapi import APIRouter, Header, HTTPException, Query, Response, UploadFile
from fastapi.responses import FileResponse

from earl_service.service.records import ModelRecord
from earl_service.service.registry import version_number

from ..deps import CacheDep, ModelId, RegistryDep, SettingsDep, StoreDep
from ..errors import NOT_FOUND
from ..schemas import ModelDetail, ModelOut, ModelVersionOut
from ..uploads import staged_triples

router = APIRouter(prefix="/models", tags=["models"])


def detail(record: ModelRecord) -> ModelDetail:
    return ModelDetail(**record.to_dict(), version=version_number(record))


@router.get("", response_model=list[ModelOut])
def list_models(store: StoreDep) -> list[ModelOut]:
    return [ModelOut(**m.to_dict()) for m in store.list_models()]


@router.get("/{model_id}", response_model=ModelDetail, responses=NOT_FOUND)
def get_model(model_id: ModelId, registry: RegistryDep) -> ModelDetail:
    return detail(registry.get(model_id))


@router.get("/{model_id}/versions", response_model=list[ModelVersionOut], responses=NOT_FOUND)
def list_versions(model_id: ModelId, registry: RegistryDep) -> list[ModelVersionOut]:
    """Every version of the model, oldest first: the registered bundle, then one per extend; the last is served."""
    return [ModelVersionOut(version=v.number, sha256=v.sha256, bytes=v.bytes, created=v.created, latest=v.latest)
            for v in registry.versions(model_id)]


@router.get("/{model_id}/bundle", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}}, 304: {"description": "unchanged"},
                       **NOT_FOUND})
def download_bundle(model_id: ModelId, registry: RegistryDep, if_none_match: str | None = Header(None),
                    version: int | None = Query(None, ge=1, description="an earlier version; the latest if omitted"),
                    ) -> Response:
    """The safetensors bundle; ETag is its payload sha256, so If-None-Match answers 304 when unchanged."""
    found = registry.version(model_id, version)
    etag = f'"{found.sha256}"'
    if if_none_match and etag in [t.strip().removeprefix("W/") for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    if not found.path.is_file():
        raise HTTPException(410, f"model {model_id} is registered but its bundle file is gone")
    name = f"{model_id}.safetensors" if version is None else f"{model_id}.v{found.number}.safetensors"
    return FileResponse(found.path, media_type="application/octet-stream", filename=name, headers={"ETag": etag})


@router.delete("/{model_id}", status_code=204, responses=NOT_FOUND)
def delete_model(model_id: ModelId, registry: RegistryDep, cache: CacheDep) -> Response:
    """Unregister the model and remove every version, and the run and uploads of the job that trained it."""
    registry.delete(model_id)
    cache.invalidate(model_id)
    return Response(status_code=204)


@router.post("", status_code=201, response_model=ModelDetail)
def upload_model(bundle: UploadFile, registry: RegistryDep) -> ModelDetail:
    """Register an existing bundle file; it is verified by load_bundle (422 with the reason if refused)."""
    bundle.file.seek(0)
    return detail(registry.upload(bundle.file, shown_name=bundle.filename or "upload"))


@router.post("/{model_id}/triples", response_model=ModelDetail, responses=NOT_FOUND)
def extend_model(model_id: ModelId, triples: UploadFile, settings: SettingsDep, registry: RegistryDep,
                 cache: CacheDep) -> ModelDetail:
    """Add triples (new entities allowed) to a model's graph without retraining: the id stays, the result is the
    model's next version (the previous one stays downloadable)."""
    registry.get(model_id)  # an unknown model is a 404 before its upload is read
    with staged_triples(triples, registry.home, f"{model_id}.triples",
                        max_unpacked_bytes=settings.max_unpacked_bytes, max_triples=settings.max_upload_triples) as path:
        record = registry.extend(model_id, path, shown_name=triples.filename or "upload")
    cache.invalidate(model_id)
    return detail(record)
