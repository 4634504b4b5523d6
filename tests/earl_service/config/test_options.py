"""Contract: `earl train`, the API job form and the worker accept the same options, defaults and bounds."""

import dataclasses
import json

import pytest
from pydantic import ValidationError

from earl_service.cli.main import _configs, build_parser, main
from earl_service.config import DataConfig, ModelConfig, TrainConfig
from earl_service.config.options import GROUPS, OPTIONS, data_cli_args, data_config_from_options
from earl_service.errors import ConfigError
from earl_service.worker.loop import WorkerConfig, configs_from_params

pytest.importorskip("fastapi")
from api.compress_jobs import job_params  # noqa: E402
from api.schemas import CompressForm, JobForm  # noqa: E402

CLI_ONLY = {"temperature", "eval_batch_size", "eval_max_triples", "checkpoint_every", "compute", "schedule_minutes",
            "device", "threads", "progress", "cuda_graphs", "row_updates", "decay_share"}  # the worker decides
# these (device, threads, progress) or keeps the defaults (cuda_graphs: off until proven on a card,
# docs/scaling.md#gpus; row_updates: auto, on the worker's device; decay_share: compress sets its slices')
# How the service exports and launches a job, and a compress job's fields (`earl compress` options, below).
# source_model names a registered model: the command line compresses a bundle file (`earl compress --from`), and
# its retrain_minutes is that command's --retrain-minutes (test_compress_model_jobs.py).
SERVICE_ONLY = {"precision", "nproc_per_node", "source_model", "retrain_minutes"} | set(CompressForm.model_fields)
WORKER = WorkerConfig(device="cpu", threads=3)
# One non-default value for every form option, as a client would type it.
CHANGED = {"model": "rotate", "dim": "32", "reserved_ratio": "0.2", "k": "5", "layers": "1", "gamma": "6.5",
           "epsilon": "1.5", "no_reserved": "true", "no_conrel": "true", "no_knn": "true", "no_conrel_knn": "true",
           "no_mulhop": "true", "seed": "7", "steps": "50", "batch_size": "64", "negatives": "8", "big_table_negatives": "16", "lr": "0.01",
           "eval_every": "5", "patience": "3", "time_limit": "2.5", "sampled": "true", "fanout": "5,all",
           "negative_chunk": "16", "lr_schedule": "cosine", "warmup": "0.1", "lr_floor": "0.05",
           "encoder_lr": "0.0005", "header": "true", "columns": "h,t,r", "recipe": "paper"}


def cli_configs(*args):
    return _configs(build_parser().parse_args(["train", "data", "--out", "run", *args]))[:2]


def worker_configs(form):
    """The configs the worker trains a job of this form with (the params as POST /jobs stores them)."""
    validated = JobForm.model_validate(form)
    return configs_from_params(job_params(validated.model_dump(), given=validated.model_fields_set)[0], WORKER)


def as_worker_runs(configs):
    model, train = configs
    return model, dataclasses.replace(train, device=WORKER.device, threads=WORKER.threads, progress=False)


def cli_option_names():
    train = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    return {a.dest for g in train._action_groups if g.title in GROUPS.values() for a in g._group_actions}


def test_compress_form_fields_are_earl_compress_options():
    compress = next(a for a in build_parser()._actions if a.dest == "command").choices["compress"]
    assert set(CompressForm.model_fields) <= {a.dest for a in compress._actions}
    assert {"time_limit", "seed", "retrain_minutes"} <= {a.dest for a in compress._actions} & set(JobForm.model_fields)


def cli_args(form):
    """The command line a user would type for the form's values."""
    return [arg for name, value in form.items()
            for arg in ([f"--{name.replace('_', '-')}"] if value == "true" else [f"--{name.replace('_', '-')}", value])]


def test_every_form_field_is_a_cli_option_and_back():
    assert set(JobForm.model_fields) - SERVICE_ONLY == cli_option_names() - CLI_ONLY
    assert set(CHANGED) == set(JobForm.model_fields) - SERVICE_ONLY  # a new option needs a value above


def test_paper_recipe_defaults_are_the_dataclass_defaults_everywhere():
    assert cli_configs("--recipe", "paper") == (ModelConfig(), TrainConfig())
    assert worker_configs({"recipe": "paper"}) == as_worker_runs((ModelConfig(), TrainConfig()))


