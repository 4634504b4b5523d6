"""kNResEnt in numpy: relational features and each entity's k nearest reserved entities, defined once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIM_STEPS = 10**9  # cosine similarities are ranked after rounding to this many steps per unit
_TIE_BITS = 24  # the rank key packs the rounded similarity above a 24-bit tie-break on the reserved position


@dataclass(frozen=True)
class SparseRows:
    """A CSR matrix (N, width): row i holds `values[indptr[i]:indptr[i+1]]` at `indices[...]` (ascending)."""

    indptr: np.ndarray  # (N + 1,) int64
    indices: np.ndarray  # (nnz,) int64
    values: np.ndarray  # (nnz,)
    width: int

    @property
    def num_rows(self) -> int:
        return len(self.indptr) - 1


def relational_features(triples: np.ndarray, num_entities: int, num_relations: int) -> SparseRows:
    """f_e as CSR (N, 2R) float64 counts: slot r counts out-edges with relation r, slot R + r in-edges."""
    edges = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    width = 2 * num_relations
    keys = np.concatenate([edges[:, 0] * width + edges[:, 1], edges[:, 2] * width + num_relations + edges[:, 1]])
    keys, counts = np.unique(keys, return_counts=True)  # sorted by (entity, slot)
    indptr = np.zeros(num_entities + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // width, minlength=num_entities), out=indptr[1:])
    return SparseRows(indptr, keys % width, counts.astype(np.float64), width)


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """concat(arange(s, s + c) for s, c in zip(starts, counts)), vectorised."""
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - np.cumsum(counts) + counts, counts)
    return offsets + np.arange(int(counts.sum()), dtype=np.int64)


def nearest_reserved(features: SparseRows, reserved: np.ndarray, k: int, temperature: float, *,
                     max_block_elements: int = 1 << 24) -> tuple[np.ndarray, np.ndarray]:
    """Top-k reserved entities by cosine similarity of relational features, with softmax(sim / T) weights.

    features: CSR (N, 2R) counts; reserved: (N_res,) entity ids. Returns ids (N, k) int64 as positions in
    `reserved` and weights (N, k) float32. Ranking key: similarity rounded to 1 / SIM_STEPS, ties broken by the
    lower reserved position; rounding makes the choice independent of float summation order, so every caller
    (training, bundle rebuild, edge reader, sampled batches) picks the very same neighbours. An entity without
    edges has similarity 0 to everything and gets the first k reserved entities with equal weights.

    Exact, and fast enough for millions of entities (the exhaustive search is O(N x N_res x 2R)):
    - entities with bit-identical unit feature vectors share one search (the long tail of low-degree
      entities repeats a few patterns), and of identical reserved vectors only the first k positions can win;
    - a float32 product screens the reserved entities sharing a slot with the block; the exact float64 key is
      then computed for the k + 8 best only, which provably hold the top k when the 8th extra one falls below
      the k-th best by more than twice the float32 error bound. Rows where it does not (many near-ties) take the
      exhaustive float64 path. Memory stays bounded by `max_block_elements` similarity entries per block.
    """
    reserved = np.asarray(reserved, dtype=np.int64)
    if len(reserved) >= 1 << _TIE_BITS:
        raise ValueError(f"at most 2**{_TIE_BITS} - 1 reserved entities are supported")
    k = min(k, len(reserved))
    if k == 0:
        return np.zeros((features.num_rows, 0), dtype=np.int64), np.zeros((features.num_rows, 0), dtype=np.float32)
    unit = _unit_rows(features)
    group, representative = identical_rows(features.indptr, features.indices, unit.values)
    search = _Candidates.build(unit, reserved, group, k)
    ids_g = np.empty((len(representative), k), dtype=np.int64)  # per pattern: positions in `reserved`
    sims_g = np.empty((len(representative), k), dtype=np.float64)
    block = max(1, min(256, max_block_elements // max(1, len(search.positions))))
    order = _by_common_slots(unit, representative, search.slot_count)
    for lo in range(0, len(representative), block):
        todo = order[lo : lo + block]  # pattern ids
        ids_g[todo], sims_g[todo] = search.top(unit, representative[todo])
    return ids_g[group], softmax_weights(sims_g[group], temperature)


def softmax_weights(sims: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(sims / T) over each row, in float64, as float32 (N, k)."""
    logits = sims / temperature
    weights = np.exp(logits - logits.max(axis=1, keepdims=True, initial=-np.inf))
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def _unit_rows(features: SparseRows) -> SparseRows:
    """The rows scaled to unit L2 norm in float64 (empty rows stay empty)."""
    n = features.num_rows
    values = features.values.astype(np.float64)
    row_of = np.repeat(np.arange(n), np.diff(features.indptr))  # (nnz,)
    norms = np.bincount(row_of, weights=values * values, minlength=n)
    inv_norm = np.divide(1.0, np.sqrt(norms), out=np.zeros(n), where=norms > 0)
    return SparseRows(features.indptr, features.indices.astype(np.int64), values * inv_norm[row_of], features.width)


