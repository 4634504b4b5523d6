"""CUDA paths against the CPU ones: the same step gives the same loss and gradients, a run trained on the GPU
evaluates the same on either device and exports a bundle that loads on a CPU-only machine, and the training
step queues its work without a host sync.

Skipped where torch sees no CUDA device (CI and the development machines); run on a lent GPU machine with
`python -m pytest tests/earl_service/test_cuda.py`.
"""

import numpy as np
import pytest
import torch
from conftest import codex_s_path, star_triples, tiny_dataset

from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.precision import ProductQuantized
from earl_service.compress.config import CompressConfig
from earl_service.compress.search import compress
from earl_service.compress.state import PICK
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.model.kernels import rotate_distance, rotate_distance_all
from earl_service.train.distributed import Ranks
from earl_service.train.finetune import FineTune, fine_tune
from earl_service.train.graphed import GraphedStep
from earl_service.train.loop import BUNDLE, Learner, eager_step, step_on_batch, train, train_step
from earl_service.train.loss import NegativeSampler, loss_fn
from earl_service.train.readout import LossReadout, read_every
from earl_service.train.run import Run, load_run
from earl_service.train.schedule import build_optimizer
from earl_service.train.state import TrainState

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CUDA = torch.device("cuda")


def test_rotate_distance_cuda_matches_cpu_kernel():
    gen = torch.Generator().manual_seed(0)
    q, ent = torch.randn(64, 40, generator=gen), torch.randn(500, 40, generator=gen)
    idx = torch.randint(0, 500, (64, 33), generator=gen)
    torch.testing.assert_close(rotate_distance(q.to(CUDA), ent.to(CUDA), idx.to(CUDA)).cpu(),
                               rotate_distance(q, ent, idx), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(rotate_distance_all(q.to(CUDA), ent.to(CUDA)).cpu(), rotate_distance_all(q, ent),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("model", ["earl", "rotate"])
def test_training_step_cuda_matches_cpu(model):
    """One full-graph step: same weights, batch and negatives on both devices give the same loss and gradients."""
    ds = tiny_dataset()
    cfg = ModelConfig(model=model, dim=8, k=3, reserved_ratio=0.2)
    cpu, gpu = Run.build(ds, cfg, torch.device("cpu")), Run.build(ds, cfg, CUDA)
    for (name, a), b in zip(cpu.model.state_dict().items(), gpu.model.state_dict().values(), strict=True):
        assert torch.equal(a, b.cpu()), name  # the same seeded initial weights on both devices
    batch = torch.as_tensor(ds.train[:64], dtype=torch.long)
    sampler = NegativeSampler(ds.train, ds.num_train_entities, ds.num_relations, torch.device("cpu"))
    neg = sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], 16, torch.Generator().manual_seed(1))
    neg_h, neg_t = neg.heads, neg.tails

    def step(run, device):
        run.model.zero_grad(set_to_none=True)
        entities, relations = run.model(run.graph)
        loss = loss_fn(run.scorer, entities, relations, batch.to(device), neg_h.to(device), neg_t.to(device), 1.0)
        loss.backward()
        return loss.detach().cpu(), {k: p.grad.cpu() for k, p in run.model.named_parameters() if p.grad is not None}

    loss_cpu, grads_cpu = step(cpu, torch.device("cpu"))
    loss_gpu, grads_gpu = step(gpu, CUDA)
    torch.testing.assert_close(loss_gpu, loss_cpu, rtol=1e-5, atol=1e-6)
    assert grads_cpu.keys() == grads_gpu.keys() and grads_cpu
    for name in grads_cpu:
        torch.testing.assert_close(grads_gpu[name], grads_cpu[name], rtol=1e-4, atol=1e-5, msg=name)


