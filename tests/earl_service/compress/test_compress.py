"""Compress to a byte budget: exact sizes, the search, its report, resuming, and every bad input."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import codex_s_path, tiny_dataset

from earl_service.bundle.format import graph_bytes, read_safetensors
from earl_service.bundle.model_io import bundle_from_model, load_bundle
from earl_service.bundle.precision import ProductQuantized
from earl_service.bundle.sizes import METRICS_ROOM, MIN_DIM, BundleSizes, padded_metrics, save_exact
from earl_service.cli.bundle import bundle_info
from earl_service.cli.main import main
from earl_service.compress import candidates as candidates_module
from earl_service.compress import config as compress_config
from earl_service.compress import costs as costs_module
from earl_service.compress import orders as orders_module
from earl_service.compress import rungs as rungs_module
from earl_service.compress import search as compress_module
from earl_service.compress.config import CompressConfig, budget_floor, parse_size
from earl_service.compress.search import compress
from earl_service.compress.state import (
    PICK,
    STATE,
    Candidate,
    CompressRun,
    Rung,
    RungResult,
    SearchState,
    rung_budget,
    rung_sizes,
    rung_weights,
)
from earl_service.config import MODELS, ModelConfig, TrainConfig
from earl_service.data.dataset import Dataset, load_dataset
from earl_service.data.labels import Labels
from earl_service.data.vocab import Vocab
from earl_service.errors import BundleError, ConfigError, DatasetError
from earl_service.model.graph import choose_reserved
from earl_service.model.modules import build_model

TINY = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=1))

PRECISIONS = ("fp32", "fp16", "int8")  # the uniform ones (bundle/precision.py): one encoding per weight


def candidate(model: str, dim: int, bytes: dict[str, int], **values) -> Candidate:
    return Candidate(name=f"{model}-d{dim}", model=model, dim=dim, bytes=bytes,
                     config=ModelConfig(model=model, dim=dim), **values)


def search_state(candidates: list[Candidate], **values) -> SearchState:
    """A state as planning leaves it, for a search run by hand (no settings to match: nothing resumes it)."""
    return SearchState(settings={}, graph_bytes=0, candidates=candidates, **values)


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(("text", "expected"), [
    ("2MB", 2_000_000), ("1.5 MiB", 1_572_864), ("500000", 500_000), ("2e6", 2_000_000), ("0.5mb", 500_000),
    ("3 kB", 3000), ("1GiB", 2**30), (123456, 123456), (2.5e6, 2_500_000),
])
def test_parse_size_reads_si_and_binary_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["-2MB", "-1", "0", "garbage", "2XB", "", "MB", "nan", "inf", "1e-9", "2 MB MB",
                                  True, -5, float("nan")])
def test_parse_size_refuses_bad_sizes(text):
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)


def test_budget_floor_is_exact_when_cheap_and_none_when_unsure(monkeypatch):
    triples = np.unique(np.random.default_rng(0).integers(0, 30, (200, 3)) % [30, 3, 30], axis=0)
    entities, relations = [f"entity{i}" for i in range(30)], ["r0", "r1", "r2"]
    floor = graph_bytes(triples, entities, relations)
    assert budget_floor(floor, triples, entities, relations) == floor
    assert budget_floor(1, triples, entities, relations) == floor
    assert budget_floor(floor + 1, triples, entities, relations) is None
    monkeypatch.setattr(compress_config, "graph_bytes", None)  # from here on nothing may pack the graph
    assert budget_floor(10**6, triples, entities, relations) is None  # above the raw bytes' xz bound
    monkeypatch.setattr(compress_config, "EXACT_FLOOR_RAW_BYTES", 100)
    assert budget_floor(floor, triples, entities, relations) is None  # too big to pack here: the worker decides



def _random_bundle(dataset: Dataset, sizes: BundleSizes, model: str, dim: int):
    """A bundle of a freshly initialised model: real (non-zero, random) weights, as after training."""
    config = sizes.config(model, dim)
    n = dataset.num_train_entities
    reserved = (choose_reserved(n, config.reserved_ratio, config.seed) if model == "earl"
                else torch.zeros(0, dtype=torch.long))
    net = build_model(config, n, dataset.num_relations, reserved)
    return bundle_from_model(net, config, Vocab(dataset.entities.names[:n]), dataset.relations, dataset.train,
                             labels=dataset.labels)


@pytest.mark.parametrize("model", ["earl", "rotate"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("data", ["tiny", "codex-s"])
def test_predicted_bytes_equal_the_written_file(tmp_path, model, precision, data):
    dataset = tiny_dataset() if data == "tiny" else load_dataset(codex_s_path())
    # Labels as the bundle stores them (only those of its own names: the last entity is a test-only one in tiny).
    labels = Labels(entities={dataset.entities.name(0): 'a "quoted" label é', dataset.entities.names[-1]: "x"},
                    relations={**dataset.labels.relations, dataset.relations.name(0): "r\\0 é"})
    dataset = replace(dataset, labels=labels)
    sizes = BundleSizes(dataset)
    metrics = {"valid": {"mrr": 0.123456789, "note": 'quotes " and \\ and é'}, "steps": 12345}
    for dim in (MIN_DIM, 37):
        bundle = _random_bundle(dataset, sizes, model, dim)
        bundle.metrics = padded_metrics(metrics)
        path = bundle.save(tmp_path / f"{dim}.safetensors", precision=precision, coding="plain")
        assert path.stat().st_size == sizes.bytes(model, dim, precision)
        assert load_bundle(path).metrics["valid"] == metrics["valid"]


def test_max_dim_is_the_largest_that_fits():
    sizes = BundleSizes(tiny_dataset())
    budget = sizes.bytes("rotate", 50, "fp16") + 3
    for precision in PRECISIONS:
        dim = sizes.max_dim("rotate", precision, budget)
        assert sizes.bytes("rotate", dim, precision) <= budget < sizes.bytes("rotate", dim + 1, precision)
    assert sizes.max_dim("rotate", "fp16", budget) == 50
    assert sizes.max_dim("earl", "fp32", 100) is None


def test_save_exact_refuses_a_size_it_did_not_predict(tmp_path):
    dataset = tiny_dataset()
    sizes = BundleSizes(dataset)
    bundle = _random_bundle(dataset, sizes, "rotate", 16)
    with pytest.raises(BundleError, match="predicted"):
        save_exact(bundle, tmp_path / "b.safetensors", precision="fp32", metrics={},
                   expected=sizes.bytes("rotate", 16, "fp32") + 1)
    with pytest.raises(BundleError, match="reserved"):
        padded_metrics({"x": "y" * METRICS_ROOM})


# ---------------------------------------------------------------- the search


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory):
    """One tiny compress run (both models, two precisions, ~3 s of search) shared by the report tests."""
    dataset = tiny_dataset()
    budget = BundleSizes(dataset).bytes("rotate", 32, "fp32")
    out = tmp_path_factory.mktemp("compress")
    config = CompressConfig(max_bytes=budget, time_limit_minutes=0.05, precisions=("fp32", "int8"))
    progress = []
    with pytest.MonkeyPatch.context() as patch:  # several candidates and rungs to check, at a few seconds' steps
        patch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)
        report = compress(dataset, out, config, train_configs=TINY, on_progress=progress.append)
    return out, report, progress


def test_compress_delivers_the_best_valid_export_within_budget(tiny_job):
    out, report, _ = tiny_job
    budget, key, pick = report["max_bytes"], report["metric_key"], report["pick"]
    size = (out / PICK).stat().st_size
    assert size == pick["bytes"] <= budget
    assert all(row["bytes"] <= budget for row in report["exports"])
    assert all(row[key] <= pick[key] for row in report["exports"])  # no candidate under the budget beats it
    assert {u["model"] for u in report["candidates"]} == {"earl", "rotate"}
    bundle = load_bundle(out / PICK)
    assert (bundle.config.model, bundle.config.dim, bundle.precision) == (pick["model"], pick["dim"], pick["precision"])
    assert report["test"] is not None and 0 < report["test"]["mrr"] <= 1


def test_compress_writes_its_evidence(tiny_job):
    out, report, progress = tiny_job
    for name in ("report.json", "report.md", "frontier.png", STATE):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "report.json").read_text())["pick"] == report["pick"]
    assert report["pick"]["candidate"] in (out / "report.md").read_text()
    summary = bundle_info(str(out / PICK))["metrics"]
    assert summary["compress"]["candidate"] == report["pick"]["candidate"]
    assert summary["valid"]["mrr"] == report["pick"]["mrr"] and summary["test"] == report["test"]
    assert {"candidate", "rung", "rungs", "time_left"} <= set(progress[0])
    assert progress[-1]["stage"] == "done"


def test_quantized_exports_share_one_training(tiny_job):
    out, report, _ = tiny_job
    by_candidate: dict[str, set] = {}
    for row in report["exports"]:
        by_candidate.setdefault(row["candidate"], set()).add((row["steps"], row["train_seconds"]))
    assert all(len(runs) == 1 for runs in by_candidate.values())
    assert all(not (out / "candidates" / name / "export-fp16.safetensors").exists() for name in by_candidate)


def test_successive_halving_keeps_the_best_half_and_each_models_best(tiny_job):
    """Each rung's survivors are the previous rung's cut replayed from the saved state: ties inside a kind broken
    by the steps a second each candidate measured (so the test reads them, not the scores alone), the best half,
    each kind's leader and the baseline."""
    out, report, _ = tiny_job
    state = SearchState.from_json(json.loads((out / STATE).read_text()))
    job = CompressRun(tiny_dataset(), out, CompressConfig(max_bytes=report["max_bytes"], time_limit_minutes=0.05),
                     TINY, state)
    rungs, model_of = state.rungs, (lambda n: job.candidate(n).model)
    sizes = rung_sizes(len(state.candidates), 2)
    assert len(rungs) == len(sizes) == len(report["rungs"])
    base = compress_module.baseline_name(state.candidates)
    for before, after, keep in zip(rungs[:-2], rungs[1:-1], sizes[1:-1], strict=True):
        ranked = sorted((n for n in before.survivors if n not in before.cut), key=lambda n: -before.results[n].score)
        ordered = compress_module.faster_among_ties(job, before, ranked)
        assert sorted(ordered) == sorted(ranked)
        kept = compress_module.survivors(ordered, keep, model_of, {n: before.results[n].score for n in ranked})
        assert set(after.survivors) == set(kept) | ({base} & set(ranked))
        assert keep <= len(after.survivors)
    assert len(rungs[-1].survivors) == 1  # the last rung trains one


