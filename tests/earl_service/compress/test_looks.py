"""A rung's looks (compress/probe.py): a challenger that learns sooner than the reference's model and trails the
reference by two standard errors after the same seconds stops at that look; nothing else changes."""

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


def test_the_look_is_for_sooner_learners_beside_a_later_learner(tmp_path):
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
    assert probe_module.look_points(job, rung) == pytest.approx([25.0, 50.0, 75.0])
    job.candidate("earl-d60").step_seconds = 2.4  # 60 s for its 25 steps: the first look then, the last at 75 s
    assert probe_module.look_points(job, rung) == pytest.approx([60.0, 75.0])
    job.candidate("earl-d60").step_seconds = 0.2
    rung.index = 1
    assert probe_module.probed(job, rung) == []  # the last rung ranks on its own
    assert probe_module.looks(job, rung) and rung.probes == {}
    rung.index = 0
    rung.results["rotate-d30"] = RungResult(exports={}, train_seconds=1.0, steps=1, score=0.1)
    assert probe_module.looks(job, rung) and rung.probes == {}  # begun by a version without looks
    # No RotatE int8 fits, so EARL d40 int8 is the search's baseline: RotatE's own (the widest at pq's default code
    # size, 4 numbers a byte: pq:30 at d60) is the reference, and the EARL candidates are its challengers.
    earl_base = _job(tmp_path, [_candidate("earl-d40"), _candidate("earl-d20"), _candidate("rotate-d60", ("pq:30",)),
                                _candidate("rotate-d120", ("pq:15",)), _candidate("rotate-d30", ("pq:8",))],
                     rung_count=3)
    assert search_module.baseline_name(earl_base.state.candidates) == "earl-d40"
    assert probe_module.probed(earl_base, earl_base.state.rungs[0]) == ["rotate-d60", "earl-d40", "earl-d20"]
    # At a later rung (not the last) the reference is the best RotatE of the rung before.
    earl_base.state.rungs[0].results = {n: RungResult(exports={}, train_seconds=1.0, steps=1, score=s) for n, s in
                                        [("rotate-d60", 0.1), ("rotate-d30", 0.2), ("earl-d40", 0.3)]}
    later = Rung(index=1, survivors=["earl-d40", "rotate-d60", "rotate-d30"], slice_seconds=100.0)
    earl_base.state.rungs.append(later)
    assert probe_module.probed(earl_base, later) == ["rotate-d30", "earl-d40"]
    earl_only = _job(tmp_path, [_candidate("earl-d40"), _candidate("earl-d20")])
    assert probe_module.probed(earl_only, earl_only.state.rungs[0]) == []  # no later learner: no evidence


@pytest.mark.parametrize(("challenger", "cut"), [
    (_look(0.10), True),  # 0.20 behind at standard errors of 0.01
    (_look(0.28), False),  # 0.02 behind: inside two standard errors of the difference (0.028)
    (_look(0.10, steps=10), False),  # too few steps to judge
])
def test_the_baseline_cuts_a_challenger_only_on_evidence(tmp_path, monkeypatch, challenger, cut):
    looks = {"rotate-d30": _look(0.30), "earl-d40": challenger}
    monkeypatch.setattr(probe_module, "probe", lambda run, rung, name, *_: looks[name])
    job = _job(tmp_path, [_candidate("rotate-d30"), _candidate("earl-d40")], rung_count=3)
    rung = job.state.rungs[0]
    assert probe_module.looks(job, rung)
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
    assert ("Rung 0's 1 look at about 25 s of training each (all rungs so far), on 500 valid triples: rotate-d30 "
            "0.3000 (standard error 0.0100) after 100 steps, earl-d40 0.1000") in text
    assert "it cut earl-d40, which rotate-d30 beat by two standard errors" in text


def test_a_challenger_within_the_noise_is_looked_at_again_and_cut_when_it_falls_behind(tmp_path, monkeypatch):
    """At rung 1 of 3: the first look (a quarter of the slice) cannot tell the two apart, the second (half) can;
    no third look is taken, and a restart takes none again."""
    scores = {"rotate-d30": [0.05, 0.20, 0.30], "earl-d40": [0.04, 0.08, 0.10]}
    calls: list[tuple[str, float]] = []

    def probe(run, rung, name, point, count):
        calls.append((name, point))
        return _look(scores[name][sum(n == name for n, _ in calls) - 1])

    monkeypatch.setattr(probe_module, "probe", probe)
    job = _job(tmp_path, [_candidate("rotate-d30"), _candidate("earl-d40"), _candidate("rotate-d15")], rung_count=3)
    job.state.rungs[0].results = {n: RungResult(exports={"int8": {"mrr": 0.01}}, train_seconds=100.0, steps=500,
                                                score=0.01) for n in ("rotate-d30", "earl-d40")}
    rung = Rung(index=1, survivors=["rotate-d30", "earl-d40"], slice_seconds=200.0)
    job.state.rungs.append(rung)
    assert probe_module.looks(job, rung)
    assert calls == [("rotate-d30", 50.0), ("earl-d40", 50.0), ("rotate-d30", 100.0), ("earl-d40", 100.0)]
    assert rung.cut == ["earl-d40"] and rung.probes["earl-d40"]["look"] == 2
    assert rung.results["rotate-d30"].score == 0.20  # left alone: the rest of its slice is the last rung's
    assert probe_module.looks(job, rung) and len(calls) == 4
    search_module.next_rung(job)
    assert job.state.rung_count == 3 and job.state.rungs[-1].survivors == ["rotate-d30"]
    # the report's table keeps the rung-0 exports: the rung-1 results are a look's score alone
    assert [(r["candidate"], r["rung"]) for r in search_module.exports_table(job)] == [("rotate-d30", 0),
                                                                                        ("earl-d40", 0)]


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
    after the first look does not take it again, and a candidate the looks kept trains the rest of its slice on the
    schedule its first look started (train_slice's schedule)."""
    monkeypatch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)
    monkeypatch.setattr(probe_module, "PROBE_STEPS", 0)
    monkeypatch.setattr(probe_module, "cut", lambda run, rung, base, challengers: run.save())  # nobody is cut
    dataset = tiny_dataset()
    config = CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 32, "fp32"), time_limit_minutes=0.1,
                            precisions=("fp32", "int8"))
    looked, schedules = [], []
    real_probe, real_train_slice = probe_module.probe, rungs_module.train_slice

    def probe(run, rung, name, point, count=1):
        looked.append((rung.index, name))
        return real_probe(run, rung, name, point, count)

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
    assert looked == [(0, base)] and list(state["rungs"][0]["probes"]) == [base]
    report = compress(dataset, tmp_path, config, train_configs=TINY)
    assert report is not None
    looks = report["rungs"][0]["probes"]
    assert looked[0] == (0, base) and len(looks) >= 2
    for name, look in looks.items():  # each look of rung 0 taken once, the stopped job's first included
        assert looked.count((0, name)) == look["look"]
    assert all(json.loads((tmp_path / STATE).read_text())["rungs"][0]["probes"][n]["schedule_seconds"] > 0
               for n in looks)
    saved = json.loads((tmp_path / STATE).read_text())["rungs"][0]["probes"]
    rest = {}  # each looked-at candidate's first slice after its look: the rest of its rung-0 slice
    for name, schedule in schedules:
        if name in looks:
            rest.setdefault(name, schedule)
    assert rest == {n: (saved[n]["schedule_start"], saved[n]["schedule_seconds"]) for n in looks}
