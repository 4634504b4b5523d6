"""The option table: `earl train`'s options, the API's job form and the worker's job mapping, from config fields.

Each option is a field of ModelConfig, TrainConfig or DataConfig (`--seed` is a field of the first two) declared with
`config.setting(...)`; its public name spells `--name-with-dashes` on the command line and `name` in the job
form and in a job's params. Bounds come in two tiers:
  - hard validity (`bounds`): checked by the dataclasses themselves, so the CLI, the worker and any library
    caller refuse a bad value with the same ConfigError;
  - service limits (`limits`): stricter bounds that keep one API request from asking for an absurd job
    (dim <= 1024, at most a week); only the job form applies them, on top of the hard ones.
`cli_only` options (device, threads, progress, ...) are the worker's own business and stay out of the form;
the form's service-only fields (precision, nproc_per_node) live in api/schemas.py.
An option the user gives wins over the named recipe's value (earl_service/config/recipes.py), which wins over the
dataclass default; `--config FILE` takes every setting from the file instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Literal

from earl_service.config import MODELS, DataConfig, ModelConfig, ModelKind, Text, TrainConfig
from earl_service.config.fields import out_of_bounds
from earl_service.config.recipes import DEFAULT, RECIPES, YIELDS_TO, recipe_fields, recipe_values
from earl_service.errors import ConfigError

if TYPE_CHECKING:  # pydantic comes with the service extras; `earl train` runs without it
    from pydantic import BaseModel

CONFIGS = (ModelConfig, TrainConfig, DataConfig)
GROUPS = {"model": "model", "training": "training",
          "sampled": "sampled training (graphs whose full-graph encoding does not fit)",
          "data": "data (how the triple files are read)"}


@dataclass(frozen=True)
class Option:
    """One public option and the config fields it sets."""

    name: str  # --name-with-dashes on the command line, `name` in the job form and a job's params
    fields: tuple[tuple[type, str], ...]  # (config class, field name)
    type: Any  # int, float, bool, str or the field's own type when `parsed` from text
    default: Any
    help: str
    group: str
    aliases: tuple[str, ...]
    bounds: dict[str, float]  # hard validity, checked by the config dataclass
    limits: dict[str, float]  # the service's stricter bounds, form only
    choices: tuple[str, ...]
    cli_only: bool
    metavar: str | None
    text: Text | None  # written as text ("10,10" for fanout) on the command line, in the form and in params

    @property
    def flags(self) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in (self.name, *self.aliases)]

    def value(self, raw: Any) -> Any:
        """`raw` as the config wants it: a text option is parsed from its text."""
        return self.text.parse(raw) if self.text and isinstance(raw, str) else raw


def _option(cls: type, f: dataclasses.Field, hints: dict[str, Any]) -> Option:
    meta = f.metadata
    group = meta["group"] or ("model" if cls is ModelConfig else "training")
    return Option(name=meta["option"] or f.name, fields=((cls, f.name),), type=hints[f.name], default=f.default,
                  help=meta["help"], group=group, aliases=meta["aliases"], bounds=meta["bounds"],
                  limits=meta["limits"], choices=meta["choices"], cli_only=meta["cli_only"], metavar=meta["metavar"],
                  text=meta["text"])


def field_options(cls: type) -> list[Option]:
    """The options of config dataclass `cls` (its fields declared with `setting`), in field order; a field with
    no public option (knn_temperature) has none. Also CompressConfig's (earl_service/compress/options.py)."""
    hints = typing.get_type_hints(cls)
    return [_option(cls, f, hints) for f in dataclasses.fields(cls) if f.metadata.get("option", "") is not None]


def _table() -> tuple[Option, ...]:
    """Every option in field order; a name declared by both configs (seed) becomes one option setting both."""
    table: dict[str, Option] = {}
    for cls in CONFIGS:
        for option in field_options(cls):
            if option.name in table:  # the same option: it must be declared alike in both configs
                first = table[option.name]
                assert dataclasses.replace(option, fields=first.fields, group=first.group) == first, option.name
                option = dataclasses.replace(first, fields=first.fields + option.fields)
            table[option.name] = option
    return tuple(table.values())


OPTIONS = _table()
FORM_OPTIONS = tuple(o for o in OPTIONS if not o.cli_only)


