"""The candidates of a compress search: each (model, dim) whose exports fit the byte budget, and as many of them
as the time limit can validate."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from functools import partial

from earl_service.bundle.codebooks import NUMBERS_PER_CODE, codes_for, default_codes
from earl_service.bundle.precision import Precision, ProductQuantized
from earl_service.bundle.sizes import MIN_DIM, BundleSizes
from earl_service.compress.config import RESERVED_RATIO, CompressConfig
from earl_service.compress.costs import largest_validation_seconds, measure_costs, with_estimates
from earl_service.compress.state import (
    FIXED_PARTS,
    Candidate,
    SearchState,
    family,
    family_name,
    rung_sizes,
    rung_weights,
    search_settings,
)
from earl_service.config import ModelKind, TrainConfig
from earl_service.data.dataset import Dataset
from earl_service.errors import ConfigError
from earl_service.train.run import GraphCache

log = logging.getLogger(__name__)

EVAL_SHARE = 0.5  # most of the time limit the search's validations may take (candidates are dropped to fit)
# Steps the first rung should give every candidate. At 116,650 entities (WordNet-full-noinv, 2 MB, 10 minutes, 2
# cores) the search kept all 9 candidates that fit, and rung 0's 11-s slices trained EARL d96 for 3 steps and
# d80 for 1: every export validated at chance (MRR 0.0003-0.0005), so the ranking was noise.
MIN_FIRST_STEPS = 100
PQDim = Callable[[BundleSizes, ModelKind, int], int | None]


def plan(dataset: Dataset, config: CompressConfig, train_configs: Mapping[ModelKind, TrainConfig], *,
         early_fraction: float, graphs: GraphCache | None = None) -> SearchState:
    """A new search: the candidates that fit the budget, their validations timed here, as many kept as the time
    limit can validate (`early_fraction`: the share of a whole validation a rung before the last costs).
    Timing the validations is part of the search: on one core it took 3 of FB15k-237's 60 minutes at 8 MB.
    `graphs`: the search's cache, so that the graphs and known answers built for the timings serve it too."""
    started = time.monotonic()
    sizes = BundleSizes(dataset, seed=config.seed, graphless=config.graphless)
    candidates = plan_candidates(sizes, config)
    measured = measure_costs(dataset, candidates, train_configs, graphs)
    planned, seconds = with_estimates(candidates, measured), largest_validation_seconds(measured)
    candidates = fit_to_time(config, planned, seconds, early_fraction)
    # What the candidates carry: a graphless search's RotatE packs no graph (xz over a 10M-triple graph took minutes
    # of a 1M-entity search's planning for this one figure).
    fixed = max(sizes.fixed_bytes(model) for model in {c.model for c in candidates})
    if graphs is not None:  # packed here for the sizes: the same parts every bundle of the search ships
        for graphless in {model in sizes.graphless for model in {c.model for c in candidates}}:
            graphs.shared((FIXED_PARTS, graphless), partial(sizes.fixed_parts, graphless))
    return SearchState(settings=search_settings(config, dataset), graph_bytes=fixed,
                       validation_seconds=seconds, candidates=candidates,
                       rung_count=len(rung_sizes(len(candidates), config.eta)),
                       spent_seconds=time.monotonic() - started,
                       dropped=[c.name for c in planned if c not in candidates])


# ---------------------------------------------------------------- what fits the byte budget


