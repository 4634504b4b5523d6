"""Configuration as frozen dataclasses: what the model is and how it is trained, each field with its option."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

from earl_service.core import rotate, scorers
from earl_service.core.scorers import IMPORTED, ImportedKind
from earl_service.errors import ConfigError

TrainedKind = Literal["earl", "rotate"]
# A bundle's model: one trained here, or an imported one (`earl import`), named by its scorer (core/scorers.py).
ModelKind = TrainedKind | ImportedKind
MODELS: tuple[TrainedKind, ...] = get_args(TrainedKind)  # what `earl train`, the job form and compress offer
# The models whose bundles may leave the training graph out: RotatE and the imported ones keep a row per entity and
# read the graph only to tell known answers apart; EARL's encoder rebuilds every entity from it.
GRAPH_OPTIONAL: tuple[ModelKind, ...] = ("rotate", *IMPORTED)
ABLATIONS = ("no_reserved", "no_conrel", "no_knn", "no_conrel_knn", "no_mulhop")
_BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b), "le": ("<=", lambda v, b: v <= b)}


class Text(NamedTuple):
    """How an option that is not a plain number is written as text (command line, job form) and read back."""

    parse: Callable[[str], Any]
    format: Callable[[Any], str]
    pattern: str | None = None  # what the job form accepts (None: any text; the config's own check decides)


def setting(default: Any, help: str, *, option: str | None = "", group: str = "", aliases: tuple[str, ...] = (),
            bounds: dict[str, float] | None = None, limits: dict[str, float] | None = None,
            choices: tuple[str, ...] = (), accepts: tuple[str, ...] = (), cli_only: bool = False,
            metavar: str | None = None, text: Text | None = None) -> Any:
    """A config field with what earl_service/config/options.py needs to offer it as `earl train --NAME` and as a job
    form field: `option` is its public name ("" for the field's own name, None for no option at all); a
    `default` of dataclasses.MISSING makes a required field (and option);
    `bounds` (ge/gt/le) are hard validity, checked here for every caller; `limits` are the service's stricter
    bounds on a job (the API form only); `accepts` are values the config takes beyond the `choices` its option
    offers (an imported model's scorer: no option trains one); `cli_only` keeps an option out of the job form."""
    metadata = {"help": help, "option": option, "group": group, "aliases": aliases, "bounds": bounds or {},
                "limits": limits or {}, "choices": choices, "accepts": accepts, "cli_only": cli_only,
                "metavar": metavar, "text": text}
    return dataclasses.field(default=default, metadata=metadata)


def out_of_bounds(value: Any, bounds: dict[str, float]) -> str | None:
    """'must be >= 1' when `value` breaks one of `bounds` (ge/gt/le), else None."""
    for key, bound in bounds.items():
        sign, holds = _BOUNDS[key]
        if not holds(value, bound):
            return f"must be {sign} {bound}"
    return None


def _check_fields(config: Any) -> None:
    """ConfigError for a field outside its declared bounds (each value of a tuple) or choices; names the option
    where it differs."""
    for f in dataclasses.fields(config):
        value, meta = getattr(config, f.name), f.metadata
        values = value if isinstance(value, tuple) else (value,)
        problem = next(filter(None, (out_of_bounds(v, meta.get("bounds", {})) for v in values)), None)
        allowed = (*meta.get("choices", ()), *meta.get("accepts", ()))
        if allowed and value not in allowed:
            problem = "must be one of " + ", ".join(map(repr, allowed))
        if problem:
            name = f.name if meta.get("option") in ("", None, f.name) else f"{f.name} (option {meta['option']})"
            raise ConfigError(f"{name} {problem}, not {value!r}")


def parse_fanout(text: str) -> tuple[int, ...]:
    """'10,10' or 'all,5' (all = 0: every edge) as the fan-out tuple."""
    try:
        values = tuple(0 if x.strip() == "all" else int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"expected comma-separated integers like 10,10, not {text!r}") from None
    if any(v < 0 for v in values):
        raise ConfigError("fan-outs must be >= 0 (0: every edge)")
    return values


# At most 8 hops in a job: more would only repeat the last value.
FANOUT_TEXT = Text(parse_fanout, lambda values: ",".join(map(str, values)), r"^(\d+|all)(,(\d+|all)){0,7}$")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture. `dim` counts complex dimensions: an entity is 2*dim reals, a relation dim phases. An imported
    model (`model` a scorer of core/scorers.py) has entity rows of 2*dim reals too, its relation rows as its scorer
    says; the other fields keep their defaults and mean nothing to it."""

    model: ModelKind = setting("earl", "EARL, or the RotatE baseline (one embedding row per entity)",
                               choices=MODELS, accepts=IMPORTED)
    dim: int = setting(150, "complex dimensions (2*dim reals per entity)", bounds={"ge": 1}, limits={"le": 1024})
    reserved_ratio: float = setting(0.1, "share of training entities with their own embedding row",
                                    bounds={"ge": 0.0, "le": 1.0})
    k: int = setting(10, "nearest reserved entities per entity (kNResEnt)", bounds={"ge": 1}, limits={"le": 100})
    # Fixed as in the reference, so no option: softmax(sim / 0.2) over the k similarities.
    knn_temperature: float = setting(0.2, "kNResEnt softmax temperature", option=None, bounds={"gt": 0.0})
    layers: int = setting(2, "GNN layers (MulHop)", bounds={"ge": 0}, limits={"le": 8})
    gamma: float = setting(10.0, "RotatE margin", aliases=("margin",), bounds={"gt": 0.0}, limits={"le": 1000.0})
    epsilon: float = setting(2.0, "RotatE phase scaling: phase = r / ((gamma + epsilon) / dim) * pi",
                             bounds={"ge": 0.0}, limits={"le": 1000.0})
    # The paper's ablations (Tables 2 and 3).
    no_reserved: bool = setting(False, "ablation: no reserved entities, hence no kNResEnt either")
    no_conrel: bool = setting(False, "ablation: no ConRel (relational features)")
    no_knn: bool = setting(False, "ablation: no kNResEnt")
    no_conrel_knn: bool = setting(False, "ablation: fixed random GNN inputs instead of ConRel + kNResEnt")
    no_mulhop: bool = setting(False, "ablation: no GNN; the encoder output is the combined ConRel/kNResEnt "
                                     "representation")
    seed: int = setting(0, "seed of the reserved entities, the initial weights, the batches and the negatives",
                        bounds={"ge": 0}, limits={"le": 2**31 - 1})
    # An imported model's only (no option trains one): LibKGE's reciprocal relations (core/scorers.py), RotatE's too.
    reciprocal: bool = setting(False, "head queries through inverse relation rows R..2R-1", option=None)

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.reciprocal and self.model == "earl":
            raise ConfigError("reciprocal relations are an imported model's; EARL has none")

    @property
    def uses_reserved(self) -> bool:
        return not self.no_reserved and self.reserved_ratio > 0

    @property
    def uses_knn(self) -> bool:
        return self.uses_reserved and not (self.no_knn or self.no_conrel_knn)

    @property
    def uses_conrel(self) -> bool:
        return not (self.no_conrel or self.no_conrel_knn)

    @property
    def gnn_layers(self) -> int:
        return 0 if self.no_mulhop else self.layers

    @property
    def graph_options(self) -> dict[str, Any]:
        """`build_graph` keywords for this model: kNResEnt's k and temperature, and input-row grouping, which
        only the EARL encoder reads (RotatE never builds h0, so grouping would be wasted start-up work)."""
        return {"k": self.k, "temperature": self.knn_temperature, "compact": self.model == "earl"}

    @property
    def embedding_range(self) -> float:
        return (self.gamma + self.epsilon) / self.dim

    @property
    def phase_scale(self) -> float:
        """Radians per unit of a raw relation value (core.rotate.phase_scale)."""
        return rotate.phase_scale(gamma=self.gamma, epsilon=self.epsilon, dim=self.dim)

    def scorer(self) -> scorers.Scorer:
        """What scores this model's triples (core/scorers.py): RotatE with this phase scale, or the imported one."""
        return scorers.scorer(self.model, gamma=self.gamma, epsilon=self.epsilon, dim=self.dim,
                              reciprocal=self.reciprocal)

    def to_dict(self) -> dict[str, Any]:
        """The fields; `reciprocal` only where set, so that every other bundle's header stays as it was."""
        values = dataclasses.asdict(self)
        if not self.reciprocal:
            del values["reciprocal"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


COMPUTE = ("fp32", "bf16", "auto")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation. Defaults are the paper's (batch 1024, 256 negatives per side, Adam 1e-3, margin 10)."""

    steps: int = setting(100_000, "training steps", bounds={"ge": 0}, limits={"le": 10_000_000})
    batch_size: int = setting(1024, "positive triples per step", bounds={"ge": 1}, limits={"le": 65_536})
    negatives: int = setting(256, "negatives per side (this many head and this many tail corruptions)",
                             bounds={"ge": 1}, limits={"le": 4096})
    big_table_negatives: int = setting(0, "negatives per side for RotatE on a big table (from 500,000 entities on a "
                                          "CPU, where positives share corruptions; docs/scaling.md): fewer buy more "
                                          "steps there (0: --negatives)", bounds={"ge": 0}, limits={"le": 4096})
    lr: float = setting(1e-3, "Adam learning rate", bounds={"gt": 0.0}, limits={"le": 1.0})
    lr_schedule: str = setting("constant", "the rate over the budget (--steps or --time-limit, whichever ends "
                                           "first): constant, or warm-up then cosine or linear decay to --lr-floor",
                               choices=("constant", "cosine", "linear"))
    warmup: float = setting(0.0, "fraction of the budget spent warming the rate up from 0 (decaying schedules)",
                            bounds={"ge": 0.0, "le": 1.0})
    lr_floor: float = setting(0.0, "the decayed rate at the end of the budget, as a fraction of --lr",
                              bounds={"ge": 0.0, "le": 1.0})
    decay_share: float = setting(1.0, "the last fraction of the budget a decaying schedule decays over; the rate "
                                      "holds at --lr before it (1: it decays from the warm-up's end)",
                                 bounds={"gt": 0.0, "le": 1.0}, cli_only=True)
    encoder_lr: float = setting(0.0, "Adam rate of EARL's shared encoder weights (0: --lr); --lr then applies "
                                     "to the tables (reserved entities, relations)", bounds={"ge": 0.0},
                                limits={"le": 1.0})
    adversarial_temperature: float = setting(1.0, "self-adversarial temperature alpha", option="temperature",
                                             bounds={"ge": 0.0}, cli_only=True)
    eval_every: int = setting(100, "steps between validations (0: no validation during training)",
                              bounds={"ge": 0}, limits={"le": 10_000_000})
    patience: int = setting(20, "validations without improvement before early stopping", bounds={"ge": 0},
                            limits={"ge": 1, "le": 10_000})
    eval_batch_size: int = setting(256, "queries per evaluation batch", bounds={"ge": 1}, cli_only=True)
    eval_max_triples: int = setting(0, "validate on a fixed random subset of this many valid triples (0: all)",
                                    bounds={"ge": 0}, cli_only=True)
    time_limit_minutes: float = setting(0.0, "stop training after this many minutes (0: no limit)",
                                        option="time_limit", metavar="MINUTES", bounds={"ge": 0.0},
                                        limits={"le": 7 * 24 * 60})
    schedule_minutes: float = setting(0.0, "the budget a decaying schedule decays over, in minutes (0: whichever of "
                                           "--steps and --time-limit ends first)", bounds={"ge": 0.0}, cli_only=True)
    # Where in the run's training time that budget starts (compress: each slice of a candidate decays on its own).
    schedule_start_minutes: float = setting(0.0, "training minutes before the schedule's budget starts", option=None,
                                            bounds={"ge": 0.0})
    checkpoint_every: int = setting(100, "steps between resumable checkpoints (0: none)", bounds={"ge": 0},
                                    cli_only=True)
    compute: str = setting("fp32", "number type of the encoder's dense maps: fp32, bf16 (autocast; fp32 master "
                                   "weights and loss) or auto (bf16 where the CPU or GPU multiplies bf16 natively: "
                                   "AVX512-BF16, AMX, CUDA; else fp32)", choices=COMPUTE, cli_only=True)
    device: str = setting("auto", "auto | cpu | cuda | cuda:N", cli_only=True)
    cuda_graphs: bool = setting(False, "capture the training step in a CUDA graph and replay it (one GPU, full-graph "
                                       "fp32 steps; each epoch's last partial batch is skipped)", cli_only=True)
    row_updates: str = setting("auto", "RotatE: gather, differentiate and update (lazy Adam) only the entity rows "
                                       "each step touches: on, off, or auto (on a CPU where a step draws fewer "
                                       "entity ids than the table has rows)",
                               choices=("auto", "on", "off"), cli_only=True)
    threads: int = setting(0, "torch intra-op threads (0: leave torch's default)", bounds={"ge": 0}, cli_only=True)
    seed: int = setting(0, "seed of the reserved entities, the initial weights, the batches and the negatives",
                        bounds={"ge": 0}, limits={"le": 2**31 - 1})
    progress: bool = setting(True, "a progress bar while training", cli_only=True)
    # Sampled (mini-batch) training: each batch encodes only its entities and negatives through sampled
    # neighbourhoods (earl_service/train/sampling.py) instead of the whole graph.
    sampled: bool = setting(False, "encode each batch's entities and negatives through sampled neighbourhoods "
                                   "only", group="sampled")
    fanout: tuple[int, ...] = setting((10, 10), "edges drawn per entity at hop 1, 2, ... (0 or 'all': every edge)",
                                      group="sampled", metavar="N,N", text=FANOUT_TEXT, bounds={"ge": 0},
                                      limits={"le": 100_000})
    negative_chunk: int = setting(0, "this many positives share one draw of negatives (0: each positive its own in "
                                     "full-graph steps, the whole batch in sampled ones)",
                                  group="sampled", metavar="C", bounds={"ge": 0}, limits={"le": 65_536})

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanout", tuple(int(x) for x in self.fanout))  # JSON gives a list
        _check_fields(self)
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if not self.fanout:
            raise ConfigError("fanout needs at least one value (0: every edge)")

    def fanout_for(self, layers: int) -> list[int | None]:
        """One fan-out per GNN layer: extra values are ignored, missing ones repeat the last; 0 -> None (all)."""
        values = [self.fanout[min(i, len(self.fanout) - 1)] for i in range(layers)]
        return [x or None for x in values]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        if values.get("bf16") and "compute" not in values:  # a config written before `compute` replaced `bf16`
            values = {**values, "compute": "bf16"}
        return cls(**{k: v for k, v in values.items() if k in names})


COLUMN_ORDERS = ("h,r,t", "h,t,r", "r,h,t", "r,t,h", "t,h,r", "t,r,h")


@dataclass(frozen=True)
class DataConfig:
    """How triple files are read where their content leaves a choice: a header row, the order of the columns."""

    header: bool | None = setting(None, "the first line is a header to skip (--no-header: it is a triple); default: "
                                        "detected from its names (head/relation/tail, subject/predicate/object, ...)",
                                  group="data")
    columns: str = setting("h,r,t", "the order of head (h), relation (r) and tail (t) in a row, e.g. h,t,r; a "
                                    "detected header's names win over the default", group="data",
                           choices=COLUMN_ORDERS)

    def __post_init__(self) -> None:
        _check_fields(self)

    @property
    def order(self) -> tuple[int, int, int]:
        """The positions of (head, relation, tail) in a row."""
        letters = self.columns.split(",")
        return letters.index("h"), letters.index("r"), letters.index("t")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


__all__ = ["ABLATIONS", "COLUMN_ORDERS", "COMPUTE", "GRAPH_OPTIONAL", "IMPORTED", "DataConfig", "ModelConfig", "Text",
           "TrainConfig", "TrainedKind", "parse_fanout", "setting"]
