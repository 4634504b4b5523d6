"""POST /keys, GET /keys, DELETE /keys/{key_id}: API keys, for admins (principal.ADMIN_PATHS). A key is shown once,
when made; the store keeps only its salted hash (earl_service/service/keys.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool

from earl_service.errors import UnknownKeyError
from earl_service.service.keys import new_key

from ..audit import TARGET
from ..deps import ID_PATTERN, StoreDep
from ..errors import NOT_FOUND
from ..schemas import KeyCreate, KeyCreated, KeyOut

router = APIRouter(prefix="/keys", tags=["keys"])
KeyId = Annotated[str, Path(pattern=ID_PATTERN, description="key id (the 12 hex digits after earl_)")]


@router.post("", status_code=201, response_model=KeyCreated)
def create_key(body: KeyCreate, request: Request, store: StoreDep) -> KeyCreated:
    """A new key for `tenant`; the answer holds the key itself, which is never shown again."""
    record, key = new_key(body.name, body.tenant, body.scopes)
    store.add_key(record)
    request.app.state.keyring.forget()  # works at once in this process, within a second in the others
    setattr(request.state, TARGET, record.id)
    return KeyCreated(**record.shown(), key=key)


@router.get("", response_model=list[KeyOut])
def list_keys(store: StoreDep) -> list[KeyOut]:
    """Every key, revoked ones too, oldest first: never a key or its hash."""
    return [KeyOut(**k.shown()) for k in store.list_keys()]


@router.delete("/{key_id}", response_model=KeyOut, responses=NOT_FOUND)
async def revoke_key(key_id: KeyId, request: Request, store: StoreDep) -> KeyOut:
    """Revoke the key: it stops working at once in this process, within a second in the others."""
    record = await run_in_threadpool(store.revoke_key, key_id)
    if record is None:
        raise UnknownKeyError(key_id)
    request.app.state.keyring.forget()
    return KeyOut(**record.shown())
