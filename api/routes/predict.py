"""Answers from a registered model: GET /predict (one query), POST /predict (a bounded batch), GET /score."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from earl_service.errors import AmbiguousNameError, BundleError, UnknownEntityError, UnknownRelationError
from earl_service.serve.predictor import LinkPredictor
from earl_service.service.registry import ModelRegistry

from ..cache import PredictorCache
from ..deps import ID_PATTERN, CacheDep, PredictSlotsDep, PrincipalDep, RegistryDep
from ..errors import NOT_FOUND
from ..gate import BODY_LIMIT_KEY
from ..limits import PredictSlots
from ..principal import needed_scope, refusal
from ..schemas import (
    MAX_BATCH_QUERIES,
    MAX_K,
    MAX_NAME_CHARS,
    MAX_PREDICT_BODY_BYTES,
    BatchPredictionOut,
    PredictBatch,
    PredictionOut,
    ScoreOut,
)

INLINE_JSON_BYTES = 64 * 1024  # a JSON body up to this is parsed on the event loop (well under a millisecond)


class OffLoopJSONRoute(APIRoute):
    """A route whose JSON body, when larger than INLINE_JSON_BYTES, is parsed in a thread: FastAPI parses it on the
    event loop, where a 1 MiB body holds every other request (a /healthz too) for its whole parse. The route's
    body limit (max_body_size) applies while the body is read; FastAPI then finds it parsed (Request.json caches)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_off_loop(request: Request) -> Response:
            if request.method == "POST" and "json" in request.headers.get("content-type", ""):
                body = await request.body()
                if len(body) > INLINE_JSON_BYTES:
                    with suppress(ValueError):  # not JSON: FastAPI parses it again and answers its own 422
                        request._json = await run_in_threadpool(json.loads, body)
            return await handler(request)

        return parsed_off_loop


