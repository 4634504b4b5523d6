"""`earl compress`: the most accurate bundle under a byte budget, by successive halving over models and dims."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from earl_service.bundle.codebooks import stored_orders, stored_tables
from earl_service.bundle.format import read_safetensors
from earl_service.bundle.sizes import save_exact
from earl_service.compress.candidates import baseline_name, plan
from earl_service.compress.config import METRICS, CompressConfig
from earl_service.compress.probe import looks
from earl_service.compress.report import build_report, write_report
from earl_service.compress.rungs import (
    early_fraction,
    evaluate_bundle,
    final_limit,
    open_rung,
    revalidate,
    run_rung,
    trained,
)
from earl_service.compress.state import (
    PICK,
    CompressRun,
    ProgressCallback,
    Rung,
    RungResult,
    ahead,
    load_state,
    rung_sizes,
)
from earl_service.config import ModelKind, TrainConfig
from earl_service.config.options import train_configs_from_options
from earl_service.config.recipes import DEFAULT
from earl_service.data.dataset import Dataset
from earl_service.errors import DatasetError
from earl_service.memory import peak_rss_mb
from earl_service.model import kernels
from earl_service.train.evaluate import SUMMARY_KEYS
from earl_service.train.run import GraphCache

# A model kind's best candidate goes on to the last rung whatever its rank while it scores at least this share of
# the best (survivors). Under the paper's RotatE recipe RotatE started slowly: on CoDEx-S it was at 5.3% of EARL at
# rung 0 and went on to win, so the floor was 2%. Under the default recipe (1e-2, cosine) it leads from rung 0,
# and a floor that low kept a clear loser training half of every last rung: on CoDEx-S at 1 MB in 10 minutes EARL
# was at 84% of RotatE at rung 0, 87% at the end, and RotatE trained 198 s of 600 (test 0.3240 against 0.4185 for
# RotatE int8 trained alone; bench/results/compress_codex-s_10min.md). A near tie on rung 0's 500-triple subset
# still goes on to the whole-split comparison.
LEADER_FLOOR = 0.9

# Halving fills its best half past each kind's leader with the next best, of whichever kind, but not with one
# scoring under this share of its own kind's best: inside a kind an early lead can flip (CoDEx-S-like fillers at
# 19-53% of their kind's leader went on to catch or pass it: WordNet-full-noinv RotatE d16 at 19% of d32, FB15k-237
# RotatE d21 at 49% of d136 and EARL d39 at 50% of d48), but on FB15k-237 at 4 MB in 60 minutes RotatE d720 pq:180
# at 5% of RotatE d118 (0.0165 against 0.3101 after equal seconds) filled rung 1 and took 489 s of training and
# most of 181 s of codebooks and fine-tuning from the pick (bench/results/compress_fb15k-237_4MB_60min_h60_4_report.md).
FILL_FLOOR = 0.1

# A cut ranks model kinds against each other only once one of them scores at least this (the search's metric):
# below it every kind's best goes on, the last rung included. On WordNet-full-noinv at 2 MB (117k entities) EARL
# leads rung-0 looks at 0.004-0.005 where RotatE's pq codes score 0.001-0.004, and RotatE goes on to win by far:
# in 10 minutes on one core the search that cut RotatE there shipped EARL d48 int8 at test MRR 0.0598, where
# RotatE d22 pq:11 trained alone for the 10 minutes tests 0.3424 (bench/results/compress_wordnet-full-noinv_10min_
# bl_before.md); of its 30-minute searches whose rung-0 leader scored under 0.02, the two that cut RotatE shipped
# EARL d35 at 0.1377 and 0.1629 (q30_2, t30_2), the six that kept it a RotatE at 0.3775-0.4235. Outside
# WordNet-full every rung-0 leader in bench/results/compress_*_report.json scored 0.0355 or more (FB15k-237 at 2 MB
# in 5 minutes: EARL 0.0355 against RotatE 0.0185, and EARL was right: RotatE int8 alone tests 0.009).
LOOK_FLOOR = 0.02


def compress(dataset: Dataset, out_dir: str | os.PathLike, config: CompressConfig, *,
             train_configs: Mapping[ModelKind, TrainConfig] | None = None,
             on_progress: ProgressCallback | None = None, should_stop: Callable[[], bool] | None = None,
             ) -> dict[str, Any] | None:
    """Search for the most accurate bundle of at most config.max_bytes bytes within the time limit; writes
    OUT/bundle.safetensors, report.json, report.md and frontier.png and returns the report. Every bundle carries
    the dataset's labels (counted in its bytes; load_dataset(labels=False) leaves them out). A job stopped
    by `should_stop` returns None; run it again with the same OUT to continue from where it stopped.
    `train_configs` says how each model kind's candidates train (default: the default recipe's; the time limit,
    seed and validation cadence are the search's own)."""
    if dataset.valid is None or not len(dataset.valid):
        raise DatasetError("compress picks on validation metrics: the dataset needs a valid split")
    out = Path(out_dir)
    train_configs = train_configs or train_configs_from_options({"progress": False}, recipe=DEFAULT)
    _, kernel_seconds = kernels.load_timed()  # before the clock, as training; the report states the seconds
    state, graphs = load_state(out, config, dataset), GraphCache(dataset)
    if state is None:
        state = plan(dataset, config, train_configs, early_fraction=early_fraction(dataset), graphs=graphs)
        state.seconds["plan"] = state.spent_seconds  # planning counts its own seconds as spent
        state.peak_rss_mb["plan"] = round(peak_rss_mb(), 1)  # reading the data included
    out.mkdir(parents=True, exist_ok=True)
    run = CompressRun(dataset, out, config, train_configs, state, on_progress, should_stop,
                      spent_before=state.spent_seconds, graphs=graphs, kernel_seconds=kernel_seconds)
    run.save()
    if config.parallel > 1:
        from earl_service.compress.lanes import Lanes

        run.lanes = Lanes(run, config.parallel)
    try:
        if not search(run):
            return None
    finally:
        if run.lanes is not None:
            run.lanes.close()
    return finish(run)