def _cut(tmp_path, scores: dict[str, tuple[float, float]], rung_count: int,
         steps: dict[str, int] | None = None) -> list[str]:
    """The survivors next_rung keeps from a rung 0 whose candidates scored `scores` (name: (MRR, its standard
    error)) after `steps` steps each in one second (default 1); the candidates' dims and precisions as their names
    say."""
    return _cut_job(tmp_path, scores, rung_count, steps).state.rungs[-1].survivors


def _cut_job(tmp_path, scores: dict[str, tuple[float, float]], rung_count: int,
             steps: dict[str, int] | None = None) -> CompressRun:
    """The search after next_rung's cut of such a rung 0 (as _cut)."""
    units = [candidate(n.split("-d")[0], int(n.split("-d")[1]), {"int8": 1} if n.endswith("0") else {"pq:4": 1})
             for n in scores]
    state = search_state(units, rung_count=rung_count, validation_seconds={"rotate": 1.0, "earl": 1.0})
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)
    results = {n: RungResult(exports={"int8": {"mrr": mrr, "standard_error": {"mrr": se, "hits_at_10": se}}},
                             train_seconds=1.0, steps=(steps or {}).get(n, 1), score=mrr)
               for n, (mrr, se) in scores.items()}
    state.rungs.append(Rung(index=0, survivors=list(scores), results=results))
    compress_module.next_rung(job)
    return job


def test_the_search_leaves_its_baseline_only_on_evidence(tmp_path):
    """The widest int8 RotatE is the baseline; the last rung trains one candidate: the best, unless the baseline
    is within MARGIN_SE standard errors of it. Earlier cuts keep the baseline beside the usual survivors however
    it scored."""
    assert compress_module.baseline_name([candidate("earl", 40, {"int8": 1}), candidate("rotate", 30, {"int8": 1}),
                                          candidate("rotate", 60, {"pq:4": 1})]) == "rotate-d30"
    assert compress_module.baseline_name([candidate("earl", 40, {"int8": 1}), candidate("earl", 20, {"int8": 1}),
                                          candidate("rotate", 60, {"pq:4": 1})]) == "earl-d40"
    assert compress_module.baseline_name([candidate("rotate", 60, {"pq:4": 1})]) is None
    close = {"earl-d40": (0.3185, 0.012), "rotate-d30": (0.3152, 0.012)}
    assert _cut(tmp_path / "a", close, rung_count=2) == ["rotate-d30"]
    clear = {"earl-d40": (0.3600, 0.012), "rotate-d30": (0.3152, 0.012)}
    assert _cut(tmp_path / "b", clear, rung_count=2) == ["earl-d40"]
    # 4 candidates, 3 rungs: 2 go on (each model's leader), and the baseline too, however far behind
    many = {"earl-d40": (0.33, 0.01), "earl-d20": (0.32, 0.01), "rotate-d61": (0.315, 0.01), "rotate-d30": (0.31, 0.01)}
    assert _cut(tmp_path / "c", many, rung_count=3) == ["earl-d40", "rotate-d61", "rotate-d30"]
    far = {**many, "rotate-d30": (0.05, 0.01)}
    assert _cut(tmp_path / "d", far, rung_count=3) == ["earl-d40", "rotate-d61", "rotate-d30"]
    no_baseline = {"earl-d41": (0.33, 0.01), "earl-d21": (0.32, 0.01), "rotate-d61": (0.05, 0.01)}  # none at int8
    assert _cut(tmp_path / "e", no_baseline, rung_count=3) == ["earl-d41", "earl-d21"]


def test_a_look_below_the_floor_keeps_every_kind(tmp_path):
    """WordNet-full-noinv's rung 0 at 2 MB in 10 minutes (one core): EARL d48 int8 (the baseline) ahead of RotatE
    d22 pq:11 by two standard errors, both under LOOK_FLOOR. The cut cannot rank the kinds there: both go on to
    the last rung, which they share. Once the leader scores LOOK_FLOOR, the same lead decides, and a kind under
    LEADER_FLOOR of the best leaves a rung before the last."""
    floor = compress_module.LOOK_FLOOR
    early = {"earl-d40": (0.0044, 0.0006), "rotate-d21": (0.0022, 0.0004)}
    job = _cut_job(tmp_path / "a", early, rung_count=2)
    assert job.state.rungs[-1].survivors == ["earl-d40", "rotate-d21"] and job.state.rung_count == 2
    later = {"earl-d40": (floor, 0.0006), "rotate-d21": (floor / 2, 0.0004)}
    assert _cut(tmp_path / "b", later, rung_count=2) == ["earl-d40"]
    four = {"earl-d40": (0.0044, 0.0006), "earl-d20": (0.0040, 0.0006), "rotate-d21": (0.0022, 0.0004),
            "rotate-d11": (0.0010, 0.0003)}
    assert _cut(tmp_path / "c", four, rung_count=3) == ["earl-d40", "rotate-d21"]
    scaled = {n: (mrr * floor / 0.0044, se) for n, (mrr, se) in four.items()}  # the same ratios at the floor
    assert _cut(tmp_path / "d", scaled, rung_count=3) == ["earl-d40", "earl-d20"]
    one_kind = {"rotate-d21": (0.0022, 0.0004), "rotate-d11": (0.0010, 0.0003)}
    assert _cut(tmp_path / "e", one_kind, rung_count=2) == ["rotate-d21"]


def test_a_tie_inside_a_model_kind_goes_to_the_faster(tmp_path):
    """Rung 0 of WordNet-full-noinv at 2 MB: two RotatE candidates near chance, apart by less than two standard
    errors; the one stepping twice as fast goes on. A clear lead still decides, and EARL's slower steps are no
    reason to drop it for a RotatE it ties."""
    speeds = {"earl-d40": 5, "rotate-d32": 10, "rotate-d16": 20}
    noise = {"earl-d40": (0.0045, 0.0008), "rotate-d32": (0.0007, 0.0003), "rotate-d16": (0.0003, 0.0002)}
    assert _cut(tmp_path / "a", noise, rung_count=3, steps=speeds) == ["earl-d40", "rotate-d16"]
    assert _cut(tmp_path / "b", noise, rung_count=3) == ["earl-d40", "rotate-d32"]  # same speed: the scores' order
    clear = {**noise, "rotate-d32": (0.02, 0.003)}
    assert _cut(tmp_path / "c", clear, rung_count=3, steps=speeds) == ["rotate-d32", "earl-d40"]
    kinds = {"rotate-d32": (0.0050, 0.0008), "earl-d40": (0.0045, 0.0008), "earl-d20": (0.0010, 0.0003)}
    assert _cut(tmp_path / "d", kinds, rung_count=3, steps={"earl-d20": 30, **speeds}) == ["rotate-d32", "earl-d40"]


