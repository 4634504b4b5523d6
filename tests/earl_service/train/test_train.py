"""Training: negatives avoid true answers, resume is bit-for-bit, a short CoDEx-S run learns, the CLI works."""

import json
import time

import numpy as np
import pytest
import torch
from conftest import codex_s_path, tiny_dataset

from earl_service.cli.main import main
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import Dataset, load_dataset
from earl_service.data.vocab import Vocab
from earl_service.train.loop import CHECKPOINT, StopRules, train
from earl_service.train.loss import NegativeSampler
from earl_service.train.readout import StepRecord
from earl_service.train.state import TrainState

FAST = dict(batch_size=32, negatives=8, eval_every=5, eval_batch_size=16, progress=False, checkpoint_every=5)


def test_negative_sampler_avoids_true_answers():
    ds = tiny_dataset()
    sampler = NegativeSampler(ds.train, 40, 3, torch.device("cpu"))
    batch = torch.as_tensor(ds.train, dtype=torch.long)
    neg = sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], 16, torch.Generator().manual_seed(0))
    assert neg.known is None  # on the CPU every hit is redrawn within the rounds here
    true = {tuple(x) for x in ds.train.tolist()}
    for (h, r, t), hs, ts in zip(ds.train.tolist(), neg.heads.tolist(), neg.tails.tolist(), strict=True):
        assert all((x, r, t) not in true for x in hs)
        assert all((h, r, x) not in true for x in ts)


def _params(path):
    return torch.load(path / CHECKPOINT, weights_only=True)["model"]


def test_resume_is_bit_for_bit(tmp_path):
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    train(ds, cfg, TrainConfig(steps=12, **FAST), tmp_path / "straight", final_eval=False)
    train(ds, cfg, TrainConfig(steps=7, **FAST), tmp_path / "split", final_eval=False)
    train(ds, cfg, TrainConfig(steps=12, **FAST), tmp_path / "split", resume=True, final_eval=False)
    a, b = _params(tmp_path / "straight"), _params(tmp_path / "split")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_training_is_deterministic(tmp_path):
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    for name in ("a", "b"):
        train(ds, cfg, TrainConfig(steps=5, **FAST), tmp_path / name, final_eval=False)
    for key, value in _params(tmp_path / "a").items():
        assert torch.equal(value, _params(tmp_path / "b")[key])


def test_the_kernel_is_loaded_before_the_time_budget_starts(tmp_path, monkeypatch):
    """A first build of the C++ kernel takes a while: it must not be spent out of a run's wall-clock budget."""
    from earl_service.model import kernels

    events = []

    def slow_load():
        events.append("kernel")
        time.sleep(0.3)
        return False  # no C++ kernel: the steps use the torch path

    monkeypatch.setattr(kernels, "extension_available", slow_load)
    metrics = train(tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2), TrainConfig(steps=3, **FAST),
                    tmp_path, final_eval=False, on_progress=lambda p: events.append(p["step"]))
    assert events == ["kernel", 1, 2, 3] and metrics["extension"] == "torch"
    assert metrics["memory"]["kernel_load_seconds"] >= 0.3


def test_a_run_that_ends_between_validations_validates_its_last_step(tmp_path):
    """A step count (or a time limit) off the validation cadence: the last steps are validated, not lost."""
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    metrics = train(ds, cfg, TrainConfig(steps=7, **FAST), tmp_path / "off", final_eval=False)
    history = json.loads((tmp_path / "off" / "history.json").read_text())
    assert history["eval_steps"] == [5, 7]
    assert metrics["best_step"] == history["eval_steps"][int(np.argmax(history["eval_mrr"]))]
    # A cancelled run stops as soon as it can: no validation after it.
    calls = []
    train(ds, cfg, TrainConfig(steps=7, **FAST), tmp_path / "cancelled", final_eval=False,
          should_stop=lambda: calls.append(1) or len(calls) > 6)
    assert json.loads((tmp_path / "cancelled" / "history.json").read_text())["eval_steps"] == [5]