# ---------------------------------------------------------------- successive halving


def search(run: CompressRun) -> bool:
    """Successive halving from wherever the saved state stopped; False if stopped before the last rung."""
    state = run.state
    if not state.rungs:
        state.rungs.append(Rung(index=0, survivors=[c.name for c in state.candidates]))
    while not state.done:
        open_rung(run, state.rungs[-1])
        if not looks(run, state.rungs[-1]) or not run_rung(run):
            run.save()
            return False
        next_rung(run)
    return True


def next_rung(run: CompressRun) -> None:
    """Keep the best 1/eta by score (each model's best and the baseline too), or mark the search done after the
    last rung. Those a look cut (probe.py) are out; one candidate left, or kept, goes straight to the last
    rung."""
    state = run.state
    rung = state.rungs[-1]
    if rung.index + 1 >= state.rung_count:
        state.done = True
    else:
        keep = rung_sizes(len(state.candidates), run.config.eta)[rung.index + 1]
        ranked = sorted((n for n in rung.survivors if n not in rung.cut), key=lambda n: -rung.results[n].score)
        base = baseline_name(state.candidates)
        if len(ranked) == 1:
            state.rung_count = rung.index + 2
        tied = [n for n in ranked if len(ranked) > 1 and not beats(run, rung, ranked[0], n)]
        model_of, scores = (lambda n: run.candidate(n).model), {n: rung.results[n].score for n in ranked}
        blind = cannot_rank_kinds(ranked, model_of, scores)
        last_cut = rung.index + 2 == state.rung_count
        if last_cut and not blind:  # the last rung trains one on the rest of the time
            kept = [base if base in tied and not decisive(run, rung, ranked[0], base) else ranked[0]]
        else:  # the best half and each kind's leader (the last cut under LOOK_FLOOR: each kind's best alone)
            kept = survivors(faster_among_ties(run, rung, ranked), 1 if last_cut else keep, model_of, scores,
                             leader_floor=0.0 if blind else LEADER_FLOOR)
            kept += [base] if base is not None and base not in kept else []
        going_on = [n for n in ranked if n in kept]
        if len(going_on) == 1:  # the fill kept one: it trains on the rest of the time
            state.rung_count = rung.index + 2
        state.rungs.append(Rung(index=rung.index + 1, survivors=going_on))
    run.save()