def test_survivors_keep_each_models_leader_however_it_ranks():
    ranked = ["earl-a", "earl-b", "earl-c", "rotate-a", "rotate-b"]  # every EARL ahead of every RotatE
    model = lambda name: name.split("-")[0]  # noqa: E731
    assert compress_module.survivors(ranked, 3, model) == ["earl-a", "earl-b", "rotate-a"]
    assert compress_module.survivors(ranked, 1, model) == ["earl-a", "rotate-a"]
    assert compress_module.survivors(ranked[:3], 2, model) == ["earl-a", "earl-b"]
    scores = {"earl-a": 0.25, "earl-b": 0.2, "earl-c": 0.1, "rotate-a": 0.23, "rotate-b": 0.01}  # a near tie
    assert compress_module.survivors(ranked, 1, model, scores) == ["earl-a", "rotate-a"]
    behind = {**scores, "rotate-a": 0.21}  # 84% of the best, as EARL was behind RotatE on CoDEx-S: dropped
    assert compress_module.survivors(ranked, 1, model, behind) == ["earl-a"]
    assert compress_module.survivors(ranked, 4, model, behind) == ["earl-a", "earl-b", "earl-c", "rotate-a"]
    far = {**scores, "earl-c": 0.02}  # 8% of its kind's best (rotate-b 4% of its): no place in the best half
    assert compress_module.survivors(ranked, 4, model, far) == ["earl-a", "earl-b", "rotate-a"]


def test_halving_leaves_out_who_is_far_behind_its_own_kind(tmp_path):
    """RotatE d720 pq:180 at 5% of RotatE d118 after equal seconds (FB15k-237 at 4 MB) fills no place: the one
    left goes straight to the last rung; at 20% of it (near where fillers caught up) it goes on."""
    far = {"rotate-d120": (0.3101, 0.0104), "rotate-d721": (0.0165, 0.0030), "rotate-d361": (0.0100, 0.0020),
           "rotate-d541": (0.0050, 0.0010)}  # the best half is two
    job = _cut_job(tmp_path / "a", far, rung_count=3)
    assert job.state.rungs[-1].survivors == ["rotate-d120"] and job.state.rung_count == 2
    near = {**far, "rotate-d721": (0.062, 0.0060)}
    job = _cut_job(tmp_path / "b", near, rung_count=3)
    assert job.state.rungs[-1].survivors == ["rotate-d120", "rotate-d721"] and job.state.rung_count == 3


def test_a_candidate_that_overruns_its_slice_takes_no_time_from_the_next(tmp_path, monkeypatch):
    """Each survivor of a rung trains for the same slice, whatever the ones before it spent: at rung 0 a
    candidate's overhead is only an estimate (its validations as timed before the search)."""
    units = [candidate("rotate", d, {"fp32": 1, "int8": 1}) for d in (30, 20, 10)]
    state = search_state(units, rungs=[Rung(index=0, survivors=[u.name for u in units])], rung_count=2,
                         validation_seconds={"rotate": 2.0})
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)
    trained = {}

    def train_slice(job, name, seconds, schedule=None):
        trained[name] = seconds
        job.candidate(name).train_seconds, job.candidate(name).steps = seconds, 1
        return {}

    def evaluate_exports(job, name, **kwargs):
        job.spent_before += 200.0  # the first candidate's exports take far longer than estimated
        return {p: {"mrr": 0.1, "hits_at_10": 0.2} for p in job.candidate(name).bytes}

    monkeypatch.setattr(rungs_module, "train_slice", train_slice)
    monkeypatch.setattr(rungs_module, "evaluate_exports", evaluate_exports)
    assert rungs_module.run_rung(job)
    reserve = 2.0 * len(job.dataset.test) / len(job.dataset.valid)  # the pick's test pass, kept back
    slice_seconds = (600 - reserve) / 3 / 3  # a third of 10 minutes for rung 0 of 2, among 3 candidates
    assert trained == pytest.approx(dict.fromkeys(trained, slice_seconds - 2 * 2.0))
    assert all(job.candidate(n).other_seconds >= 0 for n in trained)


def test_the_last_rung_and_the_pick_test_end_within_the_time_limit(tmp_path, monkeypatch):
    """A slice is charged the validations of its own rung (a subset before the last rung, the whole split in it)
    and its codebook fine-tuning, and the pick's test pass is kept back: when the work takes what the estimates
    say, search and test end at the limit. Carrying the overhead measured on rung 0's subset into the last rung
    overran it (FB15k-237 at 8 MB: 61.2 of 60 minutes)."""
    monkeypatch.setattr(rungs_module, "EARLY_VALID_TRIPLES", 2)  # of the tiny graph's 20 valid triples
    monkeypatch.setattr(rungs_module, "FINAL_EVAL_SHARE", 1.0)  # the whole split however long it takes
    clock = {"now": 0.0}
    units = [candidate("rotate", 20, {"fp32": 1, "int8": 1}, validation_seconds=30.0),
             candidate("rotate", 10, {"pq:4": 1, "pq:2": 1}, validation_seconds=20.0)]  # fine-tuned: fits only pq
    config = CompressConfig(max_bytes=10**6, time_limit_minutes=10)
    state = search_state(units, rung_count=len(rung_sizes(2, config.eta)), validation_seconds={"rotate": 30.0})
    dataset = tiny_dataset()
    job = CompressRun(dataset, tmp_path, config, TINY, state, clock=lambda: clock["now"])

    def train_slice(job, name, seconds, schedule=None):
        clock["now"] += seconds
        unit = job.candidate(name)
        unit.train_seconds, unit.steps = unit.train_seconds + seconds, 1
        return {}

    def evaluate_exports(job, name, *, tune_seconds, limit):
        unit, exports = job.candidate(name), rungs_module.rung_exports(job, name)
        validations = unit.validation_seconds * len(exports) * candidates_module.valid_fraction(job.dataset, limit)
        # each pairable pq export's codes validated in both orders on the early subset (compress/orders.py)
        validations += (orders_module.order_trials(unit, exports) * unit.validation_seconds
                        * rungs_module.early_fraction(job.dataset))
        clock["now"] += 5.0 + tune_seconds + validations  # load and export, fine-tune the pq export, validate
        tuned = sum(p.startswith("pq") for p in exports)
        return {p: {"mrr": 0.2 if p.startswith("pq") else 0.1, "hits_at_10": 0.2,
                    **({"fine_tune_seconds": tune_seconds / tuned} if p.startswith("pq") else {})} for p in exports}

    monkeypatch.setattr(rungs_module, "train_slice", train_slice)
    monkeypatch.setattr(rungs_module, "evaluate_exports", evaluate_exports)
    assert state.rung_count == 2 and compress_module.search(job)
    assert job.state.rungs[-1].survivors == ["rotate-d10"]  # its pq export scored best
    test_seconds = 20.0 * len(dataset.test) / len(dataset.valid) + 5.0  # test pass and loading the pick's run
    assert job.spent + test_seconds == pytest.approx(600.0)


