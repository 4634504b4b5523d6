"""The asymmetric-distance (ADC) scan over an entity table's codes, and the exact certificate on it.

serve/index.py's proxy with P = 1, L1 over the 2d reals [re | im], adds up over coordinates, so over pq codes it is
exact per query: with table[m, c] = sum_{j in subspace m} |q_j - codebooks[m, c, j]| (M x 256 numbers), the L1
distance from q to the row that codes (c_1 .. c_M) decode to is sum_m table[m, c_m]. The codes are never decoded to
scan them, and the index's certificate (D <= L1 <= sqrt(2) D against RotatE's distance D on the decoded rows)
carries over: results equal an exhaustive exact scan of the decoded table.

An int8 or float table's proxy codes lie near its rows, not on them (tables.PairCoded): one code per complex
coordinate, the nearest of 256 complex centroids, and table[j, c] = |q_j - centroid_c| (a modulus), so A_n = sum_j
table[j, c_nj] is RotatE's distance to the row's centroids, and each row n carries a slack s_n >= sum_j |e_nj -
centroid_{c_nj}|: D_n - s_n <= A_n <= D_n + s_n (triangle inequality). That proxy has ratio 1 where L1 has sqrt 2,
so on FB15k-237 a shortlist of ~150 rows certifies the top-10 instead of ~800, and a row has d codes rather than 2d
(168, not 336, for dim 168): the per-number grid it replaced scanned twice the codes and re-ranked five times the
rows. The certificate subtracts the slack (CodesIndex.certified_shortlist).

The scan runs in FAISS: faiss has no L1 ADC (IndexPQ with METRIC_L1 returns other numbers), but its L2 ADC sums
table[m, c] = (x_m - y[m, c])^2 for a query x. With sub-vectors of one number, the query x = 0 and centroids
y = sqrt(table) it sums our table exactly (to float32 rounding), with FAISS's SIMD loop and heap: 0.5 ms for FB15k-237's
14,505 x 84 codes on one core against 1.1 ms for numpy's per-column gather. ProductQuantizer.search scans a codes
array given by pointer, so the table's own codes are scanned in place (no copy inside FAISS). The centroids change
per query, so a lock keeps one query at a time on a scanner.
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


def modulus_table(query: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(d, 256) float32: the modulus |q_j - c| from each complex coordinate of query (2d,) [re | im] to each complex
    centroid c of centroids (256, 2) (re, im)."""
    dim = len(query) // 2
    re = query[:dim, None] - centroids[None, :, 0]  # (d, 256)
    im = query[dim:, None] - centroids[None, :, 1]
    return np.sqrt(re * re + im * im, dtype=np.float32)


def query_table(query: np.ndarray, proxy: ProxyCodes) -> np.ndarray:
    """(M, 256) float32: what each code of `proxy` adds to its ADC sum for query (2d,) (ProxyCodes' two layouts)."""
    if proxy.pairs:
        return modulus_table(query, proxy.codebooks[0])
    return lookup_table(query if proxy.columns is None else query[proxy.columns], proxy.codebooks)


def proxy_ratio(proxy: ProxyCodes) -> float:
    """How far above RotatE's distance D the ADC sum may lie, slack aside: D <= A (+ slack) <= ratio * D."""
    if proxy.pairs:
        return 1.0
    g_min, g_max = proxy_bounds(1)
    return g_max / g_min


