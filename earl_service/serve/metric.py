"""An imported model's FAISS index: a flat index of its scorer's own metric, whose shortlist provably holds the
exact top-k.

DistMult and ComplEx rank by minus a dot product, TransE and PyKEEN's RotatE by an L2 or L1 distance
(core/scorers.py `metric`): FAISS's IndexFlat computes the same order (inner product, squared L2, L1), in its own
float32 arithmetic. So no proxy is needed, only a margin for rounding. A query asks FAISS for the
`shortlist_size(k)` nearest rows plus the known answers it drops, and re-ranks them with the server's exact
distances. Every row outside has FAISS distance >= the last one returned, B; FAISS's value and the exact one
differ by less than `eps` (MARGIN of the largest value either can reach for this query: |q| max|e| for a dot
product, |q| + max|e| for L2 and L1). When the k-th exact distance kept is below B - 2 eps nothing outside can
beat it; otherwise the shortlist widens WIDEN times, up to every row. Results therefore equal the exact scan's.

On request (index="hnsw") the index is FAISS's HNSW graph of the same metric (kind "metric-hnsw"): it may miss rows
nearer than the last it returns, so the same check is a best effort there (at most HNSW_MAX_DOUBLINGS widenings,
then the shortlist as it is), and answers can differ from the exact scan's. Never chosen by "auto": on 100,000 x
128 random rows (bench/results/imported_scan_hnsw.md) a query took 3.1-4.5 ms against the flat index's 2.1-2.2, at
top-10 recall 0.49 (inner product), 0.98 (L2) and 0.93 (L1); random rows are HNSW's hard case, and no large
trained table was measured.

Measured on one thread (bench/results/imported_scan.md): 14,505 x 400 rows, the exact scan and its top-10 take
2.1 ms (dot product), 4.7 (L2) and 7.0 (L1), FAISS 1.0 ms each; 200,000 x 256: 35-76 ms against 21-29. FAISS owns
the rows it indexes (its own copy); the exact re-rank reads them there (stored_rows), so the server holds the table
once, as the index's rows (`index_bytes` 0 but for HNSW's graph over a dot product's lifted rows, a second table).

A pq table (`earl compress --from`'s usual pick) is searched on its codes instead (MetricCodes, kind
"metric-codes"): every metric adds up over coordinates, so a query's distance to the row that codes (c_1 .. c_M)
decode to is a sum of one lookup-table entry per subspace, t[m, c] = -q_m . y_mc (a dot product), |q_m - y_mc|^2
(L2, squared) or |q_m - y_mc|_1 (L1), which serve/codes.ADC sums with FAISS's loop without decoding a row. The sum is
the exact distance (squared for L2; for a dot product shifted by a constant that keeps t >= 0) up to float32
rounding, so the same certificate holds with the rounding bound MARGIN of the largest sum of the terms' magnitudes
(for a dot product sum_i |q_i e_i|: products that cancel round as their size); the shortlist is re-ranked on its
decoded rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from earl_service.core import scorers
from earl_service.serve.codes import ADC
from earl_service.serve.index import (
    HNSW_EF_CONSTRUCTION,
    HNSW_EF_SEARCH,
    HNSW_M,
    HNSW_MAX_DOUBLINGS,
    set_faiss_threads,
    shortlist_size,
)
from earl_service.serve.tables import PQTable

MARGIN = 1e-4  # relative to the largest value a distance may reach; float32 rounding is ~1e-6 of it
WIDEN = 4


class MetricIndex:
    """Shortlists for an imported model's scorer from a FAISS index of its metric: exact from a flat index (kind
    "metric-flat"), best effort from an HNSW graph ("metric-hnsw"; module doc)."""

    rotations = 1  # no proxy (LinkPredictor.rotations)

    def __init__(self, entities: np.ndarray, scorer: scorers.Scorer, faiss_index: Any, *,
                 faiss_threads: int | None = 1, kind: str = "metric-flat") -> None:
        # faiss_index never changes after build: `entities` may be a view of its rows (stored_rows).
        self.entities, self.scorer, self.faiss_index, self.kind = entities, scorer, faiss_index, kind
        self.metric = scorer.metric
        self.faiss_threads = faiss_threads
        self.calibration_ms: dict[int, float] = {}  # nothing to time: one index, exact
        self.largest_norm = float(scorers.blocked(_row_norm(self.metric), np.zeros(0), entities, None).max(initial=0.0))

    @classmethod
    def build(cls, entities: np.ndarray, scorer: scorers.Scorer, *, kind: str = "flat",
              faiss_threads: int | None = 1) -> MetricIndex:
        """`kind`: "flat" (exact) or "hnsw" (approximate; module doc)."""
        import faiss

        if scorer.metric is None:
            raise ValueError(f"{type(scorer).__name__} has no FAISS metric")
        metric = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2, "l1": faiss.METRIC_L1}[scorer.metric]
        table = np.ascontiguousarray(entities, dtype=np.float32)
        index: Any
        graphed = table
        if kind == "hnsw":
            if scorer.metric == "ip":  # as L2: top-10 recall 0.95 -> 1.0 on the test's clustered rows
                graphed, metric = mips_as_l2(table), faiss.METRIC_L2
            index = faiss.IndexHNSWFlat(graphed.shape[1], HNSW_M, metric)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        else:
            index = faiss.IndexFlat(table.shape[1], metric)
        set_faiss_threads(faiss_threads)
        index.add(graphed)
        if graphed is table:  # FAISS stores the rows themselves: re-rank on its copy, so that one is held
            table = stored_rows(index)
        return cls(table, scorer, index, faiss_threads=faiss_threads,
                   kind="metric-hnsw" if kind == "hnsw" else "metric-flat")

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def index_bytes(self) -> int:
        """Bytes the index holds beyond the table the predictor holds: none where the table is the index's own rows
        (stored_rows), else FAISS's copy (HNSW's lifted rows of a dot product); an HNSW graph's links aside."""
        if isinstance(self.entities.base, _IndexRows) and self.entities.base.index is self.faiss_index:
            return 0
        return int(self.faiss_index.ntotal) * int(self.faiss_index.d) * 4

    def eps(self, query: np.ndarray) -> float:
        """How far FAISS's distance and the exact one may differ for this query (module doc)."""
        size = float(np.abs(query).sum()) if self.metric == "l1" else float(np.linalg.norm(query))
        scale = size * self.largest_norm if self.metric == "ip" else size + self.largest_norm
        return MARGIN * max(scale, 1e-30)

    def search(self, query: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's `size` nearest rows on the distance's scale (minus the dot product, L2, L1): (ascending, ids)."""
        x = np.ascontiguousarray(query, dtype=np.float32)[None]
        if self.kind == "metric-hnsw":
            import faiss

            if self.metric == "ip":  # the L2 graph of mips_as_l2: the query gets a zero column
                x = np.concatenate([x, np.zeros((1, 1), np.float32)], axis=1)
            params = faiss.SearchParametersHNSW(efSearch=max(2 * size, HNSW_EF_SEARCH))  # type: ignore[attr-defined]
            found, ids = self.faiss_index.search(x, size, params=params)
        else:
            found, ids = self.faiss_index.search(x, size)
        keep = ids[0] >= 0  # HNSW may return fewer than asked
        values = found[0][keep]
        if self.metric == "ip" and self.kind == "metric-hnsw":  # |q - e'|^2 = |q|^2 + M^2 - 2 q.e
            values = (values - float(np.dot(x[0], x[0])) - self.largest_norm**2) / 2
        elif self.metric == "ip":
            values = -values
        elif self.metric == "l2":
            values = np.sqrt(np.maximum(values, 0.0))
        return values, ids[0][keep].astype(np.int64)

    def certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate ids and their exact distances, a provable superset of the top-k once `excluded` is dropped."""
        set_faiss_threads(self.faiss_threads)
        n = self.num_entities
        size, eps, widened = min(n, shortlist_size(k, len(excluded))), self.eps(query), 0
        while size < n:
            bound, ids = self.search(query, size)
            dist = self.scorer.distances(query, self.entities, ids)
            kept = dist[~np.isin(ids, excluded)] if len(excluded) else dist
            if len(kept) >= k and float(np.partition(kept, k - 1)[k - 1]) < float(bound[-1]) - 2 * eps:
                return ids, dist
            if self.kind == "metric-hnsw" and widened >= HNSW_MAX_DOUBLINGS:
                return ids, dist  # an approximate index: best effort
            size, widened = min(n, WIDEN * size), widened + 1
        return np.arange(n), self.scorer.distances(query, self.entities)


class MetricCodes:
    """Certified shortlists for an imported scorer from the ADC scan of a pq table's own codes (module doc): no copy
    of the table, no row decoded to scan. kind "metric-codes"."""

    kind = "metric-codes"
    rotations = 1

    def __init__(self, table: PQTable, scorer: scorers.Scorer, *, faiss_threads: int | None = 1) -> None:
        if scorer.metric is None:
            raise ValueError(f"{type(scorer).__name__} has no metric to scan codes by")
        self.table, self.scorer, self.metric, self.faiss_threads = table, scorer, scorer.metric, faiss_threads
        self.codes = table.codes  # (N, M), scanned in place
        self.books = table.codebooks  # (M, 256, s) float32
        self.adc = ADC(self.codes.shape[1])
        self.calibration_ms: dict[int, float] = {}  # nothing to time: one index, exact

    @property
    def num_entities(self) -> int:
        return len(self.table)

    @property
    def index_bytes(self) -> int:
        return 0  # the table's own codes and codebooks

    def lookup(self, query: np.ndarray) -> tuple[np.ndarray, float, float]:
        """(the query's table t (M, 256) >= 0, the constant its sums exceed the distance's scale by, the rounding
        bound): sum_m t[m, c_m] = distance + shift (squared distance for L2) of the row coded c."""
        m, _, sub = self.books.shape
        if self.table.columns is not None:  # a table coded in another order: the query's numbers in that order
            query = query[self.table.columns]
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(m, 1, sub)
        if self.metric == "ip":
            table = -np.einsum("mcs,mis->mc", self.books, q)
        elif self.metric == "l2":
            diff = self.books - q
            table = np.einsum("mcs,mcs->mc", diff, diff)
        else:
            table = np.abs(self.books - q).sum(-1)
        low = table.min(1, keepdims=True) if self.metric == "ip" else np.zeros((m, 1), np.float32)
        # How far float32 sums may round: the largest sum of the terms' magnitudes, for a dot product sum_i |q_i e_i|
        # (terms that cancel within a subspace round as their size, not their sum's), else the table's own sum.
        terms = np.einsum("mcs,mis->mc", np.abs(self.books), np.abs(q)) if self.metric == "ip" else table
        reach = float(np.abs(terms).max(1).sum())
        return (table - low).astype(np.float32), -float(low.sum()), MARGIN * max(reach, 1e-30)

    def certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate ids and their exact distances, a provable superset of the top-k once `excluded` is dropped: the
        scan's last sum bounds every row outside it."""
        set_faiss_threads(self.faiss_threads)
        n = self.num_entities
        size = min(n, shortlist_size(k, len(excluded)))
        table, shift, eps = self.lookup(query)
        while size < n:
            sums, ids = self.adc.search(table, self.codes, size)
            dist = self.scorer.distances(query, self.table, ids)  # type: ignore[arg-type]  # reads like an array
            kept = dist[~np.isin(ids, excluded)] if len(excluded) else dist
            if len(kept) >= k:
                kth = float(np.partition(kept, k - 1)[k - 1])
                on_sums = (kth * kth if self.metric == "l2" else kth) + shift
                if on_sums < float(sums[-1]) - 2 * eps:
                    return ids, dist
            size = min(n, WIDEN * size)
        return np.arange(n), self.scorer.distances(query, self.table)  # type: ignore[arg-type]


def _row_norm(metric: str | None) -> scorers.Distance:
    """Each row's size as the margin reads it (L1 for an L1 metric, else L2), as a blocked distance: scorers.blocked
    takes a table's rows a block at a time, where numpy's norm of the whole table made a temporary as big as it."""
    if metric == "l1":
        return lambda rows, _: np.abs(rows).sum(1)
    return lambda rows, _: np.sqrt(np.einsum("ij,ij->i", rows, rows))


class _IndexRows:
    """numpy's view of the float32 rows a FAISS flat index (or an HNSW graph's flat storage) holds, read-only; the
    array's base, so the index lives while any array over its rows does. The address is taken once: nothing may
    add to, reset or remove from the index after (a later add can move its storage), and a copy of this object
    would point at the original's rows (pickling the array copies the rows instead)."""

    def __init__(self, index: Any) -> None:
        import faiss

        self.index = index
        flat = faiss.downcast_index(index.storage) if isinstance(index, faiss.IndexHNSW) else index
        if not isinstance(flat, faiss.IndexFlat):
            raise TypeError(f"{type(flat).__name__} does not store its rows as float32: no rows to lend")
        n, d = int(flat.ntotal), int(flat.d)
        address = faiss.rev_swig_ptr(flat.get_xb(), n * d).ctypes.data if n else 0
        self.__array_interface__ = {"version": 3, "shape": (n, d), "typestr": "<f4", "data": (address, True)}


def stored_rows(index: Any) -> np.ndarray:
    """(N, d) float32: the rows a flat FAISS index (or an HNSW graph's flat storage) stores, in place; FAISS copies
    what it indexes, so reading the rows there rather than from the array added holds a table once, not twice."""
    return np.asarray(_IndexRows(index))


def mips_as_l2(table: np.ndarray) -> np.ndarray:
    """(N, w) -> (N, w + 1): each row with sqrt(M^2 - |e|^2) appended, M the largest norm, so that every row has
    norm M and, for a query with a zero appended, |q - e'|^2 = |q|^2 + M^2 - 2 q.e orders rows as -q.e does
    (Bachrach et al., RecSys 2014): an HNSW graph of L2 finds more of the top inner products than one of the inner
    product itself, which is no metric."""
    norms = np.einsum("ij,ij->i", table, table, dtype=np.float64)
    extra = np.sqrt(np.maximum(norms.max(initial=0.0) - norms, 0.0)).astype(np.float32)
    return np.ascontiguousarray(np.concatenate([table, extra[:, None]], axis=1))


__all__ = ["MARGIN", "MetricCodes", "MetricIndex", "mips_as_l2", "stored_rows"]
