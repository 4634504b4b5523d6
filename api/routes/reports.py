"""GET /models/{id}/report and /models/{id}/frontier.png: the evidence a compress job keeps with its model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from fastapi.responses import FileResponse

from earl_service.errors import UnknownReportError

from ..deps import ModelId, PrincipalDep, RegistryDep
from ..errors import NOT_FOUND

router = APIRouter(prefix="/models", tags=["models"])
MEDIA = {"json": "application/json", "md": "text/markdown; charset=utf-8"}


def report_file(registry: RegistryDep, model_id: str, kind: str, tenant: str | None) -> Path:
    """The model's report file of `kind` (home.REPORT_FILES); 404 for an unknown model (or another tenant's) or
    one without a report."""
    registry.get(model_id, tenant=tenant)
    path = registry.home.report_path(model_id, kind)
    if not path.is_file():
        raise UnknownReportError(model_id)
    return path


@router.get("/{model_id}/report", responses={200: {"content": {m: {} for m in MEDIA.values()}}, **NOT_FOUND})
def get_report(model_id: ModelId, registry: RegistryDep, who: PrincipalDep,
               format: Annotated[Literal["json", "md"], Query(description="json (report.json) or md")] = "json",
               ) -> Response:
    """The compress report of a compress job's model: every candidate and export with its bytes and validation
    metrics, the frontier, the pick and why, its test metrics; `?format=md` for the markdown version."""
    return Response(report_file(registry, model_id, format, who.owner).read_bytes(), media_type=MEDIA[format])


@router.get("/{model_id}/frontier.png", response_class=FileResponse,
            responses={200: {"content": {"image/png": {}}}, **NOT_FOUND})
def get_frontier(model_id: ModelId, registry: RegistryDep, who: PrincipalDep) -> FileResponse:
    """The report's plot: validation metric against bytes for every export, the frontier, the budget, the pick."""
    return FileResponse(report_file(registry, model_id, "png", who.owner), media_type="image/png")
