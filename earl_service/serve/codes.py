"""The asymmetric-distance (ADC) scan over an entity table's codes, and the exact certificate on it.

serve/index.py's proxy with P = 1, L1 over the 2d reals [re | im], adds up over coordinates, so over pq codes it is
exact per query: with table[m, c] = sum_{j in subspace m} |q_j - codebooks[m, c, j]| (M x 256 numbers), the L1
distance from q to the row that codes (c_1 .. c_M) decode to is sum_m table[m, c_m]. The codes are never decoded to
scan them, and the index's certificate (D <= L1 <= sqrt(2) D against RotatE's distance D on the decoded rows)
carries over: results equal an exhaustive exact scan of the decoded table.

An int8 table's proxy codes lie near its rows, not on them (tables.Int8Table): each row n carries a slack s_n >= the
L1 distance from the row to its codes' decoding, so A_n - s_n <= L1_n <= A_n + s_n for the scanned A, and the
certificate subtracts the slack (CodesIndex.certified_shortlist).

The scan runs in FAISS: faiss has no L1 ADC (IndexPQ with METRIC_L1 returns other numbers), but its L2 ADC sums
table[m, c] = (x_m - y[m, c])^2 for a query x. With sub-vectors of one number, the query x = 0 and centroids
y = sqrt(table) it sums our table exactly (to float32 rounding), with FAISS's SIMD loop and heap: 0.5 ms for FB15k-237's
14,505 x 84 codes on one core against 1.1 ms for numpy's per-column gather. The centroids change per query, so a
lock keeps one query at a time on an index.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from earl_service.serve.index import proxy_bounds, set_faiss_threads, shortlist_size
from earl_service.serve.tables import EntityTable, PQTable, ProxyCodes

MARGIN = 1e-4  # relative: float32 rounding in the table, the sums and the sqrt round trip is ~1e-6
# The first scan fetches WIDEN x serve/index.py's shortlist (1,600 for a top-10): FAISS's heap costs about the same for
# 400 or 1,600, and on FB15k-237 the ids whose A could still beat the 10th exact distance number ~960 (median).
WIDEN = 4
PROBE = 4  # the first PROBE * k (+ excluded) ids by A are re-ranked to bound the k-th exact distance


def lookup_table(query: np.ndarray, codebooks: np.ndarray) -> np.ndarray:
    """(M, 256) float32: the L1 distance from each sub-vector of query (M * s,) to each centroid of codebooks
    (M, 256, s)."""
    import torch

    m, _, sub = codebooks.shape
    q = torch.from_numpy(np.ascontiguousarray(query, dtype=np.float32)).view(m, 1, sub)
    return torch.cdist(q, torch.from_numpy(codebooks), p=1)[:, 0].numpy()  # (M, 256)


def load_table(index: Any, table: np.ndarray) -> None:
    """Make `index`'s product quantizer (1-number sub-vectors) sum `table` (M, 256) for the query 0."""
    import faiss

    faiss.copy_array_to_vector(np.sqrt(np.maximum(table, 0), dtype=np.float32).ravel(), index.pq.centroids)


def pq_index(codes: np.ndarray) -> Any:
    """A faiss IndexPQ holding codes (N, M) uint8 as M one-number sub-vectors (searched after load_table)."""
    import faiss

    n, m = codes.shape
    index = faiss.IndexPQ(m, m, 8, faiss.METRIC_L2)
    index.is_trained = True
    faiss.copy_array_to_vector(np.ascontiguousarray(codes, dtype=np.uint8).ravel(), index.codes)
    index.ntotal = n
    return index


def codes_view(index: Any) -> np.ndarray:
    """The (N, M) uint8 codes an IndexPQ holds, as a numpy view of faiss's own memory (alive while `index` is)."""
    import faiss

    n, m = int(index.ntotal), int(index.pq.M)
    return faiss.rev_swig_ptr(index.codes.data(), n * m).reshape(n, m)


