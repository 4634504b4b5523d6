"""What a compress job asks for, checked without torch (the API refuses a bad job before queueing it):
byte sizes ('2MB'), the job's settings (each field with its option, as config/fields.py declares train's), and
the bytes of the graph and vocabularies every bundle carries."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass
from typing import Any, cast

import numpy as np

from earl_service.bundle.format import graph_bytes, graph_csr, joined_strings
from earl_service.bundle.precision import Precision, choices, names
from earl_service.config import GRAPH_OPTIONAL, MODELS, ModelConfig, ModelKind, Text
from earl_service.config.fields import setting
from earl_service.data.triples import in_name_order
from earl_service.errors import ConfigError

# What compress searches by default: every registered precision (pq: at each code size that fits).
SEARCHED = names()
METRICS = {"mrr": "mrr", "hits@10": "hits_at_10"}  # --metric -> the key in evaluation results
KNOWN_ANSWERS = ("graph", "none")  # --known-answers: where a bundle's answers learn which facts are known
# The metrics key whose run of spaces pads a compress bundle's metrics to a fixed size (budget.padded_metrics):
# part of the file, never something to show.
# Raw graph and name bytes up to which the API packs them (xz -9e) to know a budget's floor exactly: past it the
# request would wait on a compression the worker repeats anyway, and the worker's exact check decides.
EXACT_FLOOR_RAW_BYTES = 2**20
RESERVED_RATIO = ModelConfig().reserved_ratio  # EARL's default share of reserved entities (`earl train`'s)
MAX_PARALLEL = 16  # most candidates trained at once (each process holds the data and its graphs)
PARALLEL_HELP = ("candidates a rung before the last trains at once, each in its own process (a CPU's threads split "
                 "among them, a GPU shared by them; each holds the data and its graphs); 1: one after another")

# SI prefixes are powers of ten (2MB = 2,000,000 bytes), as disk and network sizes are; KiB/MiB/GiB powers of two.
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"(?P<number>[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(?P<unit>[a-z]*)", re.IGNORECASE)


def parse_size(value: str | int | float) -> int:
    """Bytes from '2MB' (2 * 10**6), '1.5 MiB' (1.5 * 2**20), '500000' or '2e6' (rounded down)."""
    if isinstance(value, bool):
        raise ConfigError(f"a size must be a number of bytes or a string like '2MB', not {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), 1
    else:
        text = str(value).strip()
        match = _SIZE.fullmatch(text)
        if text.startswith("-"):
            raise ConfigError(f"a size must be positive, not {value!r}")
        if match is None or match["unit"].lower() not in _UNITS:
            raise ConfigError(f"cannot read {value!r} as a size; write e.g. 2MB (10**6 bytes), 1.5MiB (2**20), "
                              f"500000 or 2e6")
        number, unit = float(match["number"]), _UNITS[match["unit"].lower()]
    if not math.isfinite(number) or number * unit < 1:
        raise ConfigError(f"a size must be at least 1 byte, not {value!r}")
    return int(number * unit)


def split_names(text: str) -> tuple[str, ...]:
    """'earl, rotate' -> ('earl', 'rotate'): the --models and --precisions lists (and the job form's)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def split_models(text: str) -> tuple[ModelKind, ...]:
    """split_names typed as model kinds: CompressConfig refuses any other name with the choices."""
    return cast("tuple[ModelKind, ...]", split_names(text))


def checked_models(text: str) -> tuple[ModelKind, ...]:
    """split_models, each name checked now (ConfigError naming the choices): `earl compress --from`'s search at the
    budget starts after the coded sizes, and a name refused then would be a skipped row minutes later."""
    models = split_models(text)
    if error := _models_error(models):
        raise ConfigError(error)
    return models


def _models_error(models: Sequence[str]) -> str | None:
    """Why `models` is not a list of model kinds to search (None when it is): CompressConfig's and checked_models'."""
    unknown = [repr(n) for n in models if n not in MODELS] or ([] if models else ["'(none given)'"])
    return f"unknown model {', '.join(unknown)}; choose from {', '.join(MODELS)}" if unknown else None


# EARL's reserved share as compress searches it: shares of at most this many decimals (0.025, not 0.0251), so
# that two shares never round to one candidate name (earl-r2.5-d96) or one run folder.
RESERVED_DECIMALS = 3


def split_ratios(text: str) -> tuple[float, ...]:
    """'0.1, 0.4' -> (0.1, 0.4): the --reserved-ratios list (CompressConfig checks each share)."""
    try:
        return tuple(float(x) for x in split_names(text))
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as reserved ratios; write shares of the training entities, "
                          "e.g. 0.1,0.4") from None


