"""`earl compress --from BUNDLE`: an imported model (no dims to retrain) at every precision that fits a byte budget
(fp32, fp16, int8, pq:M for several M), pq codebooks fine-tuned against its scorer when a graph is given, each
size's filtered MRR beside the original's; the most accurate one that fits is the pick.

Every candidate is written with plain weights (no xz), so its bytes follow from its tensors' shapes: a size
estimated from them (the graph and vocabularies as packed, plus the tables as the precision stores them) rules a
candidate out before any codebook is trained, and the written file is checked against the budget.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.atomic import replacing, write_json
from earl_service.bundle.decode import StoredRows, coded_entities
from earl_service.bundle.format import read_safetensors, tensor_bytes
from earl_service.bundle.model_io import Bundle, load_bundle
from earl_service.bundle.precision import Precision, ProductQuantized
from earl_service.bundle.writer import with_metadata
from earl_service.core import scorers
from earl_service.core.known import KnownAnswers
from earl_service.data.dataset import SPLIT_SUFFIXES, load_triples_file
from earl_service.errors import ConfigError, ModelImportError
from earl_service.imports import sizes, tune

CODING = "plain"
HEADER_ROOM = 16_384  # header bytes a candidate may take beyond its tensors (names, shapes, metadata)
PICK = "bundle.safetensors"
FRONTIER_PNG = "frontier.png"  # the compress report's name for its plot (a job's model keeps it)
STATE = "compress_state.json"  # the sizes done so far, for a search stopped (a worker killed) to continue


@dataclass(frozen=True)
class ImportedSearch:
    """The settings of a search: the byte budget, minutes for it all, how many valid triples score each size
    (0: all), and fine-tuning."""

    max_bytes: int
    time_limit_minutes: float = sizes.DEFAULT_MINUTES
    eval_triples: int = 2000
    fine_tune: bool = True
    seed: int = 0
    precisions: tuple[str, ...] = ()  # () : fp32, fp16, int8 and pq:M for NUMBERS_PER_CODE


@dataclass
class Graph:
    """The graph's splits as ids over the bundle's names (rows naming an entity the model lacks are dropped)."""

    splits: dict[str, np.ndarray]
    dropped: dict[str, int] = field(default_factory=dict)

    def known(self, num_relations: int) -> KnownAnswers:
        return KnownAnswers(np.concatenate(list(self.splits.values())), num_relations)


def read_graph(folder: str | Path, bundle: Bundle) -> Graph:
    """train / valid / test of a dataset folder mapped onto the bundle's vocabularies."""
    folder = Path(folder)
    splits, dropped = {}, {}
    for split in ("train", "valid", "test"):
        path = next((p for p in (folder / f"{split}{s}" for s in SPLIT_SUFFIXES) if p.is_file()), None)
        if path is None:
            continue
        triples, _ = load_triples_file(path, bundle.entities, bundle.relations, allow_new_entities=True)
        keep = (triples[:, [0, 2]] < len(bundle.entities)).all(axis=1)
        splits[split], dropped[split] = triples[keep], int((~keep).sum())
    if "valid" not in splits:
        raise ModelImportError(f"--graph {folder}: a dataset folder with a valid file (valid.txt, ...) scores sizes")
    return Graph(splits, dropped)


def filtered_mrr(bundle: Bundle, triples: np.ndarray, known: KnownAnswers, *, params: dict | None = None) -> float:
    """Mean reciprocal filtered realistic rank over tails and heads of `triples`, by the bundle's scorer."""
    params = params or bundle.params
    config = bundle.config
    scorer = config.scorer()
    ranks = [scorers.filtered_ranks(scorer, params["entities"], params["relations"], triples, known, side=side)
             for side in ("tail", "head")]
    return float(np.mean(1.0 / np.concatenate(ranks)))


def candidates(bundle: Bundle, search: ImportedSearch) -> list[Precision]:
    return sizes.searched(bundle.config.model, bundle.config.dim, _shapes(bundle), search.precisions)


def estimate(bundle: Bundle, precision: Precision) -> int:
    """Bytes of the file without its header: the packed fixed parts and each table as `precision` stores it."""
    fixed = sum(int(v.nbytes) for v in bundle.fixed_parts().values()) + 8 * max(len(bundle.reserved), 1)
    return fixed + sizes.table_bytes(bundle.config.model, bundle.config.dim, _shapes(bundle), precision)


def _shapes(bundle: Bundle) -> sizes.Shapes:
    return {name: tuple(value.shape) for name, value in bundle.params.items()}


def eval_sample(valid: np.ndarray, search: ImportedSearch) -> np.ndarray:
    """The valid triples every size is scored on: a seeded sample of search.eval_triples (all where 0)."""
    limit = search.eval_triples
    if limit and len(valid) > limit:
        valid = valid[np.sort(np.random.default_rng(search.seed).choice(len(valid), limit, replace=False))]
    return valid


