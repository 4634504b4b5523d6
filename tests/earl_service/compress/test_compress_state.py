"""The compress state's one serialised form: it round-trips, and a state file of the untyped version loads."""

from __future__ import annotations

from earl_service.compress.state import Candidate, Rung, RungResult, SearchState
from earl_service.config import ModelConfig

# A state file as the version before the typed state wrote it: a candidate not yet timed nor trained, a rung
# not yet started (no budget), keys filled in only once known.
UNTYPED = {
    "settings": {"max_bytes": 50000, "models": ["rotate"], "precisions": ["fp32"], "metric": "mrr", "seed": 0,
                 "eta": 2, "dataset": "0123456789abcdef"},
    "graph_bytes": 1234, "validation_seconds": {"rotate": 0.5},
    "candidates": [{"name": "rotate-d24", "model": "rotate", "dim": 24, "bytes": {"fp32": 9000, "int8": 4000},
                    "config": ModelConfig(model="rotate", dim=24).to_dict(), "train_seconds": 3.5, "steps": 40},
                   {"name": "rotate-d12", "model": "rotate", "dim": 12, "bytes": {"fp32": 5000},
                    "config": ModelConfig(model="rotate", dim=12).to_dict()}],
    "rung_count": 2,
    "rungs": [{"index": 0, "survivors": ["rotate-d24", "rotate-d12"], "budget_seconds": 10.0, "slice_seconds": 5.0,
               "results": {"rotate-d24": {"exports": {"fp32": {"bytes": 9000, "mrr": 0.2, "hits_at_10": 0.4}},
                                          "train_seconds": 3.5, "steps": 40, "score": 0.2}}},
              {"index": 1, "survivors": ["rotate-d24"], "results": {}}],
    "spent_seconds": 12.0, "done": False,
}


def test_an_untyped_state_file_loads_with_what_it_lacks_at_its_defaults():
    state = SearchState.from_json(UNTYPED)
    first, second = state.candidates
    assert first == Candidate(name="rotate-d24", model="rotate", dim=24, bytes={"fp32": 9000, "int8": 4000},
                              config=ModelConfig(model="rotate", dim=24), train_seconds=3.5, steps=40)
    assert (second.validation_seconds, second.train_seconds, second.other_seconds) == (None, 0.0, 0.0)
    assert second.validation_pass(state.validation_seconds) == 0.5  # its model's largest, as before
    assert state.rungs[0].results["rotate-d24"] == RungResult(
        exports={"fp32": {"bytes": 9000, "mrr": 0.2, "hits_at_10": 0.4}}, train_seconds=3.5, steps=40, score=0.2)
    assert state.rungs[1] == Rung(index=1, survivors=["rotate-d24"])
    assert (state.rung_count, state.spent_seconds, state.done) == (2, 12.0, False)
    assert state.seconds == {}  # no time accounting in an old file: its phases start at 0


def test_the_serialised_form_round_trips_and_keeps_the_untyped_layout():
    state = SearchState.from_json(UNTYPED)
    values = state.to_json()
    assert SearchState.from_json(values) == state
    assert list(values) == [*UNTYPED, "seconds", "peak_rss_mb", "lane_seconds", "dropped"]  # the old layout, then the
    # accounting (none yet)
    assert values["seconds"] == {} and values["peak_rss_mb"] == {} and values["lane_seconds"] == 0.0
    assert list(values["rungs"][0]) == ["index", "survivors", "results", "budget_seconds", "slice_seconds",
                                        "revalidated", "probes", "cut"]  # the old layout, the last cut's second
    # look, then rung 0's first
    assert values["rungs"][0]["revalidated"] == {}
    assert values["rungs"][0]["results"] == UNTYPED["rungs"][0]["results"]
    assert {k: values["candidates"][0][k] for k in UNTYPED["candidates"][0]} == UNTYPED["candidates"][0]


def test_reading_a_job_and_starting_a_worker_import_no_torch():
    """The worker loop, the compress job and its state load without torch, as the API's job checks do: a worker
    that imported torch (~1 s) before logging its start missed `earl serve`'s start-up window."""
    import subprocess
    import sys

    code = ("import sys; import earl_service.compress.state, earl_service.compress.job, earl_service.worker.loop; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    subprocess.run([sys.executable, "-c", code], check=True)
