"""Graph features computed once per graph: relational features, normalised adjacency, k nearest reserved entities."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch

# CSR support is marked beta; the operations used here (construction, spmm, transpose) are stable.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")


SIM_STEPS = 10**9  # cosine similarities are ranked after rounding to this many steps per unit


def _csr(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A coalesced (duplicates summed) CSR matrix from COO triplets."""
    coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, shape, check_invariants=False)
    return coo.coalesce().to_sparse_csr()


@dataclass
class SparsePair:
    """A constant sparse matrix with its transpose, both CSR, so that A @ Y backpropagates as A^T @ G."""

    mat: torch.Tensor
    mat_t: torch.Tensor

    @classmethod
    def from_coo(cls, rows, cols, vals, shape: tuple[int, int]) -> SparsePair:
        return cls(_csr(rows, cols, vals, shape), _csr(cols, rows, vals, (shape[1], shape[0])))

    def to(self, device: torch.device) -> SparsePair:
        return SparsePair(self.mat.to(device), self.mat_t.to(device))

    def __matmul__(self, dense: torch.Tensor) -> torch.Tensor:
        return _SpMM.apply(self.mat, self.mat_t, dense)


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mat, mat_t, dense):
        # Sparse products run in the matrix's dtype (float32), also under bfloat16 autocast.
        ctx.mat_t, ctx.dtype = mat_t, dense.dtype
        with torch.autocast(mat.device.type, enabled=False):
            return torch.sparse.mm(mat, dense.to(mat.dtype))

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(grad.device.type, enabled=False):
            return None, None, torch.sparse.mm(ctx.mat_t, grad.to(ctx.mat_t.dtype).contiguous()).to(ctx.dtype)


def relational_features(triples: np.ndarray, num_entities: int, num_relations: int) -> torch.Tensor:
    """f_e as a CSR (N, 2R) count matrix: slot r counts out-edges with relation r, slot R + r in-edges."""
    h, r, t = (torch.as_tensor(triples[:, i], dtype=torch.long) for i in range(3))
    rows = torch.cat([h, t])
    cols = torch.cat([r, r + num_relations])
    return _csr(rows, cols, torch.ones(rows.numel()), (num_entities, 2 * num_relations))