def _ratios_error(ratios: Sequence[float]) -> str | None:
    """Why `ratios` are no reserved shares to search (None when they are)."""
    if not ratios:
        return "reserved_ratios needs at least one share, e.g. 0.1"
    bad = [r for r in ratios if not (math.isfinite(r) and 0 < r <= 1)]
    if bad:
        return f"reserved_ratios must each be above 0 and at most 1, not {', '.join(map(repr, bad))}"
    fine = [r for r in ratios if abs(r * 10**RESERVED_DECIMALS - round(r * 10**RESERVED_DECIMALS)) > 1e-6]
    if fine:
        return (f"reserved_ratios take at most {RESERVED_DECIMALS} decimals (0.025, not 0.0251), not "
                f"{', '.join(map(repr, fine))}")
    if len({round(r, RESERVED_DECIMALS) for r in ratios}) < len(ratios):
        return f"reserved_ratios lists a share twice: {', '.join(map(repr, ratios))}"
    return None


# How the size and the name lists are written in `earl compress` and the job form; each read into the config by
# compress_config_from_options (a bad one is the config's ConfigError, with the choices, not a form pattern's).
SIZE_TEXT = Text(parse_size, str)
MODELS_TEXT = Text(split_models, ",".join)
NAMES_TEXT = Text(split_names, ",".join)
RATIOS_TEXT = Text(split_ratios, lambda ratios: ",".join(f"{r:g}" for r in ratios))


