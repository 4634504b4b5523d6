"""GET /models/{id}/entities: find a model's entities by id or label (exact, prefix, fuzzy), ranked and paginated."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from earl_service.serve.names import MAX_QUERY_CHARS
from earl_service.service.registry import ModelRegistry

from ..cache import PredictorCache
from ..deps import CacheDep, ModelId, PredictSlotsDep, PrincipalDep, RegistryDep
from ..errors import NOT_FOUND
from ..schemas import EntityPage
from .predict import load_predictor

router = APIRouter(tags=["predict"])
MAX_LIMIT = 100
MAX_OFFSET = 10_000  # deeper pages are not a search any more: narrow the query


@router.get("/models/{model_id}/entities", response_model=EntityPage, responses=NOT_FOUND)
async def search_entities(
    model_id: ModelId,
    registry: RegistryDep,
    cache: CacheDep,
    slots: PredictSlotsDep,
    who: PrincipalDep,
    q: Annotated[str, Query(min_length=1, max_length=MAX_QUERY_CHARS, description="an id or label, or its start")],
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 10,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> JSONResponse:
    """Entities whose id or label equals `q` (score 1), starts with it, or resembles it (trigram similarity),
    best first; `total` counts them all. Case and repeated spaces are ignored."""
    if not q.strip():
        raise HTTPException(422, "q must hold more than spaces")
    if not await slots.acquire():  # the same slots as /predict: a first search loads the model
        raise HTTPException(503, slots.busy, headers={"Retry-After": slots.retry_after})
    try:
        return JSONResponse(await run_in_threadpool(page, registry, cache, model_id, q=q, limit=limit,
                                                    offset=offset, tenant=who.owner))
    finally:
        slots.release()


def page(registry: ModelRegistry, cache: PredictorCache, model_id: str, *, q: str, limit: int,
         offset: int, tenant: str | None) -> dict[str, Any]:
    found = load_predictor(registry, cache, model_id, tenant=tenant).search_entities(q, limit=limit, offset=offset)
    return {"total": found.total, "items": [vars(m) for m in found.items], "limit": limit, "offset": offset}
