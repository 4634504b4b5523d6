"""GET /audit: the latest writes, newest first, for admins (principal.ADMIN_PATHS); api/audit.py writes them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ..deps import StoreDep
from ..schemas import NAME_PATTERN, AuditOut

router = APIRouter(prefix="/audit", tags=["keys"])


@router.get("", response_model=list[AuditOut])
def read_audit(store: StoreDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
               tenant: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None) -> list[AuditOut]:
    """Who wrote what, when, and how it ended: the latest `limit` entries (of `tenant`)."""
    return [AuditOut(**e.to_dict()) for e in store.list_audit(limit=limit, tenant=tenant)]
