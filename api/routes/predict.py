"""GET /predict: top-k tails of (head, relation, ?) or heads of (?, relation, tail) from a registered model."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from earl_service.errors import BundleError
from earl_service.predict import LinkPredictor
from earl_service.worker.registry import ModelRegistry

from ..cache import PredictorCache
from ..deps import ID_PATTERN, CacheDep, PredictSlotsDep, RegistryDep
from ..errors import NOT_FOUND
from ..schemas import PredictionOut

router = APIRouter(tags=["predict"])


@router.get("/predict", response_model=PredictionOut, responses=NOT_FOUND)
async def predict(
    registry: RegistryDep,
    cache: CacheDep,
    slots: PredictSlotsDep,
    model: Annotated[str, Query(pattern=ID_PATTERN)],
    relation: Annotated[str, Query(min_length=1, max_length=1000)],
    head: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
    tail: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
    k: Annotated[int, Query(ge=1, le=1000)] = 10,
    exclude_known: bool = True,
) -> JSONResponse:
    """Give exactly one of `head` (predict tails) or `tail` (predict heads); known answers are left out. Entities
    and the relation are named by id, or by a label that names exactly one (422 listing the ids when several)."""
    if (head is None) == (tail is None):
        raise HTTPException(422, "give exactly one of 'head' (to predict tails) or 'tail' (to predict heads)")
    if not await slots.acquire():  # waits on the event loop, holding no thread
        raise HTTPException(503, slots.busy, headers={"Retry-After": slots.retry_after})
    try:
        # One threadpool hop for all the blocking work (store lookup, a bundle load on a cache miss, the search).
        return JSONResponse(await run_in_threadpool(answer, registry, cache, model=model, relation=relation,
                                                    head=head, tail=tail, k=k, exclude_known=exclude_known))
    finally:
        slots.release()


def answer(registry: ModelRegistry, cache: PredictorCache, *, model: str, relation: str, head: str | None,
           tail: str | None, k: int, exclude_known: bool) -> dict[str, Any]:
    """The prediction as plain JSON: FastAPI would otherwise re-validate our own PredictionOut
    (tests/api/test_api_models.py checks the body against that schema, field for field)."""
    predictor = load_predictor(registry, cache, model)
    anchor = head if head is not None else tail
    assert anchor is not None
    anchor = predictor.entities.name(predictor.entity_id(anchor))  # an id, also when given by label
    relation = predictor.relations.name(predictor.relation_id(relation))
    ask = predictor.predict_tails if head is not None else predictor.predict_heads
    found = ask(anchor, relation, k, exclude_known=exclude_known)
    ends = {"head": anchor, "tail": None} if head is not None else {"head": None, "tail": anchor}
    return {"model": model, "direction": "tail" if head is not None else "head",
            "head": ends["head"], "head_label": predictor.entity_labels.get(ends["head"] or ""),
            "relation": relation, "relation_label": predictor.relation_labels.get(relation),
            "tail": ends["tail"], "tail_label": predictor.entity_labels.get(ends["tail"] or ""),
            "k": k, "exclude_known": exclude_known, "predictions": predictor.labelled(found)}


def load_predictor(registry: ModelRegistry, cache: PredictorCache, model_id: str) -> LinkPredictor:
    """The model's predictor; a registered bundle that cannot be read is the server's fault (500), not the client's."""
    record = registry.get(model_id)
    try:
        return cache.get(record, registry.bundle_path(record))
    except (BundleError, FileNotFoundError) as exc:
        raise HTTPException(500, f"model {model_id} is registered but its bundle cannot be read: {exc}") from None
