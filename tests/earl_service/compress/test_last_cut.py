"""The search's last cut: the baseline stays unless beaten by two standard errors, and a lead the rung's subset
cannot settle is validated again on the last rung's sample (search.decisive)."""

from __future__ import annotations

import pytest
from conftest import tiny_dataset

from earl_service.bundle.sizes import BundleSizes
from earl_service.compress import candidates as candidates_module
from earl_service.compress import rungs as rungs_module
from earl_service.compress import search as search_module
from earl_service.compress.config import CompressConfig
from earl_service.compress.report import markdown
from earl_service.compress.search import compress
from earl_service.compress.state import Candidate, CompressRun, Rung, RungResult, SearchState, load_state
from earl_service.config import MODELS, ModelConfig, TrainConfig
from earl_service.train.evaluate import SUMMARY_KEYS

TINY = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=1))


def _export(mrr: float, se: float, subset: int) -> dict:
    return {"mrr": mrr, "hits_at_10": mrr, "valid_subset": subset, "standard_error": {"mrr": se, "hits_at_10": se}}


def _job(tmp_path, scores: dict[str, tuple[float, float]], subset: int) -> CompressRun:
    """A search at the cut after rung 0 of 2, whose candidates (both at int8; the RotatE one is the baseline)
    scored `scores` (name: (MRR, standard error)) on `subset` valid triples (0: all)."""
    units = [Candidate(name=n, model=n.split("-d")[0], dim=int(n.split("-d")[1]), bytes={"int8": 1},
                       config=ModelConfig(model=n.split("-d")[0], dim=int(n.split("-d")[1]))) for n in scores]
    state = SearchState(settings={}, graph_bytes=0, candidates=units, rung_count=2,
                        validation_seconds={"rotate": 1.0, "earl": 1.0})
    results = {n: RungResult(exports={"int8": _export(mrr, se, subset)}, train_seconds=1.0, steps=1, score=mrr)
               for n, (mrr, se) in scores.items()}
    state.rungs.append(Rung(index=0, survivors=list(scores), results=results))
    return CompressRun(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=10), TINY, state)


CLOSE = {"earl-d40": (0.3185, 0.012), "rotate-d30": (0.3152, 0.012)}  # a lead of 0.0033, far inside 2 SE


@pytest.mark.parametrize(("again", "kept"), [
    ({"earl-d40": (0.3300, 0.002), "rotate-d30": (0.3100, 0.002)}, "earl-d40"),  # 0.02 at SE 0.0028: decisive
    ({"earl-d40": (0.3120, 0.002), "rotate-d30": (0.3100, 0.002)}, "rotate-d30"),  # 0.002: still a tie
])
def test_an_unsettled_lead_is_validated_again_on_the_last_rungs_sample(tmp_path, monkeypatch, again, kept):
    calls = []

    def revalidate(run, name, limit):
        calls.append((name, limit))
        return {"precision": "int8", **_export(*again[name], subset=0)}

    monkeypatch.setattr(search_module, "revalidate", revalidate)
    job = _job(tmp_path, CLOSE, subset=2)
    search_module.next_rung(job)
    assert job.state.rungs[-1].survivors == [kept]
    assert sorted(calls) == [("earl-d40", 0), ("rotate-d30", 0)]  # the whole split: a pass is cheap here
    assert set(job.state.rungs[0].revalidated) == set(CLOSE)
    # a restart during the cut validates nothing twice: the saved state carries the results
    job.state.rungs.pop()
    job.state.done = False
    search_module.next_rung(job)
    assert len(calls) == 2 and job.state.rungs[-1].survivors == [kept]


def test_a_settled_cut_validates_nothing_again(tmp_path, monkeypatch):
    monkeypatch.setattr(search_module, "revalidate", lambda *a: pytest.fail("validated again"))
    clear = {"earl-d40": (0.3600, 0.012), "rotate-d30": (0.3152, 0.012)}  # beyond 2 SE on the subset
    job = _job(tmp_path / "a", clear, subset=2)
    search_module.next_rung(job)
    assert job.state.rungs[-1].survivors == ["earl-d40"]
    behind = {"earl-d40": (0.3000, 0.012), "rotate-d30": (0.3152, 0.012)}  # the baseline leads
    job = _job(tmp_path / "b", behind, subset=2)
    search_module.next_rung(job)
    assert job.state.rungs[-1].survivors == ["rotate-d30"]
    whole = _job(tmp_path / "c", CLOSE, subset=0)  # the rung already validated on the whole split
    search_module.next_rung(whole)
    assert whole.state.rungs[-1].survivors == ["rotate-d30"]


def test_revalidate_scores_the_rungs_own_export_on_a_larger_sample(tmp_path):
    """On a finished tiny search, validating the pick's export again on the whole split reproduces its last
    rung's whole-split metrics (same file, same triples), and on a subset records the subset's size."""
    dataset = tiny_dataset()
    config = CompressConfig(max_bytes=BundleSizes(dataset).bytes("rotate", 32, "fp32"), time_limit_minutes=0.05,
                            precisions=("fp32", "int8"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(candidates_module, "MIN_FIRST_STEPS", 0)
        report = compress(dataset, tmp_path, config, train_configs=TINY)
    state = load_state(tmp_path, config, dataset)
    assert report is not None and state is not None
    run = CompressRun(dataset, tmp_path, config, TINY, state)
    rung = state.rungs[-1]
    name = rung.survivors[0]  # trained and validated there (the pick may be an earlier rung's on a tiny split)
    again = rungs_module.revalidate(run, name, 0)
    best = rung.results[name].exports[again["precision"]]
    assert again["valid_subset"] == 0 and again["mrr"] == pytest.approx(best["mrr"])
    assert again["mrr"] == max(e["mrr"] for e in rung.results[name].exports.values())
    assert set(SUMMARY_KEYS) <= set(again)
    assert rungs_module.revalidate(run, name, 3)["valid_subset"] == 3


def test_the_report_says_when_a_cut_was_validated_again(tmp_path, monkeypatch):
    monkeypatch.setattr(search_module, "revalidate",
                        lambda run, name, limit: {"precision": "int8", **_export(0.33 if "earl" in name else 0.31,
                                                                                 0.002, subset=0)})
    job = _job(tmp_path, CLOSE, subset=2)
    search_module.next_rung(job)
    rungs = [{"index": r.index, "survivors": r.survivors, "budget_seconds": None,
              "scores": {n: v.score for n, v in r.results.items()},
              "revalidated": {n: {k: e[k] for k in ("precision", "valid_subset", "mrr", "standard_error")}
                              for n, e in r.revalidated.items()}} for r in job.state.rungs]
    pick = {"candidate": "earl-d40", "precision": "int8", "bytes": 1, "mrr": 0.33}
    text = markdown({"metric_key": "mrr", "metric": "mrr", "pick": pick, "test": None, "frontier": [],
                     "exports": [{**pick, "model": "earl", "dim": 40, "rung": 1, "steps": 1, "train_seconds": 1.0,
                                  "hits_at_10": 0.5, "valid_subset": 0}],
                     "max_bytes": 10**6, "candidates": [{}, {}], "spent_seconds": 60.0, "time_limit_minutes": 10,
                     "rungs": rungs, "eta": 2, "graph_bytes": 0, "sizes": "exact"})
    assert ("validated again on the whole split before the cut: earl-d40 int8 0.3300 (standard error 0.0020), "
            "rotate-d30 int8 0.3100") in text