def test_steps_zero_writes_metrics(tmp_path):
    assert main(["train", str(codex_s_path()), "--out", str(tmp_path), "--steps", "0", "--dim", "8",
                 "--no-final-eval", "--no-progress"]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 0 and metrics["trainable_parameters"] > 0
    assert metrics["config"]["model"]["dim"] == 8


def test_a_run_resumes_only_on_the_entities_it_trained_on(tmp_path):
    """Each row of a model is one entity: resuming on data whose names (or their order) differ would train every
    row as another entity; the same counts hide it from the weights' shapes."""
    from dataclasses import replace

    from earl_service.data.vocab import Vocab
    from earl_service.errors import DatasetError

    ds, model = tiny_dataset(), ModelConfig(model="rotate", dim=4)
    cfg = TrainConfig(steps=2, eval_every=0, **{k: v for k, v in FAST.items() if k != "eval_every"})
    train(ds, model, cfg, tmp_path, final_eval=False, write_bundle=False)
    renamed = replace(ds, entities=Vocab(ds.entities.names[::-1]))
    with pytest.raises(DatasetError, match="names .or their order. differ"):
        train(renamed, model, replace(cfg, steps=4), tmp_path, resume=True, final_eval=False, write_bundle=False)
    assert train(ds, model, replace(cfg, steps=4), tmp_path, resume=True, final_eval=False,
                 write_bundle=False)["steps"] == 4


def test_metrics_say_when_the_steps_ran(tmp_path):
    before = time.time()
    metrics = train(tiny_dataset(), ModelConfig(dim=4, k=3), TrainConfig(steps=5, eval_every=0, **{
        k: v for k, v in FAST.items() if k != "eval_every"}), tmp_path, final_eval=False, write_bundle=False)
    began, ended = metrics["steps_wall_clock"]  # what bench/cuda_check.py reads the GPU's utilisation over
    assert before <= began <= ended <= time.time()
    assert ended - began == pytest.approx(metrics["train_seconds"], abs=0.5)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_trains_and_warns_where_the_cpu_only_emulates_it(tmp_path, monkeypatch, caplog, native):
    from earl_service.train import run as run_module

    monkeypatch.setattr(run_module, "cpu_has_native_bf16", lambda: native)
    cfg = TrainConfig(steps=2, batch_size=32, negatives=4, eval_every=0, compute="bf16", progress=False)
    with caplog.at_level("WARNING", logger="earl_service.train.run"):
        metrics = train(tiny_dataset(), ModelConfig(dim=4, k=3), cfg, tmp_path, final_eval=False, write_bundle=False)
    assert metrics["steps"] == 2 and metrics["compute_used"] == "bf16"
    assert ("no native bfloat16" in caplog.text) is (not native)


@pytest.mark.parametrize("native", [True, False])
def test_compute_auto_takes_bf16_only_where_it_is_native_and_says_so(monkeypatch, caplog, native):
    from earl_service.train import run as train_module

    monkeypatch.setattr(train_module, "cpu_has_native_bf16", lambda: native)
    with caplog.at_level("INFO", logger="earl_service.train.run"):
        autocast = train_module.bf16_autocast(TrainConfig(compute="auto"), torch.device("cpu"))
    assert autocast is native
    assert ("bf16 (native)" if native else "fp32 (no native bf16)") in caplog.text
    assert train_module.bf16_autocast(TrainConfig(), torch.device("cpu")) is False  # fp32 unless asked


def test_native_bf16_means_avx512_bf16_or_amx_not_any_avx512(monkeypatch):
    """torch.ops.mkldnn._is_mkldnn_bf16_supported() holds on every AVX-512 CPU, emulating CPUs included."""
    from earl_service.train import run as train_module

    for avx512_bf16, amx, native in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
        assert train_module.cpu_has_native_bf16() is native


def test_a_config_written_with_the_old_bf16_switch_still_reads():
    assert TrainConfig.from_dict({"bf16": True, "steps": 5}).compute == "bf16"
    assert TrainConfig.from_dict({"bf16": False}).compute == "fp32"


def _loss_and_grads(run, batch, negatives, *, bf16: bool):
    from earl_service.train.loss import loss_fn

    run.model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        entities, relations = run.model(run.graph)
        loss = loss_fn(run.scorer, entities.float(), relations.float(), batch, *negatives, 1.0)
    loss.backward()
    return float(loss), [p.grad.clone() for p in run.model.parameters()]


def test_bf16_loss_and_gradients_match_fp32_within_bf16_rounding():
    """bf16 keeps 8 bits of mantissa (relative rounding 2^-8 = 0.4%): the loss within 1%, each gradient within
    5% of its norm and pointing the same way (cosine > 0.998), on a small graph with fp32 master weights."""
    from earl_service.train.run import Run

    ds = tiny_dataset()
    run = Run.build(ds, ModelConfig(dim=16, k=3), torch.device("cpu"))
    rng = torch.Generator().manual_seed(0)
    batch = torch.as_tensor(ds.train[:32], dtype=torch.long)
    negatives = [torch.randint(0, ds.num_train_entities, (32, 8), generator=rng) for _ in range(2)]
    loss32, grads32 = _loss_and_grads(run, batch, negatives, bf16=False)
    loss16, grads16 = _loss_and_grads(run, batch, negatives, bf16=True)
    assert abs(loss16 - loss32) <= 0.01 * abs(loss32)
    for g32, g16 in zip(grads32, grads16, strict=True):
        assert g16.dtype == torch.float32  # master weights and their gradients stay fp32
        assert (g16 - g32).norm() <= 0.05 * g32.norm() + 1e-8
        assert torch.nn.functional.cosine_similarity(g16.flatten(), g32.flatten(), dim=0) > 0.998


def test_bf16_encoding_ranks_codex_s_as_fp32_does(tmp_path):
    """The same trained weights encoded under bf16 autocast and in fp32: valid MRR within 0.005, and the true
    answer's rank unchanged for most queries."""
    from earl_service.core.known import KnownAnswers
    from earl_service.train.evaluate import rank_triples
    from earl_service.train.run import Run, load_run

    ds = load_dataset(codex_s_path())
    train(ds, ModelConfig(dim=32), TrainConfig(steps=150, batch_size=512, negatives=64, lr=3e-3, eval_every=0,
                                               progress=False), tmp_path, final_eval=False)
    run: Run = load_run(tmp_path, ds)
    known = KnownAnswers(np.concatenate([ds.train, ds.valid, ds.test]), ds.num_relations)
    ranks = {}
    for bf16 in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            entities, relations = run.model(run.graph)
        ranks[bf16] = rank_triples(entities.float(), relations.float(), run.scorer, ds.valid, known)["tail"]
    mrr = {k: float(np.mean(1.0 / v)) for k, v in ranks.items()}
    assert mrr[False] > 0.15  # trained: the comparison means something
    assert abs(mrr[True] - mrr[False]) < 0.005
    assert np.mean(ranks[True] == ranks[False]) > 0.8


@pytest.mark.parametrize("model", ["earl", "rotate"])
def test_short_codex_run_learns(tmp_path, model, capsys):
    """A couple of hundred CPU steps on CoDEx-S lift test MRR far above the untrained model's."""
    ds = load_dataset(codex_s_path())
    mcfg = ModelConfig(model=model, dim=32)
    untrained = train(ds, mcfg, TrainConfig(steps=0, progress=False), tmp_path / "untrained")
    lr = 3e-3 if model == "earl" else 3e-2  # free per-entity rows see few updates in 150 steps: larger steps
    trained = train(ds, mcfg, TrainConfig(steps=150, batch_size=512, negatives=64, lr=lr, eval_every=75,
                                          progress=False), tmp_path / "trained")
    assert untrained["test"]["mrr"] < 0.05
    assert trained["test"]["mrr"] > 3 * untrained["test"]["mrr"] and trained["test"]["mrr"] > 0.12
    assert (tmp_path / "trained" / "curves.png").stat().st_size > 0
    # `earl evaluate` reproduces the final test metrics of the best checkpoint.
    assert main(["evaluate", str(tmp_path / "trained"), str(codex_s_path()), "--split", "test"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["mrr"] == pytest.approx(trained["test"]["mrr"], abs=1e-6)


def test_cli_reports_bad_data_with_file_and_line(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("a\tr\tb\nc\td\n")
    assert main(["train", str(tmp_path), "--out", str(tmp_path / "run"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "train.txt" in err and "line 2" in err


def test_protocols_seen_and_all(tmp_path):
    """`seen` drops test triples with an entity unseen in train; `all` ranks them against an isolated node."""
    base = tiny_dataset()
    names = base.entities.names + ["only_in_test"]
    unseen = np.array([[40, 0, 1], [2, 1, 40]])
    ds = Dataset(entities=Vocab(names), relations=base.relations, num_train_entities=40, train=base.train,
                 valid=base.valid, test=np.concatenate([base.test, unseen]))
    train(ds, ModelConfig(dim=4, k=3, reserved_ratio=0.2), TrainConfig(steps=3, **FAST), tmp_path, final_eval=False)
    from earl_service.train.run import load_run

    run = load_run(tmp_path, ds, device="cpu")
    seen, everything = run.evaluate("test", "seen"), run.evaluate("test", "all")
    assert seen["count"] == 2 * len(base.test)
    assert everything["count"] == 2 * (len(base.test) + 2)
    # The extra entity is a candidate only under `all`: 41 entities, and its embedding is the empty-context one.
    assert run.graph_for("all").num_entities == 41 and run.graph_for("seen").num_entities == 40


def _cancel_after(steps):
    calls = []
    return lambda: calls.append(1) or len(calls) > steps


@pytest.mark.parametrize("sampled", [False, True])
def test_a_resumed_run_repeats_the_uninterrupted_runs_losses(tmp_path, sampled):
    """Interrupted after 7 steps (cancelled: no extra validation) and resumed: the same losses, validations and
    weights as 12 steps in one go."""
    ds, cfg = tiny_dataset(), ModelConfig(dim=4, k=3, reserved_ratio=0.2)
    tcfg = TrainConfig(steps=12, sampled=sampled, fanout=(3, 2), negative_chunk=8, **{**FAST, "eval_every": 3})
    train(ds, cfg, tcfg, tmp_path / "straight", final_eval=False, write_bundle=False)
    first = train(ds, cfg, tcfg, tmp_path / "split", final_eval=False, write_bundle=False,
                  should_stop=_cancel_after(7))
    assert first["steps"] == 7 and first["stopped"] == "cancelled"
    resumed = train(ds, cfg, tcfg, tmp_path / "split", resume=True, final_eval=False, write_bundle=False)
    assert resumed["steps"] == 12 and resumed["stopped"] == "steps"
    a, b = (torch.load(tmp_path / run / CHECKPOINT, weights_only=True) for run in ("straight", "split"))
    for key in ("steps", "losses", "eval_steps", "eval_mrr", "encoded"):
        assert a["history"][key] == b["history"][key], key
    assert len(a["history"]["losses"]) == 12 and (len(a["history"]["encoded"]) == 12) is sampled
    for key in ("step", "epoch_pos", "best_mrr", "best_step", "bad_evals"):
        assert a["state"][key] == b["state"][key], key
    assert torch.equal(a["state"]["epoch_order"], b["state"]["epoch_order"])
    assert torch.equal(a["generator"], b["generator"])
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_train_state_saves_and_loads_itself():
    state = TrainState.start(seed=5)
    state.next_rows(10, 4)
    state.step, state.best_mrr, state.stopped = 3, 0.25, "time_limit"
    state.record_steps([StepRecord(3, 1.5, 0.1, 0.2, 1.0)])
    saved = state.state_dict()
    again = TrainState.start(seed=99)
    again.load_state_dict(saved)
    assert (again.step, again.epoch_pos, again.best_mrr, again.history.losses) == (3, 4, 0.25, [1.5])
    assert again.stopped == "steps"  # why the previous attempt stopped is not the resumed run's
    for _ in range(3):  # the same batches from here on, into the next epoch's permutation
        assert torch.equal(again.next_rows(10, 4), state.next_rows(10, 4))


def test_a_checkpoint_from_another_kind_of_device_resumes_with_new_draws(caplog):
    """A CUDA run's generator state does not fit a CPU generator: the resumed run warns and draws afresh, from
    where the saved epoch left off."""
    state = TrainState.start(seed=5)
    state.next_rows(10, 4)
    saved = {**state.state_dict(), "generator": torch.zeros(16, dtype=torch.uint8), "generator_device": "cuda"}
    again = TrainState.start(seed=5)
    again.load_state_dict(saved)
    assert "drawn on cuda" in caplog.text and again.epoch_pos == 4
    for _ in range(2):  # the rest of the saved epoch: its rows, as saved
        assert torch.equal(again.next_rows(10, 4), state.next_rows(10, 4))
    assert sorted(again.next_rows(10, 10).tolist()) == list(range(10))  # a new epoch, from the new draws


class _RankOne:
    """Rank 1 of 2: `agree` answers with rank 0's decision, whatever this rank proposes."""

    world, rank, is_main = 2, 1, False

    def __init__(self, rank_zero_says):
        self.says, self.proposed = rank_zero_says, []

    def agree(self, reason):
        self.proposed.append(reason)
        return self.says


def test_stop_rules():
    assert StopRules().before_step(1e9) is None and StopRules().after_step(10, 99) is None
    # The time budget, then a cancel request.
    limited = StopRules(time_limit_s=60.0, cancel=lambda: True)
    assert limited.before_step(61.0) == "time_limit" and limited.before_step(59.0) == "cancelled"
    assert StopRules(time_limit_s=60.0, cancel=lambda: False).before_step(59.0) is None
    # Early stopping once `patience` validations in a row found nothing better; never without validation.
    assert StopRules(patience=3, eval_every=5).after_step(7, 3) == "early_stopping"
    assert StopRules(patience=3, eval_every=5).after_step(7, 2) is None
    assert StopRules(patience=3, eval_every=0).after_step(10, 3) is None


def test_stop_rules_follow_rank_zero():
    """Every rank stops when rank 0 does: before each step, and for early stopping on the validation cadence
    (only rank 0 validates, so only it knows the count)."""
    told = _RankOne("time_limit")
    assert StopRules(ranks=told).before_step(0.0) == "time_limit" and told.proposed == [None]
    told = _RankOne("early_stopping")
    rules = StopRules(patience=2, eval_every=5, ranks=told)
    assert rules.after_step(9, 0) is None and told.proposed == []  # off the cadence: nothing to agree on
    assert rules.after_step(10, 0) == "early_stopping" and told.proposed == [None]
    assert StopRules(patience=2, eval_every=5, ranks=_RankOne(None)).after_step(10, 0) is None


def test_loss_equals_its_formula_in_values_and_gradients():
    """loss = -(mean log s(g - d_pos) + mean_{b,side} sum_j w_j log s(d_neg_j - g)) / 2, w = softmax(a (g - d_neg))."""
    from earl_service.config import ModelConfig as MC
    from earl_service.model.modules import RotatE as Scorer
    from earl_service.train.loss import loss_fn

    gen = torch.Generator().manual_seed(0)
    scorer = Scorer(MC(dim=3))
    entities = torch.randn(12, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    relations = torch.randn(4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    batch = torch.tensor([[0, 1, 2], [3, 0, 3], [5, 2, 5]])  # a self-loop, a repeated relation
    neg_heads, neg_tails = (torch.randint(0, 12, (3, 5), generator=gen) for _ in range(2))
    loss = loss_fn(scorer, entities, relations, batch, neg_heads, neg_tails, 0.5)

    h, r, t = batch.T
    rel = relations[r]
    pos = scorer.gamma - scorer.distance(scorer.rotate(entities[h], rel), entities[t])
    tail_neg = scorer.gamma - scorer.distance(scorer.rotate(entities[h], rel)[:, None], entities[neg_tails])
    head_neg = scorer.gamma - scorer.distance(scorer.rotate(entities[t], rel, inverse=True)[:, None],
                                              entities[neg_heads])
    neg_terms = [(torch.softmax(0.5 * n, 1).detach() * torch.nn.functional.logsigmoid(-n)).sum(1)
                 for n in (tail_neg, head_neg)]
    expected = -(torch.nn.functional.logsigmoid(pos).mean() + torch.cat(neg_terms).mean()) / 2
    torch.testing.assert_close(loss, expected)
    for a, b in zip(torch.autograd.grad(loss, [entities, relations]),
                    torch.autograd.grad(expected, [entities, relations]), strict=True):
        torch.testing.assert_close(a, b)