def _xz_bound(raw: int) -> int:
    """Most bytes xz writes for `raw` input bytes: LZMA2 stores a chunk it cannot shrink as is (3 header bytes per
    64 KiB), plus the container's headers, index and check (far below the 2 KiB allowed here)."""
    return raw + 3 * -(-raw // 2**16) + 2048


def budget_floor(max_bytes: int, triples: np.ndarray, entities: Sequence[str], relations: Sequence[str], *,
                 graph: bool = True) -> int | None:
    """graph_bytes when `max_bytes` cannot hold it, else None; None too when it is unknown without packing a graph
    larger than EXACT_FLOOR_RAW_BYTES (the worker's exact check decides then). A budget above the raw bytes' xz
    bound needs no packing at all. graph=False: the floor of a bundle without the graph (names only)."""
    triples = triples if graph else np.zeros((0, 3), dtype=np.int64)
    raw = [len(graph_csr(triples, len(entities), len(relations))), len(joined_strings(list(entities))),
           len(joined_strings(list(relations)))]
    if max_bytes > sum(map(_xz_bound, raw)) or sum(raw) > EXACT_FLOOR_RAW_BYTES:
        return None
    triples, entities = in_name_order(triples, entities)  # as the worker's load_dataset numbers them
    floor = graph_bytes(triples, entities, relations)
    return floor if max_bytes <= floor else None


def _precision_error(name: str) -> str | None:
    """Why `name` is no precision to search (None: it is one)."""
    try:
        Precision.parse(name)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class CompressConfig:
    """What to search: the byte and time budgets, the models and precisions, the metric that picks. Each field
    is an `earl compress` option and a job form field (earl_service/compress/options.py); `limits` bound the
    form's text."""

    max_bytes: int = setting(MISSING, "most bytes the bundle file may take: 2MB (= 2,000,000: kB/MB/GB are powers "
                                      "of 10), 1.5MiB (= 1.5 * 2**20: KiB/MiB/GiB are powers of 2), 500000 or 2e6",
                             metavar="SIZE", limits={"max_length": 40, "le": 10**12}, text=SIZE_TEXT)
    time_limit_minutes: float = setting(MISSING, "minutes for the search (training, validation, exports; the final "
                                                 "test evaluation comes after)", option="time_limit",
                                        metavar="MINUTES")
    models: tuple[ModelKind, ...] = setting(MODELS, f"comma-separated models to search, from {', '.join(MODELS)}",
                                            limits={"max_length": 200}, text=MODELS_TEXT)
    precisions: tuple[str, ...] = setting(
        SEARCHED, "comma-separated precisions to export, from {registered}; pq alone: each code size that fits "
                  "(GET /precisions lists them)", limits={"max_length": 200}, text=NAMES_TEXT)
    reserved_ratios: tuple[float, ...] = setting(
        (RESERVED_RATIO,), "comma-separated shares of the training entities that EARL candidates give a row of their "
                           "own (each above 0, at most 1, 3 decimals): each share's candidates are planned at their "
                           "own dims (named earl-r40-d85 for 0.4; no rN at the default share); RotatE has none",
        metavar="RATIOS", limits={"max_length": 100}, text=RATIOS_TEXT)
    known_answers: str = setting(
        "graph", "how answers leave out facts the training graph holds: graph (every bundle carries the graph) or "
                 "none (RotatE bundles leave it out and spend its bytes on weights, so their answers include known "
                 "facts; EARL's encoder reads the graph and keeps it)", choices=KNOWN_ANSWERS)
    metric: str = setting("mrr", "the validation metric that picks", choices=tuple(METRICS))
    seed: int = setting(0, "seed of every candidate's training and of the pq codebooks")
    eta: int = setting(2, "successive halving keeps the best 1/eta of the candidates at each rung", option=None)
    # Where and how the search runs, not what it searches (as --device and --threads): `earl compress --parallel`,
    # `earl worker --compress-parallel`; no job form field, and a resumed job may change it.
    parallel: int = setting(1, PARALLEL_HELP, option=None)

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ConfigError(f"max_bytes must be at least 1, not {self.max_bytes}")
        if not self.time_limit_minutes > 0:
            raise ConfigError(f"the time limit must be positive, not {self.time_limit_minutes} minutes")
        if error := _models_error(self.models):
            raise ConfigError(error)
        errors = [e for n in self.precisions if (e := _precision_error(n))]
        if errors or not self.precisions:
            raise ConfigError("; ".join(errors) or f"unknown precision '(none given)'; choose {choices()}")
        if error := _ratios_error(self.reserved_ratios):
            raise ConfigError(error)
        if self.known_answers not in KNOWN_ANSWERS:
            raise ConfigError(f"unknown known_answers {self.known_answers!r}; choose from {', '.join(KNOWN_ANSWERS)}")
        if self.metric not in METRICS:
            raise ConfigError(f"unknown metric {self.metric!r}; choose from {', '.join(METRICS)}")
        if self.eta < 2:
            raise ConfigError("eta must be at least 2")
        if not 1 <= self.parallel <= MAX_PARALLEL:
            raise ConfigError(f"parallel must be between 1 and {MAX_PARALLEL}, not {self.parallel}")

    def settings(self) -> dict[str, Any]:
        """What a resumed job must share with the one it continues (the time limit may change)."""
        return {"max_bytes": self.max_bytes, "models": list(self.models), "precisions": list(self.precisions),
                "reserved_ratios": list(self.reserved_ratios), "known_answers": self.known_answers, "metric": self.metric, "seed": self.seed, "eta": self.eta}

    @property
    def graphless(self) -> tuple[ModelKind, ...]:
        """The models whose bundles leave the training graph out."""
        return tuple(m for m in self.models if m in GRAPH_OPTIONAL) if self.known_answers == "none" else ()

    @property
    def could_leave_graph(self) -> tuple[ModelKind, ...]:
        """The models searched that keep the graph but could leave it out (known_answers none): a way out of a
        budget the graph fills."""
        return tuple(m for m in self.models if m in GRAPH_OPTIONAL and m not in self.graphless)


__all__ = ["EXACT_FLOOR_RAW_BYTES", "KNOWN_ANSWERS", "METRICS", "RESERVED_RATIO", "SEARCHED", "CompressConfig", "budget_floor",
           "parse_size", "split_models", "split_names", "split_ratios"]