def first_scan(k: int, excluded: int, ratio: float) -> int:
    """Rows the first ADC scan keeps for a top-k query: WIDEN x serve/index.py's shortlist for the L1 proxy, half
    that for the modulus proxy (ratio 1), whose certificate holds from 800 rows on 99% of FB15k-237 queries."""
    return (WIDEN if ratio > 1 else WIDEN // 2) * shortlist_size(k, excluded)


def load_table(pq: Any, table: np.ndarray) -> None:
    """Make `pq` (a ProductQuantizer of one-number sub-vectors) sum `table` (M, 256) for the query 0."""
    import faiss

    faiss.copy_array_to_vector(np.sqrt(np.maximum(table, 0), dtype=np.float32).ravel(), pq.centroids)


class ADC:
    """FAISS's L2 ADC loop and heap (ProductQuantizer.search) over any (n, M) uint8 codes array, summing one
    query's L1 lookup table (module doc): the codes stay where they are (a table's own array, or a gathered block
    of them), so nothing holds a second copy. One query at a time loads its table into the quantizer (a lock)."""

    def __init__(self, m: int) -> None:
        import faiss

        self.pq = faiss.ProductQuantizer(m, m, 8)
        self._zero = np.zeros((1, m), dtype=np.float32)
        self._lock = threading.Lock()

    def search(self, table: np.ndarray, codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The `size` rows of `codes` (n, M) whose codes sum the least in `table` (M, 256): (sums ascending,
        row positions int64)."""
        import faiss

        size = min(size, len(codes))
        codes = np.ascontiguousarray(codes, dtype=np.uint8)
        dist, ids = np.empty((1, size), dtype=np.float32), np.empty((1, size), dtype=np.int64)
        heap = faiss.float_maxheap_array_t()
        heap.nh, heap.k, heap.val, heap.ids = 1, size, faiss.swig_ptr(dist), faiss.swig_ptr(ids)
        with self._lock:
            load_table(self.pq, table)
            self.pq.search(faiss.swig_ptr(self._zero), 1, faiss.swig_ptr(codes), len(codes), heap, True)
        found = ids[0] >= 0
        return dist[0][found], ids[0][found]


class CodesIndex:
    """The flat ADC scan over an entity table's proxy codes with serve/index.py's certificate: a top-k shortlist is
    a provable superset of the exact top-k over the decoded table (module doc). kind "codes-flat"."""

    kind = "codes-flat"
    rotations = 1

    def __init__(self, table: EntityTable, proxy: ProxyCodes, *, faiss_threads: int | None = 1) -> None:
        self.table, self.proxy = table, proxy
        self.codebooks = proxy.codebooks  # (M, 256, s), or (1, 256, 2) complex centroids
        self.slack = proxy.slack  # (N,) or None
        self.slack_max = float(proxy.slack.max(initial=0.0)) if proxy.slack is not None else 0.0
        self.codes = proxy.codes  # (N, M): a pq table's own codes, scanned in place
        self.adc = ADC(self.codes.shape[1])
        self.ratio = proxy_ratio(proxy)
        self.faiss_threads = faiss_threads
        self.calibration_ms: dict[int, float] = {}

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
        """Bytes beyond the table's own: the proxy codes when they are not the table's, and the slack."""
        codes = 0 if isinstance(self.table, PQTable) else int(self.codes.nbytes)
        return codes + self.codebooks.nbytes + (0 if self.slack is None else self.slack.nbytes)

    def scan(self, query: np.ndarray, size: int, table: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The `size` entities of smallest ADC distance A to query (2d,): (A ascending, ids); `table` is the query's
        (query_table), computed when not given."""
        set_faiss_threads(self.faiss_threads)
        return self.adc.search(query_table(query, self.proxy) if table is None else table, self.codes, size)

    def certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate ids and their exact distances to query (2d,), a provable superset of the top-k once the
        `excluded` ids are dropped. The scan returns `size` ids by ascending A; the first few re-ranked give an upper
        bound `kth` on the k-th exact distance, and only the scanned ids whose A - slack could beat it (an L1 within
        sqrt 2 of D) are re-ranked. Outside the scan every A is at least the last one: when that still cannot beat
        the candidates' k-th distance the answer is certified, else the scan widens WIDEN times, up to every entity."""
        n = self.num_entities
        size = min(n, first_scan(k, len(excluded), self.ratio))
        table = query_table(query, self.proxy)
        while True:
            proxy, ids = self.scan(query, size, table)
            first = ids[: PROBE * k + len(excluded)]
            kth = _kth_kept(first, self.distances(query, first), k, excluded)
            if kth is not None:
                lower = proxy - self.slack[ids] if self.slack is not None else proxy  # <= L1 (or D) to the row
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


__all__ = ["ADC", "CodesIndex", "first_scan", "load_table", "lookup_table", "modulus_table", "proxy_ratio", "query_table"]
