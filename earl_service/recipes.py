"""Training recipes: named sets of TrainConfig values per model kind, which the options a user sets override."""

from __future__ import annotations

import dataclasses
from typing import Any

from .config import ModelKind, TrainConfig
from .errors import ConfigError

PAPER, DEFAULT = "paper", "default"

# Recipe -> model kind -> TrainConfig field values over the dataclass defaults (which are the paper's). The one
# table to edit when a measurement picks better values; `paper` stays empty: it is the dataclass defaults.
RECIPES: dict[str, dict[ModelKind, dict[str, Any]]] = {
    PAPER: {"earl": {}, "rotate": {}},
    DEFAULT: {
        # bench/results/step_search_codex-s_schedules.md ("linear lr 3e-3": --lr-schedule linear --warmup 0.02
        # --lr 3e-3): valid MRR 0.2998 against the paper settings' 0.2829 at 600 steps.
        "earl": {"lr": 3e-3, "lr_schedule": "linear", "warmup": 0.02},
        "rotate": {},  # the paper's values: not searched yet
    },
}


def check_recipe(name: str) -> str:
    """`name` if it is a recipe; ConfigError listing the recipes otherwise."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return name


def recipe_fields() -> tuple[str, ...]:
    """The TrainConfig fields some recipe sets (in table order)."""
    return tuple(dict.fromkeys(field for kinds in RECIPES.values() for values in kinds.values() for field in values))


def recipe_values(name: str, model: ModelKind) -> dict[str, Any]:
    """Every field some recipe sets, at recipe `name`'s value for `model` or else the dataclass default: applying
    one recipe after another leaves nothing of the first."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return {field: RECIPES[check_recipe(name)][model].get(field, defaults[field]) for field in recipe_fields()}


__all__ = ["DEFAULT", "PAPER", "RECIPES", "check_recipe", "recipe_fields", "recipe_values"]
