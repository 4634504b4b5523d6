"""nn.Modules only: the EARL encoder (ConRel, kNResEnt, relational GNN), the RotatE baseline and RotatE scoring."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from earl_service.config import MODELS, ModelConfig
from earl_service.errors import ConfigError
from earl_service.model.graph import Graph, aggregate


class RotatE:
    """RotatE scoring: score(h, r, t) = gamma - sum_i |h_i * r_i - t_i| with r_i = exp(i * phase_i).

    Entities are (.., 2d) reals: real parts in [:d], imaginary parts in [d:]. Relations are (.., d) raw
    values mapped to phases by r / ((gamma + epsilon) / d) * pi, as in the RotatE reference code.
    """

    def __init__(self, config: ModelConfig):
        self.dim = config.dim
        self.gamma = config.gamma
        self.phase_scale = config.phase_scale

    def rotate(self, x: torch.Tensor, rel: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
        """x o r (or x o conj(r) when `inverse`): x (B, 2d), rel (B, d) -> (B, 2d)."""
        phase = rel * self.phase_scale
        cos, sin = torch.cos(phase), torch.sin(phase)
        if inverse:
            sin = -sin
        re, im = x[..., : self.dim], x[..., self.dim :]
        return torch.cat([re * cos - im * sin, re * sin + im * cos], dim=-1)

    def distance(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """sum_i |a_i - b_i| over complex dims; broadcasts over leading dims. (.., 2d) -> (..)."""
        diff = a - b
        re, im = diff[..., : self.dim], diff[..., self.dim :]
        return torch.sqrt(re * re + im * im + 1e-12).sum(-1)

    def score(self, h: torch.Tensor, rel: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.gamma - self.distance(self.rotate(h, rel), t)


def _uniform_(param: torch.Tensor, bound: float) -> None:
    nn.init.uniform_(param, -bound, bound)


class GNNLayer(nn.Module):
    """One layer of EARL's relational GNN (paper eqs. gnn-agg and gnn-update).

    h_e' = act( 1/c_e * [ sum_{(r,t) in O(e)} W_out [h_r; h_t] + sum_{(r,h) in I(e)} W_in [h_r; h_h] ] + W_self h_e )
    h_r' = act( W_rel h_r )
    W_out [h_r; h_t] is split as W_out_ent h_t + W_out_rel h_r (each with a bias), likewise W_in.
    """

    def __init__(self, dim: int, *, activation: bool):
        super().__init__()
        width = 2 * dim
        self.out_ent, self.out_rel = nn.Linear(width, width), nn.Linear(dim, width)
        self.in_ent, self.in_rel = nn.Linear(width, width), nn.Linear(dim, width)
        self.self_loop = nn.Linear(width, width)
        self.rel_update = nn.Linear(dim, dim)
        self.activation = activation

    def forward(self, x: torch.Tensor, rel: torch.Tensor, graph: Graph) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, 2d), rel (R, d) -> same shapes. Transform first, then aggregate in one sparse pass (see Graph)."""
        return self.propagate(x @ self.entity_weight().T, rel, graph)

    def entity_weight(self) -> torch.Tensor:
        """The three entity maps stacked (3*2d, 2d): out-edge, in-edge and self-loop."""
        return torch.cat([self.out_ent.weight, self.in_ent.weight, self.self_loop.weight])

    def propagate(self, transformed: torch.Tensor, rel: torch.Tensor, graph: Graph) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer from its inputs' entity transforms: transformed (N, 3*2d) = x @ entity_weight().T, rel (R, d)."""
        n, width = transformed.shape[0], transformed.shape[1] // 3
        ent_rows = transformed.reshape(3 * n, width)  # rows 3j, 3j+1, 3j+2: out, in, self of entity j
        # Relation transforms act on the |R| rows before aggregation; both message biases ride along, since
        # each edge contributes exactly one relation term and one neighbour term. graph.conrel holds the
        # per-entity relation counts / c_e (out-edges in columns r, in-edges in R + r): the same weights.
        rel_out = F.linear(rel, self.out_rel.weight, self.out_rel.bias + self.out_ent.bias)  # (R, 2d)
        rel_in = F.linear(rel, self.in_rel.weight, self.in_rel.bias + self.in_ent.bias)  # (R, 2d)
        assert graph.message is not None
        h = aggregate(graph.message, ent_rows, graph.conrel, torch.cat([rel_out, rel_in]), self.self_loop.bias)  # (N, 2d)
        r = self.rel_update(rel)  # (R, d)
        if self.activation:
            h, r = F.relu(h), F.relu(r)
        return h, r

    def forward_naive(
        self, x: torch.Tensor, rel: torch.Tensor, triples: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The paper's equations edge by edge, as the reference code computes them (slow; tests and benchmarks)."""
        h_idx, r_idx, t_idx = triples[:, 0], triples[:, 1], triples[:, 2]
        out_msg = self.out_ent(x[t_idx]) + self.out_rel(rel[r_idx])  # (E, 2d), message to the head
        in_msg = self.in_ent(x[h_idx]) + self.in_rel(rel[r_idx])  # (E, 2d), message to the tail
        total = torch.zeros_like(x).index_add(0, h_idx, out_msg).index_add(0, t_idx, in_msg)
        degree = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device).index_add(0, h_idx, torch.ones_like(h_idx, dtype=x.dtype))
        degree = degree.index_add(0, t_idx, torch.ones_like(t_idx, dtype=x.dtype))
        mean = total / degree.clamp(min=1)[:, None]
        h = mean + self.self_loop(x)
        r = self.rel_update(rel)
        if self.activation:
            h, r = F.relu(h), F.relu(r)
        return h, r


