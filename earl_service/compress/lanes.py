"""Several candidates of a rung trained at once (`--parallel N`), each slice in its own process.

A compress job's candidates are small: one alone kept an H200 22% busy (FB15k-237 at 2 MB in 6 minutes,
bench/results/cuda_compress_fb15k-237_2MB_6min.md), and on a CPU torch's threads scale worse over a small model
than separate processes do. So a rung before the last runs its slices in N lanes: N processes (spawned, as CUDA
needs), each holding the dataset and its graphs once for the whole search, a CPU's threads split among them (a
GPU's card shared). A lane runs rungs.run_slice on a copy of the search's state and hands back the candidate's
result, its counters and the seconds it charged to each phase; the search merges them and saves, as it does after
a slice of its own. The looks (probe.py) and the last rung (one candidate) run in the search's process.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from earl_service.compress.config import CompressConfig
from earl_service.compress.state import Candidate, CompressRun, Rung, RungResult, SearchState
from earl_service.config import ModelKind, TrainConfig
from earl_service.data.dataset import Dataset

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often the search looks at its lanes' progress and at should_stop while they run
# What a lane process keeps for the whole search (set once by _start_lane).
_LANE: dict[str, Any] = {}


def lane_configs(train_configs: Mapping[ModelKind, TrainConfig], lanes: int,
                 cores: int) -> dict[ModelKind, TrainConfig]:
    """Each model kind's training as a lane runs it: the threads given (0: every core) split among the lanes."""
    return {kind: replace(c, threads=max(1, (c.threads or cores) // lanes)) for kind, c in train_configs.items()}


class Lanes:
    """The search's lane processes, started at the first rung that uses them and shut down with the search."""

    def __init__(self, run: CompressRun, lanes: int) -> None:
        import torch

        context = multiprocessing.get_context("spawn")
        self.lanes = lanes
        self.stop, self.events = context.Event(), context.Queue()
        configs = lane_configs(run.train_configs, lanes, torch.get_num_threads())
        self.pool = ProcessPoolExecutor(max_workers=lanes, mp_context=context, initializer=_start_lane,
                                        initargs=(run.dataset, run.out, run.config, configs, self.stop, self.events))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def run_slices(self, run: CompressRun, rung: Rung, slices: Mapping[str, float], limit: int) -> bool:
        """Run each candidate's slice (name -> wall seconds) of `rung` in the lanes, merging each result into the
        search's state as it comes back (and saving); False if should_stop stopped them (what finished is kept)."""
        started = run.clock()
        state = run.state.to_json()
        futures: dict[Future, str] = {self.pool.submit(_lane_slice, state, name, limit, share, run.spent): name
                                      for name, share in slices.items()}
        lane_seconds, stopped = 0.0, False
        while futures:
            done, _ = wait(futures, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            self._forward(run)
            if not stopped and run.should_stop is not None and run.should_stop():
                self.stop.set()
                stopped = True
            for future in done:
                name = futures.pop(future)
                result, candidate, seconds, peaks, wall = future.result()
                lane_seconds += wall
                if result is not None:
                    merge(run, rung, name, result, candidate, seconds, peaks)
                    log.info("rung %d %s: %s %.4f after %d steps (a lane)", rung.index, name, run.config.metric,
                             result.score, result.steps)
                    run.save()
        self._forward(run)
        # Seconds the lanes ran beyond the search's own clock: what the phases' sums count on top of it.
        run.state.lane_seconds += max(lane_seconds - (run.clock() - started), 0.0)
        run.save()
        self.stop.clear()
        return not stopped

    def _forward(self, run: CompressRun) -> None:
        """Pass the lanes' progress events on to the search's callback."""
        while not self.events.empty():
            event = self.events.get()
            if run.on_progress is not None:
                run.on_progress({**event, "time_left": run.time_left})


def merge(run: CompressRun, rung: Rung, name: str, result: RungResult, candidate: dict[str, Any],
          seconds: Mapping[str, float], peaks: Mapping[str, float]) -> None:
    """A lane's slice of candidate `name` into the search's state: its result at `rung`, its counters (steps,
    seconds trained, calibrated validation, overhead) and the seconds and peak RSS it charged to each phase."""
    run.state.candidates = [Candidate.from_json(candidate) if c.name == name else c for c in run.state.candidates]
    rung.results[name] = result
    for phase, value in seconds.items():
        run.state.seconds[phase] = run.state.seconds.get(phase, 0.0) + value
    for phase, value in peaks.items():
        run.state.peak_rss_mb[phase] = max(run.state.peak_rss_mb.get(phase, 0.0), value)


# ---------------------------------------------------------------- inside a lane process


def _start_lane(dataset: Dataset, out: Path, config: CompressConfig, train_configs: Mapping[ModelKind, TrainConfig],
                stop: Any, events: Any) -> None:
    from earl_service.model import kernels
    from earl_service.train.run import GraphCache

    kernels.load_timed()
    _LANE.update(dataset=dataset, out=out, config=config, train_configs=train_configs, stop=stop, events=events,
                 graphs=GraphCache(dataset))


def _lane_slice(state: dict[str, Any], name: str, limit: int, share: float,
                spent: float) -> tuple[RungResult | None, dict[str, Any], dict[str, float], dict[str, float], float]:
    """Candidate `name`'s slice of the state's last rung, in this lane: (its result or None if stopped, the
    candidate after it, seconds and peak RSS by phase charged here, wall seconds)."""
    from earl_service.compress.rungs import run_slice

    started = time.monotonic()
    search = SearchState.from_json(state)
    search.seconds, search.peak_rss_mb = {}, {}
    run = CompressRun(_LANE["dataset"], _LANE["out"], _LANE["config"], _LANE["train_configs"], search,
                      on_progress=_LANE["events"].put, should_stop=_LANE["stop"].is_set, spent_before=spent,
                      graphs=_LANE["graphs"])
    result = run_slice(run, search.rungs[-1], name, limit, share)
    return (result, run.candidate(name).to_json(), dict(search.seconds), dict(search.peak_rss_mb),
            time.monotonic() - started)


__all__ = ["Lanes", "lane_configs", "merge"]
