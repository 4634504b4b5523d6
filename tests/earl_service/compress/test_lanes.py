"""Compress with --parallel: a rung's slices trained several at once, each in its own (spawned) process."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_dataset

from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.sizes import BundleSizes
from earl_service.compress import candidates as candidates_module
from earl_service.compress.config import CompressConfig
from earl_service.compress.lanes import lane_configs
from earl_service.compress.search import compress
from earl_service.compress.state import PHASES, PICK, STATE
from earl_service.config import MODELS, TrainConfig
from earl_service.errors import ConfigError

TINY = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=2))


def _config(dataset, **values) -> CompressConfig:
    return CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 24, "fp32"), models=("rotate",),
                          precisions=("fp32", "int8"), **values)


def test_a_rung_trains_its_slices_in_lanes_and_the_seconds_add_up(tmp_path, monkeypatch):
    """Rung 0's candidates train two at a time, each on a slice of twice the rung's budget over the candidates
    (the wall clock is shared), every result comes back into the state, and the report's phases add up to the
    search's wall clock plus what the lanes ran beyond it."""
    monkeypatch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)  # several candidates at a few seconds' steps
    dataset = tiny_dataset()
    events = []
    report = compress(dataset, tmp_path, _config(dataset, time_limit_minutes=0.3, parallel=2), train_configs=TINY,
                      on_progress=events.append)
    state = json.loads((tmp_path / STATE).read_text())
    first = state["rungs"][0]
    assert len(first["survivors"]) >= 3 and set(first["results"]) == set(first["survivors"])
    assert first["slice_seconds"] == pytest.approx(2 * first["budget_seconds"] / len(first["survivors"]))
    assert all(r["steps"] > 0 for r in first["results"].values())
    assert report["parallel"] == 2 and report["lane_seconds"] > 0
    seconds = report["seconds"]
    phases = sum(seconds[p] for p in (*PHASES, "other"))
    assert phases == pytest.approx(seconds["search"] + report["lane_seconds"], rel=0.02)
    assert "beyond the search's wall clock" in (tmp_path / "report.md").read_text()
    assert {e["candidate"] for e in events if e["stage"] == "train" and e["rung"] == 0} == set(first["survivors"])
    pick = report["pick"]
    assert (tmp_path / PICK).stat().st_size == pick["bytes"] <= report["max_bytes"]
    assert load_bundle(tmp_path / PICK).config.dim == pick["dim"]


def test_a_search_stopped_while_its_lanes_run_returns_none_and_continues(tmp_path, monkeypatch):
    monkeypatch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)
    dataset = tiny_dataset()
    config = _config(dataset, time_limit_minutes=0.3, parallel=2)
    assert compress(dataset, tmp_path, config, train_configs=TINY, should_stop=lambda: True) is None
    first = json.loads((tmp_path / STATE).read_text())["rungs"][0]
    assert len(first["survivors"]) >= 2
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    assert report is not None and set(report["rungs"][0]["scores"]) == set(first["survivors"])


def test_lanes_split_the_threads_given():
    configs = lane_configs(TINY, 2, cores=16)
    assert {c.threads for c in configs.values()} == {1}
    every = {"rotate": TrainConfig(threads=0)}
    assert lane_configs(every, 4, cores=16)["rotate"].threads == 4  # 0: every core, split
    assert lane_configs(every, 4, cores=2)["rotate"].threads == 1  # never under one


@pytest.mark.parametrize("parallel", [0, 17])
def test_parallel_out_of_range_is_refused(parallel):
    with pytest.raises(ConfigError, match="parallel"):
        CompressConfig(max_bytes=10**6, time_limit_minutes=1, parallel=parallel)