class LeanGetRoute(OffLoopJSONRoute):
    """GET /predict without FastAPI's dependency solving and query validation for a request that plainly passes
    them (`plain_query`): the same access rule as deps.check_access, then the same work in the same slot. Anything
    else (a missing or malformed parameter, one given twice, an unknown one, a refused sender) goes through
    FastAPI's handler, which answers exactly as it always has. Saves ~0.3 ms a request (docs/results.md#serving)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def lean(request: Request) -> Response:
            query = plain_query(request) if request.method == "GET" else None
            who = request.scope.get("state", {}).get("principal")
            if query is None or who is None or refusal(who, needed_scope("GET", "/predict")) is not None:
                return await handler(request)
            state = request.app.state
            return await in_slot(state.predict_slots, answer, state.registry, state.cache, **query, tenant=who.owner)

        return lean


router = APIRouter(tags=["predict"], route_class=OffLoopJSONRoute)

Name = Annotated[str, Query(min_length=1, max_length=MAX_NAME_CHARS)]
QUERY_KEYS = frozenset({"model", "relation", "head", "tail", "k", "exclude_known"})
BOOLEANS = {"true": True, "false": False, "1": True, "0": False}  # some of what FastAPI reads as a bool
MODEL_ID = re.compile(ID_PATTERN.removeprefix("^").removesuffix("$"))  # fullmatch: no trailing newline either


def plain_query(request: Request) -> dict[str, Any] | None:
    """GET /predict's arguments when its query string plainly satisfies the route's declaration (each known key
    once, a model id, names of 1..MAX_NAME_CHARS characters, exactly one of head and tail, k a plain number in
    1..MAX_K, exclude_known true/false/1/0), else None: LeanGetRoute then hands it to FastAPI."""
    items = request.query_params.multi_items()
    query = dict(items)
    if len(query) != len(items) or not query.keys() <= QUERY_KEYS or ("head" in query) == ("tail" in query):
        return None
    names = [query.get("relation"), query.get("head") or query.get("tail")]
    if not all(name and len(name) <= MAX_NAME_CHARS for name in names) or not MODEL_ID.fullmatch(
            query.get("model", "")):
        return None
    k, exclude = query.get("k", "10"), BOOLEANS.get(query.get("exclude_known", "true"))
    if not (k.isascii() and k.isdigit() and 1 <= int(k) <= MAX_K) or exclude is None:
        return None
    return {"model": query["model"], "relation": query["relation"], "head": query.get("head"),
            "tail": query.get("tail"), "k": int(k), "exclude_known": exclude}


async def predict(
    registry: RegistryDep,
    cache: CacheDep,
    slots: PredictSlotsDep,
    who: PrincipalDep,
    model: Annotated[str, Query(pattern=ID_PATTERN)],
    relation: Name,
    head: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_CHARS)] = None,
    tail: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_CHARS)] = None,
    k: Annotated[int, Query(ge=1, le=MAX_K)] = 10,
    exclude_known: bool = True,
) -> JSONResponse:
    """Give exactly one of `head` (predict tails) or `tail` (predict heads); known answers are left out. Entities
    and the relation are named by id, or by a label that names exactly one (422 listing the ids when several)."""
    if (head is None) == (tail is None):
        raise HTTPException(422, "give exactly one of 'head' (to predict tails) or 'tail' (to predict heads)")
    return await in_slot(slots, answer, registry, cache, model=model, relation=relation, head=head, tail=tail, k=k,
                         exclude_known=exclude_known, tenant=who.owner)


router.add_api_route("/predict", predict, methods=["GET"], response_model=PredictionOut, responses=NOT_FOUND,
                     route_class_override=LeanGetRoute)


@router.post("/predict", response_model=BatchPredictionOut, responses=NOT_FOUND, max_body_size=MAX_PREDICT_BODY_BYTES,
             openapi_extra={BODY_LIMIT_KEY: f"what a batch of {MAX_BATCH_QUERIES} queries with names of at most "
                                            f"{MAX_NAME_CHARS:,} characters needs; split the queries over several "
                                            "requests"})
async def predict_batch(registry: RegistryDep, cache: CacheDep, slots: PredictSlotsDep, who: PrincipalDep,
                        batch: PredictBatch) -> JSONResponse:
    """Up to MAX_BATCH_QUERIES queries of one model, answered in order as GET /predict answers each; an unknown
    entity or relation in any query fails the whole batch with a 404 naming the query (`queries[i]`), a label
    naming several with a 422 naming it the same way. The body may take MAX_PREDICT_BODY_BYTES (413 past that),
    what the largest batch needs; one past INLINE_JSON_BYTES is parsed in a thread (OffLoopJSONRoute)."""
    return await in_slot(slots, answer_batch, registry, cache, batch=batch, tenant=who.owner)


@router.get("/score", response_model=ScoreOut, responses=NOT_FOUND)
async def score(registry: RegistryDep, cache: CacheDep, slots: PredictSlotsDep, who: PrincipalDep,
                model: Annotated[str, Query(pattern=ID_PATTERN)], head: Name, relation: Name,
                tail: Name) -> JSONResponse:
    """The distance and score of (head, relation, tail) (RotatE's, or an imported model's scorer's), whether the graph
    holds it, and its filtered ranks; names by id or by a label that names exactly one, as for GET /predict."""
    return await in_slot(slots, score_triple, registry, cache, model=model, head=head, relation=relation, tail=tail,
                         tenant=who.owner)


async def in_slot(slots: PredictSlots, work: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any,
                  ) -> JSONResponse:
    """`work` in one threadpool hop (store lookup, a bundle load on a cache miss, the search) inside a prediction
    slot; the body goes out as plain JSON: FastAPI would otherwise re-validate our own response model (the tests
    check the bodies against those schemas, field for field)."""
    if not await slots.acquire():  # waits on the event loop, holding no thread
        raise HTTPException(503, slots.busy, headers={"Retry-After": slots.retry_after})
    try:
        return JSONResponse(await run_in_threadpool(work, *args, **kwargs))
    finally:
        slots.release()


def answer(registry: ModelRegistry, cache: PredictorCache, *, model: str, relation: str, head: str | None,
           tail: str | None, k: int, exclude_known: bool, tenant: str | None) -> dict[str, Any]:
    predictor = load_predictor(registry, cache, model, tenant=tenant)
    return {"model": model, **predictor.answer(relation, head=head, tail=tail, k=k, exclude_known=exclude_known)}


def answer_batch(registry: ModelRegistry, cache: PredictorCache, *, batch: PredictBatch,
                 tenant: str | None) -> dict[str, Any]:
    predictor = load_predictor(registry, cache, batch.model, tenant=tenant)
    results = []
    for i, query in enumerate(batch.queries):
        try:
            results.append(predictor.answer(query.relation, head=query.head, tail=query.tail, k=query.k,
                                            exclude_known=query.exclude_known))
        except (UnknownEntityError, UnknownRelationError, AmbiguousNameError) as exc:
            exc.message = f"queries[{i}]: {exc.message}"
            raise
    return {"model": batch.model, "results": results}


def score_triple(registry: ModelRegistry, cache: PredictorCache, *, model: str, head: str, relation: str,
                 tail: str, tenant: str | None) -> dict[str, Any]:
    return {"model": model, **load_predictor(registry, cache, model, tenant=tenant).score(head, relation, tail)}


def load_predictor(registry: ModelRegistry, cache: PredictorCache, model_id: str, *,
                   tenant: str | None) -> LinkPredictor:
    """The model's predictor (404 when it is another `tenant`'s); a registered bundle that cannot be read is the
    server's fault (500), not the client's."""
    record = registry.get(model_id, tenant=tenant)
    try:
        return cache.get(record, registry.bundle_path(record))
    except (BundleError, FileNotFoundError) as exc:
        raise HTTPException(500, f"model {model_id} is registered but its bundle cannot be read: {exc}") from None