def configs_from_options(values: Mapping[str, Any], *, recipe: str | None = None) -> tuple[ModelConfig, TrainConfig]:
    """Configs from option values keyed by public name (a parsed command line, a job's params), other keys
    ignored. An option in `values` was set by the user and wins; a training field it leaves out takes recipe
    `recipe`'s value for the model kind where the recipe sets one, else the dataclass default (the paper's).
    ConfigError for a bad value or an unknown recipe."""
    kwargs: dict[type, dict[str, Any]] = {cls: {} for cls in CONFIGS}
    for option in OPTIONS:
        if option.name in values:
            for cls, field in option.fields:
                kwargs[cls][field] = option.value(values[option.name])
    model = ModelConfig(**kwargs[ModelConfig])
    base = recipe_values(recipe, model.model) if recipe else {}
    # A recipe value that refines an option yields where the user set that option (YIELDS_TO).
    base = {k: v for k, v in base.items() if YIELDS_TO.get(k) not in kwargs[TrainConfig] or k in kwargs[TrainConfig]}
    return model, TrainConfig(**{**base, **kwargs[TrainConfig]})


def train_configs_from_options(values: Mapping[str, Any], *, recipe: str | None) -> dict[ModelKind, TrainConfig]:
    """One TrainConfig per model kind, as configs_from_options for that kind (a compress job trains several)."""
    return {model: configs_from_options({**values, "model": model}, recipe=recipe)[1] for model in MODELS}


def recipe_options(recipe: str, model: ModelKind) -> dict[str, Any]:
    """The job form options recipe `recipe` sets for `model`, as the form writes them (a job's params)."""
    values, options = recipe_values(recipe, model), {}
    for option in FORM_OPTIONS:
        for cls, field in option.fields:
            if cls is TrainConfig and field in values:
                options[option.name] = option.text.format(values[field]) if option.text else values[field]
    return options


def data_config_from_options(values: Mapping[str, Any]) -> DataConfig:
    """DataConfig from option values keyed by public name, as configs_from_options."""
    names = {option.name for option in OPTIONS if option.fields[0][0] is DataConfig}
    return DataConfig(**{name: values[name] for name in names if name in values})


def data_cli_args(data: DataConfig) -> list[str]:
    """`data` as `earl train` arguments (what a re-run of the command needs to read the files alike)."""
    header = [] if data.header is None else ["--header" if data.header else "--no-header"]
    return [*header, "--columns", data.columns]