def test_compact_inputs_on_cuda_give_the_full_graph_embeddings():
    """A graph whose repeated input rows are grouped (graph.CompactInputs), moved to the GPU, encodes as on the CPU."""
    from earl_service.model.graph import build_graph, choose_reserved
    from earl_service.model.modules import EARL

    cfg, reserved = ModelConfig(dim=8, k=2), choose_reserved(80, 0.1, 0)
    graph = build_graph(star_triples(), 80, 3, reserved, k=cfg.k)
    assert graph.compact is not None
    model = EARL(cfg, 3, reserved)
    cpu_ent, _ = model(graph)
    gpu_ent, _ = model.to(CUDA)(graph.to(CUDA))
    torch.testing.assert_close(gpu_ent.cpu(), cpu_ent.detach(), rtol=1e-5, atol=1e-5)


def test_negative_sampler_on_cuda_avoids_true_answers_or_flags_them():
    """On CUDA the sampler redraws through masks at fixed shapes (no host sync) from a generator on the card; a
    candidate that still makes a true triple after its rounds is flagged for the loss to ignore."""
    ds = tiny_dataset()
    sampler = NegativeSampler(ds.train, 40, 3, CUDA)
    assert sampler.fixed_shapes
    batch = torch.as_tensor(ds.train, dtype=torch.long, device=CUDA)
    neg = sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], 16, torch.Generator(device=CUDA).manual_seed(0))
    assert neg.heads.device.type == neg.tails.device.type == "cuda" and neg.known is not None
    true = {tuple(x) for x in ds.train.tolist()}
    rows = zip(ds.train.tolist(), neg.heads.tolist(), neg.tails.tolist(), neg.known[0].tolist(),
               neg.known[1].tolist(), strict=True)
    for (h, r, t), hs, ts, head_hits, tail_hits in rows:
        assert [(x, r, t) in true for x in hs] == head_hits
        assert [(h, r, x) in true for x in ts] == tail_hits


@pytest.mark.parametrize("model", ["rotate", "earl"])
def test_full_graph_steps_make_no_host_sync(model):
    """Steps under torch.cuda.set_sync_debug_mode("error"): a host sync on the hot path (a float() of the loss, a
    host-to-device copy of the batch or the negatives, nonzero's data-dependent shape) raises. 12 steps of 4,096
    cross an epoch of CoDEx-S (a new permutation, drawn on the card); the losses are read after the block, as
    the loop's LossReadout reads them, and are finite."""
    ds, steps = load_dataset(codex_s_path()), 12
    tcfg = TrainConfig(batch_size=4096, negatives=64, progress=False, device="cuda")
    run = Run.build(ds, ModelConfig(model=model, dim=32), CUDA)
    learner = Learner.build(run, build_optimizer(run.model, tcfg), tcfg, ranks=Ranks(), device=CUDA)
    assert learner.sampler.fixed_shapes and learner.triples.device.type == "cuda"
    state, losses = TrainState.start(tcfg.seed, CUDA), LossReadout(read_every(CUDA))
    run.model.train()
    losses.add(state.step, train_step(learner, state))  # the first step builds the optimizer's state
    losses.read()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            loss = train_step(learner, state)
            losses.add(state.step, loss)  # as the loop records it: under the step count the step made
    finally:
        torch.cuda.set_sync_debug_mode(0)
    records = losses.read()
    assert [r.step for r in records] == list(range(2, steps + 2))
    assert all(np.isfinite(r.loss) for r in records)


def test_cuda_run_evaluates_the_same_on_cpu_and_exports_a_cpu_bundle(tmp_path):
    ds = load_dataset(codex_s_path())
    tcfg = TrainConfig(steps=60, batch_size=256, negatives=32, eval_every=30, eval_max_triples=200,
                       progress=False, device="cuda", seed=0)
    metrics = train(ds, ModelConfig(dim=16), tcfg, tmp_path, protocol="seen")
    assert metrics["device"].startswith("cuda") and metrics["steps"] == 60
    on_cpu = load_run(tmp_path, ds, device="cpu").evaluate("test")
    on_gpu = load_run(tmp_path, ds, device="cuda").evaluate("test")
    assert on_cpu["count"] == on_gpu["count"] == metrics["test"]["count"]
    assert on_cpu["mrr"] == pytest.approx(on_gpu["mrr"], abs=2e-3)
    assert on_gpu["mrr"] == pytest.approx(metrics["test"]["mrr"], abs=2e-3)
    bundle = load_bundle(tmp_path / BUNDLE)  # written from CUDA tensors, read back as CPU ones
    emb = bundle.entity_embeddings()
    assert emb.device.type == "cpu" and np.isfinite(emb.numpy()).all()
    ref, _ = load_run(tmp_path, ds, device="cpu").embed("seen")
    torch.testing.assert_close(emb, ref.float(), rtol=1e-4, atol=1e-4)


