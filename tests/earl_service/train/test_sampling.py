"""Sampled training: full-neighbourhood sampling is the full-graph encoder, sampled edges are reweighted without
bias, layer-wise inference is exact, and sampled training learns on CoDEx-S."""

import numpy as np
import pytest
import torch
from conftest import codex_s_path, random_triples

from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.model.graph import build_graph, choose_reserved
from earl_service.model.modules import EARL
from earl_service.train.loop import train
from earl_service.train.sampling import NeighborIndex, _floyd_sample, embed_all

N, R = 60, 4


def _setup(cfg: ModelConfig, seed: int = 1):
    triples = random_triples(N, R, 240, seed=seed)  # self-loops, repeated edges, one isolated entity
    reserved = choose_reserved(N, cfg.reserved_ratio, cfg.seed) if cfg.uses_reserved else torch.zeros(0, dtype=torch.long)
    graph = build_graph(triples, N, R, reserved, k=cfg.k, dtype=torch.float64)
    index = NeighborIndex(triples, N, R, reserved, k=cfg.k, dtype=torch.float64)
    torch.manual_seed(0)
    model = EARL(cfg, R, reserved).double()
    return model, graph, index


@pytest.mark.parametrize("ablation", [None, "no_reserved", "no_conrel", "no_knn", "no_mulhop"])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_full_neighbourhood_sampling_is_the_full_graph_encoder(ablation, layers):
    cfg = ModelConfig(dim=4, k=3, reserved_ratio=0.2, layers=layers, **({ablation: True} if ablation else {}))
    model, graph, index = _setup(cfg)
    seeds = np.array([0, 5, 7, 2, 59, 30, 3])  # includes a self-loop (2), a multi-edge (3) and the isolated 59
    full, full_rel = model(graph)
    sub = index.sample(seeds, [None] * cfg.gnn_layers)
    assert sub.num_seeds == len(seeds) and torch.equal(sub.nodes[: len(seeds)], torch.from_numpy(seeds))
    out, rel = model(sub.inputs, sub.layers)
    assert out.shape == (len(seeds), 2 * cfg.dim)
    torch.testing.assert_close(out, full[seeds], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rel, full_rel, rtol=0, atol=0)
    # The backward agrees as well: the local CSR transposes carry the same gradients to every parameter.
    weight = torch.randn(out.shape, dtype=torch.float64)
    local_grads = torch.autograd.grad((out * weight).sum() + rel.sum(), list(model.parameters()), allow_unused=True)
    full_out, full_rel = model(graph)
    full_grads = torch.autograd.grad((full_out[seeds] * weight).sum() + full_rel.sum(), list(model.parameters()),
                                     allow_unused=True)
    for a, b in zip(local_grads, full_grads, strict=True):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_layerwise_inference_equals_the_full_graph_forward():
    model, graph, index = _setup(ModelConfig(dim=4, k=3, reserved_ratio=0.2))
    full, full_rel = model(graph)
    ent, rel = embed_all(model, index, chunk=7)  # several chunks, uneven last one
    torch.testing.assert_close(ent, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rel, full_rel)


def _global_dense(layer, nodes: np.ndarray, width: int) -> np.ndarray:
    """A layer graph's message matrix with its local input columns mapped back to global entity ids."""
    coo = layer.message.mat.to_sparse_coo().coalesce()
    rows, cols = coo.indices().numpy()
    out = np.zeros((layer.message.mat.shape[0], 3 * width))
    np.add.at(out, (rows, 3 * nodes[cols // 3] + cols % 3), coo.values().numpy())
    return out


def test_sampled_edges_are_reweighted_without_bias():
    """The expected sampled message matrix (fan-out 2) is the full-graph one: sampled edges weigh 1/s_e, so
    a linear layer's output is unbiased."""
    cfg = ModelConfig(dim=3, k=3, reserved_ratio=0.2, layers=1)
    _, graph, index = _setup(cfg, seed=4)
    seeds = np.arange(0, N, 3)
    full = graph.message.mat.to_dense().numpy()[seeds]
    rng = np.random.default_rng(0)
    draws = 1500
    total = np.zeros_like(full)
    for _ in range(draws):
        sub = index.sample(seeds, [2], rng)
        total += _global_dense(sub.layers[0], sub.nodes.numpy(), N)
    assert (index.degree[seeds] > 2).sum() > 5  # the fan-out of 2 really samples most of these entities
    np.testing.assert_allclose(total / draws, full, atol=0.03)
    sub = index.sample(seeds, [2], rng)
    one = _global_dense(sub.layers[0], sub.nodes.numpy(), N)
    assert np.abs(one - full).max() > 0.2  # a single draw does differ: the test has teeth


def test_fanout_bounds_the_computation_graph():
    cfg = ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    _, _, index = _setup(cfg)
    seeds = np.array([1, 2])
    sub = index.sample(seeds, [2, 1], np.random.default_rng(0))
    assert sub.nodes.numel() <= 2 + 2 * 2 + 2 * 2 * 1
    first, last = sub.layers  # input side first: 3 sets of entities shrink to the seeds
    assert last.message.mat.shape == (2, 3 * first.message.mat.shape[0])
    assert first.message.mat.shape[1] == 3 * sub.nodes.numel()
    # Every sampled edge weighs 1/s_e: each output row's neighbour weights sum to 1 (plus the self column).
    dense = last.message.mat.to_dense().reshape(2, -1, 3)
    torch.testing.assert_close(dense[..., :2].sum((1, 2)), torch.ones(2, dtype=torch.float64))


def test_floyd_sample_is_uniform_and_distinct():
    rng = np.random.default_rng(0)
    out = _floyd_sample(np.full(20000, 6), 3, rng)
    assert all(len(set(row)) == 3 for row in out[:500].tolist())
    counts = np.bincount(out.reshape(-1), minlength=6) / out.size
    np.testing.assert_allclose(counts, np.full(6, 1 / 6), atol=0.01)


def test_sampled_training_learns_on_codex(tmp_path):
    """A short sampled run (fan-out 5,5, chunks of 32 positives sharing 32 negatives per side) lifts test MRR
    far above the untrained model's; validation and the final evaluation use exact layer-wise inference."""
    ds = load_dataset(codex_s_path())
    mcfg = ModelConfig(dim=32)
    fast = {"batch_size": 256, "negatives": 32, "progress": False, "sampled": True, "fanout": (5, 5),
            "negative_chunk": 32}
    untrained = train(ds, mcfg, TrainConfig(steps=0, **fast), tmp_path / "untrained", write_bundle=False)
    trained = train(ds, mcfg, TrainConfig(steps=150, lr=5e-3, eval_every=75, eval_max_triples=300, **fast),
                    tmp_path / "trained")
    assert untrained["test"]["mrr"] < 0.05
    assert trained["test"]["mrr"] > 3 * untrained["test"]["mrr"] and trained["test"]["mrr"] > 0.12
    assert trained["memory"]["index_mb"] > 0 and trained["config"]["train"]["sampled"]
    assert (tmp_path / "trained" / "bundle.safetensors").exists()


def test_sampled_training_refuses_what_it_cannot_sample(tmp_path):
    ds = load_dataset(codex_s_path())
    with pytest.raises(ValueError, match="EARL"):
        train(ds, ModelConfig(model="rotate", dim=4), TrainConfig(steps=1, sampled=True, progress=False), tmp_path)