def plan_candidates(sizes: BundleSizes, config: CompressConfig) -> list[Candidate]:
    """Per model: the largest dim that fits at each precision (and pq code size), and half the smallest of those;
    each trained once in fp32 and exported at every precision that fits at its dim. Raises when nothing fits."""
    candidates = []
    uniform = [p for p in config.precisions if not Precision.parse(p).codes_tables]
    for model in config.models:
        for prefix, at in shares(sizes, config, model):
            tops = [d for p in uniform if (d := at.max_dim(model, p, config.max_bytes))]
            tops += [d for dim_of in pq_searches(config) if (d := dim_of(at, model, config.max_bytes))]
            if not tops:
                continue
            dims = set(tops) | ({min(tops) // 2} if min(tops) // 2 >= MIN_DIM else set())
            for dim in sorted(dims, reverse=True):
                wanted = uniform + pq_precisions(at, config, model, dim)
                fitting = {p: b for p in wanted if (b := at.bytes(model, dim, p)) <= config.max_bytes}
                if not fitting:  # half a pq:M dim that M does not divide, or where M codes nothing
                    continue
                candidates.append(Candidate(name=f"{prefix}-d{dim}", model=model, dim=dim, bytes=fitting,
                                            config=at.config(model, dim)))
    if not candidates:
        floors = uniform or [ProductQuantized.FALLBACK.name]  # pq alone: no smaller than its fallback's weights
        smallest = min((at.bytes(m, MIN_DIM, p), m, p) for m in config.models for _, at in shares(sizes, config, m)
                       for p in floors)
        raise ConfigError(
            f"max_bytes {config.max_bytes} is below the smallest bundle for this graph: {smallest[0]} bytes "
            f"({smallest[1]} dim {MIN_DIM} {smallest[2]}); the graph and vocabularies alone take "
            f"{sizes.fixed_bytes()} bytes{_smallest_without_graph(sizes, config, floors)}")
    return candidates


def shares(sizes: BundleSizes, config: CompressConfig, model: ModelKind) -> list[tuple[str, BundleSizes]]:
    """Where `model`'s candidates are planned: (the name their dims follow, the sizes at that share) for each of
    EARL's reserved shares (config.reserved_ratios: `earl` at the default share, `earl-r40` at 0.4), RotatE's one
    table (`rotate`). A share is a model of its own: its widest dims and their halves, its own bytes."""
    if model != "earl":
        return [(model, sizes)]
    return [(family_name(model, ratio), sizes.with_reserved_ratio(ratio)) for ratio in config.reserved_ratios]


def _smallest_without_graph(sizes: BundleSizes, config: CompressConfig, floors: list[str]) -> str:
    """The way out of a budget the graph fills: the models that could leave it out, and their smallest bundle then
    (MIN_DIM at the smallest precision asked, pq codes included)."""
    optional = config.could_leave_graph
    if not optional:
        return ""
    bare = sizes.leaving_out_graph(optional)
    smallest = min(((bare.bytes(m, MIN_DIM, p), m, p) for m in optional
                    for p in dict.fromkeys(floors + pq_precisions(bare, config, m, MIN_DIM))), default=None)
    if smallest is None:
        return ""
    if smallest[0] > config.max_bytes:
        return f"; without the graph (--known-answers none) {smallest[1]} still takes {smallest[0]} bytes"
    return (f"; {smallest[1]} fits without the graph, from {smallest[0]} bytes ({smallest[1]} dim {MIN_DIM} "
            f"{smallest[2]}): --known-answers none (a job's known_answers=none; answers may then include facts the "
            "graph holds)")


def pq_searches(config: CompressConfig) -> list[PQDim]:
    """For each pq spelling asked for, how to find the largest dim that fits: `pq` at each NUMBERS_PER_CODE,
    `pq:M` with M fixed (dims where M divides 2 * dim)."""
    searches: list[PQDim] = []
    for precision in map(Precision.parse, config.precisions):
        if isinstance(precision, ProductQuantized) and not precision.codes:
            searches += [partial(_pq_dim_per_code, per_code=n) for n in NUMBERS_PER_CODE]
        elif isinstance(precision, ProductQuantized):
            searches.append(partial(_pq_dim_fixed, codes=precision.codes))
    return searches


def _pq_dim_per_code(sizes: BundleSizes, model: ModelKind, max_bytes: int, *, per_code: int) -> int | None:
    dim = sizes.max_pq_dim(model, per_code, max_bytes)
    return dim if dim and sizes.pq_codes(model, dim, ProductQuantized(codes_for(dim, per_code) or 0)) else None


def _pq_dim_fixed(sizes: BundleSizes, model: ModelKind, max_bytes: int, *, codes: int) -> int | None:
    dim = sizes.max_pq_codes_dim(model, codes, max_bytes)
    return dim if dim and sizes.pq_codes(model, dim, ProductQuantized(codes)) else None


def pq_precisions(sizes: BundleSizes, config: CompressConfig, model: ModelKind, dim: int) -> list[str]:
    """The pq:M exports of a (model, dim) candidate: each asked-for code size that divides its rows and codes at
    least one table (one that codes none would be int8 by another name)."""
    out = []
    for precision in map(Precision.parse, config.precisions):
        m = precision.codes if isinstance(precision, ProductQuantized) else None
        codes = [codes_for(dim, n) for n in NUMBERS_PER_CODE] if m == 0 else [m] if m else []
        out += [ProductQuantized(c).name for c in codes
                if c and (2 * dim) % c == 0 and sizes.pq_codes(model, dim, ProductQuantized(c))]
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------- which exports a candidate fine-tunes


def dominated(candidate: Candidate) -> list[str]:
    """The pq precisions of `candidate` that an export keeping its tables (int8, fp16, fp32) outranks: both fit
    the budget and come from the same weights, the pq one coded more coarsely. They validated lower in every
    search so far, fine-tuned or not (CoDEx-S at 1 MB: RotatE d230 int8 0.3926, its fine-tuned pq:230 0.3620)."""
    coded = [p for p in candidate.bytes if Precision.parse(p).codes_tables]
    return coded if len(coded) < len(candidate.bytes) else []


def tuned_precisions(candidate: Candidate) -> list[str]:
    """The candidate's pq precisions that get codebook fine-tuning: only those that may be the pick, the ones no
    table-keeping export outranks (dominated). Fine-tuning dominated ones took 75 s (13%) of CoDEx-S's 1 MB
    search in 10 minutes, which int8 then won."""
    skipped = dominated(candidate)
    return [p for p in candidate.bytes if Precision.parse(p).codes_tables and p not in skipped]


def fine_tuned(candidate: Candidate) -> bool:
    """Whether any of the candidate's exports gets codebook fine-tuning (tuned_precisions)."""
    return bool(tuned_precisions(candidate))


# ---------------------------------------------------------------- what fits the time limit


def valid_fraction(dataset: Dataset, limit: int) -> float:
    """The share of a whole validation that one on at most `limit` triples costs (0: the whole split): of the
    triples a pass ranks (the seen ones), which on a graph with unseen entities in valid are fewer than the split."""
    return min(1.0, limit / max(dataset.seen_count("valid"), 1)) if limit else 1.0


def validation_cost(candidates: list[Candidate], seconds: Mapping[str, float], eta: int,
                    early_fraction: float = 1.0) -> float:
    """Seconds the whole halving schedule spends validating: every export of each rung's survivors, on the
    subset (`early_fraction` of a whole validation) before the last rung."""
    sizes = rung_sizes(len(candidates), eta)
    return sum(len(c.bytes) * (c.validation(seconds, early_fraction) * sum(sizes[:-1]) + c.validation(seconds)
                               * sizes[-1]) for c in candidates) / len(candidates)


def first_rung_trains(candidates: list[Candidate], config: CompressConfig, seconds: Mapping[str, float],
                      early_fraction: float = 1.0) -> bool:
    """Whether rung 0's slices of the time limit (its rung_weights share, split equally) leave every candidate at
    least as many seconds of training as of validating, and MIN_FIRST_STEPS steps at its measured step time
    (before its other overheads, which the rung measures)."""
    sizes = rung_sizes(len(candidates), config.eta)
    share = config.time_limit_minutes * 60 * rung_weights(len(sizes))[0] / len(candidates)
    first = early_fraction if len(sizes) > 1 else 1.0
    for c in candidates:
        validate = c.validation(seconds, first) * len(c.bytes)
        if share - validate < max(validate, MIN_FIRST_STEPS * c.step_seconds):
            return False
    return True


def baseline_candidate(candidates: list[Candidate]) -> Candidate | None:
    """The simplest baseline among one model's candidates, a user's obvious choice: the widest exported at int8
    (four times fp32's dims for a few thousandths of MRR); where no int8 fits, the widest exported at `--precision
    pq`'s own code size (default_codes: about DEFAULT_NUMBERS_PER_CODE numbers a byte); else the narrowest. When
    the time allows one candidate per model, this is the one kept: at CoDEx-S 1 MB in 3 minutes the search kept
    RotatE d604 pq:151 (the widest) and tested 0.3465, where RotatE d230 int8 alone tested 0.4011
    (bench/results/compress_codex-s_3min.md). Where only pq fits, every pick so far coded 4 numbers a byte: WordNet-full
    2 MB in 30 minutes (one core) picked d16 pq:8 (0.4235) over d32 pq:8, and once the plan widened and kept the
    widest, d44 pq:11 tested 0.3276; the 1M-entity graph at 8 MB picked d14 pq:7 over d28 pq:7. Among EARL's
    reserved shares, the baseline is at the share a user gets without asking (primary_family)."""
    if not candidates:
        return None
    candidates = primary_family(candidates)
    int8 = [c for c in candidates if "int8" in c.bytes]
    default_pq = [c for c in candidates if ProductQuantized(default_codes(c.dim)).name in c.bytes]
    if int8 or default_pq:
        return max(int8 or default_pq, key=lambda c: c.dim)
    return min(candidates, key=lambda c: c.dim)


def primary_family(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates of one model at its baseline's share: EARL's default reserved share where it was planned,
    else the first share listed (candidates keep the plan's order); RotatE's all."""
    shares = [c.config.reserved_ratio for c in candidates]
    share = RESERVED_RATIO if RESERVED_RATIO in shares else shares[0]
    return [c for c in candidates if c.config.reserved_ratio == share]


def baseline_name(candidates: list[Candidate]) -> str | None:
    """The search's simplest baseline: the widest RotatE exported at int8 (a user's obvious choice), else the
    widest EARL at int8; None when neither fits the budget at int8."""
    for model in ("rotate", "earl"):
        base = baseline_candidate([c for c in candidates if c.model == model and "int8" in c.bytes])
        if base is not None:
            return base.name
    return None


def _drop_order(baseline: Candidate, c: Candidate) -> tuple[bool, int]:
    """Which of a model's candidates fit_to_time drops first (the smallest key): the narrowest where an int8 export
    fits (the baseline is then the widest at int8), else the widest (wide pq-only candidates code 8 numbers a byte:
    the ones that lost at WordNet-full 2 MB and at 1M entities)."""
    return c is baseline, c.dim if "int8" in baseline.bytes else -c.dim


def _next_to_drop(theirs: list[Candidate]) -> Candidate:
    """Which of one model's candidates fit_to_time drops next: from its share with the most candidates (EARL's
    reserved shares; the one without the model's baseline on a tie), that share's farthest from its own baseline
    (_drop_order). So each share keeps its baseline until it is the share's last, and the model's baseline goes
    last of all."""
    model_baseline = baseline_candidate(theirs)
    by_share: dict[tuple[ModelKind, float], list[Candidate]] = {}
    for c in theirs:
        by_share.setdefault(family(c), []).append(c)
    members = max(by_share.values(), key=lambda cs: (len(cs), model_baseline not in cs))
    baseline = baseline_candidate(members)
    assert baseline is not None  # the share has candidates
    return min(members, key=partial(_drop_order, baseline))


def fit_to_time(config: CompressConfig, candidates: list[Candidate], seconds: Mapping[str, float],
                early_fraction: float = 1.0) -> list[Candidate]:
    """Drop the smallest candidates of the model with the most until the schedule's validations take at most
    EVAL_SHARE of the time limit, and (down to one candidate per model) until the first rung trains each
    candidate enough (first_rung_trains); refuse a limit shorter than validating the remaining candidates once.
    A model's baseline candidate (baseline_candidate) goes last, the others farthest from it first; among EARL's
    reserved shares, from the share with the most candidates first (_next_to_drop)."""
    limit, kept = config.time_limit_minutes * 60, list(candidates)
    models = len({c.model for c in candidates})

    def too_many() -> bool:
        if validation_cost(kept, seconds, config.eta, early_fraction) > EVAL_SHARE * limit:
            return True
        return len(kept) > models and not first_rung_trains(kept, config, seconds, early_fraction)

    while len(kept) > 1 and too_many():
        counts = {m: sum(c.model == m for c in kept) for m in seconds}
        crowded = max(counts, key=lambda m: counts[m])  # keep every model while another has more candidates
        kept.remove(_next_to_drop([c for c in kept if c.model == crowded]))
    first = early_fraction if len(rung_sizes(len(kept), config.eta)) > 1 else 1.0  # rung 0's share of a validation
    need = sum(c.validation(seconds, first) * len(c.bytes) for c in kept)
    if limit < need:
        raise ConfigError(
            f"a time limit of {config.time_limit_minutes:g} min is too short: validating {len(kept)} "
            f"candidate(s) once takes about {need:.1f} s here (one validation pass of each model's largest: "
            + ", ".join(f"{m} {s:.2f} s" for m, s in seconds.items())
            + f"); give at least {math.ceil(need / 60 / EVAL_SHARE)} min so that training gets time too")
    if len(kept) < len(candidates):
        log.info("kept %d of %d candidates so that validation takes at most %.0f%% of the time and the first "
                 "rung trains each at least as long as it validates it, %d steps or more", len(kept),
                 len(candidates), 100 * EVAL_SHARE, MIN_FIRST_STEPS)
    return kept


__all__ = ["EVAL_SHARE", "MIN_FIRST_STEPS", "baseline_candidate", "baseline_name", "dominated", "fine_tuned", "first_rung_trains", "fit_to_time", "plan", "plan_candidates",
           "primary_family", "shares", "tuned_precisions", "valid_fraction",
           "validation_cost"]
