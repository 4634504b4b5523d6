"""Top-k link prediction over rebuilt embeddings: a FAISS shortlist, then an exact RotatE re-rank.

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
  results therefore always equal `brute_force_tails`/`brute_force_heads`, in at most two scans.
- HNSW (approximate L) and GPU indexes (no range search): the shortlist doubles until the same certificate
  holds, at most `HNSW_MAX_DOUBLINGS` times for HNSW (best effort).

Proxy per index: plain L1 (P = 1) needs no lifted copy and scans half the bytes of P = 2 (FB15k-237: 1.2
vs 4.3 ms per scan on one core), but its looser ratio makes the range search return more: on trained bundles
(whose answers stand out from the bulk) P = 1 is faster, on embeddings whose distances concentrate (random
clustered vectors, bench/predict_index.py) the range search returns most of the graph and P = 2 is 3x faster.
So the flat index times both on a few of the graph's own queries when it is built and keeps the faster
(`flat_rotations` forces one). HNSW uses P = 2, whose tight ratio lets the doubling certificate succeed.

Index choice: IndexFlat(METRIC_L1), O(N d) per query, below `HNSW_THRESHOLD` entities; IndexHNSWFlat
(METRIC_L1) above it; a GPU flat index whenever FAISS reports a GPU. The threshold and the latencies come
from bench/predict_index.py (results in bench/results/predict_index.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .data import Vocab

if TYPE_CHECKING:
    from .bundle import Bundle

log = logging.getLogger(__name__)

# Entities from which the index is HNSW. bench/results/predict_index.md (dim 150, 1 thread, clustered synthetic):
# the flat index is always exact, p50 0.7 / 3.0 / 25 ms at 2k / 10k / 100k entities; HNSW answered in 1.4-12 ms
# but returned the exact top-10 for only 100% / 100% / 92% of queries. So exactness wins up to 100k entities.
HNSW_THRESHOLD = 100_000
HNSW_M = 32  # graph degree: higher recall per visited node at a modest memory cost (N * 2M ids)
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128  # at least; a query explores 2x its shortlist (recall 0.97 -> 0.99 on hard data)
HNSW_MAX_DOUBLINGS = 3
# P per index kind (module doc): the index holds 2P * d reals per entity; P = 4 would tighten the ratio to 1.020.
# The flat index picks among FLAT_ROTATIONS by timing CALIBRATION_QUERIES queries when it is built.
PROXY_ROTATIONS = {"hnsw": 2, "gpu-flat": 2}
FLAT_ROTATIONS = (1, 2)
CALIBRATION_QUERIES = 24
IndexKind = Literal["auto", "flat", "hnsw", "exact"]
Prediction = tuple[str, float]


def configure_threads(threads: int) -> None:
    """Set torch's and FAISS's intra-op threads: 1 in the API (many small concurrent queries), 2 in workers."""
    import torch

    torch.set_num_threads(threads)
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
    except ImportError:
        pass


def _gpu_count(faiss: Any) -> int:
    try:
        return int(faiss.get_num_gpus())
    except Exception:  # noqa: BLE001 - a CPU-only build may lack the symbol
        return 0


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

    40k (at least 400): a flat scan costs about the same for 100 or 400 results (1.2 / 1.3 ms on FB15k-237),
    and the larger shortlist certifies 85% of FB15k-237 queries at once instead of 49%, sparing a second scan.
    """
    return max(40 * k, 400) + excluded


