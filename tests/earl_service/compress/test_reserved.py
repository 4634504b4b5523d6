"""EARL's reserved share as a searched setting (`earl compress --reserved-ratios`): each share planned as a model of
its own, sized exactly, timed at its own share, cut for time share by share, and said in the report."""

from __future__ import annotations

import json

import pytest
from conftest import codex_s_path, tiny_dataset

from earl_service.bundle.model_io import bundle_from_model, load_bundle
from earl_service.bundle.sizes import BundleSizes, padded_metrics
from earl_service.compress import candidates as candidates_module
from earl_service.compress import costs as costs_module
from earl_service.compress.config import CompressConfig, split_ratios
from earl_service.compress.options import compress_config_from_options
from earl_service.compress.report import _shares, markdown
from earl_service.compress.state import STATE, Candidate, family_name, load_state, search_settings
from earl_service.config import ModelConfig
from earl_service.data.dataset import load_dataset
from earl_service.data.vocab import Vocab
from earl_service.errors import ConfigError
from earl_service.model.graph import choose_reserved
from earl_service.model.modules import build_model


def _config(**values) -> CompressConfig:
    return CompressConfig(**{"max_bytes": 10**6, "time_limit_minutes": 1, **values})


def _candidate(name: str, ratio: float, precisions: tuple[str, ...] = ("int8",)) -> Candidate:
    prefix, dim = name.rsplit("-d", 1)
    model = prefix.split("-")[0]
    return Candidate(name=name, model=model, dim=int(dim), bytes=dict.fromkeys(precisions, 1),
                     config=ModelConfig(model=model, dim=int(dim), reserved_ratio=ratio),
                     validation_seconds=1.0, step_seconds=100.0)


def test_the_shares_are_read_from_text_and_checked():
    assert split_ratios("0.1, 0.4") == (0.1, 0.4)
    config = compress_config_from_options({"max_bytes": "1MB", "time_limit": 1, "reserved_ratios": "0.025,0.4"})
    assert config.reserved_ratios == (0.025, 0.4)
    assert _config().reserved_ratios == (0.1,) and _config().settings()["reserved_ratios"] == [0.1]
    with pytest.raises(ConfigError, match="cannot read 'a,b' as reserved ratios"):
        split_ratios("a,b")


@pytest.mark.parametrize(("ratios", "message"), [
    ((), "at least one share"),
    ((0.0,), "above 0 and at most 1"),
    ((1.5,), "above 0 and at most 1"),
    ((float("nan"),), "above 0 and at most 1"),
    ((0.1000001,), "at most 3 decimals"),  # would name a second earl-r10 family
    ((0.1, 0.1), "a share twice"),
])
def test_bad_shares_are_refused_naming_the_setting(ratios, message):
    with pytest.raises(ConfigError, match=f"reserved_ratios.*{message}"):
        _config(reserved_ratios=ratios)


def test_a_share_other_than_the_default_names_its_candidates():
    assert family_name("earl", 0.1) == "earl" and family_name("rotate", 0.1) == "rotate"
    assert family_name("earl", 0.4) == "earl-r40" and family_name("earl", 0.025) == "earl-r2.5"
    assert family_name("earl", 0.001) == "earl-r0.1"


def test_each_share_is_planned_at_its_own_dims_and_bytes():
    """More reserved entities leave fewer dims in the same bytes; RotatE has no share and is planned once."""
    dataset = load_dataset(codex_s_path())
    sizes = BundleSizes(dataset)
    budget = sizes.bytes("earl", 64, "int8")
    config = _config(max_bytes=budget, precisions=("fp32", "int8"), reserved_ratios=(0.1, 0.4))
    planned = candidates_module.plan_candidates(sizes, config)
    earl = {c.name: c for c in planned if c.model == "earl"}
    assert "earl-d64" in earl and any(n.startswith("earl-r40-d") for n in earl)
    wide = max((c for c in earl.values() if c.config.reserved_ratio == 0.4), key=lambda c: c.dim)
    assert wide.dim < 64 and wide.name == f"earl-r40-d{wide.dim}"
    at_share = sizes.with_reserved_ratio(0.4)
    assert wide.bytes["int8"] == at_share.bytes("earl", wide.dim, "int8") <= budget
    assert at_share.bytes("earl", wide.dim + 1, "int8") > budget
    assert at_share.fixed_parts(False) is sizes.fixed_parts(False)  # the packed graph and names are shared
    assert all(c.config.reserved_ratio == 0.1 for c in planned if c.name.startswith("earl-d"))
    rotate = [c for c in planned if c.model == "rotate"]
    assert rotate and all(c.name.startswith("rotate-d") for c in rotate)
    assert len({c.name for c in planned}) == len(planned)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_predicted_bytes_at_another_share_equal_the_written_file(tmp_path, precision):
    dataset = load_dataset(codex_s_path())
    sizes = BundleSizes(dataset).with_reserved_ratio(0.4)
    config = sizes.config("earl", 20)
    n = dataset.num_train_entities
    reserved = choose_reserved(n, 0.4, config.seed)
    net = build_model(config, n, dataset.num_relations, reserved)
    bundle = bundle_from_model(net, config, Vocab(dataset.entities.names[:n]), dataset.relations, dataset.train,
                               labels=dataset.labels)
    bundle.metrics = padded_metrics({})
    path = bundle.save(tmp_path / "b.safetensors", precision=precision, coding="plain")
    assert path.stat().st_size == sizes.bytes("earl", 20, precision)
    assert sizes.bytes("earl", 20, precision) > BundleSizes(dataset).bytes("earl", 20, precision)


