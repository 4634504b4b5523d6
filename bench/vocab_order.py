"""Bytes of a bundle's fixed part (entity names and the training graph, each xz -9e as the bundle packs them) with
entity ids in file order (each entity numbered where it first appears, as load_dataset did before) and in name
order (as it does now: earl_service/data/triples.py `name_order`, digit runs by value), and plainly sorted.

Ids are positions and any order serves the model; the order decides what xz finds: sorted names share prefixes with
their neighbours, and related entities with nearby names (WordNet's byte offsets, Freebase's mids) get nearby ids in
the graph's CSR. The names column is `vocab.entities` of a bundle, the graph column `graph` (pack_graph).

    python bench/vocab_order.py                                   # CoDEx-S, FB15k-237, WN18RR
    python bench/vocab_order.py --graph data/wordnet-full-noinv --graph data/synthetic-1m
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, add_datasets_argument, md_table, write_results

from earl_service.bundle.format import pack_graph, pack_strings
from earl_service.data.dataset import load_dataset
from earl_service.data.triples import name_order, renumbered

DATASETS = ("codex-s", "fb15k-237", "wn18rr")


def file_order(train: np.ndarray, entities: int) -> np.ndarray:
    """Entity ids in order of first appearance in `train` (head before tail, row by row), then the rest (entities
    of valid/test only) as numbered: the numbering load_dataset gave before it sorted by name."""
    ids, first = np.unique(train[:, ::2].ravel(), return_index=True)
    seen = ids[np.argsort(first)]
    return np.concatenate([seen, np.setdiff1d(np.arange(entities), seen)])


def fixed_bytes(path: Path) -> dict:
    """Names and graph bytes of the dataset at `path` in file order, name order and plain code-point order."""
    started = time.perf_counter()
    ds = load_dataset(path, labels=False)
    names, n = ds.entities.names, len(ds.entities)
    assert names[: ds.num_train_entities] == sorted(names[: ds.num_train_entities], key=name_order), "not in name order"
    row = {"graph": path.name, "entities": n, "train_triples": len(ds.train)}
    old = file_order(ds.train, n)  # old position -> id
    plain = np.array(sorted(range(n), key=names.__getitem__), dtype=np.int64)  # code-point order
    orders = {"file": old, "name": np.arange(n), "plain": plain}  # position -> id
    for order, ids in orders.items():
        row[f"names_{order}"] = int(pack_strings([names[i] for i in ids.tolist()]).nbytes)
        row[f"graph_{order}"] = int(pack_graph(renumbered(ds.train, ids), n, ds.num_relations).nbytes)
        row[f"fixed_{order}"] = row[f"names_{order}"] + row[f"graph_{order}"]
    row["change"] = row["fixed_name"] / row["fixed_file"] - 1
    row["seconds"] = round(time.perf_counter() - started, 1)
    print(row, flush=True)
    return row


def markdown(rows: list[dict]) -> str:
    table = md_table(["graph", "entities", "train triples", "names: file / name / plain order", "bytes per name",
                      "graph: file / name / plain order", "names + graph: file -> name order", "change"],
                     [[r["graph"], f"{r['entities']:,}", f"{r['train_triples']:,}",
                       f"{r['names_file']:,} / {r['names_name']:,} / {r['names_plain']:,}",
                       f"{r['names_file'] / r['entities']:.2f} -> {r['names_name'] / r['entities']:.2f}",
                       f"{r['graph_file']:,} / {r['graph_name']:,} / {r['graph_plain']:,}",
                       f"{r['fixed_file']:,} -> {r['fixed_name']:,}", f"{r['change']:+.1%}"] for r in rows])
    return "\n".join(["# Entity ids in name order: a bundle's names and graph", "",
                      "xz -9e bytes of `vocab.entities` and `graph` as a bundle packs them, with entity ids in file "
                      "order (each numbered where it first appears, as before), in name order (load_dataset now: "
                      "digit runs by value, `name_order`) and in plain code-point order. A RotatE bundle without "
                      "its graph (`--known-answers none`) carries the names alone.", "", table])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--graph", type=Path, action="append", default=[], help="another dataset folder")
    parser.add_argument("--quick", action="store_true", help="CoDEx-S alone (a smoke run)")
    args = parser.parse_args()
    folders = [args.datasets / name for name in (DATASETS[:1] if args.quick else DATASETS)] + args.graph
    rows = [fixed_bytes(folder) for folder in folders]
    # A smoke run stays in runs/, out of bench/results.
    _, md = write_results("vocab_order", {"rows": rows}, markdown(rows), folder=REPO / "runs" if args.quick else None)
    print(md.read_text())


if __name__ == "__main__":
    main()