@pytest.mark.parametrize("estimated", [True, False])
def test_a_one_candidate_search_plans_for_the_setup_it_has_not_measured(tmp_path, monkeypatch, estimated):
    """One candidate means one rung, and no later rung takes up what its only slice did not plan for: its setup
    (building its run, writing and reading its checkpoints: 56 s at 5M entities) as planning estimated it is
    charged to its slice and kept back for the pick's test. Without the estimate the search overran by two setups."""
    monkeypatch.setattr(rungs_module, "FINAL_EVAL_SHARE", 1.0)  # the whole split however long it takes
    clock, setup = {"now": 0.0}, 30.0
    unit = candidate("rotate", 20, {"fp32": 1, "int8": 1}, validation_seconds=20.0,
                     other_seconds=setup if estimated else 0.0)
    config = CompressConfig(max_bytes=10**6, time_limit_minutes=10)
    state = search_state([unit], rung_count=len(rung_sizes(1, config.eta)), validation_seconds={"rotate": 20.0})
    dataset = tiny_dataset()
    job = CompressRun(dataset, tmp_path, config, TINY, state, clock=lambda: clock["now"])

    def train_slice(job, name, seconds, schedule=None):
        clock["now"] += seconds
        job.candidate(name).train_seconds, job.candidate(name).steps = seconds, 1
        return {}

    def evaluate_exports(job, name, *, tune_seconds, limit):
        exports = rungs_module.rung_exports(job, name)
        clock["now"] += setup + job.candidate(name).validation_seconds * len(exports)  # build, load, validate
        return {p: {"mrr": 0.1, "hits_at_10": 0.2} for p in exports}

    monkeypatch.setattr(rungs_module, "train_slice", train_slice)
    monkeypatch.setattr(rungs_module, "evaluate_exports", evaluate_exports)
    assert state.rung_count == 1 and compress_module.search(job)
    test_seconds = 20.0 * len(dataset.test) / len(dataset.valid) + setup  # the test pass and building its run
    assert job.spent + test_seconds == pytest.approx(600.0 if estimated else 600.0 + 2 * setup)


def test_a_slices_overhead_leaves_out_what_the_search_builds_once(tmp_path, monkeypatch):
    """Graphs and packed parts built into the search's cache during a slice (a lane's first slice builds its own)
    are not overhead its later slices pay again: counting them, a lane's next rung planned for an overhead the
    search's own process did not have, and the lanes' last rung ended 32 s early."""
    from earl_service.train.run import GraphCache

    clock = {"now": 0.0}
    unit = candidate("rotate", 20, {"fp32": 1, "int8": 1}, validation_seconds=2.0)
    state = search_state([unit], rungs=[Rung(index=0, survivors=[unit.name])], rung_count=2,
                         validation_seconds={"rotate": 2.0})
    dataset = tiny_dataset()
    job = CompressRun(dataset, tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state,
                      clock=lambda: clock["now"], graphs=GraphCache(dataset))

    def train_slice(job, name, seconds, schedule=None):
        clock["now"] += seconds + 20.0  # training, and a graph built into the cache
        job.graphs.build_seconds += 20.0
        job.candidate(name).train_seconds, job.candidate(name).steps = seconds, 1
        return {}

    def evaluate_exports(job, name, *, tune_seconds, limit):
        exports = rungs_module.rung_exports(job, name)
        clock["now"] += 5.0 + job.candidate(name).validation(job.state.validation_seconds, 0.5) * len(exports)
        return {p: {"mrr": 0.1, "hits_at_10": 0.2} for p in exports}

    monkeypatch.setattr(rungs_module, "train_slice", train_slice)
    monkeypatch.setattr(rungs_module, "evaluate_exports", evaluate_exports)
    monkeypatch.setattr(rungs_module, "validations", lambda job, name, limit: 2 * 1.0)
    rungs_module.open_rung(job, job.state.rungs[0])
    assert rungs_module.run_slice(job, job.state.rungs[0], unit.name, 0) is not None
    assert job.candidate(unit.name).other_seconds == pytest.approx(5.0)


def test_the_last_rung_goes_on_along_one_schedule(tmp_path, monkeypatch):
    """Each slice before the last rung decays on its own, so that a rung compares what each candidate reaches in
    its slice; the last rung's one survivor goes on along one schedule over all of its training (RotatE d255 on
    FB15k-237 in 300 + 660 s tested 0.3162 so and 0.3133 warming up again)."""
    units = [candidate("rotate", d, {"fp32": 1, "int8": 1}) for d in (20, 10)]
    state = search_state(units, rung_count=2, validation_seconds={"rotate": 1.0})
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)
    slices = []

    def train_slice(job, name, seconds, schedule=None):
        unit = job.candidate(name)
        slices.append((name, unit.train_seconds, seconds, schedule))
        unit.train_seconds, unit.steps = unit.train_seconds + seconds, 1
        return {}

    def evaluate_exports(job, name, **kwargs):
        return {p: {"mrr": 0.2 if name == "rotate-d20" else 0.1, "hits_at_10": 0.2} for p in job.candidate(name).bytes}

    monkeypatch.setattr(rungs_module, "train_slice", train_slice)
    monkeypatch.setattr(rungs_module, "evaluate_exports", evaluate_exports)
    assert compress_module.search(job) and [r.survivors for r in job.state.rungs] == [[u.name for u in units],
                                                                                      ["rotate-d20"]]
    *first, (name, before, seconds, schedule) = slices
    assert [s[3] for s in first] == [None, None]  # rung 0: each slice decays over its own seconds
    assert name == "rotate-d20" and before > 0 and schedule == (0.0, before + seconds)


def test_a_final_pass_costing_more_than_its_share_runs_on_a_subset(tmp_path, monkeypatch):
    """The last rung's validation (every export of a survivor) and the pick's test run on the whole split while a
    pass costs at most FINAL_EVAL_SHARE of the limit, else on the subset that does, never under
    EARLY_VALID_TRIPLES (a 1M-entity graph's 5,000 valid triples took about 490 s a pass)."""
    dataset = tiny_dataset()  # 20 valid and 20 test triples
    units = [candidate("rotate", 20, {"fp32": 1, "int8": 1}, validation_seconds=1.0)]
    state = search_state(units, rung_count=1, validation_seconds={"rotate": 1.0}, rungs=[Rung(0, ["rotate-d20"])])
    job = CompressRun(dataset, tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=1), TINY, state)
    assert rungs_module.final_limit(job) == 0 and rungs_module.final_limit(job, "test") == 0  # 2 s, 1 s of 3 s
    units[0].validation_seconds = 10.0  # a validation 20 s (2 exports), a test 10 s: 3 and 6 triples fit in 3 s
    assert rungs_module.final_limit(job) == 0  # the early subset (500) already holds the whole split
    monkeypatch.setattr(rungs_module, "EARLY_VALID_TRIPLES", 2)
    assert rungs_module.final_limit(job) == 3 and rungs_module.final_limit(job, "test") == 6
    assert rungs_module.test_reserve(job) == pytest.approx(10.0 * 6 / 20)


def test_a_pass_of_fixed_cost_is_never_cut_to_a_subset(tmp_path):
    """A pass whose estimate is all fixed (every entity's embeddings, no per-triple ranking) costs the same on any
    subset, so the last rung and the test rank the whole split even when it exceeds FINAL_EVAL_SHARE."""
    units = [candidate("rotate", 20, {"fp32": 1, "int8": 1}, validation_seconds=10.0, validation_fixed=10.0)]
    state = search_state(units, rung_count=1, validation_seconds={"rotate": 10.0}, rungs=[Rung(0, ["rotate-d20"])])
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=1), TINY, state)
    assert units[0].validation({"rotate": 10.0}, 0.0) == 10.0  # 20 s a validation of both exports, 3 s the share
    assert rungs_module.final_limit(job) == 0 and rungs_module.final_limit(job, "test") == 0


def test_subsets_are_shares_of_the_triples_a_pass_ranks():
    """A validation ranks the seen triples (both entities trained); a subset's share of a pass is of those, not of
    the split, which also holds triples with entities training never saw."""
    ds = tiny_dataset()  # 40 entities, all trained; 20 valid triples
    unseen = ds.valid[:10].copy()
    unseen[:, 2] = 40  # an entity only valid mentions
    ds = replace(ds, entities=Vocab([*ds.entities.names, "new"]), valid=np.concatenate([ds.valid, unseen]))
    assert len(ds.valid) == 30 and ds.seen_count("valid") == 20
    assert candidates_module.valid_fraction(ds, 10) == 0.5
    assert candidates_module.valid_fraction(ds, 25) == candidates_module.valid_fraction(ds, 0) == 1.0


def test_choose_compares_rows_validated_on_the_most_triples():
    rows = [{"candidate": "a", "precision": "int8", "bytes": 5, "mrr": 0.9, "valid_subset": 500},
            {"candidate": "b", "precision": "int8", "bytes": 5, "mrr": 0.3, "valid_subset": 1800},
            {"candidate": "c", "precision": "int8", "bytes": 4, "mrr": 0.3, "valid_subset": 1800}]
    assert compress_module.choose(rows, "mrr")["candidate"] == "c"  # a ranked on fewer; c smaller than b
    assert compress_module.choose([*rows, {**rows[0], "valid_subset": 0}], "mrr")["valid_subset"] == 0


