"""GET /predict: top-k tails of (head, relation, ?) or heads of (?, relation, tail) from a registered model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from earl_service.errors import BundleError, UnknownEntityError, UnknownRelationError

from ..deps import ID_PATTERN, CacheDep, SettingsDep, StoreDep
from ..schemas import PredictionOut
from .models import get_record

router = APIRouter(tags=["predict"])


@router.get("/predict", response_model=PredictionOut)
async def predict(
    settings: SettingsDep,
    store: StoreDep,
    cache: CacheDep,
    model: Annotated[str, Query(pattern=ID_PATTERN)],
    relation: Annotated[str, Query(min_length=1, max_length=1000)],
    head: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
    tail: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
    k: Annotated[int, Query(ge=1, le=1000)] = 10,
    exclude_known: bool = True,
) -> JSONResponse:
    """Give exactly one of `head` (predict tails) or `tail` (predict heads); known answers are left out."""
    if (head is None) == (tail is None):
        raise HTTPException(422, "give exactly one of 'head' (to predict tails) or 'tail' (to predict heads)")

    def answer() -> dict:
        # One threadpool hop for all the blocking work (store lookup, a bundle load on a cache miss, the
        # search). The body is built as plain JSON: FastAPI would otherwise re-validate our own PredictionOut
        # (tests/api/test_api_models.py checks the body against that schema, field for field).
        record = get_record(model, store)
        try:
            predictor = cache.get(record, settings.home)
        except (BundleError, FileNotFoundError) as exc:
            raise HTTPException(500, f"model {model} is registered but its bundle cannot be read: {exc}") from None
        try:
            if head is not None:
                found = predictor.predict_tails(head, relation, k, exclude_known=exclude_known)
            else:
                found = predictor.predict_heads(tail, relation, k, exclude_known=exclude_known)  # type: ignore[arg-type]
        except (UnknownEntityError, UnknownRelationError) as exc:
            raise HTTPException(404, {"message": str(exc), "kind": exc.kind, "name": exc.name,
                                      "suggestions": exc.suggestions}) from None
        label = predictor.relation_labels.get(relation)
        if isinstance(label, dict):  # {"label": ..., "description": ...} as in CoDEx's relations.en.json
            label = label.get("label")
        return {"model": model, "direction": "tail" if head is not None else "head", "head": head,
                "relation": relation, "relation_label": label if isinstance(label, str) else None, "tail": tail,
                "k": k, "exclude_known": exclude_known,
                "predictions": [{"entity": e, "score": s} for e, s in found]}

    return JSONResponse(await run_in_threadpool(answer))