def _mlp(width_in: int, width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width_in, width), nn.ReLU(), nn.Linear(width, width))


def _chain(outer: torch.Tensor, inner: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of x -> outer @ inner(x), one linear map: (outer @ W, outer @ b).

    Computed in float32 under autocast too: the product is small, and a rounded one would bias every row.
    """
    with torch.autocast(outer.device.type, enabled=False):
        return outer @ inner.weight, outer @ inner.bias


def _linears(mlp: nn.Sequential) -> tuple[nn.Linear, nn.Linear]:
    """The two Linear maps of an `_mlp` (the ReLU sits between them)."""
    first, second = mlp[0], mlp[2]
    assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
    return first, second


class EARL(nn.Module):
    """Entity-agnostic encoder: every entity embedding is rebuilt from graph features and shared weights.

    Trainable state: reserved-entity rows (N_res, 2d), relation-end embeddings (2R, 2d), ConRel MLP,
    combining MLP f_m, relation table (R, d) and the GNN layers. None of it has one row per entity.
    """

    reserved: torch.Tensor  # (N_res,) buffer: the reserved entities' ids (typed here; Module.__getattr__ is not)

    def __init__(self, config: ModelConfig, num_relations: int, reserved: torch.Tensor):
        super().__init__()
        self.config = config
        self.num_relations = num_relations
        dim, width = config.dim, 2 * config.dim
        self.register_buffer("reserved", reserved.to(torch.long).clone(), persistent=True)
        num_reserved = reserved.numel() if config.uses_reserved else 0
        self.reserved_embeddings = nn.Parameter(torch.empty(num_reserved, width)) if num_reserved else None
        self.relation_ends = nn.Parameter(torch.empty(2 * num_relations, width)) if config.uses_conrel else None
        self.conrel_mlp = _mlp(width, width) if config.uses_conrel else None
        inputs = int(config.uses_conrel) + int(config.uses_knn)
        self.combine = _mlp(inputs * width, width) if inputs else None
        self.relations = nn.Parameter(torch.empty(num_relations, dim))
        layers = config.gnn_layers
        self.gnn = nn.ModuleList(GNNLayer(dim, activation=i < layers - 1) for i in range(layers))
        self._random_inputs: dict[int, torch.Tensor] = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            bound = self.config.embedding_range
            for table in (self.reserved_embeddings, self.relation_ends, self.relations):
                if table is not None:
                    _uniform_(table, bound)
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.reset_parameters()

    def random_inputs(self, num_entities: int, device: torch.device) -> torch.Tensor:
        """Fixed random GNN inputs for the "w/o ConRel + kNResEnt" ablation, regenerated from the seed."""
        if num_entities not in self._random_inputs:
            gen = torch.Generator().manual_seed(self.config.seed + 1)  # a stream apart from the table's own draws
            bound = self.config.embedding_range
            values = torch.rand(num_entities, 2 * self.config.dim, generator=gen) * 2 * bound - bound
            self._random_inputs[num_entities] = values
        return self._random_inputs[num_entities].to(device)

    def initial(self, graph: Graph) -> torch.Tensor:
        """h^0 (N, 2d): f_m([ConRel; kNResEnt]) for every entity, own rows for reserved entities."""
        if self.combine is None:
            h0 = self.random_inputs(graph.num_entities, self.relations.device).to(self.relations.dtype, copy=True)
        else:
            h0 = _linears(self.combine)[1](self._hidden(graph))  # (N, 2d)
        return self._own_rows(graph, h0, lambda own: own)

    def _hidden(self, graph: Graph) -> torch.Tensor:
        """relu of f_m's first map over [ConRel; kNResEnt] (N, 2d): what f_m's second map turns into h^0."""
        width = 2 * self.config.dim
        assert self.combine is not None
        first, _ = _linears(self.combine)
        pre: torch.Tensor = first.bias
        offset = 0
        if self.conrel_mlp is not None:
            assert self.relation_ends is not None
            lin1, lin2 = _linears(self.conrel_mlp)
            # W1 (f_e^T R_end) = f_e^T (R_end W1^T): the first ConRel map runs on the 2R relation-end rows. ConRel's
            # second map and f_m's first are two linear maps in a row: one (2d, 2d) product of weights replaces an
            # (N, 2d) x (2d, 2d) product per step.
            ends = self.relation_ends @ lin1.weight.T  # (2R, 2d)
            w, b = _chain(first.weight[:, :width], lin2)
            pre = pre + F.linear(F.relu(graph.conrel @ ends + lin1.bias), w, b)
            offset = width
        if self.config.uses_knn:
            assert self.reserved_embeddings is not None and graph.knn is not None
            # Likewise the f_m map of the kNResEnt half runs on the N_res reserved rows, then aggregates.
            rows = self.reserved_embeddings if graph.knn_rows is None else self.reserved_embeddings[graph.knn_rows]
            res = rows @ first.weight[:, offset : offset + width].T  # (N_res, 2d), or the rows a batch uses
            pre = pre + graph.knn @ res
        return F.relu(pre)

    def _own_rows(
        self, graph: Graph, rows: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """`rows` (N, w) with each reserved entity's row replaced by transform(its own embedding), in place.

        `rows` is a product's fresh output, which no backward needs: writing into it saves an (N, w) copy.
        """
        if self.reserved_embeddings is None:
            return rows
        own: torch.Tensor = self.reserved_embeddings
        if graph.reserved_rows is not None:
            own = own[graph.reserved_rows]  # (n_res_local, 2d)
        return rows.index_copy_(0, graph.reserved, transform(own).to(rows.dtype))

    def first_transforms(self, graph: Graph) -> torch.Tensor:
        """The first GNN layer's entity transforms of h^0 (N, 3*2d), without h^0 itself.

        f_m's second map and the layer's entity maps are linear maps in a row: their (3*2d, 2d) weight product
        replaces an (N, 2d) x (2d, 2d) product per step; reserved rows take their own embedding's transforms.
        """
        assert self.combine is not None
        weight = self._first_layer().entity_weight()  # (3*2d, 2d)
        w, b = _chain(weight, _linears(self.combine)[1])
        return self._own_rows(graph, F.linear(self._hidden(graph), w, b), lambda own: own @ weight.T)

    def _first_layer(self) -> GNNLayer:
        layer = self.gnn[0]
        assert isinstance(layer, GNNLayer)
        return layer

    def forward(self, graph: Graph, layers: Sequence[Graph] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings of every entity of `graph` (N, 2d) and of every relation (R, d).

        Sampled training passes `layers`, one local graph per GNN layer (input side first): `graph` then holds
        the inputs of all n_0 sampled entities, layer l maps n_l rows to its first n_{l+1} <= n_l, and the
        result has the rows of the last layer's outputs (the batch's entities). A full graph with `compact`
        inputs runs the same way: G distinct input rows, a first layer mapping them to all N entities.
        """
        if layers is not None and len(layers) != len(self.gnn):
            raise ValueError(f"{len(layers)} layer graphs for {len(self.gnn)} GNN layers")
        if layers is None and graph.compact is not None and self.combine is not None and self.gnn:
            # h^0 depends on an entity's input rows only: compute it, and the first layer's transforms, once per
            # distinct input row (see CompactInputs); the first layer's messages then reach every entity.
            compact = graph.compact
            graph, layers = compact.inputs, [compact.first_layer, *[graph] * (len(self.gnn) - 1)]
        if not self.gnn:
            return self.initial(graph), self.relations
        first_graph = graph if layers is None else layers[0]
        if self.combine is None:
            h, rel = self.gnn[0](self.initial(graph), self.relations, first_graph)
        else:
            h, rel = self._first_layer().propagate(self.first_transforms(graph), self.relations, first_graph)
        for i, layer in enumerate(self.gnn[1:], start=1):
            h, rel = layer(h, rel, graph if layers is None else layers[i])
        return h, rel


class RotatEModel(nn.Module):
    """Plain RotatE: one free embedding per training entity.

    Entities beyond the table (first seen in valid/test, the `all` protocol) embed as untrained initial values, as
    in RotatE's own code, whose table covers every entity of the dataset and leaves those rows as initialised:
    drawn from the initial distribution with a seeded generator, so an evaluation is reproducible. (Zeros, the
    earlier choice, sit near every query under RotatE's distance and lowered the test MRR: the figures before and
    after are in bench/results/paper_runs/fb15k-237-c25fc100bed9.json, under "retested".)
    """

    def __init__(self, config: ModelConfig, num_relations: int, num_entities: int):
        super().__init__()
        self.config = config
        self.entities = nn.Parameter(torch.empty(num_entities, 2 * config.dim))
        self.relations = nn.Parameter(torch.empty(num_relations, config.dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            _uniform_(self.entities, self.config.embedding_range)
            _uniform_(self.relations, self.config.embedding_range)

    def forward(self, graph: Graph) -> tuple[torch.Tensor, torch.Tensor]:
        extra = graph.num_entities - self.entities.shape[0]
        if extra > 0:
            return torch.cat([self.entities, self.untrained(extra)]), self.relations
        return self.entities[: graph.num_entities], self.relations

    def untrained(self, n: int) -> torch.Tensor:
        """Initial values for `n` entities the table does not hold (the same `n` rows at every call)."""
        gen = torch.Generator().manual_seed(self.config.seed + 1)  # a stream apart from the table's own draws
        bound = self.config.embedding_range
        rows = torch.rand(n, self.entities.shape[1], generator=gen) * (2 * bound) - bound
        return rows.to(self.entities)


def build_model(config: ModelConfig, num_entities: int, num_relations: int, reserved: torch.Tensor) -> nn.Module:
    if config.model not in MODELS:  # an imported model's config (`earl import`): nothing here trains its scorer
        raise ConfigError(f"model {config.model!r} is imported (earl import), not one earl trains: choose "
                          f"{' or '.join(MODELS)}")
    if config.model == "rotate":
        return RotatEModel(config, num_relations, num_entities)
    return EARL(config, num_relations, reserved)


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
