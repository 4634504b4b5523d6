"""`earl compress --from BUNDLE --graph DATA --retrain-minutes M`: beside an imported model's coded sizes
(imports/compress.py), the pick of the regular search (`earl compress DATA`, compress/search.py) at the same byte
budget, trained M minutes on DATA and scored on the same valid triples; the report's pick is whichever scores
higher.

Coding a table far below its bytes loses what the codes cannot hold: FB15k-237's 45-minute ComplEx lost 0.062 MRR
as pq:25 at 1/32 of its bytes, where a model trained at that budget lost 0.013 (docs/import.md). The retrained
model is a new model over the graph's entities, not the source coded: its row says so, it ranks among the entities
the graph names, and its answers use the graph's vocabulary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.bundle.model_io import Bundle, load_bundle
from earl_service.compress.config import CompressConfig
from earl_service.compress.search import compress
from earl_service.compress.state import PICK, ProgressCallback, load_state
from earl_service.config import MODELS, ModelKind, TrainConfig
from earl_service.core.known import KnownAnswers
from earl_service.data.dataset import load_dataset
from earl_service.errors import ConfigError, DatasetError
from earl_service.imports.compress import (
    ImportedSearch,
    compress_imported,
    eval_sample,
    filtered_mrr,
    finish,
    read_graph,
)

RETRAINED = "retrained"  # its row's name in the report, and its folder under OUT


def compress_from(source: str | Path, out: str | Path, search: ImportedSearch, graph: str | Path | None = None, *,
                  retrain_minutes: float = 0.0, retrain_models: tuple[ModelKind, ...] | None = None,
                  train_configs: Mapping[ModelKind, TrainConfig] | None = None,
                  on_progress: ProgressCallback | None = None, should_stop: Callable[[], bool] | None = None,
                  shown: tuple[str, str | None] | None = None) -> dict[str, Any] | None:
    """compress_imported, then (with a graph and `retrain_minutes`) the search trained at the budget as one more
    row (over `retrain_models`, default the search's), and the pick again over all rows; `on_progress` gets both
    parts' events (the sizes', then the search's, which name a rung). None where `should_stop` stopped either part;
    run again with the same `out` to continue (each part keeps its own state: OUT/compress_state.json, OUT/retrained/)."""
    if retrain_minutes and graph is None:
        raise ConfigError("retraining at the budget needs the graph to train on (--graph DATA)")
    bundle = load_bundle(source)  # read once for both parts
    report = compress_imported(bundle, out, search, graph, on_progress=on_progress, should_stop=should_stop,
                               shown=shown)
    if report is None or not retrain_minutes or graph is None:
        return report
    row = retrained_row(bundle, Path(graph), Path(out), search, retrain_minutes, models=retrain_models,
                        train_configs=train_configs, on_progress=on_progress, should_stop=should_stop)
    if row is None:
        return None
    report["candidates"] = [r for r in report["candidates"] if r["precision"] != RETRAINED] + [row]
    report["seconds"] = round(report["seconds"] + row.get("retrained", {}).get("seconds", 0.0), 1)
    return finish(Path(out), report)


def retrained_row(source: Bundle, graph: Path, out: Path, search: ImportedSearch, minutes: float, *,
                  models: tuple[ModelKind, ...] | None = None,
                  train_configs: Mapping[ModelKind, TrainConfig] | None = None, on_progress: ProgressCallback | None = None,
                  should_stop: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """The report row of a model trained at search.max_bytes on `graph` (OUT/retrained/, a finished search there
    reused), scored like the coded sizes: filtered MRR on the same valid triples, mapped by name. `models`: the
    search's (default both). At 1/32 of FB15k-237's 45-minute ComplEx in 60 minutes, both models' search kept its
    RotatE baseline (test 0.2711 against the source's 0.2859) and EARL's alone tested 0.2819 (docs/import.md)."""
    folder = out / RETRAINED
    # Bytes like for like: a source without its graph is matched by bundles without one where the model allows.
    config = CompressConfig(max_bytes=search.max_bytes, time_limit_minutes=minutes, seed=search.seed,
                            known_answers="graph" if source.has_graph else "none", models=models or MODELS)
    try:
        dataset = load_dataset(graph, labels=False)
        finished = load_state(folder, config, dataset) is not None and (folder / "report.json").is_file()
        made = (json.loads((folder / "report.json").read_text()) if finished else
                compress(dataset, folder, config, train_configs=train_configs, on_progress=on_progress,
                         should_stop=should_stop))
    except (ConfigError, DatasetError) as exc:  # e.g. nothing trained here fits the budget beside the graph
        return {"precision": RETRAINED, "estimate": search.max_bytes, "fits": False, "skipped": str(exc)}
    if made is None:
        return None
    started = time.monotonic()
    bundle = load_bundle(folder / PICK)
    splits = read_graph(graph, source).splits
    mrr, scored = score(bundle, source, eval_sample(splits["valid"], search), np.concatenate(list(splits.values())))
    size = (folder / PICK).stat().st_size
    seconds = made["spent_seconds"] + time.monotonic() - started  # the search and its test, then this scoring
    return {"precision": RETRAINED, "estimate": size, "bytes": size, "path": f"{RETRAINED}/{PICK}",
            "fits": size <= search.max_bytes, "mrr": mrr,
            "retrained": {"candidate": made["pick"]["candidate"], "precision": made["pick"]["precision"],
                          "minutes": minutes, "entities": len(bundle.entities), "eval_triples": scored,
                          "test": made.get("test"), "seconds": round(seconds, 1), "report": f"{RETRAINED}/report.json"}}


def score(bundle: Bundle, source: Bundle, triples: np.ndarray, known: np.ndarray) -> tuple[float | None, int]:
    """Filtered MRR of a trained `bundle` on `triples`, ids over the `source`'s names mapped to the bundle's by name
    (triples naming an entity or relation it lacks are left out), with `known` (the same ids) as known answers;
    and how many triples it was scored on."""
    entity = _id_map(source.entities, bundle.entities)
    relation = _id_map(source.relations, bundle.relations)

    def mapped(ids: np.ndarray) -> np.ndarray:
        ids = np.stack([entity[ids[:, 0]], relation[ids[:, 1]], entity[ids[:, 2]]], axis=1)
        return ids[(ids >= 0).all(axis=1)]

    sample = mapped(np.asarray(triples, dtype=np.int64))
    if not len(sample):
        return None, 0
    params = {"entities": bundle.entity_embeddings().numpy(), "relations": bundle.relation_embeddings().numpy()}
    answers = KnownAnswers(mapped(np.asarray(known, dtype=np.int64)), len(bundle.relations))
    return filtered_mrr(bundle, sample, answers, params=params), len(sample)


def _id_map(names: Iterable[str], into: Iterable[str]) -> np.ndarray:
    """For each of `names`, its index in `into` (-1 where absent)."""
    index = {name: i for i, name in enumerate(into)}
    return np.array([index.get(name, -1) for name in names], dtype=np.int64)


__all__ = ["RETRAINED", "compress_from", "retrained_row", "score"]