def test_the_cut_for_time_keeps_each_shares_baseline_until_one_candidate_per_model():
    """Shares are dropped from the one with the most candidates (on a tie, the one without the model's baseline),
    each share's widest int8 last; the model's own baseline, at the default share, goes last of all."""
    earl = [_candidate("earl-d60", 0.1), _candidate("earl-d30", 0.1),
            _candidate("earl-r40-d40", 0.4), _candidate("earl-r40-d20", 0.4)]
    order, left = [], list(earl)
    while left:
        dropped = candidates_module._next_to_drop(left)
        order.append(dropped.name)
        left.remove(dropped)
    assert order == ["earl-r40-d20", "earl-d30", "earl-r40-d40", "earl-d60"]
    # Steps so slow that the first rung never trains enough: down to one candidate per model, the baselines.
    units = [*earl, _candidate("rotate-d100", 0.1), _candidate("rotate-d50", 0.1)]
    kept = candidates_module.fit_to_time(_config(time_limit_minutes=3), units, {"earl": 1.0, "rotate": 1.0}, 0.1)
    assert sorted(c.name for c in kept) == ["earl-d60", "rotate-d100"]
    assert candidates_module.baseline_name(units) == "rotate-d100"
    assert candidates_module.baseline_name(earl) == "earl-d60"  # the default share's, not the widest share's
    assert candidates_module.baseline_name(earl[2:]) == "earl-r40-d40"  # no default share: the first listed


def test_planning_times_the_ends_at_their_own_shares():
    """The widest is timed at the smallest share, the narrowest at the largest: each built as its candidate says."""
    units = [_candidate("earl-d60", 0.1), _candidate("earl-r40-d60", 0.4), _candidate("earl-r40-d30", 0.4),
             _candidate("earl-d30", 0.1)]
    timed = costs_module.timed_extremes(units)
    assert {d: c.reserved_ratio for d, c in timed.items()} == {60: 0.1, 30: 0.4}
    assert list(costs_module.timed_extremes(units[:2])) == [60]  # one dim in all: the widest alone


def test_a_search_at_two_shares_trains_each_at_its_share(tmp_path, monkeypatch):
    """A tiny search with two shares: every EARL candidate's run is built at its own share, and the report names
    the shares and what each kept."""
    from earl_service.compress.search import compress
    from earl_service.config import MODELS, TrainConfig
    from earl_service.train import run as run_module

    built = []
    real = run_module.Run.build.__func__

    def build(cls, dataset, model_config, device, **kwargs):
        if model_config.model == "earl":
            built.append((model_config.dim, model_config.reserved_ratio))
        return real(cls, dataset, model_config, device, **kwargs)

    monkeypatch.setattr(run_module.Run, "build", classmethod(build))
    dataset = tiny_dataset()
    tiny = dict.fromkeys(MODELS, TrainConfig(batch_size=64, negatives=8, eval_every=0, progress=False, threads=1))
    budget = BundleSizes(dataset).with_reserved_ratio(0.5).bytes("earl", 16, "fp32")
    config = _config(max_bytes=budget, time_limit_minutes=0.2, models=("earl",), precisions=("fp32",),
                     reserved_ratios=(0.1, 0.5))
    report = compress(dataset, tmp_path, config, train_configs=tiny)
    assert report is not None
    shares = {c["config"]["reserved_ratio"] for c in report["candidates"]}
    assert shares <= {0.1, 0.5} and {r for _, r in built} == {0.1, 0.5}
    for c in report["candidates"]:
        assert c["name"].startswith("earl-r50-d" if c["config"]["reserved_ratio"] == 0.5 else "earl-d")
        assert (c["dim"], c["config"]["reserved_ratio"]) in built
    assert report["reserved_ratios"] == [0.1, 0.5]
    text = markdown(report)
    assert "EARL's reserved shares searched: 10%: " in text and "; 50%: " in text
    pick = report["pick"]["candidate"]
    shipped = load_bundle(tmp_path / "bundle.safetensors")
    assert shipped.config.reserved_ratio == (0.5 if pick.startswith("earl-r50") else 0.1)
    assert len(shipped.reserved) == len(choose_reserved(dataset.num_train_entities, shipped.config.reserved_ratio,
                                                        shipped.config.seed))


def test_a_job_saved_before_the_setting_resumes_at_the_default_share(tmp_path):
    dataset = tiny_dataset()
    config = _config()
    settings = search_settings(config, dataset)
    del settings["reserved_ratios"]  # as an older version wrote it
    (tmp_path / STATE).write_text(json.dumps({"settings": settings, "graph_bytes": 0, "validation_seconds": {},
                                              "candidates": [], "rung_count": 1}))
    assert load_state(tmp_path, config, dataset) is not None
    with pytest.raises(ConfigError, match="other settings"):
        load_state(tmp_path, _config(reserved_ratios=(0.1, 0.4)), dataset)


def test_the_report_says_which_shares_were_cut_for_time():
    report = {"reserved_ratios": [0.1, 0.4], "dropped": ["earl-r40-d40", "earl-d30"],
              "candidates": [{"name": "earl-d60", "model": "earl", "config": {"reserved_ratio": 0.1}}]}
    assert _shares(report) == (" EARL's reserved shares searched: 10%: earl-d60 (earl-d30 cut for time); "
                               "40%: none kept (earl-r40-d40 cut for time).")
    assert _shares({**report, "dropped": []}).endswith("40%: none kept (no dim fits the budget).")
    assert _shares({**report, "reserved_ratios": [0.1]}) == ""


def test_the_default_share_keeps_the_names_and_sizes_of_before():
    sizes = BundleSizes(tiny_dataset())
    assert sizes.with_reserved_ratio(0.1) is sizes
    planned = candidates_module.plan_candidates(sizes, _config(max_bytes=sizes.bytes("earl", 16, "fp32"),
                                                               precisions=("fp32",)))
    assert all("-r" not in c.name for c in planned)
