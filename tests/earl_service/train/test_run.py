"""Run: a model with its dataset and graph; GraphCache shares one graph build between runs of one dataset."""

from __future__ import annotations

import torch
from conftest import tiny_dataset

from earl_service.config import ModelConfig
from earl_service.train.run import GraphCache, Run


def _same_graph(a, b) -> None:
    torch.testing.assert_close(a.conrel.mat.to_dense(), b.conrel.mat.to_dense())
    torch.testing.assert_close(a.knn_ids, b.knn_ids)
    torch.testing.assert_close(a.knn_weights, b.knn_weights)
    torch.testing.assert_close(a.reserved, b.reserved)


def test_runs_of_any_dim_share_one_cached_graph_equal_to_a_fresh_build():
    ds, graphs = tiny_dataset(), None
    graphs = GraphCache(ds)
    runs = [Run.build(ds, ModelConfig(dim=dim, k=3, reserved_ratio=0.2), torch.device("cpu"), graphs=graphs)
            for dim in (4, 8, 16)]
    assert graphs.builds == 1  # the graph does not depend on the dim
    fresh = Run.build(ds, ModelConfig(dim=4, k=3, reserved_ratio=0.2), torch.device("cpu"))
    for run in runs:
        _same_graph(run.graph, fresh.graph)


def test_another_reserved_set_or_k_is_another_graph():
    ds = tiny_dataset()
    graphs = GraphCache(ds)
    Run.build(ds, ModelConfig(dim=4, k=3, reserved_ratio=0.2), torch.device("cpu"), graphs=graphs)
    Run.build(ds, ModelConfig(dim=4, k=2, reserved_ratio=0.2), torch.device("cpu"), graphs=graphs)
    Run.build(ds, ModelConfig(dim=4, k=3, reserved_ratio=0.3), torch.device("cpu"), graphs=graphs)
    Run.build(ds, ModelConfig(dim=4, k=3, reserved_ratio=0.2, seed=1), torch.device("cpu"), graphs=graphs)
    assert graphs.builds == 4


def test_runs_of_one_cache_share_its_known_answers_and_rank_as_a_fresh_run():
    """Every compress slice loads its run again: the known answers (10M triples at 1M entities) are sorted once."""
    ds = tiny_dataset()
    graphs = GraphCache(ds)
    runs = [Run.build(ds, ModelConfig(model=model, dim=4), torch.device("cpu"), graphs=graphs)
            for model in ("rotate", "earl", "rotate")]
    assert runs[0].known is runs[1].known is runs[2].known is graphs.known()
    fresh = Run.build(ds, ModelConfig(model="rotate", dim=4), torch.device("cpu"))
    fresh.model.load_state_dict(runs[0].model.state_dict())
    assert fresh.known is None and fresh.evaluate("valid") == runs[0].evaluate("valid")


def test_learners_of_one_cache_share_their_negative_sampler():
    """Each compress slice builds a Learner: its sampler's sorted true pairs (two sorts of the training triples)
    are built once per device and equal a fresh sampler's."""
    from earl_service.config import TrainConfig
    from earl_service.train.distributed import Ranks
    from earl_service.train.loop import Learner
    from earl_service.train.loss import NegativeSampler
    from earl_service.train.schedule import build_optimizer

    ds, cfg, cpu = tiny_dataset(), TrainConfig(batch_size=8, negatives=4, progress=False), torch.device("cpu")
    graphs = GraphCache(ds)

    def learner(run):
        return Learner.build(run, build_optimizer(run.model, cfg), cfg, ranks=Ranks(), device=cpu)

    runs = [Run.build(ds, ModelConfig(model=model, dim=4), cpu, graphs=graphs) for model in ("rotate", "earl")]
    first, second = (learner(run).sampler for run in runs)
    assert first is second
    fresh = learner(Run.build(ds, ModelConfig(model="rotate", dim=4), cpu)).sampler
    assert fresh is not first and isinstance(fresh, NegativeSampler)
    assert torch.equal(fresh.tail_keys, first.tail_keys) and torch.equal(fresh.head_keys, first.head_keys)


def test_the_cache_counts_the_seconds_of_what_it_builds_not_of_what_it_reuses(monkeypatch):
    """A compress slice's overhead, measured to plan the next, leaves out what the cache built once
    (GraphCache.build_seconds): a lane's first slice builds its graphs again."""
    import time

    from earl_service.train import run as run_module

    slow, real = 0.2, run_module.build_graph

    def build_graph(*args, **kwargs):
        time.sleep(slow)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "build_graph", build_graph)
    ds = tiny_dataset()
    graphs = GraphCache(ds)
    Run.build(ds, ModelConfig(dim=4, k=3, reserved_ratio=0.2), torch.device("cpu"), graphs=graphs)
    built = graphs.build_seconds
    assert built >= slow
    Run.build(ds, ModelConfig(dim=8, k=3, reserved_ratio=0.2), torch.device("cpu"), graphs=graphs)  # reused
    assert graphs.shared("parts", lambda: time.sleep(slow) or 1) == graphs.shared("parts", lambda: 2) == 1
    assert built + slow <= graphs.build_seconds < built + 2 * slow


def test_rotate_runs_of_one_cache_share_their_edgeless_graph(monkeypatch):
    """RotatE reads only the graph's entity count: its edgeless graph (4 s a build at 5M entities) is built once
    per cache, not twice a compress slice."""
    from earl_service.train import run as run_module

    calls, real = [], run_module.build_graph

    def counted(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "build_graph", counted)
    ds = tiny_dataset()
    graphs = GraphCache(ds)
    first, second = (Run.build(ds, ModelConfig(model="rotate", dim=d), torch.device("cpu"), graphs=graphs)
                     for d in (4, 8))
    assert calls == [ds.num_train_entities]  # one build; each run holds it moved to its device (here: shared)
    assert first.graph.num_entities == second.graph.num_entities == ds.num_train_entities
    Run.build(ds, ModelConfig(model="rotate", dim=4), torch.device("cpu"))  # no cache: its own
    assert len(calls) == 2