def faster_among_ties(run: CompressRun, rung: Rung, ranked: list[str]) -> list[str]:
    """`ranked` (best score first) with ties inside a model kind broken by speed: next comes, of the candidates
    of the best remaining one's kind that it does not beat by MARGIN_SE standard errors, the one that took the
    most steps a second (ties keep their order). Each goes on with the same seconds, so the faster will have
    trained more; a lead inside the noise says nothing. On WordNet-full-noinv at 2 MB in 30 minutes (one core)
    rung 0 ranked RotatE d32 pq:8 at 0.0007 above d16 pq:8 at 0.0003 (chance is ~1e-5; 500 triples) and dropped
    d16, which steps about twice as fast: the pick was EARL d35 int8 at test MRR 0.1377 (3594f52), where with
    d16 kept it was RotatE d16 pq:8 at 0.4076 (185e8f8). Across kinds a step buys different learning, and the
    order stays the scores'."""
    left, out = list(ranked), []
    while left:
        kind = run.candidate(left[0]).model
        tied = [n for n in left if n == left[0] or (run.candidate(n).model == kind and not beats(run, rung, left[0], n))]
        out.append(max(tied, key=lambda n: (_speed(rung.results[n]), -left.index(n))))
        left.remove(out[-1])
    return out


def _speed(result: RungResult) -> float:
    return result.steps / result.train_seconds if result.train_seconds > 0 else 0.0


def beats(run: CompressRun, rung: Rung, a: str, b: str) -> bool:
    """Whether candidate `a`'s best export scored above `b`'s at `rung` by more than MARGIN_SE standard errors of
    the difference."""
    key = METRICS[run.config.metric]
    best_a, best_b = (rung.results[n].exports[rung.results[n].best(key)] for n in (a, b))
    return ahead(best_a, best_b, key)


def decisive(run: CompressRun, rung: Rung, leader: str, base: str) -> bool:
    """Whether `leader` beats the baseline `base` at the last cut after `rung`, which it leads without beating
    it on the rung's subset: both best exports validated again on the last rung's sample (final_limit), when
    that is larger, and compared there (kept in rung.revalidated for a restart and the report).

    On the subset a lead must be large to count: at 500 triples the standard error of an MRR near 0.25 is ~0.012,
    so the difference needs ~0.033. FB15k-237 at 738,113 bytes in 30 minutes (one core): EARL d48 led RotatE d21
    int8 by 0.0146 there, the cut kept RotatE, and the pick tested 0.0122-0.0130 below the 45-minute PyKEEN
    ComplEx it was to replace at 1/32 of its size; with this second look it picked EARL d48 pq:12, 0.0034 below
    (docs/import.md)."""
    if leader == base:
        return False
    key = METRICS[run.config.metric]
    result = rung.results[leader]
    sample = result.exports[result.best(key)].get("valid_subset", 0)
    limit = final_limit(run)
    if not sample or (limit and limit <= sample):
        return False  # the rung's sample is already as large as the last rung's
    for name in (leader, base):
        if name not in rung.revalidated:
            rung.revalidated[name] = revalidate(run, name, limit)
            run.save()
    return ahead(rung.revalidated[leader], rung.revalidated[base], key)


def cannot_rank_kinds(ranked: list[str], model_of: Callable[[str], str], scores: Mapping[str, float]) -> bool:
    """Whether a cut among `ranked` says nothing of which model kind will win: candidates of several kinds, none
    scoring LOOK_FLOOR yet."""
    return len({model_of(n) for n in ranked}) > 1 and max(scores[n] for n in ranked) < LOOK_FLOOR


def survivors(ranked: list[str], keep: int, model_of: Callable[[str], str],
              scores: Mapping[str, float] | None = None, *, leader_floor: float = LEADER_FLOOR) -> list[str]:
    """The best `keep` of `ranked` (best first), and the best of each model kind scoring at least `leader_floor` of
    the best score (`scores`; without them, every kind's best). With `scores`, the best `keep` leave out those
    under FILL_FLOOR of their own kind's best.

    Model kinds learn at different speeds: on CoDEx-S at 0.5 MB, RotatE dim 27 scored 0.013 valid MRR after 18 s
    and EARL dim 40 0.247 (5.3%), yet given 10 minutes alone RotatE reached 0.358 test MRR and EARL 0.317
    (bench/results/compress_codex-s.md). An early rung ranks within a kind well and across kinds badly, so each
    kind's leader goes on, up to the rung before the last (whose cut, next_rung, keeps one). Unless it is far
    behind: on WordNet-full-noinv at 2 MB (116,650 entities) RotatE d32 pq:8 validated at 0.0001 after 150 s
    against EARL's 0.027 (0.4%), and its place in the last rung took half the time from the pick.
    """
    best = max(scores.values(), default=0.0) if scores else 0.0
    kind_best: dict[str, float] = {}
    leaders: dict[str, str] = {}
    for name in ranked:
        if scores is not None:
            kind_best[model_of(name)] = max(kind_best.get(model_of(name), 0.0), scores[name])
        if scores is None or scores[name] >= leader_floor * best:
            leaders.setdefault(model_of(name), name)
    chosen = set(leaders.values())
    for name in ranked:
        if len(chosen) >= keep:
            break
        if scores is None or scores[name] >= FILL_FLOOR * kind_best[model_of(name)]:
            chosen.add(name)
    return [n for n in ranked if n in chosen]