class Search:
    """One search's state: the bundle, its graph, the clock, and what each candidate gave."""

    def __init__(self, bundle: Bundle, out: Path, search: ImportedSearch, graph: Graph | None,
                 spent: float = 0.0) -> None:
        self.bundle, self.out, self.search, self.graph = bundle, out, search, graph
        self.deadline = time.monotonic() + search.time_limit_minutes * 60 - spent  # `spent`: by the attempts before
        self.known = graph.known(len(bundle.relations)) if graph else None
        self.eval = self._eval_triples()
        self.row_weights = bundle.row_weights()  # what pq codebooks fit by: once, not per candidate
        self.rows: list[dict[str, Any]] = []

    def _eval_triples(self) -> np.ndarray | None:
        return None if self.graph is None else eval_sample(self.graph.splits["valid"], self.search)

    def mrr(self, params: dict | None = None) -> float | None:
        if self.eval is None or self.known is None:
            return None
        return filtered_mrr(self.bundle, self.eval, self.known, params=params)

    def run(self, precision: Precision, tune_seconds: float) -> dict[str, Any]:
        """Write one candidate (candidates/<name>.safetensors) and score it; its row for the report."""
        row: dict[str, Any] = {"precision": precision.name, "estimate": estimate(self.bundle, precision)}
        if row["estimate"] > self.search.max_bytes:
            return {**row, "fits": False, "skipped": "estimate over the budget"}
        if time.monotonic() > self.deadline:
            return {**row, "fits": None, "skipped": "time limit"}
        tables = None
        if isinstance(precision, ProductQuantized):
            tables = precision.encode_tables(self.bundle.config, self.bundle.params, seed=self.search.seed,
                                             weights=self.row_weights)
            tables = self._tuned(tables, row, tune_seconds)
        path = self.out / "candidates" / f"{precision.name.replace(':', '-')}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.bundle.save(path, precision=precision, coding=CODING, pq_tables=tables)
        row.update(bytes=path.stat().st_size, path=str(path.relative_to(self.out)))  # no server path in a report
        row["fits"] = row["bytes"] <= self.search.max_bytes
        if row["fits"]:  # scored when there is a graph, from the file's tables as stored (rows decoded as scored)
            row["mrr"] = self.mrr(self._stored(path, precision)) if self.eval is not None else None
        else:
            path.unlink()
        return row

    def _stored(self, path: Path, precision: Precision) -> dict[str, Any]:
        """The tables a candidate file scores with: its entity rows as stored (StoredRows: pq codes, int8 rows or
        fp16 decoded a block at a time, not a second float32 table beside the original's; fp32's are the original's
        own) and its relation table decoded (a few hundred rows)."""
        if precision.name == "fp32":
            return self.bundle.params
        _, tensors, _ = read_safetensors(path)
        entities = StoredRows(coded_entities(tensors) or tensors["param.entities"])
        return {"entities": entities, "relations": precision.decode(tensors, "param.relations")}

    def _tuned(self, tables: dict, row: dict[str, Any], seconds: float) -> dict:
        """Fine-tuned entity codebooks where a graph is given and they score better on the valid triples."""
        kind = self.bundle.config.model
        if self.graph is None or not self.search.fine_tune or kind not in tune.TUNABLE or "entities" not in tables:
            return tables
        codes, books = tables["entities"]
        relations = ProductQuantized.stored_values({"relations": self.bundle.params["relations"]}, {})["relations"]
        budget = tune.Tuning(seconds=seconds, seed=self.search.seed)
        tuned = tune.tune(kind, codes, books, relations, self.graph.splits["train"], budget,
                          reciprocal=self.bundle.config.reciprocal)
        before = self.mrr({"entities": StoredRows({"codes": codes, "codebooks": books}), "relations": relations})
        after = self.mrr({"entities": StoredRows({"codes": codes, "codebooks": tuned}), "relations": relations})
        row["fine_tune"] = {"steps": len(budget.losses), "seconds": round(seconds, 1), "mrr_before": before,
                            "mrr_after": after, "kept": bool(after is not None and before is not None
                                                             and after > before)}
        return {**tables, "entities": (codes, tuned)} if row["fine_tune"]["kept"] else tables


Progress = Callable[[dict[str, Any]], None]