def test_a_slice_without_time_to_train_keeps_its_last_result(tmp_path, monkeypatch):
    """At a later rung a candidate whose slice its validations and overhead already fill is not re-exported or
    re-validated (its weights did not change): its result from the rung before stands. The rung's leader always
    runs."""
    units = [candidate("rotate", 20, {"int8": 1}, validation_seconds=10.0),
             candidate("rotate", 10, {"int8": 1}, validation_seconds=10.0, other_seconds=500.0)]
    config = CompressConfig(max_bytes=10**6, time_limit_minutes=10)
    state = search_state(units, rung_count=2, validation_seconds={"rotate": 10.0})
    earlier = RungResult(exports={"int8": {"mrr": 0.1}}, train_seconds=5.0, steps=9, score=0.1)
    leader = RungResult(exports={"int8": {"mrr": 0.2}}, train_seconds=5.0, steps=9, score=0.2)
    state.rungs = [Rung(index=0, survivors=["rotate-d20", "rotate-d10"],
                                        results={"rotate-d20": leader, "rotate-d10": earlier}),
                   Rung(index=1, survivors=["rotate-d20", "rotate-d10"])]
    job = CompressRun(tiny_dataset(), tmp_path, config, TINY, state)
    ran = []

    def run_slice(job, rung, name, limit, share):
        ran.append(name)
        return leader

    monkeypatch.setattr(rungs_module, "run_slice", run_slice)
    assert rungs_module.run_rung(job)
    assert ran == ["rotate-d20"] and job.state.rungs[1].results["rotate-d10"] is earlier
    job.state.rungs[1].results.clear()
    job.candidate("rotate-d10").other_seconds = 0.0  # now its slice has time to train: it runs
    assert rungs_module.run_rung(job) and ran == ["rotate-d20", "rotate-d10", "rotate-d20"]  # the leader last


def test_the_last_rungs_leader_runs_last_on_the_time_the_others_left(tmp_path):
    """Estimates made before the search are on the safe side: the time a slice leaves unused goes to the leader of
    the last rung, which runs after the others, not to nobody."""
    clock = {"now": 0.0}
    units = [candidate("rotate", 20, {"int8": 1}, validation_seconds=1.0),
             candidate("rotate", 10, {"int8": 1}, validation_seconds=1.0)]
    state = search_state(units, rung_count=1, validation_seconds={"rotate": 1.0},
                         rungs=[Rung(index=0, survivors=["rotate-d20", "rotate-d10"])])
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state,
                      clock=lambda: clock["now"])
    shares = []

    def run_slice(job, rung, name, limit, share):
        shares.append((name, share, job.time_left - rungs_module.test_reserve(job)))
        clock["now"] += share / 2  # used half of it
        return RungResult(exports={"int8": {"mrr": 0.1}}, train_seconds=1.0, steps=1, score=0.1)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(rungs_module, "run_slice", run_slice)
        assert rungs_module.run_rung(job)
    (first, first_share, _), (last, last_share, left) = shares
    assert (first, last) == ("rotate-d10", "rotate-d20")  # the leader last
    assert first_share == pytest.approx(job.state.rungs[0].slice_seconds)
    assert last_share == pytest.approx(left) and last_share > first_share * 1.4  # its slice and half the other's


def test_each_candidate_is_charged_the_validations_of_its_own_dim(tmp_path):
    """Rung 0 charges a candidate its validations as estimated before the search: at its own dim, interpolated
    between its model's largest and smallest (both measured), not at its model's largest."""
    units = [candidate("rotate", d, {"fp32": 1, "int8": 1}) for d in (1000, 500, 100)]
    measured = {"rotate": {1000: costs_module.Costs(20.0, 1.0, 0.5), 100: costs_module.Costs(2.0, 0.1, 0.1)}}
    units = costs_module.with_estimates(units, measured)
    assert [u.validation_seconds for u in units] == pytest.approx([20.0, 10.0, 2.0])
    assert [u.step_seconds for u in units] == pytest.approx([0.5, 0.5 - 0.4 * 500 / 900, 0.1])
    assert [u.validation_fixed for u in units] == pytest.approx([1.0, 1.0 - 0.9 * 500 / 900, 0.1])
    assert costs_module.largest_validation_seconds(measured) == {"rotate": 20.0}
    state = search_state(units, rung_count=2, validation_seconds={"rotate": 20.0})
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)
    train = {u.name: rungs_module.slice_training(job, u.name, 60.0, 0) for u in units}
    assert train == pytest.approx({"rotate-d1000": 60 - 2 * 20.0, "rotate-d500": 60 - 2 * 10.0,
                                   "rotate-d100": 60 - 2 * 2.0})
    job.candidate("rotate-d100").validation_seconds = None  # a job saved before the estimates: its model's largest
    assert rungs_module.slice_training(job, "rotate-d100", 60.0, 0) == pytest.approx(60 - 2 * 20.0)


def test_early_rungs_rank_on_a_valid_subset_and_the_pick_on_the_whole_split(tmp_path, monkeypatch):
    monkeypatch.setattr(rungs_module, "EARLY_VALID_TRIPLES", 8)  # of the tiny graph's 20 valid triples
    monkeypatch.setattr(rungs_module, "FINAL_EVAL_SHARE", 1.0)  # a 3-s search: 5% would be a subset too
    monkeypatch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)  # keep candidates to drop before the last rung
    monkeypatch.setattr(rungs_module, "carried_over", _never_carried)  # 3 s: every last rung would carry some
    dataset = tiny_dataset()
    config = CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 32, "fp32"), time_limit_minutes=0.05,
                            precisions=("fp32", "int8"))
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    last = len(report["rungs"]) - 1
    assert last >= 1
    assert {row["valid_subset"] for row in report["exports"] if row["rung"] < last} == {8}
    whole = [row for row in report["exports"] if row["rung"] == last]
    assert whole and all(row["valid_subset"] == 0 for row in whole)
    key, pick = report["metric_key"], report["pick"]
    assert pick["valid_subset"] == 0 and all(row[key] <= pick[key] for row in whole)
    assert "(subset)" in (tmp_path / "report.md").read_text()


def test_validations_on_a_subset_leave_more_candidates_in_the_search():
    units = [candidate("earl", d, {"fp32": 1, "int8": 1}) for d in (150, 120, 90, 60, 30)]
    config = CompressConfig(max_bytes=10**7, time_limit_minutes=1)
    seconds = {"earl": 10.0}
    sizes = rung_sizes(5, 2)  # [5, 3, 2, 1]: 10 validations of 2 exports before the last rung
    assert candidates_module.validation_cost(units, seconds, 2, 0.25) == 20.0 * (0.25 * sum(sizes[:-1]) + 1)
    whole, subset = (len(candidates_module.fit_to_time(config, units, seconds, f)) for f in (1.0, 0.05))
    assert whole < subset


def test_slow_steps_leave_fewer_candidates_but_one_per_model():
    """Rung 0 trains each kept candidate for MIN_FIRST_STEPS steps at least and as long as it validates: at
    WordNet-full's 0.3 s a step, a 10-minute search keeps few candidates; at FB15k-237's speeds, more; never fewer
    than one per model."""
    def units(step: float) -> list[Candidate]:
        return [candidate(m, d, {"int8": 1}, validation_seconds=1.0, step_seconds=step)
                for m in ("earl", "rotate") for d in (200, 150, 100, 50, 25)]

    config = CompressConfig(max_bytes=10**7, time_limit_minutes=10)
    seconds = {"earl": 1.0, "rotate": 1.0}
    fast, slow = (candidates_module.fit_to_time(config, units(step), seconds, 0.1) for step in (0.01, 0.3))
    assert len(fast) == 10 and 2 <= len(slow) < 10
    assert {c.model for c in slow} == {"earl", "rotate"}
    assert candidates_module.first_rung_trains(slow, config, seconds, 0.1)
    assert not candidates_module.first_rung_trains(units(0.3), config, seconds, 0.1)
    share = 600 / len(rung_sizes(len(slow), 2)) / len(slow)
    assert share - 0.1 >= candidates_module.MIN_FIRST_STEPS * 0.3  # what is kept does train that long
    hopeless = candidates_module.fit_to_time(config, units(100.0), seconds, 0.1)
    assert sorted(c.name for c in hopeless) == ["earl-d200", "rotate-d200"]  # too slow for the rule: one per model


