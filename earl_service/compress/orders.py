"""The codes of a candidate's pq export: faiss codebooks for each coded table, and for RotatE's entity table the
order its numbers go to the codes in (bundle/codebooks.ORDERS), chosen on validation.

A RotatE row is [re | im]; coded contiguously, each code holds s reals or s imaginary parts, in pairs order s / 2
whole complex numbers, which RotatE rotates and measures as units. Which codes better depends on the table: post-hoc
pq:11 codes of WordNet-full's RotatE d22 validated 0.4742 paired against 0.4610 contiguous (2,000 triples), those of
FB15k-237's d182 at pq:91 0.2884 against 0.2897 (bench/results/pq_layout_*.md). So each such export codes the
table both ways and keeps the order whose decoded weights rank the rung's early subset better (ties: contiguous,
what `earl export` writes); fine-tuning then trains that order's codebooks. A user exporting without a search gets
contiguous codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from earl_service.bundle.codebooks import ORDERS, PQTables, pairable, stored_orders, stored_tables
from earl_service.bundle.format import read_safetensors
from earl_service.bundle.model_io import Bundle
from earl_service.bundle.precision import ProductQuantized
from earl_service.compress.candidates import tuned_precisions
from earl_service.compress.config import METRICS
from earl_service.compress.state import Candidate, CompressRun
from earl_service.train.run import Run

# The tables whose order an export chooses, by model: RotatE's entity table (its rows are complex numbers). EARL's
# coded tables and imported models' stay contiguous (unmeasured; an imported model's codes are served in order).
TRIED: dict[str, tuple[str, ...]] = {"rotate": ("entities",)}
# k-means rounds of a pq export's codebooks: from random rows at its first rung, from its codebooks of the rung
# before at later ones. faiss's 25 rounds took 7.8 s for FB15k-237's RotatE d292 pq:73 entity table (2 cores),
# and its search spent 38% of 5 minutes exporting; 10 rounds cost 3.1 s at 1.8% more relative error (0.2164 vs
# 0.2126), which the codebook fine-tuning then trains on; 3 warm rounds (0.95 s) matched 25 cold ones.
COLD_ITERATIONS, WARM_ITERATIONS = 10, 3


def tried(model: str, precision: ProductQuantized, source: Bundle) -> list[str]:
    """The tables of a `model` export at `precision` whose order is chosen (TRIED): those it codes whose rows hold
    an even number of numbers a code."""
    layouts = precision.resolve(source.config.dim).plan(model, source.config.dim,
                                                        {n: tuple(v.shape) for n, v in source.params.items()})
    return [n for n in TRIED.get(model, ()) if n in layouts and pairable(layouts[n].width, layouts[n].codes)]


def order_trials(candidate: Candidate, precisions: list[str]) -> int:
    """Validations on the early subset that choosing orders adds to exporting `candidate` at `precisions`: one per
    order for each pq export of a TRIED model that may be the pick (candidates.tuned_precisions: not one an int8
    export of the same weights outranks) and whose rows (2 * dim numbers) hold an even number a code."""
    if candidate.model not in TRIED:
        return 0
    chosen = [ProductQuantized.parse(p) for p in precisions if p in tuned_precisions(candidate)]
    return len(ORDERS) * sum(isinstance(p, ProductQuantized) and pairable(2 * candidate.dim, p.codes) for p in chosen)


def pq_codes(run: CompressRun, name: str, precision: ProductQuantized, source: Bundle, model_run: Run,
             limit: int) -> tuple[PQTables, dict[str, str], dict[str, Any]]:
    """Candidate `name`'s codes at `precision` of the weights in `source`: (tables, each table's order, what the
    choice measured: {"order", "order_scores": {order: score}, "order_subset": limit} where one was made, for an
    export that may be the pick: order_trials). k-means warm from the rung before's export in the same order
    (warm_start); each order of the tried tables validated on at most `limit` triples through `model_run`."""
    previous = warm_start(run.export_path(name, precision.name))
    weights = source.row_weights()  # the dataset's degrees, the graph shipped or not
    candidate = run.candidate(name)
    names = tried(candidate.model, precision, source) if order_trials(candidate, [precision.name]) else []
    coded: dict[str, tuple[PQTables, dict[str, str]]] = {}  # by order
    for order in ORDERS if names else ORDERS[:1]:
        orders = dict.fromkeys(names, order)
        warm = previous.get("orders") == {n: o for n, o in orders.items() if o != ORDERS[0]}
        start = {k: v for k, v in previous.items() if k != "orders"} if warm else {"iterations": COLD_ITERATIONS}
        with run.timed("codebooks"):
            tables = precision.encode_tables(source.config, source.params, seed=run.config.seed, weights=weights,
                                             orders=orders, **start)
        coded[order] = tables, orders
    if len(coded) == 1:
        return *coded[ORDERS[0]], {}
    key, scores, batch = METRICS[run.config.metric], {}, run.train_config(name).eval_batch_size
    for order, (tables, orders) in coded.items():
        decoded = ProductQuantized.stored_values(source.params, tables, orders)
        model_run.model.load_state_dict({k: torch.from_numpy(v) for k, v in decoded.items()}, strict=False)
        with run.timed("validate"):
            scores[order] = model_run.evaluate("valid", batch_size=batch, limit=limit)[key]
    best = max(ORDERS, key=lambda o: (scores[o], o == ORDERS[0]))
    return *coded[best], {"order": best, "order_scores": scores, "order_subset": limit}


def warm_start(previous: Path) -> dict[str, Any]:
    """encode_tables' k-means settings for a pq export whose file from the previous rung is `previous`: a few
    rounds from that export's (fine-tuned) codebooks, with the orders they were coded in, when it exists, else
    COLD_ITERATIONS from random rows."""
    if not previous.is_file():
        return {"iterations": COLD_ITERATIONS}
    meta, tensors, _ = read_safetensors(previous)
    orders = {n: o for n, o in stored_orders(meta).items() if o != ORDERS[0]}
    return {"iterations": WARM_ITERATIONS, "start": stored_tables(tensors), "orders": orders}


__all__ = ["COLD_ITERATIONS", "TRIED", "WARM_ITERATIONS", "order_trials", "pq_codes", "tried", "warm_start"]
