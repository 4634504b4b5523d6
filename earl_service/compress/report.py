"""The evidence of a compress job: report.json, report.md and frontier.png (metric against bytes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from earl_service.atomic import replacing, write_bytes, write_json
from earl_service.bundle.sizes import CODING, METRICS_ROOM
from earl_service.compress.config import METRICS, RESERVED_RATIO
from earl_service.compress.state import CompressRun, family_name

REPORT_JSON, REPORT_MD, FRONTIER_PNG = "report.json", "report.md", "frontier.png"


def frontier(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Rows no other row beats with as few bytes: the best `key` reachable at each size, smallest first."""
    best, out = float("-inf"), []
    for row in sorted(rows, key=lambda r: (r["bytes"], -r[key])):
        if row[key] > best:
            best = row[key]
            out.append(row)
    return out


def build_report(run: CompressRun, rows: list[dict[str, Any]], pick: dict[str, Any], test: dict | None, *,
                 seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """report.json's content. `seconds`: where the time went ("search" in all, then by phase, "other", and the
    pick's "test" evaluation after the search)."""
    ds, key, config, state = run.dataset, METRICS[run.config.metric], run.config, run.state
    return {
        "max_bytes": config.max_bytes, "time_limit_minutes": config.time_limit_minutes,
        "metric": config.metric, "metric_key": key, "seed": config.seed, "eta": config.eta,
        "parallel": config.parallel, "lane_seconds": round(state.lane_seconds, 3),
        "known_answers": config.known_answers, "graphless": list(config.graphless),
        "reserved_ratios": list(config.reserved_ratios) if "earl" in config.models else [],
        "dropped": list(state.dropped),
        "dataset": {"entities": ds.num_entities, "train_entities": ds.num_train_entities,
                    "relations": ds.num_relations, "train": len(ds.train), "valid": len(ds.split("valid")),
                    "test": 0 if ds.test is None else len(ds.test)},
        "graph_bytes": state.graph_bytes, "validation_seconds": state.validation_seconds,
        "sizes": f"exact: weights as {CODING} tensors (pq:M: the entity tables as M one-byte codes per row and fp16 "
                 f"codebooks, fine-tuned; other weights int8), metrics padded to {METRICS_ROOM} header bytes; every "
                 "written file was checked against its prediction",
        "candidates": [c.to_json() for c in state.candidates],
        "train": {model: run.train_configs[model].to_dict() for model in config.models},
        "rungs": [{"index": r.index, "survivors": r.survivors, "budget_seconds": r.budget_seconds,
                   "scores": {n: v.score for n, v in r.results.items()},
                   "revalidated": {n: {k: e[k] for k in ("precision", "valid_subset", key, "standard_error")}
                                   for n, e in r.revalidated.items()},
                   "probes": {n: {"look": e.get("look", 1), **{k: e[k] for k in ("steps", "train_seconds",
                                                                             "valid_subset", key, "standard_error")}}
                              for n, e in r.probes.items()},
                   "cut": list(r.cut)} for r in state.rungs],
        "exports": rows,
        "frontier": [(r["candidate"], r["precision"]) for r in frontier(rows, key)],
        "pick": pick, "test": test, "spent_seconds": run.spent, "seconds": seconds or {},
        "peak_rss_mb": round(run.peak_rss, 1),  # the process's: the search and the pick's test
        "peak_rss_mb_by_phase": dict(state.peak_rss_mb),  # each phase's own highest RSS (of the last attempt on)
    }


def write_report(out: Path, report: dict[str, Any]) -> None:
    write_json(out / REPORT_JSON, report)
    write_bytes(out / REPORT_MD, markdown(report).encode())
    plot_frontier(report, out / FRONTIER_PNG)


def _fmt(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def markdown(report: dict[str, Any]) -> str:
    key, pick, test = report["metric_key"], report["pick"], report["test"]
    on_frontier = {tuple(f) for f in report["frontier"]}
    rivals = [r for r in report["exports"] if r.get("valid_subset") == pick.get("valid_subset") and
              (r["candidate"], r["precision"]) !=
              (pick["candidate"], pick["precision"])]
    subset = min((r["valid_subset"] for r in report["exports"] if r.get("valid_subset")), default=0)  # early rungs
    runner = max(rivals, key=lambda r: r[key], default=None)
    lines = [
        "# Compress report", "",
        f"**Pick: {pick['candidate']} at {_spelled(pick)}**, {pick['bytes']:,} bytes of a {report['max_bytes']:,}-byte "
        f"budget; valid {report['metric']} {pick[key]:.4f}" + (f", test MRR {test['mrr']:.4f}" if test else "")
        + (f" (on {test['test_subset']:,} test triples drawn at random)" if test and test.get("test_subset") else "") + ".",
        "",
        f"Why: the best validation {report['metric']} of the {len(report['exports'])} exports that fit (every "
        f"candidate at every precision that fits its dim)"
        + (f", among the last rung's, validated on {_final_split(report)} (earlier rungs ranked on a fixed subset "
           f"of {subset:,} valid triples, marked below)" if subset else "")
        + (f"; next best {runner['candidate']} {runner['precision']} at {runner[key]:.4f}" if runner else "") + ". "
        f"{len(report['candidates'])} candidates shared {report['spent_seconds'] / 60:.1f} of "
        f"{report['time_limit_minutes']:g} minutes through {len(report['rungs'])} rungs of successive halving "
        f"(eta {report['eta']}); quantized exports come from the same fp32 weights.",
        "",
        f"Graph and vocabularies: {report['graph_bytes']:,} bytes in every candidate{_graphless(report)}. "
        f"Sizes: {report['sizes']}." + _shares(report),
        "", "| candidate | precision | bytes | rung | steps | train s | valid MRR | valid hits@10 | frontier |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(report["exports"], key=lambda r: -r[key]):
        mark = "yes" if (r["candidate"], r["precision"]) in on_frontier else ""
        rung = f"{r['rung']} (subset)" if r.get("valid_subset") else str(r["rung"])
        lines.append(f"| {r['candidate']} | {_spelled(r)} | {r['bytes']:,} | {rung} | {r['steps']} | "
                     f"{r['train_seconds']:.0f} | {r['mrr']:.4f} | {r['hits_at_10']:.4f} | {mark} |")
    lines += _orders(report)
    lines += ["", "| rung | candidates | seconds for the rung | scores |", "|---|---|---|---|"]
    for rung in report["rungs"]:
        scores = ", ".join(f"{n} {_fmt(s)}" for n, s in sorted(rung["scores"].items(), key=lambda kv: -kv[1]))
        budget = rung["budget_seconds"]
        lines.append(f"| {rung['index']} | {len(rung['survivors'])} | {budget:.0f} | {scores} |" if budget is not None
                     else f"| {rung['index']} | {len(rung['survivors'])} |  | {scores} |")
    lines += _looks(report)
    lines += _revalidated(report)
    lines += _seconds_table(report.get("seconds") or {}, report["time_limit_minutes"] * 60,
                            report.get("peak_rss_mb_by_phase") or {}, report.get("lane_seconds") or 0.0)
    if report.get("peak_rss_mb"):
        lanes = (f"; each of the {report['parallel']} lane processes peaked apart (their phases' peaks above), "
                 "all at once in the machine's memory" if report.get("lane_seconds") else "")
        lines += ["", f"Peak memory (RSS) of the process: {report['peak_rss_mb']:,.0f} MiB{lanes}."]
    lines += ["", f"![valid {report['metric']} against bytes]({FRONTIER_PNG})", ""]
    return "\n".join(lines)


def _spelled(export: dict[str, Any]) -> str:
    """An export's precision, and its codes' order where not contiguous (compress/orders.py)."""
    order = export.get("order", "contiguous")
    return export["precision"] + ("" if order == "contiguous" else f" ({order})")


def _orders(report: dict[str, Any]) -> list[str]:
    """A sentence on the order each pq export's entity codes were chosen in (compress/orders.py), where one was."""
    chosen = [r for r in report["exports"] if r.get("order_scores")]
    if not chosen:
        return []
    parts = [f"{r['candidate']} {r['precision']} {r['order']} (" + ", ".join(
        f"{o} {v:.4f}" for o, v in r["order_scores"].items()) + ")" for r in chosen]
    return ["", f"Codes' order: each RotatE pq export coded its entity table contiguously and in complex pairs, both "
                f"validated as coded (before fine-tuning) on at most {chosen[0]['order_subset']:,} valid triples, and "
                f"kept the better: " + "; ".join(parts) + "."]


def _looks(report: dict[str, Any]) -> list[str]:
    """A sentence per rung whose looks (probe.py) validated the reference and the challengers that learn sooner
    after the same seconds of training: how many looks, the last one's scores, and whom they cut."""
    key, lines = report["metric_key"], []
    for rung in report["rungs"]:
        if not (looks := rung.get("probes")):
            continue
        ref = next(iter(looks))  # the reference looks first
        scores = ", ".join(f"{n} {e[key]:.4f} (standard error {e['standard_error'][key]:.4f}) after {e['steps']} steps"
                           for n, e in sorted(looks.items(), key=lambda kv: -kv[1][key]))
        sample = {e["valid_subset"] for e in looks.values()}.pop()
        cut = rung.get("cut") or []
        verdict = (f"cut {', '.join(cut)}, which {ref} beat by two standard errors" if cut
                   else f"cut none: no challenger trailed {ref} by two standard errors")
        seconds = max(e["train_seconds"] for e in looks.values())
        count = max(e.get("look", 1) for e in looks.values())
        taken, they = ("1 look", "it") if count == 1 else (f"{count} looks, the last", "they")
        lines += ["", f"Rung {rung['index']}'s {taken} at about {seconds:.0f} s of training each (all rungs so far), "
                  f"on {f'{sample:,} valid triples' if sample else 'the whole split'}: {scores}; {they} {verdict}."]
    return lines


def _revalidated(report: dict[str, Any]) -> list[str]:
    """A sentence per cut that validated its contenders again on the last rung's sample (search.decisive)."""
    key, lines = report["metric_key"], []
    for rung in report["rungs"]:
        if not (again := rung.get("revalidated")):
            continue
        sample = {e["valid_subset"] for e in again.values()}.pop()
        scores = ", ".join(f"{n} {e['precision']} {e[key]:.4f} (standard error {e['standard_error'][key]:.4f})"
                           for n, e in sorted(again.items(), key=lambda kv: -kv[1][key]))
        lines += ["", f"Rung {rung['index']}'s leader did not beat the baseline by two standard errors on its subset, "
                  f"so both were validated again on {f'{sample:,} valid triples' if sample else 'the whole split'} "
                  f"before the cut: {scores}."]
    return lines


def _final_split(report: dict[str, Any]) -> str:
    final = report["pick"].get("valid_subset")
    return f"{final:,} valid triples drawn at random (a whole pass costs too much here)" if final else "the whole split"


def _shares(report: dict[str, Any]) -> str:
    """A sentence on EARL's reserved shares where the search was asked for others than the default: the
    candidates each share kept, and those planning cut for time (a share with neither had no dim that fits)."""
    ratios = report.get("reserved_ratios") or []  # none: a report of an earlier version, or no EARL searched
    if ratios in ([], [RESERVED_RATIO]):
        return ""
    kept = {c["name"]: c["config"]["reserved_ratio"] for c in report["candidates"] if c["model"] == "earl"}
    parts = []
    for ratio in ratios:
        prefix = f"{family_name('earl', ratio)}-d"
        mine = [n for n, r in kept.items() if r == ratio]
        cut = [n for n in report.get("dropped", []) if n.startswith(prefix) and n[len(prefix):].isdigit()]
        text = ", ".join(mine) or "none kept"
        if cut or not mine:
            text += f" ({', '.join(cut)} cut for time)" if cut else " (no dim fits the budget)"
        parts.append(f"{100 * ratio:g}%: {text}")
    return f" EARL's reserved shares searched: {'; '.join(parts)}."


def _graphless(report: dict[str, Any]) -> str:
    """What the graph line adds for a search whose RotatE bundles leave the graph out."""
    models = report.get("graphless") or []
    return (f" but {', '.join(models)} (known_answers none: no graph, so their answers include known facts)"
            if models else "")


def _seconds_table(seconds: dict[str, float], limit: float, peaks: dict[str, float],
                   lane_seconds: float = 0.0) -> list[str]:
    """Where the time went: each phase's seconds and share of the search (and its peak RSS where measured: reports
    of earlier versions have none), then the test after it. Slices run in lanes count each lane's seconds: the
    shares are of the search's wall clock plus `lane_seconds`, what the lanes ran beyond it."""
    if not seconds:
        return []
    search = seconds.get("search", 0.0) + lane_seconds or 1e-9

    def peak(phase: str) -> str:
        return f" {peaks[phase]:,.0f} |" if phase in peaks else " - |"

    rows = [f"| {phase} | {value:.1f} | {100 * value / search:.0f}% |{peak(phase) if peaks else ''}"
            for phase, value in seconds.items() if phase not in ("search", "test", "kernel")]
    if peaks and "test" in seconds:
        rows.append(f"| test (after the search) | {seconds['test']:.1f} | - |{peak('test')}")
    head = ["| phase | seconds | share of the search | peak RSS MiB |", "|---|---|---|---|"] if peaks else \
        ["| phase | seconds | share of the search |", "|---|---|---|"]
    kernel = seconds.get("kernel", 0.0)
    before = (f" (before its clock started, the C++ kernel took {kernel:.1f} s to load: a first use on a machine "
              "builds it)" if kernel >= 1 else "")
    lanes = (f" Slices ran in lanes, several at once: each phase counts every lane's seconds, {lane_seconds:.1f} s "
             "beyond the search's wall clock, and the shares are of both together." if lane_seconds else "")
    return ["", f"Where the time went: the search took {seconds.get('search', 0.0):.1f} s of a {limit:.0f} s limit"
                f"{before}, then the pick's test evaluation {seconds.get('test', 0.0):.1f} s.{lanes}", "", *head,
            *rows]


def plot_frontier(report: dict[str, Any], path: os.PathLike) -> None:
    """Every export (colour: model, marker: precision), the frontier, the budget line and the pick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, rows = report["metric_key"], report["exports"]
    markers = {"fp32": "o", "fp16": "s", "int8": "^", "pq:M": "D"}
    colours = {"earl": "tab:blue", "rotate": "tab:orange"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.scatter(r["bytes"] / 1e6, r[key], marker=markers.get(r["precision"], markers["pq:M"]),
                   color=colours.get(r["model"], "gray"), alpha=0.5 + 0.5 * (r["rung"] == max(x["rung"] for x in rows)))
    front = frontier(rows, key)
    ax.step([r["bytes"] / 1e6 for r in front], [r[key] for r in front], where="post", color="gray", lw=1,
            label="frontier")
    ax.axvline(report["max_bytes"] / 1e6, color="red", ls="--", lw=1, label="budget")
    pick = report["pick"]
    ax.scatter(pick["bytes"] / 1e6, pick[key], marker="*", s=250, color="gold", edgecolor="black", zorder=5,
               label=f"pick: {pick['candidate']} {pick['precision']}")
    for name, colour in colours.items():
        ax.scatter([], [], color=colour, label=name)
    for precision, marker in markers.items():
        ax.scatter([], [], marker=marker, color="gray", label=precision)
    ax.set(xlabel="bundle file (MB, 10^6 bytes)", ylabel=f"valid {report['metric']} (filtered)",
           title="Every candidate at every precision (faded: dropped at an earlier rung)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