def test_default_recipe_is_the_same_on_the_cli_and_the_worker():
    for model in ("earl", "rotate"):
        assert worker_configs({"model": model}) == as_worker_runs(cli_configs("--model", model))


def test_the_same_values_give_the_same_configs():
    model, train = cli_configs(*cli_args(CHANGED))
    assert (model.model, model.seed, train.seed, train.time_limit_minutes) == ("rotate", 7, 7, 2.5)
    assert train.fanout == (5, 0)
    assert model.no_mulhop and train.sampled and model != ModelConfig()
    assert worker_configs(CHANGED) == as_worker_runs((model, train))


def test_data_options_agree_on_the_cli_the_form_and_the_worker():
    def cli(*args):
        return data_config_from_options(vars(build_parser().parse_args(["train", "data", "--out", "run", *args])))

    assert cli() == data_config_from_options(JobForm.model_validate({}).model_dump()) == DataConfig()
    assert cli(*cli_args(CHANGED)) == data_config_from_options(JobForm.model_validate(CHANGED).model_dump())
    assert cli(*cli_args(CHANGED)) == DataConfig(header=True, columns="h,t,r")
    assert cli("--no-header").header is False
    for data in (DataConfig(), DataConfig(header=False, columns="t,r,h")):  # the worker's torchrun re-run
        assert cli(*data_cli_args(data)) == data
    evaluate = build_parser().parse_args(["evaluate", "run", "data", "--no-header", "--columns", "r,h,t"])
    assert data_config_from_options(vars(evaluate)) == DataConfig(header=False, columns="r,h,t")


def test_cli_spellings_of_earlier_releases_still_work():
    model, train = cli_configs("--margin", "6", "--temperature", "0.5", "--time-limit", "3", "--no-progress", "--bf16",
                               "--fanout", "all", "--device", "cpu", "--threads", "2", "--checkpoint-every", "0")
    assert (model.gamma, train.adversarial_temperature, train.time_limit_minutes) == (6.0, 0.5, 3.0)
    assert (train.progress, train.compute, train.fanout, train.device, train.threads) == (False, "bf16", (0,), "cpu", 2)
    assert train.checkpoint_every == 0


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in OPTIONS:
        assert option.flags[0] in text
    assert text.count("(default: ") >= len(OPTIONS)
    assert "(default: 10,10)" in text and "(default: on; this switch turns it off)" in text


def _past(bound: str, value: float, kind: type):
    """The first value on the wrong side of `bound` (ge/gt/le) for an option of type `kind`."""
    step = 1 if kind is int else 0.5
    return {"ge": value - step, "gt": value, "le": value + step}[bound]


HARD = [(o, key, bound) for o in OPTIONS if not o.text for key, bound in o.bounds.items()]  # text: below


@pytest.mark.parametrize("option,key,bound", HARD, ids=[f"{o.name}-{k}" for o, k, _ in HARD])
def test_a_value_past_a_hard_bound_is_refused_by_cli_form_and_worker(option, key, bound, tmp_path, capsys):
    value = str(_past(key, bound, option.type))
    field = option.fields[0][1]
    assert main(["train", str(tmp_path), "--out", str(tmp_path / "run"), f"{option.flags[0]}={value}"]) == 2
    assert f"{field}" in capsys.readouterr().err  # refused for the value, not for the missing train file
    if not option.cli_only:  # the worker reads form options only
        with pytest.raises(ConfigError, match=field):
            configs_from_params({option.name: option.type(value)}, WORKER)
        with pytest.raises(ValidationError, match=option.name):
            JobForm.model_validate({option.name: value})


LIMITS = [(o, key, bound) for o in OPTIONS if not o.text for key, bound in o.limits.items()]


@pytest.mark.parametrize("option,key,bound", LIMITS, ids=[f"{o.name}-{k}" for o, k, _ in LIMITS])
def test_service_limits_refuse_a_job_the_cli_still_runs(option, key, bound):
    value = _past(key, bound, option.type)
    with pytest.raises(ValidationError, match=option.name):
        JobForm.model_validate({option.name: str(value)})
    model, train = cli_configs(f"{option.flags[0]}={value}")
    assert value in (getattr(model, option.fields[0][1], None), getattr(train, option.fields[0][1], None))


