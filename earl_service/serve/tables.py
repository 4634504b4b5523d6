"""Entity tables held as a bundle stores them (fp32 rows, int8 rows with a scale each, pq codes), decoded by the row.

Each table reads like the (N, 2d) float32 array it decodes to where the predictor needs rows (`table[ids]`, `len`,
`shape`), so the exact scorers run on it unchanged, while memory stays what the file paid: 4, 1 or M/2d bytes a
number. `proxy_codes()` gives the codes the ADC scan (serve/codes.py) ranks candidates by, and per row how far
what those codes decode to may lie from the row itself: a pq table's own codes; for float and int8 rows one byte
per complex coordinate (PairCoded), coded when first asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

CENTROIDS = 256  # one code byte: bundle/codebooks.CENTROIDS
Rows = int | slice | np.ndarray


@dataclass(frozen=True)
class ProxyCodes:
    """Codes (N, M) uint8 over codebooks (M, 256, s) float32, and `slack` (N,) float32: how far each row may lie
    from what its codes decode to (None where the codes are the row itself). Two layouts (serve/codes.py sums them):
    - real sub-vectors (`pairs` False, a pq table): subspace j is s consecutive numbers of [re | im] (of the row
      taken in `columns` order where given); the ADC sum is the L1 distance over the 2d reals, within sqrt 2 of
      RotatE's distance whatever the order; slack in L1.
    - complex pairs (`pairs` True, an int8 table): code j names the nearest of one shared codebook (1, 256, 2) of
      complex numbers (re, im) to the row's complex coordinate j (M = d); the ADC sum of moduli |q_j - centroid|
      lies within the slack, the sum of moduli |e_j - centroid|, of RotatE's distance itself (triangle inequality).
    """

    codes: np.ndarray
    codebooks: np.ndarray
    slack: np.ndarray | None = None
    pairs: bool = False
    columns: np.ndarray | None = None  # real sub-vectors: the query's column each coded number is (Layout.columns)

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.codebooks.nbytes + (0 if self.slack is None else self.slack.nbytes))


class EntityTable:
    """An (N, 2d) float32 table read by rows: `self[rows]` (an id, a slice or an id array) decodes only those."""

    kind = "abstract"

    @property
    def shape(self) -> tuple[int, int]:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Rows) -> np.ndarray:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes the table holds (its proxy codes aside: ProxyCodes.nbytes)."""
        raise NotImplementedError

    def dense(self) -> np.ndarray:
        """Every row decoded: (N, 2d) float32 (for an index that needs floats)."""
        return self[slice(None)]

    def proxy_codes(self) -> ProxyCodes | None:
        """Codes the ADC scan ranks by (None: search the floats with serve/index.py's ProxyIndex)."""
        return None

    def order_codes(self, members: np.ndarray) -> np.ndarray:
        """The proxy codes in the order `members` (a permutation of the ids: an IVF's lists one after another)
        lists their rows, held instead of the by-id ones (one copy): the proxy_codes() after this."""
        raise NotImplementedError


