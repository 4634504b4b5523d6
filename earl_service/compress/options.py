"""Compress's options: `earl compress`'s flags, the job form's compress fields and the worker's reading of a job's
params, all derived from CompressConfig's fields (as earl_service/config/options.py derives `earl train`'s).

An option spells `--name-with-dashes` on the command line and `name` in the job form and a job's params. Two of
them, time_limit and seed, are training options too: the job form has one field for each (the training table's,
earl_service/config/options.py), which a compress job reads as its search's. The others are the form's compress
fields; max_bytes makes a job a compress job. Torch-free: the API builds its form from this.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import MISSING
from typing import TYPE_CHECKING, Any, Literal

from earl_service.bundle.precision import describe
from earl_service.compress.config import CompressConfig
from earl_service.config.options import FORM_OPTIONS, Option, field_options, form_constraints
from earl_service.errors import ConfigError

if TYPE_CHECKING:  # pydantic comes with the service extras; `earl compress` runs without it
    from pydantic import BaseModel

COMPRESS_OPTIONS = tuple(field_options(CompressConfig))
# The options the job form shares with a training job (time_limit, seed), and those only a compress job has.
SHARED_OPTIONS = tuple(o for o in COMPRESS_OPTIONS if o.name in {f.name for f in FORM_OPTIONS})
FORM_COMPRESS_OPTIONS = tuple(o for o in COMPRESS_OPTIONS if o not in SHARED_OPTIONS)


def _required(option: Option) -> bool:
    return option.default is MISSING


def _help(option: Option) -> str:
    """The option's help; `{registered}` names the precisions registered when the parser or form is built."""
    return option.help.replace("{registered}", describe())


def _shown_default(option: Option) -> str:
    return option.text.format(option.default) if option.text else str(option.default)


def compress_config_from_options(values: Mapping[str, Any]) -> CompressConfig:
    """CompressConfig from option values keyed by public name (a parsed `earl compress` line, a job's params),
    other keys ignored; an option absent or None takes its field's default. Text (a size, a list of names) is
    read here, so a bad one is the config's ConfigError; so is a required option left out."""
    kwargs: dict[str, Any] = {}
    for option in COMPRESS_OPTIONS:
        (_, field), raw = option.fields[0], values.get(option.name)
        if raw is None:
            if _required(option):
                raise ConfigError(f"a compress search needs {option.name}")
            continue
        value = option.value(raw)
        kwargs[field] = option.type(value) if option.type in (int, float) else value
    return CompressConfig(**kwargs)


def add_compress_options(parser: argparse.ArgumentParser) -> None:
    """`earl compress`'s search options. Their defaults stay out of the namespace (compress_config_from_options
    takes the field's), and text is parsed there, not by argparse: a bad size is the command's error, exit 2."""
    for option in COMPRESS_OPTIONS:
        shown = "" if _required(option) else f" (default: {_shown_default(option)})"
        parser.add_argument(*option.flags, dest=option.name, required=_required(option), default=argparse.SUPPRESS,
                            type=str if option.text or option.choices else option.type,
                            choices=option.choices or None, metavar=option.metavar,
                            help=(_help(option) + shown).replace("%", "%%"))


def _form_field(option: Option) -> tuple[Any, Any]:
    """(type, pydantic Field) of a compress-only form field: None (not given) for a training job."""
    from pydantic import Field

    kind = Literal[option.choices] if option.choices else str if option.text else option.type
    note = ("; gives a compress job, which needs time_limit and a valid file" if _required(option)
            else f" (default: {_shown_default(option)})")
    kind, constraints = form_constraints(option, kind | None)  # max_length: one request's text stays short
    return kind, Field(None, description=f"compress job: {_help(option)}{note}", **constraints)


def compress_form_model(name: str = "CompressFields") -> type[BaseModel]:
    """The job form's compress-only fields as a pydantic model (api/schemas.py's CompressForm); the form's
    time_limit and seed come from the training table."""
    from pydantic import create_model

    fields: dict[str, Any] = {option.name: _form_field(option) for option in FORM_COMPRESS_OPTIONS}
    return create_model(name, **fields)


__all__ = ["COMPRESS_OPTIONS", "FORM_COMPRESS_OPTIONS", "SHARED_OPTIONS", "add_compress_options",
           "compress_config_from_options", "compress_form_model"]
