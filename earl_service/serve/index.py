"""A FAISS proxy index over entity embeddings whose shortlist provably holds the exact RotatE top-k.

The distance. For a query q (h o r for tails, conj(r) o t for heads) and an entity e, let z = q - e in C^d
with moduli m_i = |z_i|. RotatE ranks by D = sum_i m_i. FAISS has no such metric, so it searches a proxy:
- L2 over the 2d reals [re | im] is ||m||_2, and ||m||_2 <= D <= sqrt(d) ||m||_2. The sandwich loosens with
  the dimension: on trained CoDEx-S embeddings the exact top-10 sat as deep as L2 rank ~220 (see
  bench/results/predict_index.md), beyond a 100-candidate shortlist.
- L1 over the 2d reals bounds each term: m_i <= |re_i| + |im_i| <= sqrt(2) m_i, whatever d is.
- L1 over P rotated copies of every complex coordinate (angles j * pi / (2P), j < P; P = 1 is plain L1)
  sums |projection| over 2P equally spaced directions, a polygon approximation of the circle:
  g_min m_i <= term_i <= g_max m_i with g_max / g_min = 1 / cos(pi / 4P) (sqrt 2 for P = 1, 1.082 for P = 2).
  Scaled by 1 / g_min, the proxy L satisfies D <= L <= ratio * D.
The shortlist is the L-nearest `shortlist_size(k)` entities plus the known answers that will be dropped,
re-ranked by the exact D. Let D_k be the k-th best exact distance in it. Every true top-k entity has
D <= D_k, hence L <= ratio * D_k, so:
- flat index (exact L): when the shortlist's largest L already exceeds ratio * D_k nothing outside can
  qualify; otherwise one FAISS range search for L < ratio * D_k returns a superset of the true top-k. Flat
  results therefore always equal an exhaustive exact scan, in at most two scans.
- HNSW (approximate L) and GPU indexes (no range search): the shortlist doubles until the same certificate
  holds, at most `HNSW_MAX_DOUBLINGS` times for HNSW (best effort).

Proxy per index: plain L1 (P = 1) needs no lifted copy and scans half the bytes of P = 2, but its looser ratio
makes the range search return more: on trained bundles (whose answers stand out from the bulk) P = 1 is faster,
on embeddings whose distances concentrate (random clustered vectors, bench/predict_index.py) the range search
returns most of the graph and P = 2 wins. So a flat index is built for both, `calibrate` times them on a few of
the graph's own queries and the faster is kept (`flat_rotations` forces one). HNSW uses P = 2, whose tight ratio
lets the doubling certificate succeed.

Index choice: IndexFlat(METRIC_L1), O(N d) per query, below `HNSW_THRESHOLD` entities; IndexHNSWFlat
(METRIC_L1) above it; a GPU flat index whenever FAISS reports a GPU. The threshold and the latencies come
from bench/predict_index.py (results in bench/results/predict_index.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from earl_service.core import rotate

log = logging.getLogger(__name__)

# Entities from which "auto" builds HNSW. The flat index is always exact; HNSW is faster only on large graphs and
# misses some exact top-10s there (bench/results/predict_index.md), so exactness wins up to this size.
HNSW_THRESHOLD = 100_000
HNSW_M = 32  # graph degree: higher recall per visited node at a modest memory cost (N * 2M ids)
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128  # at least; a query explores 2x its shortlist (recall 0.97 -> 0.99 on hard data)
HNSW_MAX_DOUBLINGS = 3
# P per index kind (module doc): the index holds 2P * d reals per entity; P = 4 would tighten the ratio to 1.020.
# The flat index picks among FLAT_ROTATIONS by timing CALIBRATION_QUERIES queries when it is built.
PROXY_ROTATIONS = {"hnsw": 2, "gpu-flat": 2}
# The most neighbours faiss's GPU indexes return per query (GPU_MAX_SELECTION_K in faiss/gpu/utils/Select.cuh;
# they raise past it). A certified shortlist can need more (many known answers excluded, or a loose proxy): past it
# the query is answered by the exact scan of every entity instead, so the certificate holds on the GPU too.
GPU_MAX_K = 2048
FLAT_ROTATIONS = (1, 2)
CALIBRATION_QUERIES = 24
CALIBRATION_K = 10
IndexKind = Literal["auto", "flat", "hnsw"]
SampleQuery = tuple[np.ndarray, np.ndarray]  # (query (2d,), known answer ids it drops), for calibration
# The queries themselves, or what makes them when calibration needs them (most builds time nothing).
Sample = Sequence[SampleQuery] | Callable[[], Sequence[SampleQuery]]
K = TypeVar("K", bound=Hashable)


class Shortlister(Protocol):
    """What calibrate times: an index's certified shortlist (ProxyIndex here, serve/codes.py's CodesIndex)."""

    @property
    def num_entities(self) -> int: ...

    def certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


def proxy_bounds(rotations: int) -> tuple[float, float]:
    """(g_min, g_max): the range of sum_j |cos(phi + j pi / 2P)| + |sin(...)| over phi (2P directions)."""
    directions = 2 * rotations
    angles = np.arange(directions) * np.pi / directions
    g_min = float(np.abs(np.cos(angles)).sum())  # phi on a direction
    g_max = float(np.abs(np.cos(angles + np.pi / (2 * directions))).sum())  # phi halfway between two
    return g_min, g_max


def lift(x: np.ndarray, dim: int, rotations: int) -> np.ndarray:
    """(.., 2d) [re | im] -> (.., 2Pd): every complex coordinate rotated by j * pi / (2P), j < P, over g_min.

    The L1 distance between lifted vectors lies in [D, D * g_max / g_min], D the RotatE distance.
    """
    if rotations == 1:  # g_min = 1 and no rotation: the [re | im] vector itself
        return np.ascontiguousarray(x, dtype=np.float32)
    g_min, _ = proxy_bounds(rotations)
    re, im = x[..., :dim], x[..., dim:]
    parts = []
    for j in range(rotations):
        angle = j * np.pi / (2 * rotations)
        c, s = np.cos(angle), np.sin(angle)
        parts += [re * c - im * s, re * s + im * c]
    return (np.concatenate(parts, axis=-1) / g_min).astype(np.float32)


def shortlist_size(k: int, excluded: int = 0) -> int:
    """Candidates fetched from the L1 index for a top-k query that will drop `excluded` known answers.

    40k (at least 400): a flat scan costs about the same for 100 or 400 results, and the larger shortlist
    certifies 85% of FB15k-237 queries at once instead of 49%, sparing a second scan.
    """
    return max(40 * k, 400) + excluded


def set_faiss_threads(threads: int | None) -> None:
    """Set FAISS's OpenMP threads for the calling thread (OpenMP keeps the setting per thread); None: leave it."""
    if threads is not None:
        import faiss

        faiss.omp_set_num_threads(threads)


