"""Graph features computed once per graph: relational features, normalised adjacency, k nearest reserved entities."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

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
    max_block_elements: int = 1 << 25,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k reserved entities by cosine similarity of relational features, with softmax(sim / T) weights.

    features: CSR (N, 2R) counts; reserved: (N_res,) entity ids. Returns ids (N, k) as positions in
    `reserved` and weights (N, k). Rows are processed in blocks of at most `max_block_elements` similarity
    entries, so memory stays bounded for any N. An entity without edges has similarity 0 to everything
    and gets the first k reserved entities with equal weights.
    """
    num_entities, width = features.shape
    if reserved.numel() >= 1 << 24:
        raise ValueError("at most 2**24 - 1 reserved entities are supported")
    k = min(k, reserved.numel())
    crow, col, val = features.crow_indices(), features.col_indices(), features.values()
    row_of = torch.repeat_interleave(torch.arange(num_entities), crow[1:] - crow[:-1])  # (nnz,)
    val = val.double()
    norms = torch.zeros(num_entities, dtype=torch.float64).index_add_(0, row_of, val * val)
    inv_norm = torch.where(norms > 0, 1.0 / norms.sqrt(), torch.zeros((), dtype=torch.float64))
    unit = val * inv_norm[row_of]  # L2-normalised feature values, (nnz,)

    position = torch.full((num_entities,), -1, dtype=torch.long)
    position[reserved] = torch.arange(reserved.numel())
    is_res = position[row_of] >= 0
    res_unit = torch.zeros(reserved.numel(), width, dtype=torch.float64)  # (N_res, 2R)
    res_unit[position[row_of[is_res]], col[is_res]] = unit[is_res]

    block = max(1, max_block_elements // max(1, reserved.numel(), width))
    ids = torch.empty(num_entities, k, dtype=torch.long)
    sims = torch.empty(num_entities, k, dtype=torch.float64)
    # Ranking key: similarity rounded to 1e-9, ties broken by the lower reserved position. Rounding makes the
    # choice independent of float summation order, so the numpy edge reader picks the very same neighbours.
    tiebreak = (1 << 24) - 1 - torch.arange(reserved.numel(), dtype=torch.int64)  # lower position wins
    for start in range(0, num_entities, block):
        stop = min(num_entities, start + block)
        lo, hi = int(crow[start]), int(crow[stop])
        rows = torch.zeros(stop - start, width, dtype=torch.float64)  # (b, 2R)
        rows[row_of[lo:hi] - start, col[lo:hi]] = unit[lo:hi]
        sim = torch.round((rows @ res_unit.T) * SIM_STEPS).to(torch.int64)  # (b, N_res), similarity in 1e-9 steps
        top = torch.topk(sim * (1 << 24) + tiebreak, k, dim=1, sorted=True).indices
        ids[start:stop] = top
        sims[start:stop] = torch.gather(sim, 1, top).double() / SIM_STEPS
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

    @property
    def non_reserved(self) -> torch.Tensor:
        mask = torch.ones(self.num_entities, dtype=torch.bool)
        mask[self.reserved] = False
        return mask.nonzero().squeeze(1)

    def to(self, device: torch.device) -> Graph:
        def move(x):
            return None if x is None else x.to(device)

        return Graph(
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
) -> Graph:
    """Precompute the graph features of `triples` (E, 3) over `num_entities` nodes.

    `knn` passes stored (ids, weights) tables instead of recomputing them (a bundle may carry them).
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
        kk = knn_ids.shape[1]
        knn_pair = SparsePair.from_coo(
            torch.arange(n).repeat_interleave(kk), knn_ids.reshape(-1), knn_weights.reshape(-1).to(dtype), (n, reserved.numel())
        )
    return Graph(n, num_rel, edges, reserved, conrel, message, knn_pair, knn_ids, knn_weights, degree.float())


def choose_reserved(num_entities: int, ratio: float, seed: int) -> torch.Tensor:
    """int(ratio * N) entity ids drawn uniformly without replacement, sorted; at least one when ratio > 0.

    At least one, so that a tiny graph (2 entities at ratio 0.1) still has what the kNResEnt encoder reads.
    """
    count = int(ratio * num_entities)
    if ratio > 0 and num_entities > 0:
        count = max(count, 1)
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(num_entities, generator=gen)[:count].sort().values
