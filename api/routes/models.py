"""The model registry: list, inspect, download (ETag, any version), delete, upload a bundle, extend with triples."""

from __future__ import annotations

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, UploadFile
from fastapi.responses import FileResponse

from earl_service.service.records import ModelRecord
from earl_service.service.registry import version_number
from earl_service.service.tenants import Quota

from ..audit import TARGET
from ..deps import UPLOAD_SLOT, CacheDep, ModelId, PrincipalDep, RegistryDep, SettingsDep, StoreDep
from ..errors import NOT_FOUND
from ..limits import room_headers
from ..principal import Principal
from ..schemas import ModelDetail, ModelOut, ModelVersionOut
from ..settings import Settings
from ..uploads import staged_triples

router = APIRouter(prefix="/models", tags=["models"])


def detail(record: ModelRecord) -> ModelDetail:
    return ModelDetail(**record.to_dict(), version=version_number(record))


def quota_of(who: Principal, settings: Settings) -> Quota | None:
    """The quota the sender's registrations are held to: its tenant's, for a key without the admin scope."""
    return settings.tenant_quota if who.bound else None


@router.get("", response_model=list[ModelOut])
def list_models(store: StoreDep, who: PrincipalDep) -> list[ModelOut]:
    """The sender's tenant's models (an admin's: every tenant's), newest first."""
    return [ModelOut(**m.to_dict()) for m in store.list_models(owner=who.owner)]


@router.get("/{model_id}", response_model=ModelDetail, responses=NOT_FOUND)
def get_model(model_id: ModelId, registry: RegistryDep, who: PrincipalDep) -> ModelDetail:
    return detail(registry.get(model_id, tenant=who.owner))


@router.get("/{model_id}/versions", response_model=list[ModelVersionOut], responses=NOT_FOUND)
def list_versions(model_id: ModelId, registry: RegistryDep, who: PrincipalDep) -> list[ModelVersionOut]:
    """Every version of the model, oldest first: the registered bundle, then one per extend; the last is served."""
    return [ModelVersionOut(version=v.number, sha256=v.sha256, bytes=v.bytes, created=v.created, latest=v.latest)
            for v in registry.versions(model_id, tenant=who.owner)]


@router.get("/{model_id}/bundle", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}}, 304: {"description": "unchanged"},
                       **NOT_FOUND})
def download_bundle(model_id: ModelId, registry: RegistryDep, who: PrincipalDep,
                    if_none_match: str | None = Header(None),
                    version: int | None = Query(None, ge=1, description="an earlier version; the latest if omitted"),
                    ) -> Response:
    """The safetensors bundle; ETag is its payload sha256, so If-None-Match answers 304 when unchanged."""
    found = registry.version(model_id, version, tenant=who.owner)
    etag = f'"{found.sha256}"'
    if if_none_match and etag in [t.strip().removeprefix("W/") for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    if not found.path.is_file():
        raise HTTPException(410, f"model {model_id} is registered but its bundle file is gone")
    name = f"{model_id}.safetensors" if version is None else f"{model_id}.v{found.number}.safetensors"
    return FileResponse(found.path, media_type="application/octet-stream", filename=name, headers={"ETag": etag})


@router.delete("/{model_id}", status_code=204, responses=NOT_FOUND)
def delete_model(model_id: ModelId, registry: RegistryDep, cache: CacheDep, who: PrincipalDep) -> Response:
    """Unregister the model and remove every version, and the run and uploads of the job that trained it."""
    registry.delete(model_id, tenant=who.owner)
    cache.invalidate(model_id)
    return Response(status_code=204)


@router.post("", status_code=201, response_model=ModelDetail, dependencies=[UPLOAD_SLOT])
def upload_model(bundle: UploadFile, request: Request, response: Response, settings: SettingsDep,
                 registry: RegistryDep, who: PrincipalDep) -> ModelDetail:
    """Register an existing bundle file as the sender's tenant's; it is verified by load_bundle (422 with the
    reason if refused). A file identical to a registered version is stored once (linked). A key's tenant is held
    to its quota of models (429) and bytes (413); X-Quota-Models-Left and X-Quota-Bytes-Left say what is left."""
    bundle.file.seek(0)
    record = registry.upload(bundle.file, shown_name=bundle.filename or "upload", owner=who.tenant,
                             quota=quota_of(who, settings))
    setattr(request.state, TARGET, record.id)
    if who.bound:
        response.headers.update(room_headers(registry.store, who.tenant, settings.tenant_quota))
    return detail(record)


@router.post("/{model_id}/triples", response_model=ModelDetail, responses=NOT_FOUND, dependencies=[UPLOAD_SLOT])
def extend_model(model_id: ModelId, triples: UploadFile, response: Response, settings: SettingsDep,
                 registry: RegistryDep, cache: CacheDep, who: PrincipalDep) -> ModelDetail:
    """Add triples (new entities allowed) to a model's graph without retraining: the id stays, the result is the
    model's next version (the previous one stays downloadable). Triples the graph holds already change nothing:
    no new version is stored. Within the owner's quota of bytes (413)."""
    registry.get(model_id, tenant=who.owner)  # an unknown model is a 404 before its upload is read
    with staged_triples(triples, registry.home, f"{model_id}.triples",
                        max_unpacked_bytes=settings.max_unpacked_bytes, max_triples=settings.max_upload_triples) as path:
        record = registry.extend(model_id, path, shown_name=triples.filename or "upload", tenant=who.owner,
                                 quota=quota_of(who, settings))
    cache.invalidate(model_id)
    if who.bound:
        response.headers.update(room_headers(registry.store, who.tenant, settings.tenant_quota))
    return detail(record)