def test_a_cuda_run_resumes(tmp_path):
    """A checkpoint's generator states load as CPU tensors whatever the device: a CUDA run resumes and repeats
    the uninterrupted run's losses."""
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    tcfg = TrainConfig(steps=8, batch_size=32, negatives=8, eval_every=3, eval_batch_size=16, checkpoint_every=3,
                       progress=False, device="cuda")
    train(ds, cfg, tcfg, tmp_path / "straight", final_eval=False, write_bundle=False)
    calls = []
    train(ds, cfg, tcfg, tmp_path / "split", final_eval=False, write_bundle=False,
          should_stop=lambda: calls.append(1) or len(calls) > 5)
    train(ds, cfg, tcfg, tmp_path / "split", resume=True, final_eval=False, write_bundle=False)
    a, b = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=True) for run in ("straight", "split"))
    assert len(b["history"]["losses"]) == 8
    assert torch.equal(a["generator"], b["generator"])  # the card's generator, saved and restored
    # Approximately: CUDA's scatter-adds are not deterministic, so two straight runs differ in the last bits too.
    assert b["history"]["losses"] == pytest.approx(a["history"]["losses"], rel=1e-4)


@pytest.fixture(scope="module")
def codex_run(tmp_path_factory):
    """A RotatE and an EARL run on CoDEx-S trained briefly on the CPU: the source of the pq tables below."""
    ds, runs = load_dataset(codex_s_path()), {}
    # Half the entities reserved: 1,017 rows, enough for pq:8 to code EARL's reserved table (fewer rows would
    # cost more in codebooks than int8 does, and plan() leaves such a table uncoded).
    configs = {"rotate": ModelConfig(model="rotate", dim=16), "earl": ModelConfig(dim=16, reserved_ratio=0.5)}
    for model, config in configs.items():
        out = tmp_path_factory.mktemp(model)
        train(ds, config, TrainConfig(steps=20, batch_size=256, negatives=16, eval_every=0, progress=False,
                                      device="cpu"), out)
        runs[model] = out
    return ds, runs


@pytest.mark.parametrize("model", ["rotate", "earl"])
def test_pq_fine_tuning_on_cuda_matches_cpu(codex_run, model):
    """Codebook fine-tuning builds its gathers where the run lives (Run.device; it crashed on CUDA with its
    codebooks left on the CPU). A CUDA run draws its batches and negatives from the card's generator, another
    stream than the CPU's, so the two runs agree in what they do, not bit for bit: the codes stay, and losses
    and codebooks stay close to the CPU's from the same start."""
    ds, runs = codex_run
    bundle = load_bundle(runs[model] / BUNDLE)
    tables = ProductQuantized(8).encode_tables(bundle.config, bundle.params)
    assert tables, f"pq:8 codes no table of this {model} model"
    cfg = TrainConfig(batch_size=256, negatives=16, lr=3e-3, eval_every=0, progress=False)
    results = {}
    for device in ("cpu", "cuda"):
        run = load_run(runs[model], ds, device=device)
        assert run.device.type == device
        results[device] = fine_tune(run, bundle.params, tables, cfg, FineTune(steps=5, seconds=600))
    (cpu, cpu_info), (gpu, gpu_info) = results["cpu"], results["cuda"]
    assert len(gpu_info.losses) == len(cpu_info.losses) == 5 and np.isfinite(gpu_info.losses).all()
    assert np.mean(gpu_info.losses) == pytest.approx(np.mean(cpu_info.losses), rel=0.15)
    for name in tables:
        np.testing.assert_array_equal(gpu[name][0], cpu[name][0])  # the codes stay
        # 5 Adam steps of lr 3e-3 move a codeword by at most ~1.5e-2 on either device
        np.testing.assert_allclose(gpu[name][1].astype(np.float32), cpu[name][1].astype(np.float32), atol=3e-2)