def test_the_last_candidate_of_a_model_is_its_int8_baseline():
    """Down to one candidate per model, the one kept is the widest exported at int8 (the simplest baseline), not
    the widest: a wide pq-only candidate trains slowest and codes worst on a short budget."""
    units = [candidate("rotate", 604, {"pq:151": 1}, validation_seconds=1.0, step_seconds=100.0),
             candidate("rotate", 230, {"int8": 1, "pq:115": 1}, validation_seconds=1.0, step_seconds=100.0),
             candidate("rotate", 115, {"fp32": 1, "int8": 1}, validation_seconds=1.0, step_seconds=100.0)]
    config = CompressConfig(max_bytes=10**7, time_limit_minutes=3)
    kept = candidates_module.fit_to_time(config, units, {"rotate": 1.0}, 0.1)
    assert [c.name for c in kept] == ["rotate-d230"]
    assert candidates_module.baseline_candidate(units[:1]).name == "rotate-d604"  # the only one


def test_the_last_candidate_of_a_pq_only_model_codes_pqs_default_width():
    """Where no int8 export fits (WordNet-full at 2 MB), the one kept is the widest at `--precision pq`'s own code
    size (4 numbers a byte), and wider pq-only candidates go first: name order's freed bytes widened WordNet-full's
    plan to RotatE d44 pq:11, d22 pq:11 and d11 pq:11, and keeping the widest tested 0.3276 where d16 pq:8 had
    tested 0.4235."""
    def units(step: float) -> list[Candidate]:
        return [candidate("rotate", 44, {"pq:11": 1}, validation_seconds=1.0, step_seconds=step),
                candidate("rotate", 22, {"pq:11": 1}, validation_seconds=1.0, step_seconds=step),
                candidate("rotate", 11, {"pq:11": 1}, validation_seconds=1.0, step_seconds=step),
                candidate("earl", 48, {"int8": 1}, validation_seconds=1.0, step_seconds=step),
                candidate("earl", 24, {"int8": 1}, validation_seconds=1.0, step_seconds=step)]

    config = CompressConfig(max_bytes=10**7, time_limit_minutes=3)
    seconds = {"rotate": 1.0, "earl": 1.0}
    kept = candidates_module.fit_to_time(config, units(100.0), seconds, 0.1)
    assert sorted(c.name for c in kept) == ["earl-d48", "rotate-d22"]
    some = candidates_module.fit_to_time(config, units(0.05), seconds, 0.1)
    assert sorted(c.name for c in some) == ["earl-d24", "earl-d48", "rotate-d11", "rotate-d22"]  # widest pq first
    assert candidates_module.baseline_candidate(units(1.0)[:3]).name == "rotate-d22"
    narrow = [candidate("rotate", 44, {"pq:11": 1}), candidate("rotate", 11, {"pq:11": 1})]
    assert candidates_module.baseline_candidate(narrow).name == "rotate-d11"  # no default pq: the narrowest


class Killed(Exception):
    pass


def _never_carried(*args):
    """rungs.carried_over for a test of a few seconds' search, whose later slices have no time to train at all:
    every survivor runs, as the test's counts expect."""
    return None


def _killed_in_rung_1(dataset, out, config):
    """Run a compress job that is killed as rung 1 starts training; returns its saved state."""
    def kill_in_rung_1(progress):
        if progress["rung"] == 1 and progress["stage"] == "train":
            raise Killed

    with pytest.raises(Killed), pytest.MonkeyPatch.context() as patch:
        patch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)  # plan several candidates: a rung 1 to be killed in
        compress(dataset, out, config, train_configs=TINY, on_progress=kill_in_rung_1)
    return json.loads((out / STATE).read_text())


def test_a_killed_job_continues_after_its_last_completed_rung(tmp_path, monkeypatch):
    monkeypatch.setattr(rungs_module, "carried_over", _never_carried)
    dataset = tiny_dataset()
    config = CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 24, "fp32"), time_limit_minutes=0.05,
                            models=("rotate",), precisions=("fp32", "int8"))

    before = _killed_in_rung_1(dataset, tmp_path, config)
    assert set(before["rungs"][0]["results"]) == set(before["rungs"][0]["survivors"]) and not before["done"]
    trained = []
    real_train = rungs_module.train

    def spy(dataset, model_config, train_config, out_dir, **kwargs):
        trained.append(Path(out_dir).name)
        assert kwargs["resume"]
        return real_train(dataset, model_config, train_config, out_dir, **kwargs)

    monkeypatch.setattr(rungs_module, "train", spy)
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    later = [name for rung in report["rungs"][1:] for name in rung["survivors"]]
    assert trained == later  # rung 0 was not trained again
    assert report["rungs"][0]["scores"] == {n: r["score"] for n, r in before["rungs"][0]["results"].items()}
    with pytest.raises(ConfigError, match="other settings"):
        compress(dataset, tmp_path, CompressConfig(max_bytes=config.max_bytes - 1, time_limit_minutes=0.05,
                                                   models=("rotate",), precisions=("fp32", "int8")))


def test_a_stopped_job_returns_none_and_trains_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(rungs_module, "train", _never)
    config = CompressConfig(max_bytes=50_000, time_limit_minutes=1, models=("rotate",))
    assert compress(tiny_dataset(), tmp_path, config, train_configs=TINY, should_stop=lambda: True) is None
    assert json.loads((tmp_path / STATE).read_text())["rungs"][0]["results"] == {}


# ---------------------------------------------------------------- bad input


def _never(*args, **kwargs):
    raise AssertionError("nothing may be trained")


def test_a_budget_below_the_smallest_bundle_fails_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(rungs_module, "train", _never)
    dataset = tiny_dataset()
    sizes = BundleSizes(dataset)
    smallest = min(sizes.bytes(m, MIN_DIM, p) for m in ("earl", "rotate") for p in PRECISIONS)
    with pytest.raises(ConfigError, match=f"{smallest} bytes") as error:
        compress(dataset, tmp_path / "job", CompressConfig(max_bytes=smallest - 1, time_limit_minutes=1))
    assert f"alone take {sizes.fixed_bytes()} bytes" in str(error.value)
    assert not (tmp_path / "job").exists()
    # The way out, named: RotatE without the graph, from as many bytes as its smallest bundle then takes.
    found = re.search(r"rotate fits without the graph, from (\d+) bytes \(rotate dim 8 (\S+)\): --known-answers none",
                      str(error.value))
    assert found, str(error.value)
    bare, precision = int(found[1]), found[2]
    assert bare == BundleSizes(dataset, graphless=("rotate",)).bytes("rotate", MIN_DIM, precision) < smallest
    with pytest.raises(AssertionError, match="nothing may be trained"):  # that budget plans, then trains
        compress(dataset, tmp_path / "bare", CompressConfig(max_bytes=bare, time_limit_minutes=1, known_answers="none"))
    with pytest.raises(ConfigError, match=f"without the graph \\(--known-answers none\\) rotate still takes {bare}"):
        compress(dataset, tmp_path / "job", CompressConfig(max_bytes=bare - 1, time_limit_minutes=1))
    with pytest.raises(ConfigError, match="below the smallest bundle"):  # a code size that codes nothing at dim 8
        compress(dataset, tmp_path / "job", CompressConfig(max_bytes=100, time_limit_minutes=1, precisions=("pq:3",)))


def test_timing_the_validations_counts_against_the_time_limit(tmp_path, monkeypatch):
    """The validation passes timed before the search are the search's time too (3 of 60 minutes on FB15k-237)."""
    timed, seen = candidates_module.measure_costs, {}

    def slow_timing(*args):
        time.sleep(0.5)
        return timed(*args)

    def search(job):
        seen["spent"] = job.spent_before
        return False  # stopped: the test needs only what the search started with

    monkeypatch.setattr(candidates_module, "measure_costs", slow_timing)
    monkeypatch.setattr(compress_module, "search", search)
    assert compress(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=1),
                    train_configs=TINY) is None
    assert seen["spent"] >= 0.5
    assert json.loads((tmp_path / STATE).read_text())["spent_seconds"] >= 0.5


def test_a_time_limit_shorter_than_one_validation_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(rungs_module, "train", _never)
    with pytest.raises(ConfigError, match="too short"):
        compress(tiny_dataset(), tmp_path, CompressConfig(max_bytes=50_000, time_limit_minutes=1e-6), train_configs=TINY)