class CodesIndex:
    """The flat ADC scan over an entity table's proxy codes with serve/index.py's certificate: a top-k shortlist is
    a provable superset of the exact top-k over the decoded table (module doc). kind "codes-flat"."""

    kind = "codes-flat"
    rotations = 1

    def __init__(self, table: EntityTable, proxy: ProxyCodes, *, faiss_threads: int | None = 1) -> None:
        self.table = table
        self.codebooks = proxy.codebooks  # (M, 256, s)
        self.slack = proxy.slack  # (N,) or None
        self.slack_max = float(proxy.slack.max(initial=0.0)) if proxy.slack is not None else 0.0
        self.index = pq_index(proxy.codes)
        if isinstance(table, PQTable):  # the table reads faiss's copy of its codes: one copy in memory
            table.codes = codes_view(self.index)
        g_min, g_max = proxy_bounds(1)
        self.ratio = g_max / g_min
        self.faiss_threads = faiss_threads
        self.calibration_ms: dict[int, float] = {}
        self._lock = threading.Lock()

    @classmethod
    def build(cls, table: EntityTable, *, faiss_threads: int | None = 1) -> CodesIndex:
        proxy = table.proxy_codes()
        assert proxy is not None, "a float table is searched by serve/index.py's ProxyIndex"
        return cls(table, proxy, faiss_threads=faiss_threads)

    @property
    def num_entities(self) -> int:
        return len(self.table)

    @property
    def index_bytes(self) -> int:
        """Bytes beyond the table's own: the codes faiss holds when they are not the table's, and the slack."""
        codes = 0 if isinstance(self.table, PQTable) else int(self.index.ntotal) * int(self.index.pq.M)
        return codes + self.codebooks.nbytes + (0 if self.slack is None else self.slack.nbytes)

    def scan(self, query: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The `size` entities of smallest ADC distance A to query (2d,): (A ascending, ids)."""
        table = lookup_table(query, self.codebooks)
        zero = np.zeros((1, self.codebooks.shape[0]), dtype=np.float32)
        set_faiss_threads(self.faiss_threads)
        with self._lock:
            load_table(self.index, table)
            proxy, ids = self.index.search(zero, size)
        found = ids[0] >= 0
        return proxy[0][found], ids[0][found].astype(np.int64)

    def certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate ids and their exact distances to query (2d,), a provable superset of the top-k once the
        `excluded` ids are dropped. The scan returns `size` ids by ascending A; the first few re-ranked give an upper
        bound `kth` on the k-th exact distance, and only the scanned ids whose A - slack could beat it (an L1 within
        sqrt 2 of D) are re-ranked. Outside the scan every A is at least the last one: when that still cannot beat
        the candidates' k-th distance the answer is certified, else the scan widens WIDEN times, up to every entity."""
        n = self.num_entities
        size = min(n, WIDEN * shortlist_size(k, len(excluded)))
        while True:
            proxy, ids = self.scan(query, size)
            first = ids[: PROBE * k + len(excluded)]
            kth = _kth_kept(first, self.distances(query, first), k, excluded)
            if kth is not None:
                lower = proxy - self.slack[ids] if self.slack is not None else proxy  # <= L1 to the decoded row
                ids = ids[lower <= kth * self.ratio * (1 + MARGIN)]
            dist = self.distances(query, ids)
            kth = _kth_kept(ids, dist, k, excluded)
            if size >= n or (kth is not None and kth < (float(proxy[-1]) - self.slack_max) / self.ratio * (1 - MARGIN)):
                return ids, dist
            size = min(n, WIDEN * size)

    def distances(self, query: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
        from earl_service.core import rotate

        return rotate.distances(query, self.table, ids)  # type: ignore[arg-type]  # the table reads like an array


def _kth_kept(ids: np.ndarray, dist: np.ndarray, k: int, excluded: np.ndarray) -> float | None:
    """The k-th smallest of `dist` once the `excluded` ids are dropped (None when fewer than k are left)."""
    kept = dist[~np.isin(ids, excluded)] if len(excluded) else dist
    return float(np.partition(kept, k - 1)[k - 1]) if len(kept) >= k else None


__all__ = ["CodesIndex", "codes_view", "load_table", "lookup_table", "pq_index"]
