"""EARL modules: the exact parameter count, fast GNN == the paper's per-edge equations, ablation switches."""

from dataclasses import replace

import pytest
import torch
from conftest import star_triples

from earl_service.config import ABLATIONS, ModelConfig
from earl_service.model.graph import build_graph, choose_reserved
from earl_service.model.modules import EARL, GNNLayer, RotatE, RotatEModel, trainable_parameters


def test_parameter_count_fb15k237_paper_settings():
    # FB15k-237: |R| = 237, dim 150, N_res = int(0.1 * 14505) = 1450, 2 layers.
    model = EARL(ModelConfig(dim=150), 237, choose_reserved(14505, 0.1, 0))
    d, num_rel, n_res = 150, 237, 1450
    assert trainable_parameters(model) == 5 * num_rel * d + 54 * d * d + 30 * d + 2 * d * n_res == 1_832_250


def test_rotate_baseline_parameter_count():
    model = RotatEModel(ModelConfig(model="rotate", dim=100), 237, 14505)
    assert trainable_parameters(model) == 14505 * 200 + 237 * 100


def test_rotate_entities_unseen_in_training_embed_as_initial_values(small_graph_triples):
    """Not zeros (a point near every query under RotatE's distance), but untrained draws, the same every call."""
    cfg = ModelConfig(model="rotate", dim=3)
    model = RotatEModel(cfg, 4, 25)
    graph = build_graph(small_graph_triples, 30, 4, choose_reserved(30, 0.2, 0), k=2)
    entities, _ = model(graph)
    extra = entities[25:]
    assert entities.shape == (30, 6) and torch.equal(entities[:25], model.entities)
    assert extra.abs().min() > 0 and extra.abs().max() <= cfg.embedding_range
    assert torch.equal(model(graph)[0][25:], extra)


