"""GET /models/{id}/relations: a model's relations with their labels, for pickers (the console's query view)."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from starlette.concurrency import run_in_threadpool

from ..deps import CacheDep, ModelId, PredictSlotsDep, PrincipalDep, RegistryDep
from ..errors import NOT_FOUND
from ..schemas import RelationPage
from .predict import load_predictor

router = APIRouter(prefix="/models", tags=["models"])


@router.get("/{model_id}/relations", response_model=RelationPage, responses=NOT_FOUND)
async def list_relations(model_id: ModelId, registry: RegistryDep, cache: CacheDep, slots: PredictSlotsDep,
                         who: PrincipalDep,
                         limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
                         offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> dict[str, Any]:
    """The relations in vocabulary order, `limit` from `offset`, each with its label (null without one)."""
    if not await slots.acquire():  # a cache miss loads the bundle, as a prediction does: the same bound
        raise HTTPException(503, slots.busy, headers={"Retry-After": slots.retry_after})
    try:
        predictor = await run_in_threadpool(partial(load_predictor, registry, cache, model_id, tenant=who.owner))
    finally:
        slots.release()
    names = predictor.relations.names
    items = [{"id": name, "label": predictor.relation_labels.get(name)} for name in names[offset:offset + limit]]
    return {"total": len(names), "items": items, "limit": limit, "offset": offset}
