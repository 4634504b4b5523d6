"""Recipes: `paper` is the dataclass defaults, `default` applies when none is named, options given win over both."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import tiny_dataset

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.bundle import bundle_info
from earl_service.cli.main import _configs, build_parser, main
from earl_service.compress import candidates as candidates_module
from earl_service.compress import search as compress_module
from earl_service.compress.config import CompressConfig
from earl_service.config import MODELS, TrainConfig
from earl_service.config.options import configs_from_options, train_configs_from_options
from earl_service.config.recipes import DEFAULT, PAPER, RECIPES, check_recipe, recipe_fields, recipe_values
from earl_service.errors import ConfigError
from earl_service.worker.loop import WorkerConfig, configs_from_params, train_configs_from_params

TINY = ["--steps", "2", "--dim", "4", "--k", "2", "--batch-size", "16", "--negatives", "4", "--eval-every", "0",
        "--no-progress", "--no-final-eval", "--threads", "1"]
WORKER = WorkerConfig(device="cpu", threads=1)


def cli_train_config(*args: str) -> TrainConfig:
    return _configs(build_parser().parse_args(["train", "data", "--out", "run", *args]))[1]


def with_recipe(name: str, model: str) -> TrainConfig:
    """TrainConfig() with recipe `name`'s table entries for `model`, read from the table itself."""
    return dataclasses.replace(TrainConfig(), **RECIPES[name][model])


def test_every_recipe_names_every_model_kind_with_train_config_fields():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for kinds in RECIPES.values():
        assert set(kinds) == set(MODELS)
        assert all(set(values) <= fields for values in kinds.values())
        for values in kinds.values():
            TrainConfig(**values)  # valid values, within the field's bounds and choices


@pytest.mark.parametrize("model", MODELS)
def test_paper_recipe_is_todays_defaults_field_by_field(model):
    cli = cli_train_config("--recipe", PAPER, "--model", model)
    for field in dataclasses.fields(TrainConfig):
        assert getattr(cli, field.name) == field.default, field.name
    assert configs_from_options({"model": model}, recipe=PAPER)[1] == TrainConfig()
    assert train_configs_from_options({}, recipe=PAPER)[model] == TrainConfig()
    assert recipe_values(PAPER, model) == {f: getattr(TrainConfig(), f) for f in recipe_fields()}


@pytest.mark.parametrize("model", MODELS)
def test_default_recipe_applies_when_none_is_named(model):
    assert build_parser().parse_args(["train", "data", "--out", "run"]).recipe == DEFAULT
    assert cli_train_config("--model", model) == with_recipe(DEFAULT, model)
    assert train_configs_from_options({}, recipe=DEFAULT)[model] == with_recipe(DEFAULT, model)


def test_no_recipe_keeps_the_dataclass_defaults_for_library_callers():
    assert configs_from_options({}) == configs_from_options({}, recipe=PAPER)
    assert TrainConfig() == with_recipe(PAPER, "earl")


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("model", MODELS)
def test_an_option_given_wins_over_the_recipe(recipe, model):
    train = cli_train_config("--recipe", recipe, "--model", model, "--lr", "0.0123", "--lr-schedule", "cosine")
    assert (train.lr, train.lr_schedule) == (0.0123, "cosine")
    others = {k: v for k, v in recipe_values(recipe, model).items() if k not in ("lr", "lr_schedule")}
    assert {k: getattr(train, k) for k in others} == others  # the recipe still sets the rest
    # An option given at its dataclass default still wins: given, not different, is what counts.
    assert cli_train_config("--recipe", recipe, "--model", model, "--lr", str(TrainConfig.lr)).lr == TrainConfig.lr


def test_big_table_negatives_give_way_to_negatives_given():
    """The default recipe's negatives on a big RotatE table refine --negatives: given, that wins everywhere."""
    assert cli_train_config("--model", "rotate").big_table_negatives == RECIPES[DEFAULT]["rotate"]["big_table_negatives"]
    given = cli_train_config("--model", "rotate", "--negatives", "128")
    assert (given.negatives, given.big_table_negatives) == (128, 0)
    both = cli_train_config("--model", "rotate", "--negatives", "128", "--big-table-negatives", "16")
    assert (both.negatives, both.big_table_negatives) == (128, 16)
    assert configs_from_options({"model": "rotate", "negatives": 64}, recipe=DEFAULT)[1].big_table_negatives == 0


def test_applying_one_recipe_after_another_leaves_nothing_of_the_first():
    for model in MODELS:
        for name in RECIPES:
            assert set(recipe_values(name, model)) == set(recipe_fields())