def nearest_reserved(
    features: torch.Tensor,
    reserved: torch.Tensor,
    k: int,
    temperature: float,
    *,
    max_block_elements: int = 1 << 24,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k reserved entities by cosine similarity of relational features, with softmax(sim / T) weights.

    features: CSR (N, 2R) counts; reserved: (N_res,) entity ids. Returns ids (N, k) as positions in
    `reserved` and weights (N, k). Ranking key: similarity rounded to 1e-9, ties broken by the lower reserved
    position; rounding makes the choice independent of float summation order, so the numpy edge reader picks
    the very same neighbours. An entity without edges has similarity 0 to everything and gets the first k
    reserved entities with equal weights.

    Exact, and fast enough for millions of entities (the exhaustive search is O(N x N_res x 2R)):
    - entities with bit-identical unit feature vectors share one search (the long tail of low-degree
      entities repeats a few patterns), and of identical reserved vectors only the first k positions can win;
    - a float32 sparse product screens every reserved entity; the exact float64 key is then computed for the
      k + 8 best only, which provably hold the top k when the 8th extra one falls below the k-th best by more
      than twice the float32 error bound. Rows where it does not (many near-ties) take the exhaustive float64
      path. Memory stays bounded by `max_block_elements` similarity entries per block.
    Runs on one torch thread: its per-block operations are small, and OpenMP's fork/join on each of them cost
    more than they saved (5x more on 2 shared cores).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _nearest_reserved(features, reserved, k, temperature, max_block_elements)
    finally:
        torch.set_num_threads(threads)


def _nearest_reserved(
    features: torch.Tensor, reserved: torch.Tensor, k: int, temperature: float, max_block_elements: int
) -> tuple[torch.Tensor, torch.Tensor]:
    num_entities, width = features.shape
    if reserved.numel() >= 1 << 24:
        raise ValueError("at most 2**24 - 1 reserved entities are supported")
    k = min(k, reserved.numel())
    crow, col, val = features.crow_indices(), features.col_indices(), features.values()
    nnz = crow[1:] - crow[:-1]  # (N,)
    row_of = torch.repeat_interleave(torch.arange(num_entities), nnz)  # (nnz,)
    val = val.double()
    norms = torch.zeros(num_entities, dtype=torch.float64).index_add_(0, row_of, val * val)
    inv_norm = torch.where(norms > 0, 1.0 / norms.sqrt(), torch.zeros((), dtype=torch.float64))
    unit = val * inv_norm[row_of]  # L2-normalised feature values, (nnz,)

    group, representative = _identical_rows(crow, col, unit)  # (N,) pattern id, (G,) one entity per pattern
    # Reserved candidates: the first k positions of each distinct reserved vector (the rest always lose ties).
    res_group = group[reserved]
    order = torch.argsort(res_group, stable=True)
    first = torch.ones(order.numel(), dtype=torch.bool)
    first[1:] = res_group[order][1:] != res_group[order][:-1]
    start = torch.cummax(torch.where(first, torch.arange(order.numel()), 0), 0).values
    keep = torch.zeros(reserved.numel(), dtype=torch.bool)
    keep[order[torch.arange(order.numel()) - start < k]] = True
    cand = keep.nonzero().squeeze(1)  # (M,) reserved positions, ascending
    position = torch.full((num_entities,), -1, dtype=torch.long)
    position[reserved[cand]] = torch.arange(cand.numel())
    is_res = position[row_of] >= 0
    res_unit = torch.zeros(cand.numel(), width, dtype=torch.float64)  # (M, 2R)
    res_unit[position[row_of[is_res]], col[is_res]] = unit[is_res]
    res_unit_t = res_unit.T.contiguous()  # (2R, M)
    res_unit32_t = res_unit_t.float()
    tiebreak = (1 << 24) - 1 - cand  # (M,) lower position wins
    # Which candidates use each slot (CSC of res_unit): a block screens only the candidates sharing a slot with
    # one of its rows; every other candidate has similarity exactly 0 there.
    res_rows, res_slots = res_unit.nonzero(as_tuple=True)
    by_slot = torch.argsort(res_slots, stable=True)
    slot_members = res_rows[by_slot]
    slot_count = torch.bincount(res_slots, minlength=width)
    slot_start = torch.cumsum(slot_count, 0) - slot_count

    ids_g = torch.empty(representative.numel(), k, dtype=torch.long)  # per pattern: positions in `reserved`
    sims_g = torch.empty(representative.numel(), k, dtype=torch.float64)
    extra = min(8, cand.numel() - k)
    # Rows per block (at most 256, and at most max_block_elements similarities against all candidates), in an
    # order that groups rows sharing their most common slots.
    block = max(1, min(256, max_block_elements // max(1, cand.numel())))
    order = _by_common_slots(crow, col, representative, slot_count)
    for lo in range(0, representative.numel(), block):
        todo = order[lo : lo + block]  # pattern ids
        reps = representative[todo]
        b = reps.numel()
        counts = nnz[reps]
        idx = _ranges(crow[reps], counts)  # (E,) this block's entries
        entry_row = torch.repeat_interleave(torch.arange(b), counts)  # (E,)
        ecol, eval_ = col[idx], unit[idx]
        top_ids, top_sims = torch.empty(b, k, dtype=torch.long), torch.empty(b, k, dtype=torch.float64)
        done = torch.zeros(b, dtype=torch.bool)
        slots = torch.unique(ecol)  # (S,) the block's slots
        local_col = torch.searchsorted(slots, ecol)  # (E,) entries' columns among `slots`
        sharing = torch.unique(slot_members[_ranges(slot_start[slots], slot_count[slots])])  # (C,) candidates
        if extra > 0 and sharing.numel() >= k + extra:
            dense = res_unit32_t.index_select(0, slots).index_select(1, sharing)  # (S, C)
            rows32 = _csr_rows(counts, local_col, eval_.float(), slots.numel())
            values, found = torch.topk(torch.sparse.mm(rows32, dense), k + extra, dim=1, sorted=True)  # (b, k+8)
            found = sharing[found]
            bound = (counts.double() + 2) * 2.0**-22  # twice the float32 error of a sum of nnz unit products
            # Complete when the (k+8)-th falls clearly below the k-th: then no unscreened candidate can reach the
            # top k, and the k-th is > 0, so the candidates sharing no slot (similarity 0) cannot either.
            done = values[:, -1].double() < values[:, k - 1].double() - 2 * bound - 2e-9
            # Exact float64 similarities of the candidates, summed over each row's nonzero features.
            exact = torch.zeros(b, k + extra, dtype=torch.float64).index_add_(
                0, entry_row, eval_[:, None] * res_unit[found[entry_row], ecol[:, None]])
            top_ids[done], top_sims[done] = _rank(exact[done], found[done], tiebreak[found[done]], k)
        if not done.all():
            # Near-ties or zeros in the top k: every candidate sharing a slot, in float64, and the k lowest
            # positions among the others (they all have similarity 0, so only those can enter the top k).
            rest = (~done).nonzero().squeeze(1)
            others = torch.ones(cand.numel(), dtype=torch.bool)
            others[sharing] = False
            columns = torch.cat([sharing, others.nonzero().squeeze(1)[:k]]).sort().values  # (C + k,)
            dense = res_unit_t.index_select(0, slots).index_select(1, columns)  # (S, C + k) float64
            part = torch.isin(entry_row, rest)
            rows64 = _csr_rows(counts[rest], local_col[part], eval_[part], slots.numel())
            exact = torch.sparse.mm(rows64, dense)  # (b'', C + k)
            top_ids[rest], top_sims[rest] = _rank(exact, columns.expand(rest.numel(), -1),
                                                  tiebreak[columns].expand(rest.numel(), -1), k)
        ids_g[todo], sims_g[todo] = cand[top_ids], top_sims
    ids, sims = ids_g[group], sims_g[group]
    return ids, torch.softmax(sims / temperature, dim=1).float()


def _by_common_slots(crow: torch.Tensor, col: torch.Tensor, rows: torch.Tensor, popularity: torch.Tensor) -> torch.Tensor:
    """An order of `rows` (positions into it) sorted by each row's three most popular columns, so that
    consecutive rows share columns."""
    counts = (crow[1:] - crow[:-1])[rows].numpy()
    entries = _ranges(crow[rows], torch.from_numpy(counts)).numpy()
    owner = np.repeat(np.arange(len(counts)), counts)
    cols = col.numpy()[entries]
    order = np.lexsort((-popularity.numpy()[cols], owner))  # by row, then most popular column first
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(order)) - starts[owner[order]]
    top = np.full((len(counts), 3), -1, dtype=np.int64)
    keep = rank < 3
    top[owner[order][keep], rank[keep]] = cols[order][keep]
    return torch.from_numpy(np.lexsort((top[:, 2], top[:, 1], top[:, 0])))


def _ranges(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """cat(arange(s, s + c) for s, c in zip(starts, counts))."""
    offsets = torch.repeat_interleave(starts - torch.cumsum(counts, 0) + counts, counts)
    return offsets + torch.arange(int(counts.sum()))


def _csr_rows(counts: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, width: int) -> torch.Tensor:
    crow = torch.zeros(counts.numel() + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(counts, 0)
    return torch.sparse_csr_tensor(crow, cols, values, (counts.numel(), width), check_invariants=False)


def _rank(sim: torch.Tensor, columns: torch.Tensor, tiebreak: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of `columns` (b, c) by similarity (b, c) rounded to 1e-9, then by `tiebreak` (b, c).

    Returns the chosen columns (b, k) and their rounded similarities (b, k)."""
    steps = torch.round(sim * SIM_STEPS).to(torch.int64)  # (b, c) similarity in 1e-9 steps
    top = torch.topk(steps * (1 << 24) + tiebreak, k, dim=1, sorted=True).indices
    return torch.gather(columns, 1, top), torch.gather(steps, 1, top).double() / SIM_STEPS


def _identical_rows(crow: torch.Tensor, col: torch.Tensor, unit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Group rows of a CSR matrix whose (column, float64 value) entries are bit-identical.

    Returns the group of every row (N,) and the lowest row of every group (G,). Rows are compared through two
    independent 64-bit hashes of their entries (a collision would need ~2**64 rows)."""
    n = crow.numel() - 1
    nnz = (crow[1:] - crow[:-1]).numpy()
    bits = unit.numpy().view(np.uint64)
    entry = (col.numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ bits
    hashes = []
    for salt in (0x632BE59BD9B4E019, 0x8CB92BA72F3D8DD7):
        h = _splitmix64(entry ^ np.uint64(salt))
        row = np.zeros(n, dtype=np.uint64)
        nonempty = nnz > 0
        if nonempty.any():
            row[nonempty] = np.add.reduceat(h, crow[:-1].numpy()[nonempty])  # wraps mod 2**64: fine for a hash
        hashes.append(row + _splitmix64(nnz.astype(np.uint64) ^ np.uint64(salt)))
    order = np.lexsort((hashes[1], hashes[0]))  # stable: equal rows keep ascending ids
    h0, h1 = hashes[0][order], hashes[1][order]
    new = np.ones(n, dtype=bool)
    new[1:] = (h0[1:] != h0[:-1]) | (h1[1:] != h1[:-1])
    group = np.empty(n, dtype=np.int64)
    group[order] = np.cumsum(new) - 1
    return torch.from_numpy(group), torch.from_numpy(order[new].astype(np.int64))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def nearest_reserved_exhaustive(
    features: torch.Tensor, reserved: torch.Tensor, k: int, temperature: float, *, max_block_elements: int = 1 << 25
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference for `nearest_reserved`: every entity against every reserved entity in float64 (slow)."""
    num_entities, width = features.shape
    k = min(k, reserved.numel())
    crow, col, val = features.crow_indices(), features.col_indices(), features.values()
    row_of = torch.repeat_interleave(torch.arange(num_entities), crow[1:] - crow[:-1])  # (nnz,)
    val = val.double()
    norms = torch.zeros(num_entities, dtype=torch.float64).index_add_(0, row_of, val * val)
    inv_norm = torch.where(norms > 0, 1.0 / norms.sqrt(), torch.zeros((), dtype=torch.float64))
    unit = val * inv_norm[row_of]
    position = torch.full((num_entities,), -1, dtype=torch.long)
    position[reserved] = torch.arange(reserved.numel())
    is_res = position[row_of] >= 0
    res_unit = torch.zeros(reserved.numel(), width, dtype=torch.float64)
    res_unit[position[row_of[is_res]], col[is_res]] = unit[is_res]
    block = max(1, max_block_elements // max(1, reserved.numel(), width))
    tiebreak = (1 << 24) - 1 - torch.arange(reserved.numel(), dtype=torch.int64)
    ids = torch.empty(num_entities, k, dtype=torch.long)
    sims = torch.empty(num_entities, k, dtype=torch.float64)
    for start in range(0, num_entities, block):
        stop = min(num_entities, start + block)
        lo, hi = int(crow[start]), int(crow[stop])
        rows = torch.zeros(stop - start, width, dtype=torch.float64)
        rows[row_of[lo:hi] - start, col[lo:hi]] = unit[lo:hi]
        everything = torch.arange(reserved.numel()).expand(stop - start, -1)
        ids[start:stop], sims[start:stop] = _rank(rows @ res_unit.T, everything, tiebreak.expand(stop - start, -1), k)
    return ids, torch.softmax(sims / temperature, dim=1).float()


@dataclass
class Graph:
    """Everything the encoder needs about one graph; built once, reused every step.

    Row-normalised matrices divide by c_e = in-degree + out-degree (edges counted with multiplicity).
    - conrel (N, 2R): f_e / c_e, the mean of the relation-end slots over e's edges (ConRel input).
    - message (N, 3N): the entity part of a GNN layer. Columns 3j / 3j+1 / 3j+2 address the out-message /
      in-message / self transforms of entity j, so sum_j (W_out h_j + W_in h_j) / c_e + W_self h_e is one spmm
      over the rows of X [W_out; W_in; W_self]^T. The relation part reuses `conrel` (same 1/c_e weights).
    - knn_ids / knn_weights (N, k): nearest reserved entities (positions in `reserved`) and weights.

    Sampled training (earl_service/sampling.py) builds small local graphs of the same class: one holds the
    encoder inputs of the sampled entities (no `message`; `reserved` and the `knn` columns then address only the
    reserved rows named by `reserved_rows` / `knn_rows`), and one per GNN layer holds a rectangular message
    matrix (n_out, 3 n_in) whose n_out outputs are the first n_out of its n_in inputs.

    `compact` (full graphs with many repeated input rows, see `compact_inputs`) lets the encoder compute the
    initial embeddings and the first layer's transforms once per distinct input row instead of once per entity.
    """

    num_entities: int
    num_relations: int
    triples: torch.Tensor  # (E, 3) int64, the edges the encoder reads
    reserved: torch.Tensor  # (N_res,) entity ids with their own embedding rows
    conrel: SparsePair
    message: SparsePair | None  # None in the input graph of a sampled batch (no GNN layer reads it)
    knn: SparsePair | None  # (N, N_res) weights, the kNResEnt aggregation as a sparse matrix
    knn_ids: torch.Tensor | None
    knn_weights: torch.Tensor | None
    degree: torch.Tensor  # (N,) c_e
    # Local graphs only (None: every reserved row, in order): the reserved_embeddings row of each entity in
    # `reserved`, and the reserved_embeddings row behind each column of `knn`.
    reserved_rows: torch.Tensor | None = None
    knn_rows: torch.Tensor | None = None
    compact: CompactInputs | None = None

    @property
    def non_reserved(self) -> torch.Tensor:
        mask = torch.ones(self.num_entities, dtype=torch.bool)
        mask[self.reserved] = False
        return mask.nonzero().squeeze(1)

    def to(self, device: torch.device) -> Graph:
        def move(x):
            return None if x is None else x.to(device)

        moved = Graph(
            self.num_entities,
            self.num_relations,
            self.triples.to(device),
            self.reserved.to(device),
            self.conrel.to(device),
            move(self.message),
            move(self.knn),
            move(self.knn_ids),
            move(self.knn_weights),
            self.degree.to(device),
            move(self.reserved_rows),
            move(self.knn_rows),
        )
        if self.compact is not None:  # its first layer shares every tensor but `message` with this graph
            c = self.compact
            moved.compact = CompactInputs(c.inputs.to(device), replace(moved, message=c.first_layer.message.to(device)),
                                          c.index.to(device))
        return moved


@dataclass
class CompactInputs:
    """The encoder's inputs once per distinct input row, and a first GNN layer that reads them.

    h^0_e = f_m([ConRel(conrel_e); kNResEnt(knn_e)]) is a function of e's input rows alone, so entities whose
    ConRel and kNResEnt rows are bit-identical (the long tail of low-degree entities shares a few relation
    patterns) have the same h^0, and so the same first-layer transforms [W_out; W_in; W_self] h^0. `inputs`
    holds one row per distinct pattern of the non-reserved entities, then every reserved entity (own rows);
    `first_layer` is the full graph with its message matrix (N, 3 G) addressing those G rows (edges to entities
    of one pattern summed). sum_j W x_j over neighbours j is unchanged, so the layer's output is the full-graph
    one up to float summation order. WN18RR's 40,559 training entities give 7,035 rows (2,980 patterns
    and 4,055 reserved entities); FB15k-237's 237 relations leave too few repeats to group.
    """

    inputs: Graph  # G rows; `reserved` = its last N_res rows, in the order of the full graph's `reserved`
    first_layer: Graph  # the full graph with message (N, 3G)
    index: torch.Tensor  # (N,) each entity's row in `inputs`


def _knn_matrix(ids: torch.Tensor, weights: torch.Tensor, num_reserved: int, dtype: torch.dtype) -> SparsePair:
    """The kNResEnt aggregation (rows, N_res) from each row's k reserved positions `ids` and their `weights`."""
    rows = torch.arange(ids.shape[0]).repeat_interleave(ids.shape[1])
    return SparsePair.from_coo(rows, ids.reshape(-1), weights.reshape(-1).to(dtype), (ids.shape[0], num_reserved))


def compact_inputs(graph: Graph, message: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *,
                   min_saving: float = 0.1) -> CompactInputs | None:
    """Group `graph`'s entities by bit-identical (ConRel, kNResEnt) input rows; None when that saves less than
    `min_saving` of the rows (FB15k-237's 237 relations leave few repeats). `message`: the (rows, cols, values)
    triplets that built graph.message."""
    n, num_rel = graph.num_entities, graph.num_relations
    crow, col, val = graph.conrel.mat.crow_indices(), graph.conrel.mat.col_indices(), graph.conrel.mat.values()
    conrel_counts = crow[1:] - crow[:-1]
    counts = conrel_counts
    rows, cols, vals = torch.repeat_interleave(torch.arange(n), counts), col, val.double()
    if graph.knn_ids is not None and graph.knn_weights is not None:
        k = graph.knn_ids.shape[1]
        rows = torch.cat([rows, torch.arange(n).repeat_interleave(k)])
        cols = torch.cat([cols, 2 * num_rel + graph.knn_ids.reshape(-1)])
        vals = torch.cat([vals, graph.knn_weights.reshape(-1).double()])
        counts = counts + k
    order = torch.argsort(rows, stable=True)
    entry_crow = torch.zeros(n + 1, dtype=torch.long)
    entry_crow[1:] = torch.cumsum(counts, 0)
    entry_cols, entry_vals = cols[order], vals[order]
    group, _ = _identical_rows(entry_crow, entry_cols, entry_vals)

    is_res = torch.zeros(n, dtype=torch.bool)
    is_res[graph.reserved] = True
    patterns, pattern_of = torch.unique(group[~is_res], return_inverse=True)
    g, n_res = patterns.numel(), graph.reserved.numel()
    if g + n_res > (1 - min_saving) * n:
        return None
    index = torch.empty(n, dtype=torch.long)
    index[~is_res] = pattern_of
    index[graph.reserved] = torch.arange(g, g + n_res)
    size = g + n_res
    rep = torch.full((size,), n, dtype=torch.long).scatter_reduce(0, index, torch.arange(n), "amin")  # lowest id
    # The grouping compares hashes: confirm that every entity's entries equal its representative's, entry by entry.
    mate = rep[index]
    if not torch.equal(counts, counts[mate]):
        return None
    mine, theirs = _ranges(entry_crow[:-1], counts), _ranges(entry_crow[mate], counts)
    if not (torch.equal(entry_cols[mine], entry_cols[theirs]) and torch.equal(entry_vals[mine], entry_vals[theirs])):
        return None

    rep_counts = conrel_counts[rep]
    picked = _ranges(crow[rep], rep_counts)
    conrel = SparsePair.from_coo(torch.arange(size).repeat_interleave(rep_counts), col[picked], val[picked],
                                 (size, 2 * num_rel))
    knn = knn_ids = knn_weights = None
    if graph.knn_ids is not None and graph.knn_weights is not None:
        knn_ids, knn_weights = graph.knn_ids[rep], graph.knn_weights[rep]
        knn = _knn_matrix(knn_ids, knn_weights, n_res, val.dtype)
    # degree: the representative's (entities of a row may differ in degree; nothing that builds h0 reads it).
    inputs = Graph(size, num_rel, torch.zeros(0, 3, dtype=torch.long), torch.arange(g, g + n_res), conrel, None,
                   knn, knn_ids, knn_weights, graph.degree[rep])
    m_rows, m_cols, m_vals = message
    first = SparsePair.from_coo(m_rows, 3 * index[m_cols // 3] + m_cols % 3, m_vals, (n, 3 * size))
    return CompactInputs(inputs, replace(graph, message=first, compact=None), index)


def build_graph(
    triples: np.ndarray,
    num_entities: int,
    num_relations: int,
    reserved: torch.Tensor,
    *,
    k: int = 10,
    temperature: float = 0.2,
    knn: tuple[torch.Tensor, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
    compact: bool = True,
) -> Graph:
    """Precompute the graph features of `triples` (E, 3) over `num_entities` nodes.

    `knn` passes stored (ids, weights) tables instead of recomputing them (a bundle may carry them).
    `compact`: also group repeated input rows (`compact_inputs`), when that saves at least 10% of them.
    """
    n, num_rel = num_entities, num_relations
    edges = torch.as_tensor(np.asarray(triples), dtype=torch.long).reshape(-1, 3)
    h, r, t = edges[:, 0], edges[:, 1], edges[:, 2]
    degree = torch.bincount(h, minlength=n).double() + torch.bincount(t, minlength=n).double()
    inv = torch.where(degree > 0, 1.0 / degree.clamp(min=1), torch.zeros((), dtype=torch.float64)).to(dtype)
    ones = torch.ones(edges.shape[0], dtype=dtype)

    conrel = SparsePair.from_coo(
        torch.cat([h, t]), torch.cat([r, r + num_rel]), torch.cat([inv[h], inv[t]]), (n, 2 * num_rel)
    )
    nodes = torch.arange(n)
    rows = torch.cat([h, t, nodes])
    cols = torch.cat([3 * t, 3 * h + 1, 3 * nodes + 2])
    vals = torch.cat([inv[h] * ones, inv[t] * ones, torch.ones(n, dtype=dtype)])
    message = SparsePair.from_coo(rows, cols, vals, (n, 3 * n))

    knn_pair = knn_ids = knn_weights = None
    reserved = reserved.to(torch.long)
    if reserved.numel() > 0:
        if knn is None:
            knn = nearest_reserved(relational_features(edges.numpy(), n, num_rel), reserved, k, temperature)
        knn_ids, knn_weights = knn
        knn_pair = _knn_matrix(knn_ids, knn_weights, reserved.numel(), dtype)
    graph = Graph(n, num_rel, edges, reserved, conrel, message, knn_pair, knn_ids, knn_weights, degree.float())
    if compact:
        graph.compact = compact_inputs(graph, (rows, cols, vals))
    return graph


def choose_reserved(num_entities: int, ratio: float, seed: int) -> torch.Tensor:
    """int(ratio * N) entity ids drawn uniformly without replacement, sorted; at least one when ratio > 0.

    At least one, so that a tiny graph (2 entities at ratio 0.1) still has what the kNResEnt encoder reads.
    """
    count = int(ratio * num_entities)
    if ratio > 0 and num_entities > 0:
        count = max(count, 1)
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(num_entities, generator=gen)[:count].sort().values
