"""The sizes `earl compress --from` searches, from a model's table shapes alone: which precisions it tries and the
bytes each stores. Torch-free, so the API can refuse a compress job whose budget no size meets before queueing it
(api/compress_jobs.py), with the same numbers the search rules candidates out by (imports/compress.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from earl_service.bundle.codebooks import Layout
from earl_service.bundle.format import tensor_bytes
from earl_service.bundle.precision import Precision, ProductQuantized

NUMBERS_PER_CODE = (1, 2, 4, 8, 16)  # pq:M candidates: M = width / n for each n dividing the row width
DEFAULT_MINUTES = 10.0  # a search's time limit when none is given (`earl compress --from`, a job over a model)
Shapes = dict[str, tuple[int, ...]]  # a bundle's weight tables by name: entities (N, 2d), relations (R, d or 2d)
# The tensors every size of a model carries unchanged (Bundle.fixed_parts, and the reserved ids' buffer).
FIXED_PARTS = ("graph.packed", "vocab.entities", "vocab.relations", "labels.entities", "labels.relations",
               "buffer.reserved")


def searched(model: str, dim: int, shapes: Shapes, precisions: Sequence[str] = ()) -> list[Precision]:
    """The precisions a search tries: `precisions` (resolved at dim), or fp32, fp16, int8 and pq:M for each M of
    NUMBERS_PER_CODE whose plan codes a table (a pq that codes nothing is int8 under another name)."""
    if precisions:
        return [Precision.parse(p).resolve(dim) for p in precisions]
    width = 2 * dim
    found: list[Precision] = [Precision.parse(p) for p in ("fp32", "fp16", "int8")]
    for n in NUMBERS_PER_CODE:
        if width % n == 0:
            pq = ProductQuantized(width // n)
            if pq.plan(model, dim, shapes):
                found.append(pq)
    return found


def table_bytes(model: str, dim: int, shapes: Shapes, precision: Precision) -> int:
    """Bytes of the weight tables as `precision` stores them: coded tables' codes and codebooks, the others'
    rows (a pq bundle keeps what it does not code at ProductQuantized.FALLBACK)."""
    layouts: dict[str, Layout] = {}
    if isinstance(precision, ProductQuantized):
        layouts = precision.plan(model, dim, shapes)
    store = ProductQuantized.FALLBACK if isinstance(precision, ProductQuantized) else precision
    return sum(layouts[name].nbytes if name in layouts else shape[0] * store.row_bytes(shape[1])
               for name, shape in shapes.items())


def fixed_bytes(path: str | os.PathLike) -> int:
    """Bytes of a bundle file's FIXED_PARTS, read from its header alone (no weight is read or decoded)."""
    _, stored = tensor_bytes(path)
    return sum(stored.get(name, 0) for name in FIXED_PARTS)


def smallest(model: str, dim: int, shapes: Shapes, *, fixed_bytes: int,
             precisions: Sequence[str] = ()) -> tuple[int, str]:
    """(bytes, precision) of the smallest size the search tries, its header left out: a budget below it meets
    none. `fixed_bytes`: the graph, vocabularies and labels every size carries unchanged."""
    sizes = [(fixed_bytes + table_bytes(model, dim, shapes, p), p.name)
             for p in searched(model, dim, shapes, precisions)]
    return min(sizes)


__all__ = ["DEFAULT_MINUTES", "FIXED_PARTS", "NUMBERS_PER_CODE", "Shapes", "fixed_bytes", "searched", "smallest",
           "table_bytes"]