def _cli_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` for argparse: its ConfigError's message becomes argparse's ("argument --fanout: expected ...")."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _recipe_sets(option: Option) -> bool:
    """Whether some recipe sets `option`'s training field."""
    return any(cls is TrainConfig and field in recipe_fields() for cls, field in option.fields)


def _shown_default(option: Option) -> str:
    """The default as help shows it; a field some recipe sets says so (the dataclass default is the paper's)."""
    shown = option.text.format(option.default) if option.text else str(option.default)
    return f"the recipe's, else {shown}" if _recipe_sets(option) else shown


def _add_argument(group: argparse._ArgumentGroup, option: Option) -> None:
    """The option's flags; its default stays out of the namespace (argparse.SUPPRESS), so that an option in the
    parsed values is one the user gave: it wins over the recipe (configs_from_options)."""
    help_text = option.help.replace("%", "%%")
    given_only: dict[str, Any] = {"dest": option.name, "default": argparse.SUPPRESS}
    if option.type == bool | None:  # three states: --header, --no-header, or neither (detect)
        group.add_argument(*option.flags, action=argparse.BooleanOptionalAction, help=help_text, **given_only)
        return
    if option.type is bool and option.default:  # a switch that turns an option off: --no-progress
        group.add_argument(f"--no-{option.name.replace('_', '-')}", action="store_false",
                           help=f"{help_text} (default: on; this switch turns it off)", **given_only)
        return
    if option.type is bool:
        group.add_argument(*option.flags, action="store_true", help=f"{help_text} (default: off)", **given_only)
        return
    kind = _cli_type(option.text.parse) if option.text else (str if option.choices else option.type)
    default = _shown_default(option).replace("%", "%%")
    group.add_argument(*option.flags, type=kind, choices=option.choices or None, metavar=option.metavar,
                       help=f"{help_text} (default: {default})", **given_only)


def add_recipe_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--recipe: the named training settings that options not given take (`earl train`, `earl compress`)."""
    parser.add_argument("--recipe", choices=tuple(RECIPES), default=DEFAULT,
                        help="named training settings per model kind for the options not given (paper: the "
                             "paper's; default: the measured best, docs/training.md#recipes) (default: %(default)s)")


def add_train_options(parser: argparse.ArgumentParser) -> None:
    """`earl train`'s model, training, sampled-training and data option groups."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    add_recipe_option(groups["training"])
    for option in OPTIONS:
        _add_argument(groups[option.group], option)
    # The switch that --compute replaced, still accepted.
    groups["training"].add_argument("--bf16", dest="compute", action="store_const", const="bf16",
                                    default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_data_options(parser: argparse.ArgumentParser) -> None:
    """The data group alone, for commands that read a dataset without training (`earl evaluate`, `earl compress`)."""
    group = parser.add_argument_group(GROUPS["data"])
    for option in OPTIONS:
        if option.group == "data":
            _add_argument(group, option)


NUMBER_BOUNDS = ("ge", "gt", "le")  # bounds on a number; a text option's apply to each number its text holds


def form_constraints(option: Option, kind: Any) -> tuple[Any, dict[str, Any]]:
    """The type `kind` of `option`'s form field with its validator, and its pydantic Field constraints: hard
    bounds, then the service limits over them. A text option's text constraints (max_length, its pattern) go to
    the field, and its number bounds to a validator of the numbers the text holds: a fanout of 5,000 digits
    matches the pattern."""
    from pydantic import AfterValidator

    constraints: dict[str, Any] = {**option.bounds, **option.limits}
    if option.text is None:
        return kind, constraints
    numeric = {k: v for k, v in constraints.items() if k in NUMBER_BOUNDS}
    text = {k: v for k, v in constraints.items() if k not in NUMBER_BOUNDS}
    if option.text.pattern:
        text["pattern"] = option.text.pattern
    return (Annotated[kind, AfterValidator(partial(_bounded_text, option, numeric))] if numeric else kind), text


def _bounded_text(option: Option, bounds: dict[str, float], raw: str | None) -> str | None:
    """`raw` when each number of its parsed value is within `bounds`; ValueError (the form's 422) otherwise."""
    if raw is None:
        return raw
    assert option.text is not None
    try:
        value = option.text.parse(raw)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    for number in value if isinstance(value, tuple) else (value,):
        if problem := out_of_bounds(number, bounds):
            shown = f"{number}" if len(f"{number}") <= 20 else f"a number of {len(str(number))} digits"
            raise ValueError(f"{option.name}: each value {problem}, not {shown}")
    return raw


def _form_field(option: Option) -> tuple[Any, Any]:
    """(type, pydantic Field) of `option` in the job form, bounded by form_constraints."""
    from pydantic import Field

    kind, default = option.type, option.default
    if option.choices:
        kind = Literal[option.choices]
    elif option.text:
        kind, default = str, option.text.format(option.default)
    kind, constraints = form_constraints(option, kind)
    help_text = f"{option.help} (not given: the recipe's value, else this default)" if _recipe_sets(option) \
        else option.help
    return kind, Field(default, description=help_text, **constraints)


def _recipe_field() -> tuple[Any, Any]:
    from pydantic import Field

    return Literal[tuple(RECIPES)], Field(DEFAULT, description=(
        "named training settings per model kind for the options not given (paper: the paper's; default: the "
        "measured best; docs/training.md#recipes)"))


def form_model(name: str = "TrainOptions") -> type[BaseModel]:
    """The job form's training options as a pydantic model (unknown fields are the route's to refuse); which
    fields a request set (`model_fields_set`) decides what its recipe fills in (api/compress_jobs.job_params)."""
    from pydantic import ConfigDict, create_model

    fields: dict[str, Any] = {"recipe": _recipe_field(),
                              **{option.name: _form_field(option) for option in FORM_OPTIONS}}
    return create_model(name, __config__=ConfigDict(extra="ignore"), **fields)


__all__ = ["FORM_OPTIONS", "OPTIONS", "Option", "add_data_options", "field_options", "add_recipe_option", "add_train_options",
           "configs_from_options", "data_cli_args", "data_config_from_options", "form_constraints", "form_model", "recipe_options",
           "train_configs_from_options"]