class LinkPredictor:
    """Answer (h, r, ?) and (?, r, t) queries with entity names, best first.

    entity_embeddings (N, 2d) float32 [re | im]; relation_embeddings (R, d) raw relation values, mapped to
    phases by value * pi / ((gamma + epsilon) / d) as in training; known_triples (E, 3) int64 ids whose
    answers `exclude_known` drops. `index` is "auto" (flat / HNSW by size, GPU when available), "flat",
    "hnsw" or "exact" (no index: score every entity). `faiss_threads` sets FAISS's OpenMP threads in
    every thread that queries (OpenMP keeps the setting per thread): 1 by default, since one query cannot use
    more and idle OpenMP threads spinning on busy cores made a 2k-entity search 18x slower (12 ms instead of
    0.65 ms); None leaves the setting alone. `flat_rotations` forces the flat index's proxy (module doc).
    """

    def __init__(
        self,
        entity_embeddings: np.ndarray,
        relation_embeddings: np.ndarray,
        entities: Vocab,
        relations: Vocab,
        known_triples: np.ndarray,
        *,
        gamma: float,
        epsilon: float,
        index: IndexKind = "auto",
        hnsw_threshold: int = HNSW_THRESHOLD,
        relation_labels: dict[str, str] | None = None,
        faiss_threads: int | None = 1,
        flat_rotations: int | None = None,
    ) -> None:
        self.entity_embeddings = np.ascontiguousarray(entity_embeddings, dtype=np.float32)  # (N, 2d)
        self.relation_embeddings = np.ascontiguousarray(relation_embeddings, dtype=np.float32)  # (R, d)
        n, width = self.entity_embeddings.shape
        num_rel, dim = self.relation_embeddings.shape
        if width != 2 * dim:
            raise ValueError(f"entity embeddings have {width} columns; relations of dim {dim} need {2 * dim}")
        if n != len(entities) or num_rel != len(relations):
            raise ValueError(f"{n} entity rows for {len(entities)} names, {num_rel} relation rows for "
                             f"{len(relations)} names")
        self.entities, self.relations = entities, relations
        self.dim, self.gamma = dim, float(gamma)
        self.phase_scale = np.pi / ((gamma + epsilon) / dim)
        self.relation_labels = dict(relation_labels or {})
        triples = np.asarray(known_triples, dtype=np.int64).reshape(-1, 3)
        h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
        self._answers = {"tail": _answer_index(h * num_rel + r, t), "head": _answer_index(t * num_rel + r, h)}
        self.faiss_threads = faiss_threads if index != "exact" else None
        self._set_faiss_threads()
        self.index_kind, self._index = self._build_index(index, hnsw_threshold)
        self._use_rotations(PROXY_ROTATIONS.get(self.index_kind, 1))
        if self.index_kind == "flat":
            self._calibrate_flat(flat_rotations, triples)

    def _use_rotations(self, rotations: int, index: Any = None) -> None:
        self.rotations = rotations
        g_min, g_max = proxy_bounds(rotations)
        self._ratio = g_max / g_min
        if index is not None:
            self._index = index

    def _calibrate_flat(self, forced: int | None, triples: np.ndarray) -> None:
        """Keep the flat index's proxy (P in FLAT_ROTATIONS) that answers a sample of the graph's own queries
        fastest (module doc); both are exact, so the choice only moves latency."""
        import time

        import faiss

        options = [forced] if forced else list(FLAT_ROTATIONS)
        indexes = {}
        for rotations in options:
            x = lift(self.entity_embeddings, self.dim, rotations)
            indexes[rotations] = faiss.IndexFlat(x.shape[1], faiss.METRIC_L1)
            indexes[rotations].add(x)
        self.calibration_ms: dict[int, float] = {}
        if len(options) > 1 and self.num_entities > shortlist_size(10):
            rng = np.random.default_rng(0)
            picks = (triples[rng.integers(len(triples), size=CALIBRATION_QUERIES)] if len(triples) else
                     np.stack([rng.integers(self.num_entities, size=CALIBRATION_QUERIES),
                               rng.integers(len(self.relations), size=CALIBRATION_QUERIES),
                               rng.integers(self.num_entities, size=CALIBRATION_QUERIES)], 1))
            for rotations in options:
                self._use_rotations(rotations, indexes[rotations])
                start = time.perf_counter()
                for h, r, t in picks:
                    for side, anchor in (("tail", h), ("head", t)):
                        query = self.query_vector(side, int(anchor), int(r))  # type: ignore[arg-type]
                        self._certified_shortlist(query, 10, self._known(side, int(anchor), int(r)))
                self.calibration_ms[rotations] = (time.perf_counter() - start) * 1e3 / (2 * len(picks))
            best = min(self.calibration_ms, key=self.calibration_ms.__getitem__)
        else:
            best = options[0]
        self._use_rotations(best, indexes[best])

    @classmethod
    def from_bundle(cls, bundle: Bundle, **kwargs: Any) -> LinkPredictor:
        """A predictor over a bundle's rebuilt embeddings and its graph's triples as the known answers."""
        labels = getattr(bundle, "relation_labels", None)
        return cls(bundle.entity_embeddings().numpy(), bundle.relation_embeddings().numpy(), bundle.entities,
                   bundle.relations, bundle.triples, gamma=bundle.config.gamma, epsilon=bundle.config.epsilon,
                   relation_labels=labels if isinstance(labels, dict) else None, **kwargs)

    @property
    def num_entities(self) -> int:
        return self.entity_embeddings.shape[0]

    def _build_index(self, kind: IndexKind, hnsw_threshold: int) -> tuple[str, Any]:
        if kind == "exact":
            return "exact", None
        import faiss

        gpus = _gpu_count(faiss)
        if kind == "auto":
            kind = "flat" if gpus or self.num_entities < hnsw_threshold else "hnsw"
        if kind == "hnsw":
            x = lift(self.entity_embeddings, self.dim, PROXY_ROTATIONS["hnsw"])  # (N, 2Pd)
            index = faiss.IndexHNSWFlat(x.shape[1], HNSW_M, faiss.METRIC_L1)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            index.add(x)
            return "hnsw", index
        if gpus:
            x = lift(self.entity_embeddings, self.dim, PROXY_ROTATIONS["gpu-flat"])
            try:
                resources = faiss.StandardGpuResources()
                cpu_index = faiss.IndexFlat(x.shape[1], faiss.METRIC_L1)
                cpu_index.add(x)
                return "gpu-flat", faiss.index_cpu_to_gpu(resources, 0, cpu_index)
            except Exception as exc:  # noqa: BLE001 - a driver or memory problem: the CPU index still answers
                log.warning("FAISS reports %d GPU(s) but the GPU index failed (%s); using the CPU index", gpus, exc)
        return "flat", None  # built by _calibrate_flat

    def _set_faiss_threads(self) -> None:
        """OpenMP thread counts are per calling thread: set ours in whichever thread (API threadpool) queries."""
        if self.faiss_threads is not None:
            import faiss

            faiss.omp_set_num_threads(self.faiss_threads)

    # ------------------------------------------------------------------ queries

    def predict_tails(self, head: str, relation: str, k: int = 10, *, exclude_known: bool = True) -> list[Prediction]:
        """Top-k (tail, score) for (head, relation, ?), best first; score = gamma - distance."""
        return self._predict("tail", head, relation, k, exclude_known, exact=False)

    def predict_heads(self, tail: str, relation: str, k: int = 10, *, exclude_known: bool = True) -> list[Prediction]:
        """Top-k (head, score) for (?, relation, tail), best first."""
        return self._predict("head", tail, relation, k, exclude_known, exact=False)

    def brute_force_tails(self, head: str, relation: str, k: int = 10, *, exclude_known: bool = True,
                          ) -> list[Prediction]:
        """Like predict_tails, scoring every entity exactly (the reference for the index path)."""
        return self._predict("tail", head, relation, k, exclude_known, exact=True)

    def brute_force_heads(self, tail: str, relation: str, k: int = 10, *, exclude_known: bool = True,
                          ) -> list[Prediction]:
        return self._predict("head", tail, relation, k, exclude_known, exact=True)

    def known_answers(self, side: Literal["tail", "head"], anchor: str, relation: str) -> list[str]:
        """Names of the known tails of (anchor, relation, ?) or heads of (?, relation, anchor)."""
        ids = self._known(side, self.entities.id(anchor), self.relations.id(relation))
        return [self.entities.names[i] for i in ids]

    def query_vector(self, side: Literal["tail", "head"], anchor: int, relation: int) -> np.ndarray:
        """(2d,) h o r for tail queries, conj(r) o t for head queries (|h o r - t| = |h - conj(r) o t|)."""
        phase = self.relation_embeddings[relation] * self.phase_scale  # (d,)
        cos, sin = np.cos(phase), np.sin(phase)
        if side == "head":
            sin = -sin
        x = self.entity_embeddings[anchor]
        re, im = x[: self.dim], x[self.dim :]
        return np.concatenate([re * cos - im * sin, re * sin + im * cos]).astype(np.float32)

    def distances(self, query: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """Exact RotatE distance sum_i |q_i - e_i| from query (2d,) to entities `ids` (all when None)."""
        out = np.empty(self.num_entities if ids is None else len(ids), dtype=np.float32)
        step = 8192  # rows per block: bounds the temporaries for large graphs
        for start in range(0, len(out), step):
            rows = slice(start, start + step) if ids is None else ids[start : start + step]
            diff = self.entity_embeddings[rows] - query  # (b, 2d), a fresh block we may overwrite
            np.square(diff, out=diff)
            moduli = diff[:, : self.dim] + diff[:, self.dim :]
            np.sqrt(moduli, out=moduli)
            out[start : start + step] = moduli.sum(1)
        return out

    def _known(self, side: str, anchor: int, relation: int) -> np.ndarray:
        keys, answers = self._answers[side]
        key = anchor * len(self.relations) + relation
        lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
        return answers[lo:hi]

    def _predict(self, side: str, anchor_name: str, relation_name: str, k: int, exclude_known: bool,
                 *, exact: bool) -> list[Prediction]:
        if k < 1:
            raise ValueError(f"k must be >= 1, not {k}")
        anchor, relation = self.entities.id(anchor_name), self.relations.id(relation_name)
        query = self.query_vector(side, anchor, relation)  # type: ignore[arg-type]
        excluded = self._known(side, anchor, relation) if exclude_known else np.zeros(0, dtype=np.int64)
        if exact or self._index is None:
            ids, dist = self._score_all(query)
        else:
            ids, dist = self._certified_shortlist(query, k, excluded)
        if len(excluded):
            keep = ~np.isin(ids, excluded)
            ids, dist = ids[keep], dist[keep]
        order = np.lexsort((ids, dist))[:k]  # ascending distance, ties by id: the same order on every path
        names = self.entities.names
        return [(names[int(i)], float(self.gamma - d)) for i, d in zip(ids[order], dist[order], strict=True)]

    def _score_all(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(self.num_entities), self.distances(query)

    def _certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shortlist ids and their exact distances, a provable superset of the top-k (module doc)."""
        self._set_faiss_threads()
        size = shortlist_size(k, len(excluded))
        lifted = lift(query, self.dim, self.rotations)[None]  # (1, 2Pd)
        doublings = 0
        while size < self.num_entities:
            proxy, ids = self._search(lifted, size)
            dist = self.distances(query, ids)
            kept = dist[~np.isin(ids, excluded)] if len(excluded) else dist
            if len(ids) and len(kept) >= k:
                kth = float(np.partition(kept, k - 1)[k - 1])
                if kth < float(proxy.max()) / self._ratio * (1 - 1e-4):  # margin for float32 rounding
                    return ids, dist
                if self.index_kind == "flat":  # one more scan: every entity that could beat kth
                    ids = self._range(lifted, kth * self._ratio * (1 + 1e-4))
                    return ids, self.distances(query, ids)
            if self.index_kind == "hnsw" and doublings >= HNSW_MAX_DOUBLINGS:
                return ids, dist  # approximate index: best effort
            size, doublings = 2 * size, doublings + 1
        return self._score_all(query)

    def _range(self, lifted: np.ndarray, radius: float) -> np.ndarray:
        """Ids of every entity whose proxy distance is below `radius` (exact flat index only)."""
        _, _, ids = self._index.range_search(lifted, radius)
        return ids.astype(np.int64)

    def _search(self, lifted: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The `size` nearest entities by the L1 proxy: (proxy distances, ids), without -1 padding."""
        if self.index_kind == "hnsw":
            import faiss

            params = faiss.SearchParametersHNSW(efSearch=max(2 * size, HNSW_EF_SEARCH))
            proxy, ids = self._index.search(lifted, size, params=params)
        else:
            proxy, ids = self._index.search(lifted, size)
        found = ids[0] >= 0  # HNSW may return fewer than asked
        return proxy[0][found], ids[0][found].astype(np.int64)


def _answer_index(keys: np.ndarray, answers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (key, answer) pairs without duplicates, for searchsorted lookups of one key's answers."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    pairs = np.unique(np.stack([keys, answers], 1), axis=0)
    return pairs[:, 0], pairs[:, 1]


__all__ = ["HNSW_THRESHOLD", "LinkPredictor", "configure_threads", "shortlist_size"]
