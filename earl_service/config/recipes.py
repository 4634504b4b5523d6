"""Training recipes: named sets of TrainConfig values per model kind, which the options a user sets override."""

from __future__ import annotations

import dataclasses
from typing import Any

from earl_service.config import ModelKind, TrainConfig
from earl_service.errors import ConfigError

PAPER, DEFAULT = "paper", "default"

# Recipe -> model kind -> TrainConfig field values over the dataclass defaults (which are the paper's). The one
# table to edit when a measurement picks better values; `paper` stays empty: it is the dataclass defaults.
RECIPES: dict[str, dict[ModelKind, dict[str, Any]]] = {
    PAPER: {"earl": {}, "rotate": {}},
    DEFAULT: {
        # bench/results/recipes_codex-s_2min_candidates_1core*.md, 2 minutes of one core each, valid MRR: paper
        # 0.3073; cosine decay from 5e-3 0.3260 (linear 0.3234), with bf16 where it is native (more steps a
        # minute at the same quality: tests/earl_service/test_train.py, bench/results/cuda_run_fb15k-237.md).
        # The peak is 3e-3: from 5e-3 FB15k-237 diverged after 3,142 steps (recipes_fb15k-237_60min_1core.md);
        # from 3e-3 it tested 0.3080 in 60 minutes of one core, from 2e-3 0.3059
        # (recipes_fb15k-237_60min_candidates_1core.md). Batch and negatives stay the paper's: smaller batches
        # won on CoDEx-S, larger ones on FB15k-237 and WN18RR (bench/results/paper_convergence.md).
        "earl": {"lr": 3e-3, "lr_schedule": "cosine", "warmup": 0.02, "compute": "auto"},
        # bench/results/recipes_codex-s_2min_rotate_d108.md and, on a graph not tuned on,
        # recipes_fb15k-237_5min_rotate_d50.md (one core each): the paper's constant 1e-3 tested 0.2652 and 0.0105,
        # cosine decay from 1e-2 0.3946 and 0.2220, with 128 negatives a side (more steps a minute) 0.3974 and 0.2545.
        # Big tables (train/rows.py, from 500,000 entities, shared corruptions): 32 a side. Synthetic 1M entities,
        # d20, 12 minutes of one core, valid MRR on 2,000 triples (standard error ~0.0012): 128 a side 0.0085
        # (18,955 steps), 32 0.0115 (44,937), 8 0.0124 (79,893): level with 32, which keeps more negatives for
        # longer budgets (docs/scaling.md#big-rotate-tables-shared-corruptions-and-row-updates).
        "rotate": {"lr": 1e-2, "lr_schedule": "cosine", "warmup": 0.02, "negatives": 128, "big_table_negatives": 32},
    },
}

# A recipe value that refines an option the user set gives way to it: --negatives 128 on a big table keeps 128.
YIELDS_TO = {"big_table_negatives": "negatives"}


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


__all__ = ["DEFAULT", "PAPER", "RECIPES", "YIELDS_TO", "check_recipe", "recipe_fields", "recipe_values"]
