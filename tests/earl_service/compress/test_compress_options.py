"""Contract: `earl compress`, the API job form and the worker read the same compress options alike."""

import pytest

from earl_service.cli.main import build_parser
from earl_service.compress.config import CompressConfig
from earl_service.compress.job import compress_settings
from earl_service.compress.options import (
    COMPRESS_OPTIONS,
    FORM_COMPRESS_OPTIONS,
    SHARED_OPTIONS,
    compress_config_from_options,
)
from earl_service.config.options import FORM_OPTIONS

pytest.importorskip("fastapi")
from api.compress_jobs import job_params  # noqa: E402
from api.schemas import CompressForm, JobForm  # noqa: E402

# `earl compress` arguments that are no search setting: where and how its candidates train and read the data.
NOT_SEARCH = {"help", "data", "out", "device", "threads", "parallel", "labels", "recipe", "header", "columns", "func",
              "from_bundle", "graph", "eval_triples", "retrain_minutes"}  # --from, --graph, --eval-triples,
# --retrain-minutes: an imported bundle's search
# One non-default value for every compress option, as a client (or a user on the command line) would type it.
CHANGED = {"max_bytes": "1.5MiB", "time_limit": "2.5", "models": "rotate", "precisions": "int8,pq:16",
           "reserved_ratios": "0.025,0.4", "known_answers": "none", "metric": "hits@10", "seed": "7"}
EXPECTED = CompressConfig(max_bytes=1_572_864, time_limit_minutes=2.5, models=("rotate",),
                          precisions=("int8", "pq:16"), reserved_ratios=(0.025, 0.4), known_answers="none",
                          metric="hits@10", seed=7)


def compress_parser():
    return next(a for a in build_parser()._actions if a.dest == "command").choices["compress"]


def cli_config(values):
    args = [arg for name, value in values.items() for arg in (f"--{name.replace('_', '-')}", value)]
    return compress_config_from_options(vars(compress_parser().parse_args(["data", "--out", "job", *args])))


def worker_config(form):
    """The search the worker runs for a job of this form (the params as POST /jobs stores them)."""
    validated = JobForm.model_validate(form)
    return compress_settings(job_params(validated.model_dump(), given=validated.model_fields_set)[0])


def test_every_compress_option_is_an_earl_compress_flag_and_back():
    flags = {a.dest for a in compress_parser()._actions} - NOT_SEARCH
    assert flags == {o.name for o in COMPRESS_OPTIONS} == set(CHANGED)


def test_every_compress_option_is_a_job_form_field():
    assert set(CompressForm.model_fields) == {o.name for o in FORM_COMPRESS_OPTIONS}
    assert {o.name for o in SHARED_OPTIONS} == {"time_limit", "seed"} <= {o.name for o in FORM_OPTIONS}
    assert {o.name for o in COMPRESS_OPTIONS} <= set(JobForm.model_fields)


def test_the_same_values_give_the_same_search_on_the_cli_and_the_worker():
    assert cli_config(CHANGED) == worker_config(CHANGED) == EXPECTED


def test_defaults_agree_on_the_cli_the_form_and_the_config():
    required = {"max_bytes": "2MB", "time_limit": "1"}
    assert cli_config(required) == worker_config(required) == CompressConfig(max_bytes=2 * 10**6,
                                                                            time_limit_minutes=1.0)


def test_a_search_without_a_required_option_is_refused(capsys):
    with pytest.raises(SystemExit):
        compress_parser().parse_args(["data", "--out", "job", "--time-limit", "1"])
    assert "--max-bytes" in capsys.readouterr().err
    with pytest.raises(Exception, match="max_bytes"):
        compress_config_from_options({"time_limit": 1})


def test_the_form_keeps_its_length_limits():
    for option in FORM_COMPRESS_OPTIONS:
        if "max_length" in option.limits:
            with pytest.raises(ValueError, match=option.name):
                CompressForm.model_validate({option.name: "x" * (option.limits["max_length"] + 1)})