# ---------------------------------------------------------------- the pick and its outputs


def finish(run: CompressRun) -> dict[str, Any]:
    """Write the pick as OUT/bundle.safetensors with its test metrics, and the report beside it."""
    rows = exports_table(run)
    pick = choose(rows, run.config.metric)
    name, precision = pick["candidate"], pick["precision"]
    run.emit("export", name, precision=precision)
    test, search_seconds, seconds = None, run.spent, run.accounting()  # the search's, before the test
    started = run.clock()
    model_run, source = trained(run, name)
    if run.dataset.test is not None and len(run.dataset.test):
        limit = final_limit(run, "test")
        test = evaluate_bundle(model_run, run.export_path(name, precision), "test",
                               batch_size=run.train_config(name).eval_batch_size, limit=limit)
        test["test_subset"] = limit if 0 < limit < len(run.dataset.test) else 0
    seconds["test"] = round(run.clock() - started, 3)
    seconds["kernel"] = round(run.kernel_seconds, 3)
    run.mark_peak("test")
    report = build_report(run, rows, pick, test, seconds={"search": round(search_seconds, 3), **seconds})
    # The pick is the export its metrics were measured on: a pq export's fine-tuned codebooks, not new ones.
    meta, tested, _ = read_safetensors(run.export_path(name, precision))
    save_exact(source, run.out / PICK, precision=precision, metrics=pick_metrics(report),
               expected=run.candidate(name).bytes[precision], pq_tables=stored_tables(tested) or None,
               pq_orders=stored_orders(meta))
    write_report(run.out, report)
    run.emit("done", name, precision=precision)
    return report


def exports_table(run: CompressRun) -> list[dict[str, Any]]:
    """One row per candidate and precision: its latest evaluation (from the last rung it reached)."""
    latest = {name: (rung.index, result) for rung in run.state.rungs for name, result in rung.results.items()
              if result.exports}  # a look's cut (probe.py) leaves a score and no exports: the rung before's stand
    rows = []
    for name, (index, result) in latest.items():
        candidate = run.candidate(name)
        for precision, values in result.exports.items():
            rows.append({"candidate": name, "model": candidate.model, "dim": candidate.dim, "precision": precision,
                         "rung": index, "steps": result.steps, "train_seconds": result.train_seconds, **values})
    return rows


def choose(rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The best row validated on the most triples: the last rung's, on the whole split or final_limit's subset
    (rows from earlier rungs were ranked on a smaller subset, against candidates with less training); among equals,
    the smaller file."""
    key = METRICS[metric]

    def triples(row: dict[str, Any]) -> float:
        return row.get("valid_subset") or math.inf  # 0: the whole split

    most = max(map(triples, rows))
    return max((r for r in rows if triples(r) == most), key=lambda r: (r[key], -r["bytes"]))


def pick_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """The short summary the pick's bundle carries (shown by `earl info`); report.json has the rest."""
    pick = report["pick"]
    return {"valid": {k: pick[k] for k in SUMMARY_KEYS}, "test": report["test"],
            "compress": {"max_bytes": report["max_bytes"], "bytes": pick["bytes"], "candidate": pick["candidate"],
                         "precision": pick["precision"], "metric": report["metric"],
                         "candidates": len(report["candidates"]), "exports": len(report["exports"]),
                         "rungs": len(report["rungs"]), "minutes": round(report["spent_seconds"] / 60, 2),
                         "report": "report.json"}}


__all__ = ["choose", "compress", "evaluate_bundle", "pick_metrics"]