def test_candidates_are_dropped_until_validation_leaves_time_to_train():
    units = [candidate(m, d, {"fp32": 1, "int8": 1}) for m in ("earl", "rotate") for d in (80, 40, 20)]
    seconds = {"earl": 1.0, "rotate": 0.5}
    config = CompressConfig(max_bytes=10**6, time_limit_minutes=0.5)
    kept = candidates_module.fit_to_time(config, units, seconds)
    assert candidates_module.validation_cost(kept, seconds, 2) <= 15 < candidates_module.validation_cost(units, seconds, 2)
    assert {u.model for u in kept} == {"earl", "rotate"}
    assert min(u.dim for u in kept) > 20  # the smallest go first
    assert candidates_module.fit_to_time(replace(config, time_limit_minutes=60), units, seconds) == units


@pytest.mark.parametrize(("settings", "message"), [
    ({"models": ("earl", "transe")}, "unknown model 'transe'"),
    ({"models": ()}, "unknown model"),
    ({"precisions": ("fp8",)}, "unknown precision 'fp8'"),
    ({"metric": "hits@3"}, "unknown metric"),
    ({"time_limit_minutes": 0}, "time limit must be positive"),
    ({"time_limit_minutes": -1}, "time limit must be positive"),
    ({"max_bytes": 0}, "max_bytes"),
])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        CompressConfig(**{"max_bytes": 10**6, "time_limit_minutes": 1, **settings})


def test_a_dataset_without_valid_split_is_refused(tmp_path):
    dataset = tiny_dataset()
    dataset.valid = None
    with pytest.raises(DatasetError, match="valid"):
        compress(dataset, tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=1))


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--max-bytes", "2 parsecs", "cannot read '2 parsecs' as a size"),
    ("--max-bytes", "-3MB", "must be positive"),
    ("--models", "earl,transe", "unknown model 'transe'"),
    ("--precisions", "fp32,bf16", "unknown precision 'bf16'"),
])
def test_the_command_line_reports_bad_input(tmp_path, capsys, option, value, message):
    args = {"--max-bytes": "2MB", "--time-limit": "1", "--models": "earl,rotate", "--precisions": "fp32", option: value}
    argv = ["compress", str(tmp_path), "--out", str(tmp_path / "job")] + [f"{k}={v}" for k, v in args.items()]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_candidates_only_hold_precisions_that_fit():
    dataset = tiny_dataset()
    sizes = BundleSizes(dataset)
    config = CompressConfig(max_bytes=sizes.bytes("rotate", 40, "fp16"), time_limit_minutes=1)
    units = candidates_module.plan_candidates(sizes, config)
    for unit in units:
        assert unit.bytes and all(b <= config.max_bytes for b in unit.bytes.values())
        too_big = set(PRECISIONS) - set(unit.bytes)
        assert all(sizes.bytes(unit.model, unit.dim, p) > config.max_bytes for p in too_big)
    rotate_dims = sorted(u.dim for u in units if u.model == "rotate")
    assert rotate_dims[-1] == sizes.max_dim("rotate", "int8", config.max_bytes)
    assert np.all(np.diff(rotate_dims) > 0)


# ---------------------------------------------------------------- pq candidates (codebooks)


def test_pq_candidates_buy_dims_that_int8_cannot_afford():
    sizes = BundleSizes(load_dataset(codex_s_path()))
    config = CompressConfig(max_bytes=100_000, time_limit_minutes=1, models=("rotate",), precisions=("int8", "pq"))
    units = candidates_module.plan_candidates(sizes, config)
    int8_dim = sizes.max_dim("rotate", "int8", config.max_bytes)
    pq_dims = [u.dim for u in units if any(p.startswith("pq:") for p in u.bytes)]
    assert pq_dims and max(pq_dims) > 2 * int8_dim
    for unit in units:
        for precision, size in unit.bytes.items():
            assert size == sizes.bytes("rotate", unit.dim, precision) <= config.max_bytes
            if precision.startswith("pq:"):
                assert sizes.pq_codes("rotate", unit.dim, precision) == 1
    fixed = CompressConfig(max_bytes=100_000, time_limit_minutes=1, models=("rotate",), precisions=("pq:16",))
    assert all(set(u.bytes) == {"pq:16"} for u in candidates_module.plan_candidates(sizes, fixed))
    with pytest.raises(ConfigError, match="pq:M"):
        CompressConfig(max_bytes=100_000, time_limit_minutes=1, precisions=("pq:0",))


def test_pq_exports_that_int8_outranks_are_made_at_the_last_rung_untuned(tmp_path):
    """A candidate that fits at int8 has its pq exports (the same weights, coded more coarsely) validated only at
    the last rung, for the frontier, and never fine-tuned: its slices train without the fine-tuning share. A
    candidate that fits only as pq keeps both at every rung."""
    both = candidate("rotate", 20, {"int8": 1, "pq:10": 1, "pq:5": 1})
    coded = candidate("rotate", 40, {"pq:20": 1, "pq:10": 1})
    state = search_state([both, coded], rung_count=2, validation_seconds={"rotate": 10.0})
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)
    state.rungs.append(Rung(index=0, survivors=[both.name, coded.name]))
    assert candidates_module.dominated(both) == ["pq:10", "pq:5"] and candidates_module.dominated(coded) == []
    assert not candidates_module.fine_tuned(both) and candidates_module.fine_tuned(coded)
    assert rungs_module.rung_exports(job, both.name) == ["int8"]
    assert rungs_module.rung_exports(job, coded.name) == ["pq:20", "pq:10"]
    assert rungs_module.slice_training(job, both.name, 60.0, 0) == pytest.approx(60 - 10.0)
    # each pq export of d40 (4 and 8 numbers a code) also validates its codes in both orders (compress/orders.py),
    # on the early subset: here the tiny graph's whole valid split
    assert orders_module.order_trials(coded, ["pq:20", "pq:10"]) == 4
    assert rungs_module.slice_training(job, coded.name, 100.0, 0) == pytest.approx(
        (100 - 2 * 10.0 - 4 * 10.0) / (1 + rungs_module.FINE_TUNE_SHARE))
    state.rungs.append(Rung(index=1, survivors=[both.name]))
    assert rungs_module.rung_exports(job, both.name) == ["int8", "pq:10", "pq:5"]
    assert rungs_module.slice_training(job, both.name, 60.0, 0) == pytest.approx(60 - 3 * 10.0)


def test_a_long_slice_charges_fine_tuning_no_more_than_its_step_cap(tmp_path):
    """Fine-tuning stops at FINE_TUNE_STEPS per export: once a slice's share of it would outlast that (at the
    seconds per step measured at the candidate's last rung), the slice trains on the rest."""
    coded = candidate("rotate", 40, {"pq:20": 1, "pq:10": 1})
    state = search_state([coded], rung_count=2, validation_seconds={"rotate": 10.0})
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)
    state.rungs.append(Rung(index=0, survivors=[coded.name]))
    assert rungs_module.tuning_cap(job, coded.name) == math.inf  # nothing measured yet
    validating = 2 * 10.0 + 4 * 10.0  # both exports, and each one's codes in both orders (compress/orders.py)
    assert rungs_module.slice_training(job, coded.name, 1000.0, 0) == pytest.approx((1000 - validating) / 1.25)
    steps = rungs_module.FINE_TUNE_STEPS
    tuned = {"fine_tune_steps": steps, "fine_tune_seconds": 0.1 * steps}  # 0.1 s a step
    state.rungs[0].results[coded.name] = RungResult(exports={p: {"mrr": 0.1, **tuned} for p in coded.bytes},
                                                    train_seconds=1.0, steps=1, score=0.1)
    state.rungs.append(Rung(index=1, survivors=[coded.name]))
    cap = 2 * 0.1 * steps
    assert rungs_module.tuning_cap(job, coded.name) == pytest.approx(cap)
    assert rungs_module.slice_training(job, coded.name, 1000.0, 0) == pytest.approx(1000 - validating - cap)
    assert rungs_module.slice_training(job, coded.name, 100.0, 0) == pytest.approx((100 - validating) / 1.25)
    state.rungs[1].results[coded.name] = RungResult(exports={}, train_seconds=2.0, steps=2, score=0.2)  # a look's
    state.rungs.append(Rung(index=2, survivors=[coded.name]))
    assert rungs_module.tuning_cap(job, coded.name) == pytest.approx(cap)  # the rate of the rung that measured it