def compress_imported(source: str | Path | Bundle, out: str | Path, search: ImportedSearch,
                      graph: str | Path | None = None,
                      *, on_progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                      shown: tuple[str, str | None] | None = None) -> dict[str, Any] | None:
    """Search the precisions of the bundle `source` under search.max_bytes; writes out/report.json, report.md,
    candidates/ and the pick as out/bundle.safetensors. Returns the report, or None when `should_stop` said so
    between two sizes (a service job cancelled). `on_progress` gets {stage, precision, step, total, time_left}
    after each size; `shown` names the source and the graph in the report (a job's model id, not its path).
    `source`: a bundle file, or one already loaded from its file."""
    start = time.monotonic()
    bundle = source if isinstance(source, Bundle) else load_bundle(source)
    source = bundle.path or source
    if set(bundle.params) != {"entities", "relations"}:
        raise ModelImportError(f"{source}: a {bundle.config.model} bundle holds a trained encoder; `earl compress "
                               "--from` searches the sizes of an imported model's tables (`earl import`)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = search_settings(bundle, search, graph)
    saved = load_state(out, settings)
    spent = saved["seconds"] if saved else 0.0
    state = Search(bundle, out, search, read_graph(graph, bundle) if graph else None, spent)
    original = saved["original"] if saved else {"bytes": bundle.num_bytes, "precision": bundle.precision,
                                                "mrr": state.mrr()}
    done = {row["precision"]: row for row in (saved["rows"] if saved else [])}
    reused = 0
    chosen = candidates(bundle, search)
    # Half the time goes to fine-tuning, shared by the pq sizes that may fit: one ruled out by its estimate takes
    # none (sharing among all five left FB15k-237's one fitting size at 1/32 a fifth of it).
    tuned = sum(isinstance(p, ProductQuantized) and estimate(bundle, p) <= search.max_bytes for p in chosen)
    tune_seconds = search.time_limit_minutes * 60 / 2 / max(tuned, 1)
    for step, precision in enumerate(chosen, 1):
        if should_stop is not None and should_stop():
            return None
        row = done.get(precision.name)
        if row is None or (row.get("fits") and not (out / row["path"]).is_file()):  # not done, or its file is gone
            row = state.run(precision, tune_seconds)
        else:
            reused += 1
        state.rows.append(row)
        write_json(out / STATE, {"settings": settings, "original": original, "rows": state.rows,
                                 "seconds": round(spent + time.monotonic() - start, 1)})
        if on_progress is not None:
            on_progress({"stage": "size", "precision": precision.name, "step": step, "total": len(chosen),
                         "time_left": max(0.0, state.deadline - time.monotonic()), "resumed": bool(saved)})
    source_name, graph_name = shown or (str(source), str(graph) if graph else None)
    report = {"source": source_name, "model": bundle.config.model, "dim": bundle.config.dim,
              "entities": len(bundle.entities), "relations": len(bundle.relations), "max_bytes": search.max_bytes,
              "graph": graph_name, "eval_split": "valid" if graph else None,
              "eval_triples": 0 if state.eval is None else len(state.eval),
              "dropped": state.graph.dropped if state.graph else {}, "original": original, "candidates": state.rows,
              "pick": None, "seconds": round(spent + time.monotonic() - start, 1), "resumed_sizes": reused}
    return finish(out, report)


def finish(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Pick the most accurate row that fits (without a graph: the largest), copy its file to out/PICK and write
    report.json, report.md and the plot; also after a row is added (compress/retrained.py)."""
    fitting = [r for r in report["candidates"] if r.get("fits")]
    scored = all(r.get("mrr") is not None for r in fitting)
    pick = max(fitting, key=lambda r: (r["mrr"], -r["bytes"]) if scored else (r["bytes"], 0)) if fitting else None
    report["pick_metrics"] = pick is not None and write_pick(out, report, pick)
    report["pick_bytes"] = (out / PICK).stat().st_size if pick is not None else None  # the summary's bytes too
    report["pick"] = pick and pick["precision"]
    report.pop("plot", None)
    if scored and fitting and plot_sizes(report, out / FRONTIER_PNG):
        report["plot"] = FRONTIER_PNG
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    return report


def write_pick(out: Path, report: dict[str, Any], pick: dict[str, Any]) -> bool:
    """The pick's file as out/PICK, its metrics saying what was searched and what it scored (`earl info`, the
    service's model view): True; or, where that longer header would not fit the budget, the file as scored (False).
    A model trained at the budget (compress/retrained.py) carries its own search's summary already: copied as is."""
    source = out / pick["path"]
    metrics = json.loads(tensor_bytes(source)[0].get("metrics") or "{}")
    if "compress" in metrics:
        shutil.copyfile(source, out / PICK)
        return True
    summary = {"from": report["source"], "max_bytes": report["max_bytes"], "precision": pick["precision"],
               "valid": {"mrr": pick.get("mrr"), "triples": report["eval_triples"]},
               "original": {k: report["original"].get(k) for k in ("bytes", "precision", "mrr")},
               "report": "report.json"}
    with_metadata(source, out / PICK, {"metrics": json.dumps({**metrics, "compress": summary}, default=str)})
    if (out / PICK).stat().st_size <= report["max_bytes"]:
        return True
    shutil.copyfile(source, out / PICK)
    return False


def plot_sizes(report: dict[str, Any], path: Path) -> bool:
    """Valid MRR against bytes of every size written and scored, the original's MRR, the budget and the pick; False
    where matplotlib is absent (the [train] extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in report["candidates"] if r.get("mrr") is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r["bytes"] / 1e6 for r in rows], [r["mrr"] for r in rows], color="tab:orange", label="sizes")
    for r in rows:
        ax.annotate(r["precision"], (r["bytes"] / 1e6, r["mrr"]), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    ax.axhline(report["original"]["mrr"], color="gray", lw=1, label=f"original ({report['original']['precision']})")
    ax.axvline(report["max_bytes"] / 1e6, color="red", ls="--", lw=1, label="budget")
    pick = next(r for r in rows if r["precision"] == report["pick"])
    ax.scatter(pick["bytes"] / 1e6, pick["mrr"], marker="*", s=250, color="gold", edgecolor="black", zorder=5,
               label=f"pick: {pick['precision']}")
    ax.set_xscale("log")
    ax.set(xlabel="bundle file (MB, 10^6 bytes)", ylabel="valid MRR (filtered)",
           title=f"{report['model']} dim {report['dim']}: each size that was written and scored")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return True


def search_settings(bundle: Bundle, search: ImportedSearch, graph: str | Path | None) -> dict[str, Any]:
    """What a continued search must share with the one it continues: the search's settings, the source's
    identity (its kind, shapes and bytes) and whether a graph scores the sizes."""
    return {**{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(search).items()},
            "source": {"model": bundle.config.model, "dim": bundle.config.dim, "entities": len(bundle.entities),
                       "relations": len(bundle.relations), "bytes": bundle.num_bytes, "precision": bundle.precision},
            "graph": graph is not None}


def load_state(out: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The sizes an earlier attempt in `out` finished (None when there is none); another search's is refused."""
    path = out / STATE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # cut short while written (write_json replaces atomically, so only by hand): search again
    if saved.get("settings") != settings:
        raise ConfigError(f"{out} holds a `compress --from` search with other settings or another model "
                          f"({saved.get('settings')}); give another --out, or the same settings to continue it")
    return saved


def markdown(report: dict[str, Any]) -> str:
    def mrr(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    lines = [f"# `earl compress --from` {Path(report['source']).name}", "",
             f"{report['model']} dim {report['dim']}, {report['entities']:,} entities; budget "
             f"{report['max_bytes']:,} bytes; MRR: filtered, tails and heads, on {report['eval_triples']:,} "
             f"{report['eval_split'] or '(no graph)'} triples.", "",
             "| precision | bytes | of original | fits | MRR | fine-tuned (MRR before -> after) |", "|---|---|---|---|---|---|",
             f"| original ({report['original']['precision']}) | {report['original']['bytes']:,} | 1 | - | "
             f"{mrr(report['original']['mrr'])} | |"]
    for row in report["candidates"]:
        size = row.get("bytes", row["estimate"])
        tuned = row.get("fine_tune")
        note = (f"{mrr(tuned['mrr_before'])} -> {mrr(tuned['mrr_after'])}{'' if tuned['kept'] else ' (not kept)'}"
                if tuned else row.get("skipped", ""))
        lines.append(f"| {row['precision']}{' **pick**' if row['precision'] == report['pick'] else ''} | "
                     f"{size:,}{'' if 'bytes' in row else ' (est.)'} | 1/{report['original']['bytes'] / size:.1f} | "
                     f"{'yes' if row.get('fits') else 'no'} | {mrr(row.get('mrr'))} | {note} |")
    for row in report["candidates"]:
        if row.get("retrained"):  # compress/retrained.py: a model trained at the budget, not the source coded
            made = row["retrained"]
            lines += ["", f"retrained: {made['candidate']} at {made['precision']}, the pick of `earl compress` on the "
                          f"graph in {made['minutes']:g} minutes, not the source coded; it ranks among "
                          f"{made['entities']:,} entities (the source: {report['entities']:,}), on "
                          f"{made['eval_triples']:,} of the {report['eval_triples']:,} triples (the rest name an "
                          "entity it lacks)."]
    if report.get("plot"):
        lines += ["", f"![valid MRR against bytes]({report['plot']})"]
    return "\n".join(lines) + "\n"


__all__ = ["PICK", "STATE", "Graph", "ImportedSearch", "compress_imported", "estimate", "eval_sample", "filtered_mrr",
           "finish", "load_state", "markdown", "read_graph", "search_settings", "write_pick"]