class ProxyIndex:
    """A FAISS index over lift(entities, rotations) and the certified shortlist search on it (module doc).

    entities (N, 2d) float32 [re | im], kept for the exact re-rank; `kind` is "flat", "hnsw" or "gpu-flat".
    `faiss_threads` is set in every thread that searches: 1 by default, since one query cannot use more and
    idle OpenMP threads spinning on busy cores slow a small search many times over; None leaves it alone.
    `calibration_ms`: the mean query time of each proxy the flat build timed (empty when it timed none).
    """

    def __init__(self, entities: np.ndarray, faiss_index: Any, *, kind: str, rotations: int,
                 faiss_threads: int | None = 1, calibration_ms: dict[int, float] | None = None) -> None:
        self.entities = np.ascontiguousarray(entities, dtype=np.float32)  # (N, 2d)
        self.dim = self.entities.shape[1] // 2
        self.faiss_index, self.kind, self.rotations = faiss_index, kind, rotations
        g_min, g_max = proxy_bounds(rotations)
        self.ratio = g_max / g_min
        self.faiss_threads = faiss_threads
        self.calibration_ms = dict(calibration_ms or {})

    @classmethod
    def build(cls, entities: np.ndarray, *, kind: IndexKind = "auto", hnsw_threshold: int = HNSW_THRESHOLD,
              faiss_threads: int | None = 1, flat_rotations: int | None = None,
              sample: Sample = ()) -> ProxyIndex:
        """The index of `kind` ("auto": flat below `hnsw_threshold` entities or with a GPU, else HNSW); a flat
        index keeps the proxy that answers `sample` fastest, or `flat_rotations` when given."""

        set_faiss_threads(faiss_threads)
        gpus = gpu_count()
        if kind == "auto":
            kind = "flat" if gpus or len(entities) < hnsw_threshold else "hnsw"
        if kind == "hnsw":
            rotations = PROXY_ROTATIONS["hnsw"]
            index = _hnsw_index(lift(entities, entities.shape[1] // 2, rotations))
            return cls(entities, index, kind="hnsw", rotations=rotations, faiss_threads=faiss_threads)
        if gpus:
            rotations = PROXY_ROTATIONS["gpu-flat"]
            index = _gpu_flat_index(lift(entities, entities.shape[1] // 2, rotations), gpus)
            if index is not None:
                return cls(entities, index, kind="gpu-flat", rotations=rotations, faiss_threads=faiss_threads)
        options = [flat_rotations] if flat_rotations else list(FLAT_ROTATIONS)
        candidates = {p: cls(entities, _flat_index(lift(entities, entities.shape[1] // 2, p)), kind="flat",
                             rotations=p, faiss_threads=faiss_threads) for p in options}
        best, timings = calibrate(candidates, sample)
        return cls(entities, candidates[best].faiss_index, kind="flat", rotations=best, faiss_threads=faiss_threads,
                   calibration_ms=timings)

    @property
    def num_entities(self) -> int:
        return self.entities.shape[0]

    @property
    def index_bytes(self) -> int:
        """Bytes of the faiss index (the lifted copies, and HNSW's links), the entities it re-ranks with aside."""
        index = self.faiss_index
        floats = int(index.ntotal) * int(index.d) * 4
        return floats + (int(index.ntotal) * 2 * HNSW_M * 4 if self.kind == "hnsw" else 0)  # level 0's links

    def certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate ids and their exact distances to query (2d,), a provable superset of the top-k once the
        `excluded` ids are dropped (best effort for HNSW; module doc)."""
        set_faiss_threads(self.faiss_threads)
        size = shortlist_size(k, len(excluded))
        lifted = lift(query, self.dim, self.rotations)[None]  # (1, 2Pd)
        doublings = 0
        while size < self.num_entities and (self.kind != "gpu-flat" or size <= GPU_MAX_K):
            proxy, ids = self.search(lifted, size)
            dist = rotate.distances(query, self.entities, ids)
            kept = dist[~np.isin(ids, excluded)] if len(excluded) else dist
            if len(ids) and len(kept) >= k:
                kth = float(np.partition(kept, k - 1)[k - 1])
                if kth < float(proxy.max()) / self.ratio * (1 - 1e-4):  # margin for float32 rounding
                    return ids, dist
                if self.kind == "flat":  # one more scan: every entity that could beat kth
                    ids = self.range_search(lifted, kth * self.ratio * (1 + 1e-4))
                    return ids, rotate.distances(query, self.entities, ids)
            if self.kind == "hnsw" and doublings >= HNSW_MAX_DOUBLINGS:
                return ids, dist  # approximate index: best effort
            size, doublings = 2 * size, doublings + 1
        return np.arange(self.num_entities), rotate.distances(query, self.entities)

    def search(self, lifted: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The `size` nearest entities to lifted (1, 2Pd) by the proxy: (proxy distances, ids), without -1 padding."""
        if self.kind == "hnsw":
            import faiss

            # faiss's __init__.pyi leaves out this swig class (swigfaiss.py defines it).
            params = faiss.SearchParametersHNSW(efSearch=max(2 * size, HNSW_EF_SEARCH))  # type: ignore[attr-defined]
            proxy, ids = self.faiss_index.search(lifted, size, params=params)
        else:
            proxy, ids = self.faiss_index.search(lifted, size)
        found = ids[0] >= 0  # HNSW may return fewer than asked
        return proxy[0][found], ids[0][found].astype(np.int64)

    def range_search(self, lifted: np.ndarray, radius: float) -> np.ndarray:
        """Ids of every entity whose proxy distance to lifted (1, 2Pd) is below `radius` (exact flat index only)."""
        _, _, ids = self.faiss_index.range_search(lifted, radius)
        return ids.astype(np.int64)


def calibrate(candidates: Mapping[K, Shortlister], sample: Sample) -> tuple[K, dict[K, float]]:
    """The key of the candidate index that answers `sample` fastest, and each one's mean ms per query.

    Every candidate is exact, so the choice only moves latency. With one candidate, no sample, or a graph no
    larger than a shortlist (every query scans it all), nothing is timed and the first candidate is chosen;
    a callable `sample` is only called when something is timed.
    """
    first_key, first = next(iter(candidates.items()))
    if len(candidates) == 1 or first.num_entities <= shortlist_size(CALIBRATION_K):
        return first_key, {}
    queries = sample() if callable(sample) else sample
    if not queries:
        return first_key, {}
    timings = {}
    for key, index in candidates.items():
        start = time.perf_counter()
        for query, excluded in queries:
            index.certified_shortlist(query, CALIBRATION_K, excluded)
        timings[key] = (time.perf_counter() - start) * 1e3 / len(queries)
    return min(timings, key=timings.__getitem__), timings


def gpu_count() -> int:
    """The GPUs FAISS can use (0 on a CPU-only build)."""
    import faiss

    try:
        return int(faiss.get_num_gpus())
    except Exception:  # noqa: BLE001 - a CPU-only build may lack the symbol
        return 0


def _flat_index(x: np.ndarray) -> Any:
    """An exact L1 index over x (N, w)."""
    import faiss

    index = faiss.IndexFlat(x.shape[1], faiss.METRIC_L1)
    index.add(x)
    return index


def _hnsw_index(x: np.ndarray) -> Any:
    """An approximate L1 index (HNSW graph) over x (N, w)."""
    import faiss

    index = faiss.IndexHNSWFlat(x.shape[1], HNSW_M, faiss.METRIC_L1)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    index.add(x)
    return index


def _gpu_flat_index(x: np.ndarray, gpus: int) -> Any | None:
    """An exact L1 index over x (N, w) on GPU 0, or None when the GPU cannot hold it (the CPU index answers)."""
    import faiss

    try:
        return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, _flat_index(x))
    except Exception as exc:  # noqa: BLE001 - a driver or memory problem: the CPU index still answers
        log.warning("FAISS reports %d GPU(s) but the GPU index failed (%s); using the CPU index", gpus, exc)
        return None


__all__ = ["GPU_MAX_K", "HNSW_THRESHOLD", "PROXY_ROTATIONS", "ProxyIndex", "calibrate", "lift", "proxy_bounds", "shortlist_size"]
