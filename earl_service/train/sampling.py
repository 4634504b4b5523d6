"""Sampled training for graphs too big to encode whole: per-batch L-hop neighbourhoods as small local graphs.

A batch encodes only its entities (positives and shared negatives, the "seeds") through their sampled
neighbourhoods. `NeighborIndex` holds what every batch reads, built once (O(E)): each entity's incident edges,
its degree c_e, relational-feature counts and kNResEnt tables. `NeighborIndex.sample` draws at most
`fanout[i]` incident edges of every entity at hop i (hop 0: the seeds), remaps the reached entities to local
ids (seeds first, then hop 1, hop 2, ...) and builds the local `Graph`s that the unchanged `EARL.initial` and
`GNNLayer.forward` consume:
- the input graph: ConRel rows f_e / c_e and kNResEnt rows of every reached entity (exact, never sampled);
- one graph per GNN layer, a rectangular message matrix (n_out, 3 n_in) whose outputs are the first n_out
  inputs, since the entities each layer must produce shrink towards the seeds.
A sampled edge of e weighs 1/s_e instead of 1/c_e (s_e = edges drawn, c_e = full-graph degree): the mean over
the sample estimates the mean over all c_e edges without bias, and when s_e = c_e (fan-out "all", or a degree
within the fan-out) it is the full-graph weight, so full-neighbourhood sampling reproduces the full-graph
embeddings exactly. Memory per batch grows with seeds x fan-out^L, not with the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from earl_service.config import ModelConfig, TrainConfig
from earl_service.core import knn as core_knn
from earl_service.errors import ConfigError
from earl_service.model.graph import Graph, SparsePair, csr_tensor, knn_tables
from earl_service.model.modules import EARL

Fanout = Sequence[int | None]  # per hop; None or <= 0: every incident edge


@dataclass
class Subgraph:
    """The sampled computation graph of one batch."""

    nodes: torch.Tensor  # (n_0,) global entity ids of every reached entity; the first `num_seeds` are the seeds
    num_seeds: int
    inputs: Graph  # encoder inputs of the n_0 entities (ConRel, kNResEnt, reserved rows)
    layers: list[Graph]  # one per GNN layer, input side first; the last one outputs the seeds

    def to(self, device: torch.device) -> Subgraph:
        return Subgraph(self.nodes.to(device), self.num_seeds, self.inputs.to(device), [g.to(device) for g in self.layers])


def _floyd_sample(sizes: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k distinct offsets in [0, size) for each row, uniform over k-subsets (Floyd's algorithm): (M,) -> (M, k)."""
    out = np.empty((len(sizes), k), dtype=np.int64)
    for i in range(k):
        top = sizes - k + i  # draw from [0, top]; on a repeat take `top` itself, which no earlier step could draw
        pick = (rng.random(len(sizes)) * (top + 1)).astype(np.int64)
        repeat = (out[:, :i] == pick[:, None]).any(1)
        out[:, i] = np.where(repeat, top, pick)
    return out