def test_fast_gnn_equals_naive_per_edge(small_graph_triples):
    torch.manual_seed(0)
    n, num_rel, dim = 30, 4, 3
    graph = build_graph(small_graph_triples, n, num_rel, choose_reserved(n, 0.2, 0), k=2, dtype=torch.float64)
    for activation in (True, False):
        layer = GNNLayer(dim, activation=activation).double()
        x = torch.randn(n, 2 * dim, dtype=torch.float64, requires_grad=True)
        rel = torch.randn(num_rel, dim, dtype=torch.float64, requires_grad=True)
        fast_h, fast_r = layer(x, rel, graph)
        naive_h, naive_r = layer.forward_naive(x, rel, graph.triples)
        torch.testing.assert_close(fast_h, naive_h, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(fast_r, naive_r, rtol=1e-10, atol=1e-10)
        g_h, g_r = torch.randn_like(fast_h), torch.randn_like(fast_r)
        params = [x, rel, *layer.parameters()]
        fast_grads = torch.autograd.grad((fast_h * g_h).sum() + (fast_r * g_r).sum(), params)
        naive_grads = torch.autograd.grad((naive_h * g_h).sum() + (naive_r * g_r).sum(), params)
        for a, b in zip(fast_grads, naive_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def unfused_forward(model: EARL, graph) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder as the paper writes it: h^0 through f_m's two maps, then each GNN layer on its own."""
    h, rel = model.initial(graph), model.relations
    if model.conrel_mlp is not None:  # ConRel's second map applied, then f_m's first: recompute h^0 that way
        lin1, lin2 = model.conrel_mlp[0], model.conrel_mlp[2]
        first, second = model.combine[0], model.combine[2]
        width = 2 * model.config.dim
        conrel = lin2(torch.relu(graph.conrel @ (model.relation_ends @ lin1.weight.T) + lin1.bias))
        pre = first.bias + conrel @ first.weight[:, :width].T
        if model.config.uses_knn:
            pre = pre + graph.knn @ (model.reserved_embeddings @ first.weight[:, width:].T)
        h = second(torch.relu(pre))
        if model.reserved_embeddings is not None:
            h = h.index_copy(0, graph.reserved, model.reserved_embeddings)
    for layer in model.gnn:
        h, rel = layer(h, rel, graph)
    return h, rel


@pytest.mark.parametrize("ablation", [None, *ABLATIONS])
def test_fused_linear_maps_equal_the_encoder_map_by_map(small_graph_triples, ablation):
    """ConRel's second map with f_m's first, f_m's second with the first layer's: fused, same values and grads."""
    cfg = ModelConfig(dim=3, k=2, reserved_ratio=0.2, **({ablation: True} if ablation else {}))
    graph, reserved = _graph(small_graph_triples, cfg, dtype=torch.float64)
    graph.compact = None  # map by map over every entity's own inputs
    model = EARL(cfg, 4, reserved).double()
    fused, unfused = model(graph), unfused_forward(model, graph)
    weights = [torch.randn_like(t) for t in fused]
    params = list(model.parameters())
    fused_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(fused, weights, strict=True)), params)
    unfused_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(unfused, weights, strict=True)), params)
    for a, b in zip([*fused, *fused_grads], [*unfused, *unfused_grads], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("ablation", [None, *ABLATIONS])
def test_repeated_input_rows_are_encoded_once_with_the_same_result(ablation):
    cfg = ModelConfig(dim=3, k=2, reserved_ratio=0.1, **({ablation: True} if ablation else {}))
    n, num_rel = 80, 3
    graph, reserved = _graph(star_triples(), cfg, n, num_rel, dtype=torch.float64)
    assert graph.compact is not None and graph.compact.inputs.num_entities < 40  # the leaves share one row or few
    index = graph.compact.index
    assert torch.equal(index[reserved], torch.arange(graph.compact.inputs.num_entities - reserved.numel(),
                                                        graph.compact.inputs.num_entities))
    model = EARL(cfg, num_rel, reserved).double()

    def run(g):
        model.zero_grad()
        ent, rel = model(g)
        weights = torch.linspace(-1, 1, ent.numel(), dtype=ent.dtype).reshape(ent.shape)
        ((ent * weights).sum() + rel.square().sum()).backward()
        return ent.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    compact_ent, compact_grads = run(graph)
    full_ent, full_grads = run(replace(graph, compact=None))
    assert compact_ent.shape == (n, 6)
    torch.testing.assert_close(compact_ent, full_ent, rtol=1e-10, atol=1e-10)
    for a, b in zip(compact_grads, full_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_input_rows_are_not_grouped_when_that_saves_little(small_graph_triples):
    graph = build_graph(small_graph_triples, 30, 4, choose_reserved(30, 0.2, 0), k=2)
    assert graph.compact is None  # 30 entities of a random graph: almost every row is its own
    assert build_graph(star_triples(), 80, 3, choose_reserved(80, 0.1, 0), k=2, compact=False).compact is None


def test_a_hash_collision_cannot_group_different_rows(monkeypatch):
    """Rows are grouped by hash, then checked entry by entry: a (simulated) collision turns grouping off."""
    from earl_service.model import graph as graph_module

    def collide(crow, col, unit):
        n = crow.numel() - 1
        return torch.zeros(n, dtype=torch.long), torch.zeros(1, dtype=torch.long)

    monkeypatch.setattr(graph_module, "_identical_rows", collide)
    assert build_graph(star_triples(), 80, 3, choose_reserved(80, 0.1, 0), k=2).compact is None


def test_a_moved_graph_shares_its_tensors_with_its_compact_first_layer():
    graph = build_graph(star_triples(), 80, 3, choose_reserved(80, 0.1, 0), k=2).to(torch.device("cpu"))
    first = graph.compact.first_layer
    assert first.conrel is graph.conrel and first.triples is graph.triples and first.compact is None
    assert first.message.mat.shape == (80, 3 * graph.compact.inputs.num_entities)


def _graph(triples, cfg: ModelConfig, n=30, num_rel=4, dtype=torch.float32):
    reserved = choose_reserved(n, cfg.reserved_ratio, cfg.seed) if cfg.uses_reserved else torch.zeros(0, dtype=torch.long)
    return build_graph(triples, n, num_rel, reserved, k=cfg.k, dtype=dtype), reserved


def expected_count(cfg: ModelConfig, num_rel: int, n_res: int) -> int:
    d = cfg.dim
    w = 2 * d
    count = num_rel * d  # relation table
    if cfg.uses_reserved:
        count += n_res * w
    if cfg.uses_conrel:
        count += 2 * num_rel * w + 2 * (w * w + w)
    inputs = int(cfg.uses_conrel) + int(cfg.uses_knn)
    if inputs:
        count += inputs * w * w + w + w * w + w
    per_layer = 2 * (w * w + w + d * w + w) + (w * w + w) + (d * d + d)
    return count + cfg.gnn_layers * per_layer


@pytest.mark.parametrize("ablation", [None, *ABLATIONS])
def test_ablation_switches(small_graph_triples, ablation):
    cfg = ModelConfig(dim=4, k=3, reserved_ratio=0.2, **({ablation: True} if ablation else {}))
    graph, reserved = _graph(small_graph_triples, cfg)
    model = EARL(cfg, 4, reserved)
    assert trainable_parameters(model) == expected_count(cfg, 4, reserved.numel())
    ent, rel = model(graph)
    assert ent.shape == (30, 8) and rel.shape == (4, 4)
    assert torch.isfinite(ent).all()
    (ent.sum() + rel.sum()).backward()
    assert all(p.grad is not None for p in model.parameters())
    if ablation == "no_mulhop":
        assert len(model.gnn) == 0
        # Without the GNN the reserved entities' embeddings are their own rows.
        torch.testing.assert_close(ent[reserved], model.reserved_embeddings.detach())
    if ablation in ("no_reserved",):
        assert model.reserved_embeddings is None
    if ablation in ("no_conrel", "no_conrel_knn"):
        assert model.relation_ends is None


def test_reserved_entities_use_their_own_rows(small_graph_triples):
    cfg = ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    graph, reserved = _graph(small_graph_triples, cfg)
    model = EARL(cfg, 4, reserved)
    h0 = model.initial(graph)
    torch.testing.assert_close(h0[reserved], model.reserved_embeddings.detach())


def test_encoder_is_entity_agnostic(small_graph_triples):
    """The same weights embed a bigger graph: parameters do not depend on the number of entities."""
    cfg = ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    graph, reserved = _graph(small_graph_triples, cfg)
    model = EARL(cfg, 4, reserved)
    big = build_graph(small_graph_triples, 40, 4, reserved, k=3)  # 10 extra isolated entities
    small_ent, _ = model(graph)
    big_ent, _ = model(big)
    torch.testing.assert_close(big_ent[:30], small_ent)
    assert torch.allclose(big_ent[30], big_ent[39])  # isolated entities share the empty-context embedding


def test_rotate_score_identities():
    cfg = ModelConfig(dim=5)
    scorer = RotatE(cfg)
    h, t = torch.randn(7, 10), torch.randn(7, 10)
    r = torch.randn(7, 5)
    # |h o r - t| == |h - conj(r) o t| because every |r_i| = 1.
    a = scorer.distance(scorer.rotate(h, r), t)
    b = scorer.distance(h, scorer.rotate(t, r, inverse=True))
    torch.testing.assert_close(a, b)
    # A rotation by the identity phase leaves the vector unchanged.
    torch.testing.assert_close(scorer.rotate(h, torch.zeros(7, 5)), h)