def test_unknown_recipe_is_refused_with_the_names(tmp_path, capsys):
    with pytest.raises(ConfigError, match=f"unknown recipe 'fast'; choose from {', '.join(RECIPES)}$"):
        check_recipe("fast")
    with pytest.raises(ConfigError, match="choose from"):
        configs_from_options({}, recipe="fast")
    with pytest.raises(SystemExit):
        main(["train", str(tmp_path), "--out", str(tmp_path / "run"), "--recipe", "fast"])
    err = capsys.readouterr().err
    assert "--recipe" in err and all(name in err for name in RECIPES)


def graph(folder):
    folder.mkdir()
    rows = [f"e{i % 12}\tr{i % 3}\te{(i * 5 + 1) % 12}\n" for i in range(40)]
    (folder / "train.tsv").write_text("".join(rows))
    (folder / "valid.tsv").write_text("".join(rows[:5]))
    return folder


@pytest.mark.parametrize("recipe", [None, PAPER])
def test_metrics_and_bundle_record_the_recipe_and_its_values(tmp_path, recipe):
    data, run = graph(tmp_path / "kg"), tmp_path / "run"
    named = ["--recipe", recipe] if recipe else []
    assert main(["train", str(data), "--out", str(run), *TINY, *named]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["recipe"] == (recipe or DEFAULT)
    expected = dataclasses.replace(with_recipe(recipe or DEFAULT, "earl"), **_tiny_values())
    assert TrainConfig.from_dict(metrics["config"]["train"]) == expected
    assert load_bundle(run / "bundle.safetensors").metrics["recipe"] == (recipe or DEFAULT)
    assert bundle_info(str(run / "bundle.safetensors"))["metrics"]["recipe"] == (recipe or DEFAULT)


def _tiny_values() -> dict:
    return {"steps": 2, "batch_size": 16, "negatives": 4, "eval_every": 0, "progress": False, "threads": 1}


def test_config_file_applies_no_recipe_and_records_the_files(tmp_path):
    data, run = graph(tmp_path / "kg"), tmp_path / "run"
    assert main(["train", str(data), "--out", str(run), *TINY, "--recipe", PAPER]) == 0
    rerun = tmp_path / "rerun"
    assert main(["train", str(data), "--out", str(rerun), "--config", str(run / "metrics.json"),
                 "--recipe", DEFAULT, "--no-final-eval"]) == 0
    first, second = (json.loads((d / "metrics.json").read_text()) for d in (run, rerun))
    assert second["config"]["train"] == first["config"]["train"]  # every setting from the file
    assert second["recipe"] == PAPER


def test_worker_applies_the_recipe_of_a_job_under_its_values():
    params = {"model": "earl", "recipe": DEFAULT, "lr": None, "steps": 5}  # None: the recipe's value
    _, train = configs_from_params(params, WORKER)
    assert train == dataclasses.replace(with_recipe(DEFAULT, "earl"), steps=5, device="cpu", threads=1,
                                        progress=False)
    assert configs_from_params({**params, "lr": 0.0123}, WORKER)[1].lr == 0.0123
    per_model = train_configs_from_params({"recipe": DEFAULT, "lr": None}, WORKER)
    assert per_model["rotate"].lr == with_recipe(DEFAULT, "rotate").lr
    assert configs_from_params({"lr": 0.001}, WORKER)[1] == configs_from_params({}, WORKER)[1]  # queued before


class _Planned(Exception):
    """Raised in place of the search's first measurement: the test only needs what it was given."""


def test_compress_trains_its_candidates_with_the_default_recipe(tmp_path, monkeypatch):
    seen = {}

    def planned(dataset, units, train_configs, graphs=None):
        seen.update(train_configs)
        raise _Planned

    monkeypatch.setattr(candidates_module, "measure_costs", planned)
    with pytest.raises(_Planned):
        compress_module.compress(tiny_dataset(), tmp_path, CompressConfig(max_bytes=10**6, time_limit_minutes=1))
    assert seen == {m: dataclasses.replace(with_recipe(DEFAULT, m), progress=False) for m in MODELS}


@pytest.mark.parametrize("recipe", [None, PAPER])
def test_earl_compress_passes_its_recipe_per_model(tmp_path, monkeypatch, recipe):
    seen = {}

    def fake(dataset, out, config, *, train_configs, on_progress):
        seen.update(train_configs)
        raise _Planned

    monkeypatch.setattr(compress_module, "compress", fake)
    data = graph(tmp_path / "kg")
    with pytest.raises(_Planned):
        main(["compress", str(data), "--out", str(tmp_path / "job"), "--max-bytes", "1MB", "--time-limit", "1",
              "--threads", "1", *(["--recipe", recipe] if recipe else [])])
    for model in MODELS:
        expected = with_recipe(recipe or DEFAULT, model)
        assert seen[model] == dataclasses.replace(expected, progress=False, device="auto", threads=1)
