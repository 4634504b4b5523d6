"""Rung 0's first look (compress/probe.py): a challenger that learns sooner than the baseline's model and trails the
baseline by two standard errors after the same seconds stops there; nothing else changes."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_dataset

from earl_service.bundle.sizes import BundleSizes
from earl_service.compress import candidates as candidates_module
from earl_service.compress import probe as probe_module
from earl_service.compress import rungs as rungs_module
from earl_service.compress import search as search_module
from earl_service.compress.config import CompressConfig
from earl_service.compress.report import markdown
from earl_service.compress.search import compress
from earl_service.compress.state import STATE, Candidate, CompressRun, Rung, RungResult, SearchState
from earl_service.config import MODELS, ModelConfig, TrainConfig

TINY = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=1))


def _candidate(name: str, precisions: tuple[str, ...] = ("int8",), step: float = 0.1) -> Candidate:
    model, dim = name.split("-d")
    return Candidate(name=name, model=model, dim=int(dim), bytes=dict.fromkeys(precisions, 1),
                     config=ModelConfig(model=model, dim=int(dim)), step_seconds=step)


def _job(tmp_path, candidates: list[Candidate], rung_count: int = 2, slice_seconds: float = 100.0) -> CompressRun:
    state = SearchState(settings={}, graph_bytes=0, candidates=candidates, rung_count=rung_count,
                        validation_seconds={"rotate": 1.0, "earl": 1.0})
    state.rungs.append(Rung(index=0, survivors=[c.name for c in candidates], budget_seconds=slice_seconds *
                            len(candidates), slice_seconds=slice_seconds))
    return CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)


def _look(mrr: float, se: float = 0.01, steps: int = 100) -> dict:
    return {"mrr": mrr, "hits_at_10": mrr, "standard_error": {"mrr": se, "hits_at_10": se}, "valid_subset": 500,
            "steps": steps, "train_seconds": 25.0, "schedule_start": 0.0, "schedule_seconds": 90.0}


def test_the_look_is_for_sooner_learners_beside_a_baseline_at_rung_0(tmp_path):
    job = _job(tmp_path, [_candidate("rotate-d30"), _candidate("rotate-d60", ("pq:15",)), _candidate("earl-d40"),
                          _candidate("earl-d60", step=1.6), _candidate("earl-d80", step=10.0)])
    rung = job.state.rungs[0]
    # earl-d80's 25 steps take 250 s, more than 3/4 of its 100-s slice; earl-d60's 40 s put the look after 40 s
    assert probe_module.probed(job, rung) == ["rotate-d30", "earl-d40", "earl-d60"]  # the baseline first
    assert probe_module.look_seconds(job, rung) == pytest.approx(40.0)
    job.candidate("earl-d80").step_seconds = 2.8  # 70 s: past half the slice, before three quarters
    assert probe_module.probed(job, rung) == ["rotate-d30", "earl-d40", "earl-d60", "earl-d80"]
    assert probe_module.look_seconds(job, rung) == pytest.approx(70.0)
    job.candidate("earl-d80").step_seconds = 10.0
    job.candidate("earl-d60").step_seconds = 0.2
    assert probe_module.look_seconds(job, rung) == pytest.approx(25.0)  # a quarter of the slice at least
    rung.index = 1
    assert probe_module.probed(job, rung) == []  # a later rung ranks on its own
    assert probe_module.first_look(job, rung) and rung.probes == {}  # a later rung
    rung.index = 0
    rung.results["rotate-d30"] = RungResult(exports={}, train_seconds=1.0, steps=1, score=0.1)
    assert probe_module.first_look(job, rung) and rung.probes == {}  # begun by a version without looks
    earl_only = _job(tmp_path, [_candidate("earl-d40"), _candidate("earl-d20"), _candidate("rotate-d60", ("pq:15",))])
    assert probe_module.probed(earl_only, earl_only.state.rungs[0]) == []  # RotatE learns later: no evidence


@pytest.mark.parametrize(("challenger", "cut"), [
    (_look(0.10), True),  # 0.20 behind at standard errors of 0.01
    (_look(0.28), False),  # 0.02 behind: inside two standard errors of the difference (0.028)
    (_look(0.10, steps=10), False),  # too few steps to judge
])
def test_the_baseline_cuts_a_challenger_only_on_evidence(tmp_path, monkeypatch, challenger, cut):
    looks = {"rotate-d30": _look(0.30), "earl-d40": challenger}
    monkeypatch.setattr(probe_module, "probe", lambda run, rung, name: looks[name])
    job = _job(tmp_path, [_candidate("rotate-d30"), _candidate("earl-d40")], rung_count=3)
    rung = job.state.rungs[0]
    assert probe_module.first_look(job, rung)
    assert rung.cut == (["earl-d40"] if cut else [])
    if not cut:
        assert rung.results == {}  # both go on to train the rest of their slices
        return
    assert rung.results["earl-d40"].score == 0.10 and rung.results["earl-d40"].exports == {}
    assert rung.results["rotate-d30"].score == 0.30  # left alone, the baseline stops at its look too
    search_module.next_rung(job)
    assert job.state.rung_count == 2  # so the next rung is the last: the baseline trains on the rest of the time
    assert job.state.rungs[-1].survivors == ["rotate-d30"] and job.state.rungs[-1].index == 1
    text = markdown(_report(job))
    assert ("Rung 0's first look, after about 25 s of training each, on 500 valid triples: rotate-d30 0.3000 "
            "(standard error 0.0100) after 100 steps, earl-d40 0.1000") in text
    assert "it cut earl-d40, which the baseline beat by two standard errors" in text


def _report(job: CompressRun) -> dict:
    rungs = [{"index": r.index, "survivors": r.survivors, "budget_seconds": None,
              "scores": {n: v.score for n, v in r.results.items()}, "revalidated": {},
              "probes": r.probes, "cut": r.cut} for r in job.state.rungs]
    pick = {"candidate": "rotate-d30", "precision": "int8", "bytes": 1, "mrr": 0.31}
    return {"metric_key": "mrr", "metric": "mrr", "pick": pick, "test": None, "frontier": [],
            "exports": [{**pick, "model": "rotate", "dim": 30, "rung": 1, "steps": 1, "train_seconds": 1.0,
                         "hits_at_10": 0.5, "valid_subset": 0}],
            "max_bytes": 10**6, "candidates": [{}, {}], "spent_seconds": 60.0, "time_limit_minutes": 10,
            "rungs": rungs, "eta": 2, "graph_bytes": 0, "sizes": "exact"}


def test_a_real_search_looks_once_and_continues_each_schedule(tmp_path, monkeypatch):
    """On a tiny graph: the baseline and the EARL challenger are looked at after the same seconds, a job stopped
    after the first look does not look again, and a candidate the look kept trains the rest of its slice on the
    schedule its look started (train_slice's schedule)."""
    monkeypatch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)
    monkeypatch.setattr(probe_module, "PROBE_STEPS", 0)
    monkeypatch.setattr(probe_module, "cut", lambda run, rung, base, challengers: run.save())  # nobody is cut
    dataset = tiny_dataset()
    config = CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 32, "fp32"), time_limit_minutes=0.1,
                            precisions=("fp32", "int8"))
    looked, schedules = [], []
    real_probe, real_train_slice = probe_module.probe, rungs_module.train_slice

    def probe(run, rung, name):
        looked.append(name)
        return real_probe(run, rung, name)

    def train_slice(run, name, seconds, schedule=None):
        schedules.append((name, schedule))
        return real_train_slice(run, name, seconds, schedule)

    monkeypatch.setattr(probe_module, "probe", probe)
    monkeypatch.setattr(rungs_module, "train_slice", train_slice)  # the rest of a slice; the look calls its own
    stop = {"now": False}

    def after_one_look(event):
        stop["now"] = stop["now"] or (event["stage"] == "evaluate" and event.get("probe"))

    assert compress(dataset, tmp_path, config, train_configs=TINY, on_progress=after_one_look,
                    should_stop=lambda: stop["now"]) is None
    state = json.loads((tmp_path / STATE).read_text())
    base = search_module.baseline_name([Candidate.from_json(c) for c in state["candidates"]])
    assert looked == [base] and list(state["rungs"][0]["probes"]) == [base]
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    assert report is not None
    looks = report["rungs"][0]["probes"]
    assert looked[0] == base and looked.count(base) == 1 and len(looks) >= 2
    assert all(json.loads((tmp_path / STATE).read_text())["rungs"][0]["probes"][n]["schedule_seconds"] > 0
               for n in looks)
    saved = json.loads((tmp_path / STATE).read_text())["rungs"][0]["probes"]
    rest = {}  # each looked-at candidate's first slice after its look: the rest of its rung-0 slice
    for name, schedule in schedules:
        if name in looks:
            rest.setdefault(name, schedule)
    assert rest == {n: (saved[n]["schedule_start"], saved[n]["schedule_seconds"]) for n in looks}