def _csr(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """A CSR matrix from COO triplets, duplicates summed: numpy's sort-based unique, several times faster than
    torch's COO coalesce on the ~10^5 entries a batch has."""
    key = rows * shape[1] + cols
    unique, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse, weights=vals, minlength=len(unique))
    crow = np.zeros(shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(unique // shape[1], minlength=shape[0]), out=crow[1:])
    return csr_tensor(crow, unique % shape[1], summed, shape, dtype=dtype)


def _pair(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int], dtype: torch.dtype) -> SparsePair:
    return SparsePair(_csr(rows, cols, vals, shape, dtype), _csr(cols, rows, vals, (shape[1], shape[0]), dtype))


class NeighborIndex:
    """Incident edges (CSR over entities), degrees, relational features and kNResEnt tables of one graph.

    An edge (h, r, t) is listed twice: under h as an out-edge to t (GNN column 3t, relation slot r) and under t
    as an in-edge from h (column 3h + 1, slot R + r), exactly the entries of build_graph's matrices.
    `sample` uses a scratch array: one index serves one thread.
    """

    def __init__(
        self,
        triples: np.ndarray,
        num_entities: int,
        num_relations: int,
        reserved: torch.Tensor,
        *,
        k: int = 10,
        temperature: float = 0.2,
        knn: tuple[torch.Tensor, torch.Tensor] | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        n, num_rel = num_entities, num_relations
        edges = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
        self.num_entities, self.num_relations, self.dtype = n, num_rel, dtype
        owner = np.concatenate([edges[:, 0], edges[:, 2]])
        order = np.argsort(owner, kind="stable")
        del owner
        index_type = np.int32 if n < 2**31 else np.int64
        self._other = np.concatenate([edges[:, 2], edges[:, 0]])[order].astype(index_type)  # (2E,)
        self._slot = np.concatenate([edges[:, 1], edges[:, 1] + num_rel])[order].astype(np.int32)  # (2E,) r or R + r
        del order
        counts = np.bincount(np.concatenate([edges[:, 0], edges[:, 2]]), minlength=n)
        self.degree = counts.astype(np.int64)  # (N,) c_e, a self-loop counted twice as in build_graph
        self._indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=self._indptr[1:])

        # Relational features f_e as CSR counts over the 2R slots (duplicate slots of one entity summed).
        features = core_knn.relational_features(edges, n, num_rel)
        self._feat_cols = features.indices.astype(np.int32)
        self._feat_counts = features.values  # float64
        self._feat_indptr = features.indptr

        self.reserved = reserved.to(torch.long)
        self._reserved_pos = np.full(n, -1, dtype=np.int64)
        self._reserved_pos[self.reserved.numpy()] = np.arange(self.reserved.numel())
        self.knn_ids = self.knn_weights = None
        if self.reserved.numel() > 0:
            if knn is None:
                knn = knn_tables(features, self.reserved.numpy(), k=k, temperature=temperature)
            self.knn_ids, self.knn_weights = knn[0].to(torch.long), knn[1].float()
        self._local = np.full(n, -1, dtype=np.int64)  # scratch: global id -> local id during `sample`

    @property
    def num_edges(self) -> int:
        return len(self._other) // 2

    def nbytes(self) -> int:
        """Bytes held by the index (what every batch shares)."""
        arrays = [self._other, self._slot, self.degree, self._indptr, self._feat_cols, self._feat_counts,
                  self._feat_indptr, self._reserved_pos, self._local]
        tensors = [t for t in (self.knn_ids, self.knn_weights, self.reserved) if t is not None]
        return sum(a.nbytes for a in arrays) + sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------ sampling

    def _draw(self, frontier: np.ndarray, fanout: int | None, rng: np.random.Generator | None):
        """Incident-edge positions of the frontier's entities, their owners and weights 1/s_e."""
        start, degree = self._indptr[frontier], self.degree[frontier]
        take = degree if fanout is None or fanout <= 0 else np.minimum(degree, fanout)
        whole = take == degree
        pos = [core_knn.ranges(start[whole], degree[whole])]
        owner = [np.repeat(frontier[whole], degree[whole])]
        weight = [np.repeat(1.0 / np.maximum(degree[whole], 1), degree[whole])]
        part = np.flatnonzero(~whole)
        if part.size:
            assert fanout is not None  # only a finite fan-out takes fewer edges than an entity's degree
            if rng is None:
                raise ValueError("a finite fan-out needs a random generator")
            offsets = _floyd_sample(degree[part], int(fanout), rng)  # (M, fanout)
            pos.append((start[part][:, None] + offsets).reshape(-1))
            owner.append(np.repeat(frontier[part], fanout))
            weight.append(np.full(part.size * int(fanout), 1.0 / int(fanout)))
        return np.concatenate(pos), np.concatenate(owner), np.concatenate(weight)

    def sample(self, seeds: np.ndarray, fanout: Fanout, rng: np.random.Generator | None = None) -> Subgraph:
        """The computation graph of `seeds` (distinct global ids) for len(fanout) GNN layers.

        fanout[i] edges are drawn (uniformly, without replacement) around each entity first reached at hop i;
        None or <= 0 takes them all (then no generator is needed).
        """
        seeds = np.asarray(seeds, dtype=np.int64)
        local = self._local
        if seeds.size and (local[seeds] >= 0).any():
            raise ValueError("seeds must be distinct")
        local[seeds] = np.arange(len(seeds))
        groups, bounds, hops = [seeds], [len(seeds)], []
        frontier = seeds
        try:
            for hop_fanout in fanout:
                pos, owner, weight = self._draw(frontier, hop_fanout, rng)
                other = self._other[pos].astype(np.int64)
                new = np.unique(other[local[other] < 0])
                local[new] = np.arange(bounds[-1], bounds[-1] + len(new))
                groups.append(new)
                bounds.append(bounds[-1] + len(new))
                hops.append((local[owner], local[other], self._slot[pos].astype(np.int64), weight))
                frontier = new
            nodes = np.concatenate(groups)
        finally:
            for group in groups:
                local[group] = -1
        layers = []
        depth = len(hops)
        for layer in range(depth):  # input side first: layer l outputs the entities of hops < depth - l
            used = hops[: depth - layer]
            layers.append(self._layer_graph([h[0] for h in used], [h[1] for h in used], [h[2] for h in used],
                                            [h[3] for h in used], bounds[depth - 1 - layer], bounds[depth - layer]))
        return Subgraph(torch.from_numpy(nodes), len(seeds), self._input_graph(nodes), layers)

    def _layer_graph(self, owners, others, slots, weights, n_out: int, n_in: int) -> Graph:
        rows, other, slot, value = (np.concatenate(x) for x in (owners, others, slots, weights))
        num_rel = self.num_relations
        outputs = np.arange(n_out, dtype=np.int64)
        message = _pair(
            np.concatenate([rows, outputs]),
            np.concatenate([3 * other + (slot >= num_rel), 3 * outputs + 2]),  # out: 3j, in: 3j + 1, self: 3e + 2
            np.concatenate([value, np.ones(n_out)]),
            (n_out, 3 * n_in), self.dtype,
        )
        conrel = _pair(rows, slot, value, (n_out, 2 * num_rel), self.dtype)
        return Graph.gnn_layer(message, conrel, num_relations=num_rel)

    def _input_graph(self, nodes: np.ndarray) -> Graph:
        """ConRel rows f_e / c_e, kNResEnt rows and reserved rows of `nodes` (global ids)."""
        n, num_rel = len(nodes), self.num_relations
        start = self._feat_indptr[nodes]
        count = self._feat_indptr[nodes + 1] - start
        idx = core_knn.ranges(start, count)
        rows = np.repeat(np.arange(n, dtype=np.int64), count)
        degree = self.degree[nodes]
        inv = 1.0 / np.maximum(degree, 1)
        conrel = _pair(rows, self._feat_cols[idx].astype(np.int64), self._feat_counts[idx] * inv[rows],
                       (n, 2 * num_rel), self.dtype)
        pos = self._reserved_pos[nodes]
        is_res = pos >= 0
        reserved = torch.from_numpy(np.flatnonzero(is_res))
        reserved_rows = torch.from_numpy(pos[is_res])
        knn = knn_rows = None
        if self.knn_ids is not None and self.knn_weights is not None:
            ids = self.knn_ids[torch.from_numpy(nodes)].numpy()  # (n, k) positions in `reserved`
            weights = self.knn_weights[torch.from_numpy(nodes)].numpy()
            unique, columns = np.unique(ids, return_inverse=True)
            kk = ids.shape[1]
            knn = _pair(np.repeat(np.arange(n, dtype=np.int64), kk), columns.reshape(-1),
                        weights.reshape(-1).astype(np.float64), (n, len(unique)), self.dtype)
            knn_rows = torch.from_numpy(unique)
        return Graph.encoder_inputs(n, num_rel, conrel=conrel, reserved=reserved, degree=torch.from_numpy(degree).float(),
                                    knn=knn, reserved_rows=reserved_rows, knn_rows=knn_rows)


@torch.no_grad()
def embed_all(model: EARL, index: NeighborIndex, *, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Every entity's embedding (N, 2d) and the relations (R, d), layer by layer over full neighbourhoods.

    Exact (the full-graph forward up to float summation order) in bounded memory: two (N, 2d) tables plus one
    chunk's neighbourhood, where the full-graph forward holds the (3N, 2d) transformed rows of a layer.
    """
    device = model.relations.device
    n = index.num_entities
    h: torch.Tensor | None = None
    for start in range(0, n, chunk):
        nodes = np.arange(start, min(n, start + chunk))
        rows = model.initial(index.sample(nodes, []).to(device).inputs)  # (c, 2d)
        if h is None:
            h = rows.new_empty(n, rows.shape[1])
        h[start : start + len(nodes)] = rows
    assert h is not None, "an index has at least one entity"
    rel = model.relations
    for layer in model.gnn:
        out = torch.empty_like(h)
        next_rel = rel
        for start in range(0, n, chunk):
            sub = index.sample(np.arange(start, min(n, start + chunk)), [None]).to(device)
            out[start : start + sub.num_seeds], next_rel = layer(h[sub.nodes], rel, sub.layers[0])
        h, rel = out, next_rel
    return h, rel


def check_sampled(cfg: TrainConfig, model_config: ModelConfig) -> None:
    """Refuses settings sampled training cannot run with (ConfigError)."""
    if not cfg.sampled:
        return
    if model_config.model != "earl":
        raise ConfigError("sampled training is for the EARL encoder; RotatE has no graph encoding to sample")
    if model_config.no_conrel_knn:
        raise ConfigError("sampled training needs ConRel or kNResEnt inputs; --no-conrel-knn draws one random "
                          "input row per entity of the whole graph")
