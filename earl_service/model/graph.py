"""Graph features computed once per graph: relational features, normalised adjacency, k nearest reserved entities."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch

from earl_service.core import knn as core_knn
from earl_service.model.kernels import csr_mm, csr_mm_sum


def csr_tensor(crow: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int], *,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """A torch CSR matrix of numpy CSR arrays (int64 indices), trusted as well-formed; values cast to `dtype`.

    The cast happens here, before the matrix exists: `.to(dtype)` on a CSR tensor copies its index arrays too."""
    vals = torch.from_numpy(values) if dtype is None else torch.from_numpy(values).to(dtype)
    with _csr_is_beta():
        return torch.sparse_csr_tensor(torch.from_numpy(np.asarray(crow, dtype=np.int64)),
                                       torch.from_numpy(np.asarray(cols, dtype=np.int64)), vals,
                                       shape, check_invariants=False)


def _csr(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A coalesced (duplicates summed) CSR matrix from COO triplets."""
    coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, shape, check_invariants=False)
    with _csr_is_beta():
        return coo.coalesce().to_sparse_csr()


@contextmanager
def _csr_is_beta() -> Iterator[None]:
    """Silence torch's warning that CSR support is beta (raised once, at the first CSR tensor): construction,
    spmm and transpose, all this package uses, are stable."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        yield


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


def _sparse_dense(mat: torch.Tensor, dense: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """mat @ dense summed in mat's dtype, as `out_dtype`: the C++ kernel on a CPU (which reads and writes bfloat16
    as is), else torch's product and casts."""
    out = csr_mm(mat, dense, out_dtype=out_dtype)
    if out is None:
        with torch.autocast(mat.device.type, enabled=False):
            out = torch.sparse.mm(mat, dense.to(mat.dtype).contiguous()).to(out_dtype)
    return out


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mat, mat_t, dense):
        # Sparse products run in the matrix's dtype (float32), also under bfloat16 autocast; the gradient of a
        # bfloat16 input comes back in bfloat16.
        ctx.mat_t, ctx.dtype = mat_t, dense.dtype
        return _sparse_dense(mat, dense, mat.dtype)

    @staticmethod
    def backward(ctx, grad):
        return None, None, _sparse_dense(ctx.mat_t, grad, ctx.dtype)


