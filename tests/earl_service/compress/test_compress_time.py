"""Where a compress search's seconds go: the report's time accounting adds up and sees what it is given."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import tiny_dataset

from earl_service.bundle.sizes import BundleSizes
from earl_service.compress import rungs as rungs_module
from earl_service.compress import search as search_module
from earl_service.compress.config import CompressConfig
from earl_service.compress.search import compress
from earl_service.compress.state import PHASES, Candidate
from earl_service.config import MODELS, ModelConfig, TrainConfig
from earl_service.model import kernels

TINY = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=1))
SLOW = 0.5  # seconds added to every validation of an export (above what bookkeeping takes on a loaded machine)
BALLAST_MB = 256  # and memory, held while it sleeps


@pytest.fixture(scope="module")
def slow_validation_report(tmp_path_factory):
    """A tiny search whose every validation takes SLOW seconds more than it would: the accounting must charge
    them to "validate", not to training or to "other"."""
    dataset = tiny_dataset()
    config = CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 32, "fp32"), time_limit_minutes=0.1,
                            precisions=("fp32", "int8"))
    calls: list[str] = []
    real, real_kernel, real_plan = rungs_module.evaluate_weights, kernels.extension_available, search_module.plan

    def slow(run, split, **kwargs):
        calls.append(split)
        ballast = np.ones(BALLAST_MB << 17)  # float64: BALLAST_MB MiB, every page written
        time.sleep(SLOW)
        del ballast
        return real(run, split, **kwargs)

    def slow_kernel() -> bool:  # a first build on a new machine
        time.sleep(SLOW)
        calls.append("kernel")
        return real_kernel()

    def plan(*args, **kwargs):
        calls.append("plan")
        return real_plan(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rungs_module, "evaluate_weights", slow)  # the rungs' validations and the pick's test
        patch.setattr(kernels, "extension_available", slow_kernel)
        patch.setattr(search_module, "plan", plan)
        report = compress(dataset, tmp_path_factory.mktemp("slow"), config, train_configs=TINY)
    return report, calls


def test_the_phases_and_other_add_up_to_what_the_search_spent(slow_validation_report):
    report, _ = slow_validation_report
    seconds = report["seconds"]
    assert set(seconds) == {"search", *PHASES, "other", "test", "kernel"}
    assert all(value >= 0 for value in seconds.values())
    parts = sum(seconds[p] for p in (*PHASES, "other"))
    assert parts == pytest.approx(seconds["search"], abs=0.01)
    assert seconds["search"] <= report["spent_seconds"]  # the search's seconds, then the pick's test
    assert seconds["plan"] > 0 and seconds["train"] > 0 and seconds["export"] > 0


def test_an_injected_slow_validation_is_charged_to_validate(slow_validation_report):
    report, calls = slow_validation_report
    validations = calls.count("valid")
    assert validations >= len(report["exports"])  # every export was validated at least once
    seconds = report["seconds"]
    assert seconds["validate"] >= SLOW * validations
    assert seconds["other"] < SLOW  # not one injected delay leaked out of its phase
    assert seconds["test"] >= SLOW  # the pick's test evaluation is timed apart, after the search


def test_the_kernel_loads_before_the_clock_starts(slow_validation_report):
    """Training builds or loads the C++ kernel before its clock, and so does a search: a first build (30-45 s on
    one core) is not the time limit's; the report states it beside the search's seconds."""
    report, calls = slow_validation_report
    from earl_service.compress.report import markdown

    assert calls[:2] == ["kernel", "plan"]
    assert report["seconds"]["kernel"] >= SLOW
    built = {**report, "seconds": {**report["seconds"], "kernel": 32.0}}
    assert "before its clock started, the C++ kernel took 32.0 s to load" in markdown(built)


def test_each_phase_has_its_own_peak_memory_and_the_validations_ballast_is_theirs(slow_validation_report):
    report, _ = slow_validation_report
    peaks = report["peak_rss_mb_by_phase"]
    assert {"plan", "setup", "train", "export", "validate", "test"} <= set(peaks)
    assert report["peak_rss_mb"] == pytest.approx(max(peaks.values()), abs=0.1)
    # the validations held BALLAST_MB more than the exports before them, whose own peak does not show it
    assert peaks["validate"] >= peaks["export"] + 0.8 * BALLAST_MB
    assert peaks["test"] >= peaks["export"] + 0.8 * BALLAST_MB


def test_the_report_says_where_the_time_went(slow_validation_report, tmp_path):
    from earl_service.compress.report import markdown

    text = markdown(slow_validation_report[0])
    assert "Where the time went" in text and "| validate |" in text and "| other |" in text
    assert "peak RSS MiB" in text and "| test (after the search) |" in text and "| kernel |" not in text
    assert slow_validation_report[0]["peak_rss_mb"] > 50 and "Peak memory (RSS) of the process" in text


def test_a_validation_pass_is_timed_on_two_subsets_and_extrapolated():
    """Fixed seconds (the embeddings) plus seconds per triple, fitted from two timed subsets: a whole pass of
    FB15k-237's 17,535 valid triples is estimated without being run."""
    from earl_service.compress.costs import TIMING_BATCHES, pass_seconds

    now, asked = [0.0], []

    def evaluate(limit: int) -> None:
        asked.append(limit)
        now[0] += 2.0 + 0.01 * limit

    assert pass_seconds(evaluate, 17_535, 256, clock=lambda: now[0]) == pytest.approx((2.0 + 0.01 * 17_535, 2.0))
    assert asked == [1, *(256 * n for n in TIMING_BATCHES)]  # a one-triple warm-up, then whole ranking batches
    assert max(asked) < 17_535  # never the whole split
    asked.clear()
    assert pass_seconds(evaluate, 40, 256, clock=lambda: now[0]) == pytest.approx((2.0 + 0.01 * 40, 0.0))  # tiny
    assert set(asked) == {1, 40}


def test_a_measured_validation_recalibrates_the_estimate_in_its_shape():
    """A rung's validation on a subset rescales the estimate from before the search, fixed part and per-triple
    part alike: a subset's time is mostly the fixed part, and scaling it up pro rata would charge a whole pass
    several times what it costs."""
    unit = Candidate(name="earl-d64", model="earl", dim=64, bytes={"int8": 1}, config=ModelConfig(model="earl", dim=64),
                     validation_seconds=12.0, validation_fixed=2.0)  # 2 s + 10 s over the split
    assert unit.validation({}, 0.1) == pytest.approx(3.0)
    unit.calibrate({}, 1.5, 0.1)  # it took half the time estimated: the machine is twice as fast
    assert (unit.validation_seconds, unit.validation_fixed) == pytest.approx((6.0, 1.0))
    assert unit.validation({}) == pytest.approx(6.0)  # not 15 s: 1.5 s on a tenth, pro rata
    unit.calibrate({}, 0.0, 0.1)  # nothing measured: nothing changes
    assert unit.validation({}) == pytest.approx(6.0)


def test_the_search_charges_validations_as_they_were_measured(slow_validation_report):
    """Each validated candidate leaves the search with a validation estimate calibrated on its validations: the
    injected SLOW seconds an export, far above what planning timed (it calls the model directly)."""
    report, _ = slow_validation_report
    validated = {row["candidate"] for row in report["exports"]}
    for unit in report["candidates"]:
        if unit["name"] in validated:
            assert unit["validation_seconds"] >= SLOW
