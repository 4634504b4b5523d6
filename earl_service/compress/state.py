"""A compress search's state: its candidates, its rungs and their results, saved as one JSON file for resume."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from earl_service.atomic import write_json
from earl_service.compress.config import RESERVED_RATIO, CompressConfig
from earl_service.config import ModelConfig, ModelKind, TrainConfig
from earl_service.data.dataset import Dataset
from earl_service.errors import ConfigError
from earl_service.memory import peak_rss_mb, reset_peak_rss

if TYPE_CHECKING:  # torch: the worker and the API read a job's state without it
    from earl_service.bundle.model_io import Bundle
    from earl_service.train.run import GraphCache

STATE, PICK = "compress_state.json", "bundle.safetensors"
ProgressCallback = Callable[[dict[str, Any]], None]
# One precision's export of a candidate, as the report lists it: its file bytes, its codebook fine-tuning (pq),
# the valid subset it was ranked on (0: the whole split) and its valid metrics (SUMMARY_KEYS).
Export = dict[str, Any]
# Where a search's seconds go, phase by phase (CompressRun.timed): planning (sizes and the validation timings),
# setting a candidate up (its graph features, kNN and model, loading its run), training steps, k-means of pq
# codebooks, fine-tuning them, writing exports, validating exports. What none of them holds is
# "other" in the report (saving state, the pick's file); the pick's test evaluation is timed apart as "test".
# The GraphCache key (with the graphless flag) of the packed graph, names and labels every bundle of a search
# ships: planning packs them for the sizes (candidates.plan), and every export of the search reuses them.
FIXED_PARTS = "fixed_parts"
PHASES = ("plan", "setup", "train", "codebooks", "fine_tune", "export", "validate")

# The search (search.py) leaves its simplest baseline (baseline_name: what a user would train without a search) only on
# evidence, and only at the last cut: every earlier cut keeps it, and at the last another candidate must beat it
# by more than this many standard errors of their difference on the rung's validation sample. On CoDEx-S at 1 MB
# in 10 minutes EARL d125 led RotatE d230 int8 at rung 1 by 0.003 (500 valid triples, standard errors ~0.012
# each), both went on to share the last rung, and RotatE, trained 277 s of the 600, tested 0.3830 against 0.4218
# for the same model trained alone. At 2 MB, rung 0 (each candidate at its schedule's peak rate) put RotatE d473
# at 0.1867 against EARL d182's 0.2835, cut it, and the search picked EARL (test 0.3344) where RotatE d473 trained
# alone tested 0.4218: an early rung's ranking across kinds is not evidence enough to drop the baseline.
MARGIN_SE = 2.0


def ahead(a: Export, b: Export, key: str) -> bool:
    """Whether export `a` scored above `b` on `key` by more than MARGIN_SE standard errors of the difference
    (unpaired, so on the safe side: both ranked the same triples); an export without standard errors (a job saved
    by an older version) counts its score as exact."""
    errors = [e.get("standard_error", {}).get(key, 0.0) for e in (a, b)]
    return a[key] - b[key] > MARGIN_SE * math.hypot(*errors)



def rung_sizes(count: int, eta: int) -> list[int]:
    """Candidates per rung: count, ceil(count / eta), ... down to 1."""
    sizes = [count]
    while sizes[-1] > 1:
        sizes.append(math.ceil(sizes[-1] / eta))
    return sizes


def rung_weights(rungs: int) -> list[float]:
    """Each rung's share of the search's time: each rung weighs twice the one before (two rungs get 1/3 and 2/3;
    three 1/7, 2/7, 4/7), so that the time goes to the candidates still in the race. Equal shares (successive
    halving's usual split) gave CoDEx-S's 1 MB search in 10 minutes two rungs of 287 and 248 s: the loser trained
    143 s and the pick, RotatE d230 int8, 295 s of 600, testing 0.3775 against 0.4185 for the same model trained
    alone for the 10 minutes (bench/results/compress_codex-s_1MB_10min_floor_report.md). With weights 1, 2, 3 the
    0.5 MB search's pick trained 416 s of 600 through three rungs."""
    total = 2**rungs - 1
    return [2**i / total for i in range(rungs)]


def rung_budget(time_left: float, index: int, rungs: int) -> float:
    """Rung `index`'s seconds out of the `time_left` for it and the rungs after it, by rung_weights."""
    weights = rung_weights(rungs)
    return time_left * weights[index] / sum(weights[index:])


def _known(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `values` that are fields of `cls` (a state file may carry keys this version does not read)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


@dataclass
class Candidate:
    """One (model, dim), trained once in fp32 and exported at every precision in `bytes` (each fits the budget)."""

    name: str  # "rotate-d100"
    model: ModelKind
    dim: int
    bytes: dict[str, int]  # precision -> the exact bytes of its export
    config: ModelConfig
    # One validation pass at its dim, estimated before the search and calibrated by each of its validations since
    # (calibrate); None in a job saved before the estimates, which charges its model's largest candidate's
    # (SearchState.validation_seconds). `validation_fixed` of it does not grow with the triples (every entity's
    # embeddings).
    validation_seconds: float | None = None
    validation_fixed: float = 0.0
    step_seconds: float = 0.0  # one training step at its dim, estimated before the search (0: not measured)
    train_seconds: float = 0.0  # trained so far, over every rung
    steps: int = 0
    # Its last slice's wall time besides training, fine-tuning and validating (building, loading, exporting).
    other_seconds: float = 0.0

    def validation_pass(self, by_model: Mapping[str, float]) -> float:
        """Seconds of one validation pass: its own estimate, else its model's largest candidate's."""
        return by_model[self.model] if self.validation_seconds is None else self.validation_seconds

    def validation(self, by_model: Mapping[str, float], fraction: float = 1.0) -> float:
        """Seconds of validating one export on `fraction` of the valid split: the fixed part, and the rest pro rata."""
        whole = self.validation_pass(by_model)
        fixed = min(self.validation_fixed, whole)
        return fixed + (whole - fixed) * fraction

    def calibrate(self, by_model: Mapping[str, float], seconds: float, fraction: float) -> None:
        """Scale the validation estimate to a measured validation of one export on `fraction` of the split that took
        `seconds`: the estimate's shape (fixed and per-triple parts) from before the search, its speed from now.
        On WordNet-full-noinv (8 MB, one core) planning put RotatE d27's pass at 84 s (interpolated between its
        model's largest and smallest dims) where its passes took 48 s, and the search ended 65 s before its limit."""
        predicted, whole = self.validation(by_model, fraction), self.validation_pass(by_model)
        if seconds > 0 and predicted > 0:
            scale = seconds / predicted
            self.validation_seconds, self.validation_fixed = whole * scale, min(self.validation_fixed, whole) * scale

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "config": self.config.to_dict()}

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> Candidate:
        return cls(**{**_known(cls, values), "config": ModelConfig.from_dict(values["config"])})


def family_name(model: ModelKind, ratio: float) -> str:
    """The prefix of a candidate's name: its model, and for EARL at a share other than the default its percent
    (earl-r40, earl-r2.5; shares have at most RESERVED_DECIMALS decimals, so two never share a name)."""
    return model if model != "earl" or ratio == RESERVED_RATIO else f"{model}-r{round(ratio * 100, 1):g}"


def family(candidate: Candidate) -> tuple[ModelKind, float]:
    """Which planned model a candidate belongs to: its kind and, for EARL, its reserved share (RotatE's is its
    config's default, unread)."""
    return candidate.model, candidate.config.reserved_ratio


@dataclass
class RungResult:
    """A candidate's evaluation at one rung: each export, the training behind them, the score that ranks it."""

    exports: dict[str, Export]  # by precision
    train_seconds: float
    steps: int
    score: float  # the best export's metric (CompressConfig.metric)

    def best(self, key: str) -> str:
        """The precision of its best export by metric `key`."""
        return max(self.exports, key=lambda p: self.exports[p][key])


@dataclass
class Rung:
    """One rung of successive halving: who is in it and how each did."""

    index: int
    survivors: list[str]
    results: dict[str, RungResult] = field(default_factory=dict)  # by candidate, filled as each is evaluated
    budget_seconds: float | None = None  # fixed when the rung starts: its share of the time left
    slice_seconds: float | None = None  # each survivor's share of budget_seconds
    # The cut after it, when inconclusive on its subset: the contenders' best exports validated again on the last
    # rung's sample (search.decisive), by candidate.
    revalidated: dict[str, Export] = field(default_factory=dict)
    # The rung's looks (probe.py), by candidate, the latest of each ("look": its number): the reference and each
    # challenger that learns sooner than it, validated after the same seconds of their slices; `cut`: the
    # challengers a look stopped.
    probes: dict[str, Export] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> Rung:
        results = {name: RungResult(**_known(RungResult, r)) for name, r in values["results"].items()}
        return cls(**{**_known(cls, values), "results": results})


@dataclass
class SearchState:
    """What survives a restart: the plan (candidates, rungs to run) and every rung so far. One serialised form,
    to_json/from_json, which is also the layout the state files of earlier versions have (they load as they are)."""

    settings: dict[str, Any]  # CompressConfig.settings() and the dataset's fingerprint: a resume must match them
    graph_bytes: int  # the graph and vocabularies every candidate carries
    validation_seconds: dict[str, float]  # per model: one validation pass at its largest candidate's dim
    candidates: list[Candidate]
    rung_count: int
    rungs: list[Rung] = field(default_factory=list)
    spent_seconds: float = 0.0
    done: bool = False
    seconds: dict[str, float] = field(default_factory=dict)  # per PHASES entry, over every attempt
    peak_rss_mb: dict[str, float] = field(default_factory=dict)  # per phase (and "test"): the highest RSS in it
    # Seconds that slices run in lanes (lanes.py) added beyond the search's clock: the phases' sums count every
    # lane's seconds, so they may add up to more than the wall clock by this much.
    lane_seconds: float = 0.0
    # The candidates planning found to fit the budget but dropped so that the time limit validates and trains the
    # rest (candidates.fit_to_time), by name: the report says which EARL reserved shares were cut so.
    dropped: list[str] = field(default_factory=list)

    def candidate(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "graph_bytes": self.graph_bytes,
                "validation_seconds": self.validation_seconds,
                "candidates": [c.to_json() for c in self.candidates], "rung_count": self.rung_count,
                "rungs": [r.to_json() for r in self.rungs], "spent_seconds": self.spent_seconds, "done": self.done,
                "seconds": self.seconds, "peak_rss_mb": self.peak_rss_mb, "lane_seconds": self.lane_seconds,
                "dropped": self.dropped}

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> SearchState:
        return cls(**{**_known(cls, values), "candidates": [Candidate.from_json(c) for c in values["candidates"]],
                      "rungs": [Rung.from_json(r) for r in values.get("rungs", [])]})


def dataset_fingerprint(dataset: Dataset) -> str:
    digest = hashlib.sha256()
    for part in (dataset.train, dataset.valid):
        digest.update(part.tobytes() if part is not None else b"")
    return digest.hexdigest()[:16]


def search_settings(config: CompressConfig, dataset: Dataset) -> dict[str, Any]:
    """What a resumed job must share with the one it continues: the search's settings and the data."""
    return {**config.settings(), "dataset": dataset_fingerprint(dataset)}


def load_state(out: Path, config: CompressConfig, dataset: Dataset) -> SearchState | None:
    """The saved state of a job in `out` with the same settings (None if there is none); refuses another job's."""
    path = out / STATE
    if not path.exists():
        return None
    values = json.loads(path.read_text())
    if isinstance(values.get("settings"), dict):  # written before these were settings: what the search did then
        values["settings"].setdefault("known_answers", "graph")  # the graph was kept
        values["settings"].setdefault("reserved_ratios", [RESERVED_RATIO])  # EARL at its default share
    if values.get("settings") != search_settings(config, dataset):
        raise ConfigError(f"{out} holds a compress job with other settings or data ({values.get('settings')}); "
                          "give another --out, or the same settings to continue it")
    return SearchState.from_json(values)


@dataclass
class CompressRun:
    """One compress search: its inputs, and the state that survives a restart (saved as STATE after every step)."""

    dataset: Dataset
    out: Path
    config: CompressConfig
    train_configs: Mapping[ModelKind, TrainConfig]  # how each model kind's candidates train
    state: SearchState
    on_progress: ProgressCallback | None = None
    should_stop: Callable[[], bool] | None = None
    clock: Callable[[], float] = time.monotonic  # wall seconds, for the time limit (a test's own clock)
    started: float | None = None  # clock() when this attempt started (None: now)
    spent_before: float = 0.0  # seconds earlier attempts spent
    # The dataset's graphs and what else every candidate and rung shares (the shipped bundles' packed parts),
    # built once (None: each training, evaluation and export builds its own).
    graphs: GraphCache | None = None
    kernel_seconds: float = 0.0  # loading (or building) the C++ kernel before the clock started
    lanes: Any = None  # lanes.Lanes when slices run several at once (config.parallel > 1), else None

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.clock()

    @property
    def spent(self) -> float:
        assert self.started is not None
        return self.spent_before + self.clock() - self.started

    @property
    def time_left(self) -> float:
        return max(0.0, self.config.time_limit_minutes * 60 - self.spent)

    def charge(self, phase: str, seconds: float, *, peak_mb: float = 0.0) -> None:
        """Add `seconds` to `phase`'s total (one of PHASES), and the process's peak RSS since the last charge
        (or `peak_mb`, a peak measured inside it, if higher) to `phase`'s peak; the count then restarts."""
        assert phase in PHASES, phase
        self.state.seconds[phase] = self.state.seconds.get(phase, 0.0) + max(seconds, 0.0)
        self.mark_peak(phase, peak_mb)

    def mark_peak(self, phase: str, peak_mb: float = 0.0) -> None:
        """Record the peak RSS since the last mark as `phase`'s, and restart the count (train/memory.py): each
        phase's own peak, so that a report says which one held the most (the process's is the largest)."""
        peaks = self.state.peak_rss_mb
        peaks[phase] = round(max(peaks.get(phase, 0.0), peak_rss_mb(), peak_mb), 1)
        reset_peak_rss()

    @property
    def peak_rss(self) -> float:
        """The process's peak RSS over the search so far (MB): the largest phase peak, or the count now."""
        return max([peak_rss_mb(), *self.state.peak_rss_mb.values()])

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Charge the block's wall seconds to `phase`."""
        started = self.clock()
        try:
            yield
        finally:
            self.charge(phase, self.clock() - started)

    def accounting(self) -> dict[str, float]:
        """Seconds by phase so far, with "other" the rest of what the search spent (never below 0), lanes' seconds
        beyond the wall clock included (SearchState.lane_seconds)."""
        phases = {p: round(self.state.seconds.get(p, 0.0), 3) for p in PHASES}
        spent = self.spent + self.state.lane_seconds
        return {**phases, "other": round(max(spent - sum(phases.values()), 0.0), 3)}

    def save(self) -> None:
        self.state.spent_seconds = self.spent
        write_json(self.out / STATE, self.state.to_json())

    def emit(self, stage: str, candidate: str | None = None, **extra: Any) -> None:
        if self.on_progress is not None:
            rungs = self.state.rungs
            self.on_progress({"stage": stage, "candidate": candidate, "rung": len(rungs) - 1 if rungs else None,
                              "rungs": self.state.rung_count, "time_left": self.time_left, **extra})

    def candidate(self, name: str) -> Candidate:
        return self.state.candidate(name)

    def train_config(self, name: str) -> TrainConfig:
        """How candidate `name` trains: its model kind's TrainConfig."""
        return self.train_configs[self.candidate(name).model]

    def run_dir(self, name: str) -> Path:
        return self.out / "candidates" / name

    def export_path(self, name: str, precision: str) -> Path:
        """Where candidate `name`'s best weights are saved at `precision` (evaluated, and the pick's source)."""
        return self.run_dir(name) / f"export-{precision}.safetensors"

    def shipped(self, bundle: Bundle) -> Bundle:
        """`bundle` as this search ships it: without its graph when its model is graphless (known_answers none),
        its graph, vocabularies and labels packed once per search (every candidate's are the dataset's)."""
        graphless = bundle.config.model in self.config.graphless
        shipped = bundle.without_graph() if graphless else bundle
        if self.graphs is None:
            return shipped
        return shipped.with_fixed_parts(self.graphs.shared((FIXED_PARTS, graphless), shipped.fixed_parts))

    @property
    def cache_seconds(self) -> float:
        """Seconds this process has spent building what `graphs` keeps for the rest of the search: paid once, so
        not part of the overhead a slice measures to plan the next (a lane's first slice builds its own)."""
        return 0.0 if self.graphs is None else self.graphs.build_seconds


__all__ = ["FIXED_PARTS", "MARGIN_SE", "PHASES", "PICK", "STATE", "Candidate", "CompressRun", "Export", "ProgressCallback", "Rung",
           "RungResult", "SearchState", "ahead", "family", "family_name", "load_state", "rung_budget", "rung_sizes", "rung_weights",
           "search_settings"]
