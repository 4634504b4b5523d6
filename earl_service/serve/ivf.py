"""An inverted file over an entity table's codes for big graphs, cached on disk beside its bundle.

From IVF_THRESHOLD entities a flat scan of every code costs more than a query may (19 ms for 1M x 32 codes), so the
rows are split into ~N / LIST_SIZE lists by k-means over the decoded rows (L2, faiss.Kmeans on a sample). A query
scans the codes of the NPROBE lists whose centroids lie nearest it (the ADC scan of serve/codes.py), then re-ranks
exactly the candidates whose L1 could beat the k-th exact distance found. Lists are a heuristic: no certificate,
recall@10 against brute force is measured instead (bench/serve_scale.py, tests/earl_service/serve/test_ivf.py).

One copy of the codes: the table keeps them list by list (tables.PQTable.order_codes), reading a row by id through
an inverse permutation, and the lists are runs of that array with the ids they hold (4 + 4 bytes an entity).

Building takes seconds to tens of seconds at 1M entities, so the built index is written beside the bundle as
`<bundle file>.ivf-<sha256[:16]>.npz` (atomic write) and read back on the next load; a bundle replaced at the same
path has another sha256, so its stale index files are removed and a new one is built.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from earl_service.atomic import replacing
from earl_service.serve.codes import ADC, MARGIN, PROBE, first_scan, proxy_ratio, query_table
from earl_service.serve.index import set_faiss_threads
from earl_service.serve.tables import EntityTable, ProxyCodes

log = logging.getLogger(__name__)

IVF_THRESHOLD = 100_000  # entities from which "auto" builds the IVF over a coded table (the flat scan below)
LIST_SIZE = 1024  # entities per list on average (nlist = N / LIST_SIZE): 977 lists at 1M
NPROBE = 24  # lists scanned per query: recall@10 >= 0.99 on the 1M synthetic bundle (bench/results/serve_scale.md)
TRAIN_PER_LIST = 64  # k-means sample: this many rows per list
KMEANS_ITERATIONS = 10


def cache_file(bundle_path: Path, sha256: str) -> Path:
    """Where the IVF of the bundle at `bundle_path` with payload `sha256` is kept."""
    return bundle_path.with_name(f"{bundle_path.name}.ivf-{sha256[:16]}.npz")


class CodesIVF:
    """Lists of an entity table's ids over its proxy codes (module doc); kind "codes-ivf"."""

    kind = "codes-ivf"
    rotations = 1

    def __init__(self, table: EntityTable, proxy: ProxyCodes, coarse: np.ndarray, starts: np.ndarray,
                 members: np.ndarray, *, nprobe: int = NPROBE, faiss_threads: int | None = 1) -> None:
        import faiss

        self.table, self.codebooks, self.slack = table, proxy.codebooks, proxy.slack
        self.codes = table.order_codes(members)
        self.proxy = replace(proxy, codes=self.codes)  # not holding the by-id codes: one copy  # list by list: list l's codes are codes[starts[l]:starts[l + 1]]
        self.coarse = faiss.IndexFlatL2(coarse.shape[1])  # the lists' centroids in the table's 2d reals
        self.coarse.add(np.ascontiguousarray(coarse, dtype=np.float32))
        self.starts, self.members = starts, members  # list l holds the ids members[starts[l]:starts[l + 1]]
        self.slack_max = float(self.slack.max(initial=0.0)) if self.slack is not None else 0.0
        self.adc = ADC(self.codes.shape[1])
        self.nprobe, self.faiss_threads = nprobe, faiss_threads
        self.ratio = proxy_ratio(proxy)
        self.calibration_ms: dict[int, float] = {}

    @classmethod
    def build(cls, table: EntityTable, *, cache: Path | None = None, faiss_threads: int | None = 1) -> CodesIVF:
        """The IVF of `table`, read from `cache` when it is there (and readable), else built (and written there)."""
        proxy = table.proxy_codes()
        assert proxy is not None, "an IVF over codes needs a coded table"
        set_faiss_threads(faiss_threads)
        if cache is not None and cache.exists():
            try:
                return cls._read(table, proxy, cache, faiss_threads)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                log.warning("rebuilding the IVF index: %s is unreadable (%s)", cache, exc)
        index = cls(table, proxy, *_build_lists(table), faiss_threads=faiss_threads)
        if cache is not None:
            index._write(cache)
        return index

    @classmethod
    def _read(cls, table: EntityTable, proxy: ProxyCodes, path: Path, faiss_threads: int | None) -> CodesIVF:
        with np.load(path) as stored:
            coarse, starts, members = stored["coarse"], stored["starts"], stored["members"]
        n = len(table)
        if (len(members) != n or coarse.ndim != 2 or coarse.shape[1] != table.shape[1] or len(starts) != len(coarse) + 1
                or starts[0] != 0 or starts[-1] != n or np.any(np.diff(starts) < 0) or members.min(initial=0) < 0
                or members.max(initial=0) >= n):
            raise ValueError(f"its lists hold {len(members)} ids of rows {coarse.shape[1:]} wide, the table "
                             f"{table.shape}")
        return cls(table, proxy, coarse, starts.astype(np.int64), members.astype(_id_dtype(n)),
                   faiss_threads=faiss_threads)

    def _write(self, path: Path) -> None:
        for stale in path.parent.glob(f"{path.name.split('.ivf-')[0]}.ivf-*.npz"):
            stale.unlink(missing_ok=True)  # an index of what the bundle held before it was replaced
        coarse = self.coarse.reconstruct_n(0, self.coarse.ntotal)
        try:
            with replacing(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, coarse=coarse, starts=self.starts, members=self.members)
        except OSError as exc:  # a read-only models folder: serve anyway, rebuild next time
            log.warning("cannot cache the IVF index at %s (%s)", path, exc)

    @property
    def num_entities(self) -> int:
        return len(self.table)

    @property
    def nlist(self) -> int:
        return len(self.starts) - 1

    @property
    def index_bytes(self) -> int:
        """The lists' ids and bounds, the centroids, the slack, an int8 table's proxy codes (a pq table's codes are
        its own, counted in its nbytes with the inverse permutation)."""
        slack = 0 if self.slack is None else self.slack.nbytes
        codes = 0 if self.codes is getattr(self.table, "codes", None) else self.codes.nbytes
        return int(self.members.nbytes + self.starts.nbytes + self.coarse.ntotal * self.coarse.d * 4 + slack + codes)

    def scan(self, query: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The `size` entities of smallest ADC distance A among the NPROBE nearest lists: (A ascending, ids)."""
        set_faiss_threads(self.faiss_threads)
        lists = self.coarse.search(np.ascontiguousarray(query, dtype=np.float32)[None], self.nprobe)[1][0]
        runs = [slice(self.starts[lst], self.starts[lst + 1]) for lst in lists.tolist() if lst >= 0]
        ids = np.concatenate([self.members[run] for run in runs])  # contiguous runs: no gather of random rows
        block = np.concatenate([self.codes[run] for run in runs])
        proxy, at = self.adc.search(query_table(query, self.proxy), block, size)
        return proxy, ids[at].astype(np.int64)

    def certified_shortlist(self, query: np.ndarray, k: int, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate ids and exact distances from the probed lists (best effort: module doc): the first ids by A
        bound the k-th exact distance, and only those whose A - slack could beat it are re-ranked."""
        proxy, ids = self.scan(query, first_scan(k, len(excluded), self.ratio))
        first = ids[: PROBE * k + len(excluded)]
        dist = self.distances(query, first)
        kept = dist[~np.isin(first, excluded)] if len(excluded) else dist
        if len(kept) >= k:
            kth = float(np.partition(kept, k - 1)[k - 1])
            lower = proxy - self.slack[ids] if self.slack is not None else proxy
            ids = ids[lower <= kth * self.ratio * (1 + MARGIN)]
        return ids, self.distances(query, ids)

    def distances(self, query: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
        from earl_service.core import rotate

        return rotate.distances(query, self.table, ids)  # type: ignore[arg-type]  # the table reads like an array


def _id_dtype(n: int) -> type[np.integer]:
    return np.int32 if n < 2**31 else np.int64


def _build_lists(table: EntityTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k-means centroids (nlist, 2d) over a sample of the decoded rows and every row assigned to its nearest:
    (centroids, starts (nlist + 1,) int64, the ids list by list (N,) int32)."""
    import faiss

    n = len(table)
    nlist = max(1, n // LIST_SIZE)
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(n, min(n, nlist * TRAIN_PER_LIST), replace=False))
    kmeans = faiss.Kmeans(table.shape[1], nlist, niter=KMEANS_ITERATIONS, seed=0, verbose=False)
    kmeans.train(np.ascontiguousarray(table[sample]))
    assign = np.empty(n, dtype=np.int64)
    for start in range(0, n, 65_536):  # decode a block at a time: no (N, 2d) float table at once
        assign[start : start + 65_536] = kmeans.index.search(table[slice(start, start + 65_536)], 1)[1][:, 0]
    members = np.argsort(assign, kind="stable").astype(_id_dtype(n))
    starts = np.searchsorted(assign[members], np.arange(nlist + 1)).astype(np.int64)
    return np.asarray(kmeans.centroids), starts, members


__all__ = ["IVF_THRESHOLD", "NPROBE", "CodesIVF", "cache_file"]