def test_service_limits_are_at_least_as_strict_as_the_hard_bounds():
    for option in OPTIONS:
        for key in option.bounds.keys() & option.limits.keys():
            stricter = option.limits[key] >= option.bounds[key] if key in ("ge", "gt") else \
                option.limits[key] <= option.bounds[key]
            assert stricter, (option.name, key)


@pytest.mark.parametrize("argv,message", [(["--model", "transe"], "invalid choice"),
                                          (["--fanout", "10,x"], "comma-separated integers"),
                                          (["--fanout", "-1"], "fan-outs must be >= 0"),
                                          (["--dim", "abc"], "invalid int value")])
def test_cli_refuses_what_argparse_can_read_with_a_usage_error(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", str(tmp_path), "--out", str(tmp_path / "run"), *argv])
    assert message in capsys.readouterr().err


def test_form_refuses_a_bad_fanout_and_the_worker_reads_its_text():
    with pytest.raises(ValidationError, match="fanout"):
        JobForm.model_validate({"fanout": "10,,10"})
    assert configs_from_params({"fanout": "all,3"}, WORKER)[1].fanout == (0, 3)
    assert configs_from_params({"fanout": [4, 4]}, WORKER)[1].fanout == (4, 4)  # a job stored by hand


def test_worker_reads_only_form_options():
    model, train = configs_from_params({"eval_batch_size": 1, "knn_temperature": 9.0, "precision": "int8"}, WORKER)
    assert (model.knn_temperature, train.eval_batch_size) == (ModelConfig().knn_temperature, 256)


def test_fields_without_an_option_are_still_checked():
    assert "knn_temperature" not in {o.name for o in OPTIONS}
    with pytest.raises(ConfigError, match="knn_temperature must be > 0.0"):
        ModelConfig(knn_temperature=0.0)
    with pytest.raises(ConfigError, match=r"time_limit_minutes \(option time_limit\) must be >= 0.0"):
        TrainConfig(time_limit_minutes=-1)
    with pytest.raises(ConfigError, match="device"):
        TrainConfig(device="tpu")


@pytest.mark.parametrize("content", ["[1, 2]", '{"model": {}}', "not json"])
def test_config_file_of_the_wrong_shape_is_a_config_error(content, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="--config"):
        cli_configs("--config", str(path))


def test_config_file_takes_every_setting(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"config": {"model": {"dim": 12, "knn_temperature": 0.5}, "train": {"fanout": [3]}}}))
    model, train = cli_configs("--config", str(path), "--dim", "99")
    assert (model.dim, model.knn_temperature, train.fanout) == (12, 0.5, (3,))


def _form_schema_of(field: str) -> dict:
    props = JobForm.model_json_schema()["properties"][field]
    return next((p for p in props.get("anyOf", [props]) if p.get("type") != "null"), props)


def test_every_numeric_form_field_has_both_bounds_and_every_text_field_a_length():
    """Issue 56: no job field may carry a number the worker cannot use; a text field is bounded in length, and
    the numbers its text holds are bounded by its option (below)."""
    for name in JobForm.model_fields:
        schema = _form_schema_of(name)
        if schema.get("type") in ("integer", "number"):
            assert "maximum" in schema and ("minimum" in schema or "exclusiveMinimum" in schema), name
        elif schema.get("type") == "string" and "enum" not in schema:
            assert "maxLength" in schema or "pattern" in schema, name


@pytest.mark.parametrize("form", [{"fanout": "9" * 5000}, {"fanout": "10," + "9" * 4000}, {"fanout": "100001"},
                                  {"max_bytes": "9" * 40, "time_limit": "1"}, {"max_bytes": "2e12", "time_limit": "1"}])
def test_a_text_fields_numbers_are_bounded_by_its_option(form):
    """A fanout of 5,000 digits matched the form's pattern and failed in the worker (issue 56)."""
    with pytest.raises(ValidationError, match=next(iter(form))):
        JobForm.model_validate(form)


def test_text_numbers_within_the_limits_still_pass():
    assert JobForm.model_validate({"fanout": "100000,all"}).fanout == "100000,all"
    assert JobForm.model_validate({"max_bytes": "1000GB", "time_limit": "1"}).max_bytes == "1000GB"
    with pytest.raises(ConfigError, match="fanout must be >= 0"):
        TrainConfig(fanout=(3, -1))