def _rank(sim: np.ndarray, columns: np.ndarray, tiebreak: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of `columns` (b, c) by similarity (b, c) rounded to 1 / SIM_STEPS, then by `tiebreak` (b, c).

    Returns the chosen columns (b, k) and their rounded similarities (b, k), best first."""
    steps = np.round(sim * SIM_STEPS).astype(np.int64)  # (b, c) similarity in 1e-9 steps
    key = steps * (1 << _TIE_BITS) + tiebreak  # unique per row: the tie-break is a distinct position
    top = np.argpartition(-key, k - 1, axis=1)[:, :k]
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(key, top, 1), axis=1), 1)  # (b, k)
    return np.take_along_axis(columns, top, 1), np.take_along_axis(steps, top, 1) / SIM_STEPS


@dataclass(frozen=True)
class _Block:
    """The nonzero entries of a block of b rows (patterns), in row order."""

    counts: np.ndarray  # (b,) entries per row
    entry_row: np.ndarray  # (E,) row within the block
    cols: np.ndarray  # (E,) feature slot
    values: np.ndarray  # (E,) float64 unit feature value
    slots: np.ndarray  # (S,) the block's distinct slots, ascending
    local_col: np.ndarray  # (E,) each entry's slot among `slots`

    @classmethod
    def of(cls, unit: SparseRows, rows: np.ndarray) -> _Block:
        counts = unit.indptr[rows + 1] - unit.indptr[rows]
        idx = ranges(unit.indptr[rows], counts)
        cols = unit.indices[idx]
        slots = np.unique(cols)
        return cls(counts, np.repeat(np.arange(len(rows)), counts), cols, unit.values[idx], slots,
                   np.searchsorted(slots, cols))

    def times(self, rows: np.ndarray, matrix: np.ndarray) -> np.ndarray:
        """The block's rows `rows` (ascending) times `matrix` (S, C) over its slots: (len(rows), C)."""
        part = np.isin(self.entry_row, rows)
        return _sparse_times(self.counts[rows], self.local_col[part], self.values[part].astype(matrix.dtype), matrix)


def _sparse_times(counts: np.ndarray, cols: np.ndarray, values: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Sparse rows (counts (b,), then cols and values (E,) in row order) times `matrix` (S, C): (b, C).

    Each row sums its products in entry order, in `matrix`'s dtype, as a CSR product does: one step per entry
    rank, over the rows holding that many entries (longest rows first). Sparse rather than a dense product: a
    row uses a few dozen of the block's slots, and small dense products spend their time in BLAS threading."""
    order = np.argsort(-counts, kind="stable")
    by_length = counts[order]
    starts = (np.cumsum(counts) - counts)[order]
    out = np.zeros((len(counts), matrix.shape[1]), dtype=matrix.dtype)
    for rank in range(int(by_length.max(initial=0))):
        m = np.count_nonzero(by_length > rank)
        entry = starts[:m] + rank
        out[:m] += values[entry, None] * matrix[cols[entry]]
    result = np.empty_like(out)
    result[order] = out
    return result


@dataclass(frozen=True)
class _Candidates:
    """The reserved entities that can enter a top k, as unit feature columns, and which of them use each slot."""

    positions: np.ndarray  # (M,) positions in `reserved`, ascending
    unit_t: np.ndarray  # (2R, M) float64 unit features
    unit32_t: np.ndarray  # (2R, M) the same in float32, for screening
    tiebreak: np.ndarray  # (M,) larger for a lower position, which wins ties
    slot_members: np.ndarray  # candidates (indices into `positions`) grouped by slot: CSC of unit_t's nonzeros
    slot_start: np.ndarray  # (2R,)
    slot_count: np.ndarray  # (2R,)
    k: int

    @classmethod
    def build(cls, unit: SparseRows, reserved: np.ndarray, group: np.ndarray, k: int) -> _Candidates:
        # Of reserved entities with an identical vector only the first k positions can win (the rest lose ties).
        res_group = group[reserved]
        order = np.argsort(res_group, kind="stable")
        first = np.ones(len(order), dtype=bool)
        first[1:] = res_group[order][1:] != res_group[order][:-1]
        start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        keep = np.zeros(len(reserved), dtype=bool)
        keep[order[np.arange(len(order)) - start < k]] = True
        positions = np.flatnonzero(keep)
        row_of = np.repeat(np.arange(unit.num_rows), np.diff(unit.indptr))  # (nnz,)
        candidate = np.full(unit.num_rows, -1)
        candidate[reserved[positions]] = np.arange(len(positions))
        is_res = candidate[row_of] >= 0
        unit_t = np.zeros((unit.width, len(positions)))  # (2R, M)
        unit_t[unit.indices[is_res], candidate[row_of[is_res]]] = unit.values[is_res]
        members, slots = np.nonzero(unit_t.T)  # row-major: by candidate, then slot
        slot_count = np.bincount(slots, minlength=unit.width)
        return cls(positions, unit_t, unit_t.astype(np.float32), (1 << _TIE_BITS) - 1 - positions,
                   members[np.argsort(slots, kind="stable")], np.cumsum(slot_count) - slot_count, slot_count, k)

    def top(self, unit: SparseRows, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest reserved positions (b, k) of entities `rows` (b,) and their rounded similarities."""
        block = _Block.of(unit, rows)
        # Candidates sharing no slot with the block have similarity exactly 0 to all of its rows.
        sharing = np.unique(self.slot_members[ranges(self.slot_start[block.slots], self.slot_count[block.slots])])
        ids, sims = np.empty((len(rows), self.k), dtype=np.int64), np.empty((len(rows), self.k))
        done = np.zeros(len(rows), dtype=bool)
        extra = min(8, len(self.positions) - self.k)
        if extra > 0 and len(sharing) >= self.k + extra:
            done = self._screened(block, sharing, extra, ids, sims)
        if not done.all():
            self._exhaustive(block, sharing, np.flatnonzero(~done), ids, sims)
        return self.positions[ids], sims

    def _screened(self, block: _Block, sharing: np.ndarray, extra: int, ids: np.ndarray, sims: np.ndarray,
                  ) -> np.ndarray:
        """Fill the rows whose top k the float32 screen settles; returns which rows (b,) it settled."""
        k, width = self.k, self.k + extra
        dense = self.unit32_t[block.slots][:, sharing]  # (S, C)
        screen = block.times(np.arange(len(block.counts)), dense)  # (b, C)
        found = np.argpartition(-screen, width - 1, axis=1)[:, :width]
        found = np.take_along_axis(found, np.argsort(-np.take_along_axis(screen, found, 1), axis=1), 1)  # (b, k+8)
        values = np.take_along_axis(screen, found, 1).astype(np.float64)
        found = sharing[found]
        bound = (block.counts + 2) * 2.0**-22  # twice the float32 error of a sum of nnz unit products
        # Settled when the (k+8)-th falls clearly below the k-th: then no unscreened candidate can reach the
        # top k, and the k-th is > 0, so the candidates sharing no slot (similarity 0) cannot either.
        done = values[:, -1] < values[:, k - 1] - 2 * bound - 2e-9
        # Exact float64 similarities of the found candidates, summed over each row's entries in order.
        exact = np.zeros((len(block.counts), width))
        np.add.at(exact, block.entry_row,
                  block.values[:, None] * self.unit_t[block.cols[:, None], found[block.entry_row]])
        ids[done], sims[done] = _rank(exact[done], found[done], self.tiebreak[found[done]], k)
        return done

    def _exhaustive(self, block: _Block, sharing: np.ndarray, rest: np.ndarray, ids: np.ndarray,
                    sims: np.ndarray) -> None:
        """Fill rows `rest` in float64 against every candidate sharing a slot, and the k lowest positions among
        the others (they all have similarity 0, so only those can enter the top k)."""
        others = np.ones(len(self.positions), dtype=bool)
        others[sharing] = False
        columns = np.sort(np.concatenate([sharing, np.flatnonzero(others)[: self.k]]))  # (C + k,)
        exact = block.times(rest, self.unit_t[block.slots][:, columns])  # (b'', C + k)
        shape = (len(rest), len(columns))
        ids[rest], sims[rest] = _rank(exact, np.broadcast_to(columns, shape),
                                      np.broadcast_to(self.tiebreak[columns], shape), self.k)


def _by_common_slots(unit: SparseRows, rows: np.ndarray, popularity: np.ndarray) -> np.ndarray:
    """An order of `rows` (positions into it) sorted by each row's three most popular columns, so that
    consecutive rows share columns."""
    counts = unit.indptr[rows + 1] - unit.indptr[rows]
    entries = ranges(unit.indptr[rows], counts)
    owner = np.repeat(np.arange(len(counts)), counts)
    cols = unit.indices[entries]
    order = np.lexsort((-popularity[cols], owner))  # by row, then most popular column first
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(order)) - starts[owner[order]]
    top = np.full((len(counts), 3), -1, dtype=np.int64)
    keep = rank < 3
    top[owner[order][keep], rank[keep]] = cols[order][keep]
    return np.lexsort((top[:, 2], top[:, 1], top[:, 0]))


def identical_rows(indptr: np.ndarray, cols: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group rows of a CSR matrix whose (column, float64 value) entries are bit-identical.

    Returns the group of every row (N,) and the lowest row of every group (G,). Rows are compared through two
    independent 64-bit hashes of their entries (a collision would need ~2**64 rows)."""
    n = len(indptr) - 1
    nnz = np.diff(indptr)
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    entry = (np.asarray(cols).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ bits
    hashes = []
    for salt in (0x632BE59BD9B4E019, 0x8CB92BA72F3D8DD7):
        h = _splitmix64(entry ^ np.uint64(salt))
        row = np.zeros(n, dtype=np.uint64)
        nonempty = nnz > 0
        if nonempty.any():
            row[nonempty] = np.add.reduceat(h, indptr[:-1][nonempty])  # wraps mod 2**64: fine for a hash
        hashes.append(row + _splitmix64(nnz.astype(np.uint64) ^ np.uint64(salt)))
    order = np.lexsort((hashes[1], hashes[0]))  # stable: equal rows keep ascending ids
    h0, h1 = hashes[0][order], hashes[1][order]
    new = np.ones(n, dtype=bool)
    new[1:] = (h0[1:] != h0[:-1]) | (h1[1:] != h1[:-1])
    group = np.empty(n, dtype=np.int64)
    group[order] = np.cumsum(new) - 1
    return group, order[new].astype(np.int64)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def nearest_reserved_exhaustive(features: SparseRows, reserved: np.ndarray, k: int, temperature: float, *,
                                max_block_elements: int = 1 << 25) -> tuple[np.ndarray, np.ndarray]:
    """The reference for `nearest_reserved`: every entity against every reserved entity in float64 (slow)."""
    reserved = np.asarray(reserved, dtype=np.int64)
    n, k = features.num_rows, min(k, len(reserved))
    unit = _unit_rows(features)
    row_of = np.repeat(np.arange(n), np.diff(unit.indptr))  # (nnz,)
    position = np.full(n, -1)
    position[reserved] = np.arange(len(reserved))
    is_res = position[row_of] >= 0
    res_unit = np.zeros((len(reserved), unit.width))  # (N_res, 2R)
    res_unit[position[row_of[is_res]], unit.indices[is_res]] = unit.values[is_res]
    block = max(1, max_block_elements // max(1, len(reserved), unit.width))
    tiebreak = (1 << _TIE_BITS) - 1 - np.arange(len(reserved), dtype=np.int64)
    ids, sims = np.empty((n, k), dtype=np.int64), np.empty((n, k))
    for start in range(0, n, block):
        stop = min(n, start + block)
        lo, hi = unit.indptr[start], unit.indptr[stop]
        rows = np.zeros((stop - start, unit.width))
        rows[row_of[lo:hi] - start, unit.indices[lo:hi]] = unit.values[lo:hi]
        shape = (stop - start, len(reserved))
        ids[start:stop], sims[start:stop] = _rank(rows @ res_unit.T, np.broadcast_to(np.arange(len(reserved)), shape),
                                                  np.broadcast_to(tiebreak, shape), k)
    return ids, softmax_weights(sims, temperature)