class PairCoded(EntityTable):
    """A table of float rows (as trained, or decoded from int8) whose proxy codes name, for each complex coordinate
    (re_j, im_j), the nearest of 256 complex centroids shared by every row and coordinate (k-means over a sample of
    them), so one (d, 256) lookup table per query serves every row; each row's slack is the sum of its coordinates'
    distances to their centroids, the certificate's allowance (ProxyCodes, codes.py). Coded once, when first asked
    for: one byte per complex coordinate and a float per row beside the table."""

    BLOCK = 16_384  # rows coded at a time: bounds the float32 temporaries
    SAMPLE = 256 * CENTROIDS  # complex coordinates the codebook is trained on (faiss's default cap)
    _proxy: ProxyCodes | None = None
    _position: np.ndarray | None = None  # after order_codes: row i's proxy codes are at _position[i]

    def coordinates(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """(S, 2) float32: complex coordinate cols[s] of row rows[s] as (re, im)."""
        raise NotImplementedError

    def proxy_codes(self) -> ProxyCodes:
        if self._proxy is None:
            self._proxy = self._pair_codes()
        return self._proxy

    def forget_codes(self) -> None:
        """Drop the pair codes (a search that does not use them), to be coded again if asked for."""
        self._proxy = self._position = None

    def order_codes(self, members: np.ndarray) -> np.ndarray:
        proxy = self.proxy_codes()  # the slack stays by id
        codes, self._position = _reordered(proxy.codes, self._position, members)
        self._proxy = ProxyCodes(codes, proxy.codebooks, proxy.slack, pairs=True)
        return codes

    def _pair_codes(self) -> ProxyCodes:
        """Each complex coordinate's nearest centroid (L2 in the plane: the modulus) and each row's slack."""
        import faiss

        n, width = self.shape
        dim = width // 2
        centroids = self._centroids()  # (256, 2)
        nearest = faiss.IndexFlatL2(2)
        nearest.add(centroids)
        codes = np.empty((n, dim), dtype=np.uint8)
        slack = np.empty(n, dtype=np.float32)
        for start in range(0, n, self.BLOCK):
            rows = self[slice(start, start + self.BLOCK)]  # (b, 2d)
            points = np.ascontiguousarray(np.stack([rows[:, :dim], rows[:, dim:]], -1).reshape(-1, 2))  # (b * d, 2)
            picked = nearest.search(points, 1)[1].reshape(len(rows), dim)  # (b, d) centroid ids
            codes[start : start + self.BLOCK] = picked
            # The slack from the centroids themselves: FAISS's expanded squared distances lose digits near 0.
            near = centroids[picked]  # (b, d, 2)
            slack[start : start + self.BLOCK] = np.hypot(rows[:, :dim] - near[..., 0], rows[:, dim:] - near[..., 1]).sum(1)
        return ProxyCodes(codes, centroids[None], slack, pairs=True)

    def _centroids(self) -> np.ndarray:
        """(256, 2) float32: k-means over SAMPLE of the table's complex coordinates (all of them when fewer, padded
        by repeats when there are fewer than 256)."""
        import faiss

        n, width = self.shape
        dim = width // 2
        rng = np.random.default_rng(0)
        flat = rng.choice(n * dim, min(n * dim, self.SAMPLE), replace=False) if n * dim > self.SAMPLE else np.arange(n * dim)
        rows, cols = np.divmod(flat, dim)
        points = np.ascontiguousarray(self.coordinates(rows, cols), dtype=np.float32)  # (S, 2)
        if len(points) <= CENTROIDS:
            return np.resize(points, (CENTROIDS, 2)) if len(points) else np.zeros((CENTROIDS, 2), np.float32)
        kmeans = faiss.Kmeans(2, CENTROIDS, niter=20, seed=0, min_points_per_centroid=1, verbose=False)
        kmeans.train(points)
        return np.asarray(kmeans.centroids, dtype=np.float32)


class DenseTable(PairCoded):
    """Rows as float32, as trained (fp32 and fp16 bundles, EARL's rebuilt entities)."""

    kind = "fp32"

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = np.ascontiguousarray(rows, dtype=np.float32)  # (N, 2d)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows.shape

    def __getitem__(self, rows: Rows) -> np.ndarray:
        return self.rows[rows]

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def dense(self) -> np.ndarray:
        return self.rows

    def coordinates(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return np.stack([self.rows[rows, cols], self.rows[rows, cols + self.shape[1] // 2]], 1)


class PQTable(EntityTable):
    """Rows as pq codes (N, M) uint8 over fp16 codebooks (M, 256, 2d / M): row i, subspace j is
    codebooks[j, codes[i, j]] (bundle/codebooks.decode_table), so its proxy codes are the codes themselves."""

    kind = "pq"

    def __init__(self, codes: np.ndarray, codebooks: np.ndarray, columns: np.ndarray | None = None) -> None:
        self.codes = np.ascontiguousarray(codes, dtype=np.uint8)  # (N, M)
        self.codebooks = np.ascontiguousarray(codebooks, dtype=np.float32)  # (M, 256, s), exactly the fp16 values
        # In pairs order (bundle/codebooks.ORDERS) the row's column each coded number is, and where each column is
        # among the coded numbers: a decoded row is read back through the latter.
        self.columns = columns
        self._back = None if columns is None else np.argsort(columns)
        m, _, sub = self.codebooks.shape
        # Each centroid as one opaque item of s floats, and where subspace j's start: one take gathers a row's
        # centroids, 4-5x faster than numpy's two-array fancy indexing (0.3 vs 1.5 ms for 1,000 FB15k-237 rows).
        self._centroids = self.codebooks.reshape(m * CENTROIDS, sub).view(np.dtype((np.void, 4 * sub))).ravel()
        self._offsets = np.arange(m, dtype=np.intp) * CENTROIDS
        self.position: np.ndarray | None = None  # after order_codes: row i's codes are codes[position[i]]

    @property
    def shape(self) -> tuple[int, int]:
        m, _, sub = self.codebooks.shape
        return len(self.codes), m * sub

    def order_codes(self, members: np.ndarray) -> np.ndarray:
        """The codes in `members`' order, read by id through the inverse permutation (4 bytes a row): an IVF's lists
        are then contiguous runs of the one codes array (a gather of random rows cost 3.6 ms a query at 1M)."""
        self.codes, self.position = _reordered(self.codes, self.position, members)
        return self.codes

    def __getitem__(self, rows: Rows) -> np.ndarray:
        codes = self.codes[rows] if self.position is None else self.codes[self.position[rows]]
        picked = codes.astype(np.intp) + self._offsets  # (b, M), or (M,) for one id
        rows = self._centroids.take(picked).view(np.float32).reshape(*picked.shape[:-1], self.shape[1])
        return rows if self._back is None else rows[..., self._back]

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.codebooks.nbytes + (0 if self.position is None else self.position.nbytes))

    def proxy_codes(self) -> ProxyCodes:
        return ProxyCodes(self.codes, self.codebooks, columns=self.columns)


class Int8Table(PairCoded):
    """Rows as int8 values (N, 2d) times a float32 scale each (bundle/precision.Int8), searched by their pair codes
    (PairCoded)."""

    kind = "int8"

    def __init__(self, values: np.ndarray, scale: np.ndarray) -> None:
        self.values = np.ascontiguousarray(values, dtype=np.int8)  # (N, 2d)
        self.scale = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)  # (N,)

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape

    def __getitem__(self, rows: Rows) -> np.ndarray:
        scale = self.scale[rows]
        return self.values[rows].astype(np.float32) * (scale[..., None] if np.ndim(scale) else scale)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.scale.nbytes)

    def coordinates(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        dim = self.shape[1] // 2
        return np.stack([self.values[rows, cols], self.values[rows, cols + dim]], 1) * self.scale[rows, None]


def _reordered(codes: np.ndarray, position: np.ndarray | None, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`codes` (in the order `position` says, by id when None) put in `members`' order, and the new position."""
    by_id = codes if position is None else codes[position]
    position = np.empty(len(members), dtype=members.dtype)
    position[members] = np.arange(len(members), dtype=members.dtype)
    return np.ascontiguousarray(by_id[members]), position


def entity_table(stored: dict[str, Any], entities: Callable[[], np.ndarray], *, from_codes: bool = True,
                 ) -> EntityTable:
    """The table to serve: from the bundle's stored codes (Bundle.stored) when it holds some and `from_codes`,
    else the float rows (N, 2d) `entities()` gives (called only then)."""
    if from_codes and "codes" in stored:
        return PQTable(stored["codes"], stored["codebooks"], stored.get("columns"))
    if from_codes and "values" in stored:
        return Int8Table(stored["values"], stored["scale"])
    return DenseTable(entities())


__all__ = ["DenseTable", "EntityTable", "Int8Table", "PQTable", "PairCoded", "ProxyCodes", "entity_table"]