def aggregate(a: SparsePair, x: torch.Tensor, b: SparsePair, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """a @ x + b @ y + bias, differentiable in x, y and bias: one pass of the C++ kernel on a CPU (no (N, w)
    partial products to write, read and add), else the two sparse products and the sums."""
    return _SpMMSum.apply(a.mat, a.mat_t, x, b.mat, b.mat_t, y, bias)


class _SpMMSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, a_t, x, b, b_t, y, bias):
        ctx.a_t, ctx.b_t, ctx.dtypes = a_t, b_t, (x.dtype, y.dtype, bias.dtype)
        out = csr_mm_sum(a, x, b, y, bias)
        if out is None:
            out = _sparse_dense(a, x, a.dtype) + _sparse_dense(b, y, b.dtype) + bias.to(a.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        x_dtype, y_dtype, bias_dtype = ctx.dtypes
        return (None, None, _sparse_dense(ctx.a_t, grad, x_dtype), None, None, _sparse_dense(ctx.b_t, grad, y_dtype),
                grad.sum(0).to(bias_dtype))


def knn_tables(features: core_knn.SparseRows, reserved: np.ndarray, *, k: int, temperature: float,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """core.knn.nearest_reserved of relational features (N, 2R) as the torch tables the encoder reads: ids (N, k)
    as positions in `reserved` (N_res,) and their weights (N, k)."""
    ids, weights = core_knn.nearest_reserved(features, reserved, k, temperature)
    return torch.from_numpy(ids), torch.from_numpy(weights)


def _ranges(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """cat(arange(s, s + c) for s, c in zip(starts, counts))."""
    return torch.from_numpy(core_knn.ranges(starts.numpy(), counts.numpy()))


def _identical_rows(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """core_knn.identical_rows on torch tensors: each row's group (N,) and the lowest row of every group (G,)."""
    group, first = core_knn.identical_rows(crow.numpy(), col.numpy(), values.numpy())
    return torch.from_numpy(group), torch.from_numpy(first)


@dataclass
class Graph:
    """Everything the encoder needs about one graph; built once, reused every step.

    Row-normalised matrices divide by c_e = in-degree + out-degree (edges counted with multiplicity).
    - conrel (N, 2R): f_e / c_e, the mean of the relation-end slots over e's edges (ConRel input).
    - message (N, 3N): the entity part of a GNN layer. Columns 3j / 3j+1 / 3j+2 address the out-message /
      in-message / self transforms of entity j, so sum_j (W_out h_j + W_in h_j) / c_e + W_self h_e is one spmm
      over the rows of X [W_out; W_in; W_self]^T. The relation part reuses `conrel` (same 1/c_e weights).
    - knn_ids / knn_weights (N, k): nearest reserved entities (positions in `reserved`) and weights.

    Sampled training (earl_service/train/sampling.py) builds small local graphs of the same class: one holds the
    encoder inputs of the sampled entities (no `message`; `reserved` and the `knn` columns then address only the
    reserved rows named by `reserved_rows` / `knn_rows`), and one per GNN layer holds a rectangular message
    matrix (n_out, 3 n_in) whose n_out outputs are the first n_out of its n_in inputs.

    `compact` (full graphs with many repeated input rows, see `compact_inputs`) lets the encoder compute the
    initial embeddings and the first layer's transforms once per distinct input row instead of once per entity.
    """

    num_entities: int
    num_relations: int
    triples: torch.Tensor  # (E, 3) int64, the edges the encoder reads (none in the graphs of a sampled batch)
    reserved: torch.Tensor  # (N_res,) entity ids with their own embedding rows
    conrel: SparsePair
    degree: torch.Tensor  # (N,) c_e
    message: SparsePair | None = None  # None in an inputs-only graph (no GNN layer reads it)
    knn: SparsePair | None = None  # (N, N_res) weights, the kNResEnt aggregation as a sparse matrix
    knn_ids: torch.Tensor | None = None
    knn_weights: torch.Tensor | None = None
    # Local graphs only (None: every reserved row, in order): the reserved_embeddings row of each entity in
    # `reserved`, and the reserved_embeddings row behind each column of `knn`.
    reserved_rows: torch.Tensor | None = None
    knn_rows: torch.Tensor | None = None
    compact: CompactInputs | None = None

    @classmethod
    def encoder_inputs(
        cls, num_entities: int, num_relations: int, *, conrel: SparsePair, reserved: torch.Tensor,
        degree: torch.Tensor, knn: SparsePair | None = None, knn_ids: torch.Tensor | None = None,
        knn_weights: torch.Tensor | None = None, reserved_rows: torch.Tensor | None = None,
        knn_rows: torch.Tensor | None = None,
    ) -> Graph:
        """A graph holding only what builds h^0 (ConRel, kNResEnt and reserved rows): no edges, no message."""
        return cls(num_entities, num_relations, _no_edges(), reserved, conrel, degree, knn=knn, knn_ids=knn_ids,
                   knn_weights=knn_weights, reserved_rows=reserved_rows, knn_rows=knn_rows)

    @classmethod
    def gnn_layer(cls, message: SparsePair, conrel: SparsePair, *, num_relations: int) -> Graph:
        """One GNN layer of a sampled batch: message (n_out, 3 n_in) and conrel (n_out, 2R), nothing else."""
        return cls(message.mat.shape[0], num_relations, _no_edges(), torch.zeros(0, dtype=torch.long), conrel,
                   torch.zeros(0), message=message)

    def to(self, device: torch.device) -> Graph:
        def move(x):
            return None if x is None else x.to(device)

        moved = Graph(self.num_entities, self.num_relations, self.triples.to(device), self.reserved.to(device),
                      self.conrel.to(device), self.degree.to(device), message=move(self.message), knn=move(self.knn),
                      knn_ids=move(self.knn_ids), knn_weights=move(self.knn_weights),
                      reserved_rows=move(self.reserved_rows), knn_rows=move(self.knn_rows))
        if self.compact is not None:  # its first layer shares every tensor but `message` with this graph
            c = self.compact
            assert c.first_layer.message is not None  # a first layer is a GNN layer: it has its message matrix
            moved.compact = CompactInputs(c.inputs.to(device), replace(moved, message=c.first_layer.message.to(device)),
                                          c.index.to(device))
        return moved


def _no_edges() -> torch.Tensor:
    return torch.zeros(0, 3, dtype=torch.long)


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
    grouping = _input_groups(graph, min_saving)
    if grouping is None:
        return None
    index, rep = grouping
    n, num_rel, n_res, size = graph.num_entities, graph.num_relations, graph.reserved.numel(), rep.numel()
    crow, col, val = graph.conrel.mat.crow_indices(), graph.conrel.mat.col_indices(), graph.conrel.mat.values()
    rep_counts = (crow[1:] - crow[:-1])[rep]
    picked = _ranges(crow[rep], rep_counts)
    conrel = SparsePair.from_coo(torch.arange(size).repeat_interleave(rep_counts), col[picked], val[picked],
                                 (size, 2 * num_rel))
    knn = knn_ids = knn_weights = None
    if graph.knn_ids is not None and graph.knn_weights is not None:
        knn_ids, knn_weights = graph.knn_ids[rep], graph.knn_weights[rep]
        knn = _knn_matrix(knn_ids, knn_weights, n_res, val.dtype)
    # degree: the representative's (entities of a row may differ in degree; nothing that builds h0 reads it).
    inputs = Graph.encoder_inputs(size, num_rel, conrel=conrel, reserved=torch.arange(size - n_res, size),
                                  degree=graph.degree[rep], knn=knn, knn_ids=knn_ids, knn_weights=knn_weights)
    m_rows, m_cols, m_vals = message
    first = SparsePair.from_coo(m_rows, 3 * index[m_cols // 3] + m_cols % 3, m_vals, (n, 3 * size))
    return CompactInputs(inputs, replace(graph, message=first, compact=None), index)


def _input_groups(graph: Graph, min_saving: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each entity's compact row (N,) and the lowest entity of each row (G + N_res,): non-reserved entities with
    bit-identical input rows share one of the first G rows, reserved entities own the last N_res, in order.
    None when that saves less than `min_saving` of the rows, or when hashing grouped unequal rows."""
    n = graph.num_entities
    entry_crow, entry_cols, entry_vals = _input_rows(graph)
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
    rep = torch.full((g + n_res,), n, dtype=torch.long).scatter_reduce(0, index, torch.arange(n), "amin")
    # The grouping compares hashes: confirm that every entity's entries equal its representative's, entry by entry.
    mate, counts = rep[index], entry_crow[1:] - entry_crow[:-1]
    if not torch.equal(counts, counts[mate]):
        return None
    mine, theirs = _ranges(entry_crow[:-1], counts), _ranges(entry_crow[mate], counts)
    if not (torch.equal(entry_cols[mine], entry_cols[theirs]) and torch.equal(entry_vals[mine], entry_vals[theirs])):
        return None
    return index, rep


def _input_rows(graph: Graph) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every entity's encoder inputs as one CSR row (crow (N+1,), cols, float64 values): its ConRel entries, then
    its kNResEnt ones in columns 2R + reserved position."""
    n, num_rel = graph.num_entities, graph.num_relations
    crow, col, val = graph.conrel.mat.crow_indices(), graph.conrel.mat.col_indices(), graph.conrel.mat.values()
    counts = crow[1:] - crow[:-1]
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
    return entry_crow, cols[order], vals[order]


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
            features = core_knn.relational_features(edges.numpy(), n, num_rel)
            knn = knn_tables(features, reserved.numpy(), k=k, temperature=temperature)
        knn_ids, knn_weights = knn
        knn_pair = _knn_matrix(knn_ids, knn_weights, reserved.numel(), dtype)
    graph = Graph(n, num_rel, edges, reserved, conrel, degree.float(), message=message, knn=knn_pair, knn_ids=knn_ids,
                  knn_weights=knn_weights)
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