def test_compress_with_every_precision_runs_on_cuda(tmp_path):
    """`earl compress --device cuda` with the default precisions, pq included, for both models: it crashed in pq
    fine-tuning (EARL) and in the loss (RotatE) before the run's device became explicit."""
    dataset = load_dataset(codex_s_path())
    tcfg = TrainConfig(batch_size=256, negatives=16, eval_every=0, progress=False, device="cuda", threads=1)
    config = CompressConfig(max_bytes=300_000, time_limit_minutes=0.5)
    report = compress(dataset, tmp_path, config, train_configs={"earl": tcfg, "rotate": tcfg})
    exports = report["exports"]
    assert {r["model"] for r in exports} == {"earl", "rotate"}
    assert any(r["precision"].startswith("pq:") for r in exports)
    assert all(np.isfinite(r[report["metric_key"]]) for r in exports)
    assert (tmp_path / PICK).stat().st_size == report["pick"]["bytes"] <= config.max_bytes


@pytest.mark.parametrize("model,compute", [("rotate", "fp32"), ("earl", "fp32"), ("earl", "bf16")])
def test_a_graphed_step_trains_as_the_eager_step(model, compute):
    """--cuda-graphs: 3 eager warm-up steps, a capture, then replays give the eager steps' losses from the same start
    (the same batches while the epoch lasts, the same negatives from the registered generator), and no replay
    waits on the card."""
    ds = load_dataset(codex_s_path())  # 32,888 training rows: 12 steps of 1,024 stay in one epoch
    tcfg = TrainConfig(batch_size=1024, negatives=32, progress=False, device="cuda", cuda_graphs=True,
                       compute=compute)
    losses = {}
    for graphed in (False, True):
        torch.manual_seed(0)
        run = Run.build(ds, ModelConfig(model=model, dim=32), CUDA)
        learner = Learner.build(run, build_optimizer(run.model, tcfg), tcfg, ranks=Ranks(), device=CUDA)
        learner.graphed = GraphedStep.build(learner, eager_step, step_on_batch) if graphed else None
        assert (learner.graphed is not None) == graphed
        state = TrainState.start(tcfg.seed, CUDA)
        out = [train_step(learner, state) for _ in range(5)]  # the warm-up and the capture
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out += [train_step(learner, state) for _ in range(7)]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert state.step == 12
        losses[graphed] = torch.stack(out).cpu()
    tolerance = 1e-4 if compute == "fp32" else 2e-3  # bf16: the graph re-casts what the eager step cached
    torch.testing.assert_close(losses[True], losses[False], rtol=tolerance, atol=tolerance / 10)


def test_a_graphed_run_validates_checkpoints_and_resumes(tmp_path):
    """`earl train --cuda-graphs`: validation and checkpoints between replays, a stop and a resume (which captures
    again), the same number of steps as asked and finite losses."""
    ds = load_dataset(codex_s_path())
    tcfg = TrainConfig(steps=40, batch_size=1024, negatives=32, eval_every=10, eval_max_triples=200,
                       checkpoint_every=10, progress=False, device="cuda", cuda_graphs=True)
    calls = []
    train(ds, ModelConfig(dim=16), tcfg, tmp_path, final_eval=False,
          should_stop=lambda: calls.append(1) or len(calls) > 15)
    metrics = train(ds, ModelConfig(dim=16), tcfg, tmp_path, resume=True)
    assert metrics["steps"] == 40 and np.isfinite(metrics["test"]["mrr"])
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert len(ckpt["history"]["losses"]) == 40 and np.isfinite(ckpt["history"]["losses"]).all()