def test_fine_tuning_never_timed_is_charged_at_the_estimated_step(tmp_path):
    """A candidate with a step estimate and no fine-tuning timed yet (a look left it alone before its first
    export) is charged UNTIMED_TUNE_STEPS of its steps per fine-tuning step, and its last slice fine-tunes no
    longer than that: the rest of the slice trains."""
    coded = candidate("rotate", 40, {"pq:20": 1, "pq:10": 1})
    coded.step_seconds = 0.1
    state = search_state([coded], rung_count=2, validation_seconds={"rotate": 10.0})
    job = CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)
    state.rungs.append(Rung(index=0, survivors=[coded.name]))
    cap = rungs_module.FINE_TUNE_STEPS * rungs_module.UNTIMED_TUNE_STEPS * 0.1 * 2
    assert rungs_module.tuning_cap(job, coded.name) == pytest.approx(cap)
    validating = 2 * 10.0 + 4 * 10.0  # both exports, and each one's codes in both orders (compress/orders.py)
    assert rungs_module.slice_training(job, coded.name, 1600.0, 0) == pytest.approx(1600 - validating - cap)


def test_rungs_take_growing_shares_of_the_time():
    assert rung_weights(1) == [1.0]
    assert rung_weights(4) == pytest.approx([1 / 15, 2 / 15, 4 / 15, 8 / 15])
    # each rung's budget from the time left for it and the rungs after it: the planned split when nothing overruns
    left = 600.0
    for index, weight in enumerate(rung_weights(3)):
        budget = rung_budget(left, index, 3)
        assert budget == pytest.approx(600 * weight)
        left -= budget
    assert rung_budget(100.0, 2, 3) == pytest.approx(100.0)  # the last rung takes whatever is left


def test_a_killed_job_with_pq_candidates_continues(tmp_path, monkeypatch):
    monkeypatch.setattr(rungs_module, "carried_over", _never_carried)
    dataset = load_dataset(codex_s_path())
    # 0.2 minutes reached rung 1 alone on a core, not beside two busy processes (pytest -n 2 and a benchmark).
    config = CompressConfig(max_bytes=100_000, time_limit_minutes=0.3, models=("rotate",), precisions=("int8", "pq"))

    before = _killed_in_rung_1(dataset, tmp_path, config)
    first = before["rungs"][0]["results"]
    assert any(p.startswith("pq:") for r in first.values() for p in r["exports"])
    assert all("fine_tune_steps" in v for r in first.values() for p, v in r["exports"].items() if p.startswith("pq:"))
    trained = []
    real_train = rungs_module.train

    def spy(dataset, model_config, train_config, out_dir, **kwargs):
        trained.append(Path(out_dir).name)
        return real_train(dataset, model_config, train_config, out_dir, **kwargs)

    monkeypatch.setattr(rungs_module, "train", spy)
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    assert trained == [name for rung in report["rungs"][1:] for name in rung["survivors"]]
    assert report["rungs"][0]["scores"] == {n: r["score"] for n, r in first.items()}
    pick = report["pick"]
    assert (tmp_path / PICK).stat().st_size == pick["bytes"] <= config.max_bytes
    assert load_bundle(tmp_path / PICK).precision == pick["precision"]
    assert any(r["precision"].startswith("pq:") for r in report["exports"])  # the report lists them


def test_a_pq_pick_ships_the_codebooks_it_was_tested_with(tmp_path, monkeypatch):
    """The pick's file holds the weights of the export its valid and test metrics were measured on: a pq export's
    fine-tuned codebooks, in the order its codes were chosen in, not codebooks trained afresh when the pick is
    written (which shipped other weights). Each pq export's k-means starts cold at its candidate's first rung, in
    each order it tries, and warm, from the codebooks of the rung before, at later ones in the order chosen there."""
    dataset = load_dataset(codex_s_path())
    # 18 s: two rungs even on a loaded machine (at 12 s, with both codes' orders to try, one rung only under load)
    config = CompressConfig(max_bytes=100_000, time_limit_minutes=0.3, models=("rotate",), precisions=("pq",))
    starts = []
    real = ProductQuantized.encode_tables

    def spy(self, model_config, params, **kwargs):
        order = (kwargs.get("orders") or {}).get("entities", "contiguous")
        starts.append((model_config.dim, str(self), order, kwargs["iterations"], kwargs.get("start") is not None))
        return real(self, model_config, params, **kwargs)

    monkeypatch.setattr(ProductQuantized, "encode_tables", spy)
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    assert len(report["rungs"]) > 1
    coded = [(dim, pq, order) for dim, pq, order, _, _ in starts]
    for i, (dim, pq, order, iterations, warm) in enumerate(starts):
        assert iterations == (orders_module.WARM_ITERATIONS if warm else orders_module.COLD_ITERATIONS)
        assert not warm or (dim, pq, order) in coded[:i]  # warm only from the same export in the same order
    assert any(warm for *_, warm in starts)
    assert {order for _, _, order, _, _ in starts} == {"contiguous", "pairs"}  # RotatE's codes tried both ways
    chosen = [r for r in report["exports"] if r["precision"].startswith("pq:")]
    assert chosen and all(r["order"] in r["order_scores"] and r["order_subset"] > 0 for r in chosen)
    pick = report["pick"]
    assert pick["precision"].startswith("pq:")
    shipped = load_bundle(tmp_path / PICK)
    assert json.loads(read_safetensors(tmp_path / PICK)[0]["pq_manifest"])["entities"][3:] == (
        [] if pick["order"] == "contiguous" else [pick["order"]])
    tested = load_bundle(tmp_path / "candidates" / pick["candidate"] / f"export-{pick['precision']}.safetensors")
    assert shipped.params.keys() == tested.params.keys()
    for name, value in tested.params.items():
        np.testing.assert_array_equal(shipped.params[name], value, err_msg=name)
    assert shipped.num_bytes == pick["bytes"] <= config.max_bytes


def test_known_answers_none_ships_rotate_without_its_graph(tmp_path):
    """RotatE candidates leave the graph out and spend its bytes on dims; the pick's file has no graph, its bytes
    exactly as planned; EARL candidates keep theirs."""
    dataset = load_dataset(codex_s_path())
    kept = CompressConfig(max_bytes=100_000, time_limit_minutes=0.15, precisions=("int8",))
    dropped = replace(kept, known_answers="none")
    assert dropped.graphless == ("rotate",) and kept.graphless == ()

    def top(config, model):
        sizes = BundleSizes(dataset, graphless=config.graphless)
        return max(u.dim for u in candidates_module.plan_candidates(sizes, config) if u.model == model)

    assert top(dropped, "rotate") > top(kept, "rotate") and top(dropped, "earl") == top(kept, "earl")
    report = compress(dataset, tmp_path, replace(dropped, models=("rotate",)), train_configs=TINY)
    shipped = load_bundle(tmp_path / PICK)
    assert not shipped.has_graph and shipped.num_bytes == report["pick"]["bytes"] <= 100_000
    assert report["known_answers"] == "none" and report["graphless"] == ["rotate"]


def test_budget_floor_without_the_graph_is_the_names_alone():
    from earl_service.bundle.format import graph_bytes

    dataset = load_dataset(codex_s_path())
    names = dataset.entities.names[: dataset.num_train_entities]
    full = budget_floor(1, dataset.train, names, dataset.relations.names)
    bare = budget_floor(1, dataset.train, names, dataset.relations.names, graph=False)
    assert bare == graph_bytes(dataset.train[:0], names, dataset.relations.names) < full - 10_000
    assert budget_floor(bare + 1, dataset.train, names, dataset.relations.names, graph=False) is None
    assert budget_floor(bare + 1, dataset.train, names, dataset.relations.names) == full


def test_a_killed_graphless_search_continues_graphless(tmp_path):
    """Scale settings survive a kill mid-search: a known_answers none job resumes without its graph and ships
    without it, and the same folder refuses the job with the graph kept (other settings)."""
    dataset = load_dataset(codex_s_path())
    config = CompressConfig(max_bytes=60_000, time_limit_minutes=0.2, models=("rotate",), precisions=("int8", "pq"),
                            known_answers="none")
    before = _killed_in_rung_1(dataset, tmp_path, config)
    assert before["settings"]["known_answers"] == "none"
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    assert report["rungs"][0]["scores"] == {n: r["score"] for n, r in before["rungs"][0]["results"].items()}
    shipped = load_bundle(tmp_path / PICK)
    assert not shipped.has_graph and shipped.num_bytes == report["pick"]["bytes"] <= 60_000
    with pytest.raises(ConfigError, match="other settings"):
        compress(dataset, tmp_path, replace(config, known_answers="graph"), train_configs=TINY)
