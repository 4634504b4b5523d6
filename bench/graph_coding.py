"""Bits per triple of the bundle's graph coding against the alternatives (issue 53: "the graph coded compactly").

Every coding is lossless over the set of distinct training triples and ends in xz -9e, as the bundle's does:
- raw ids: the (h, r, t) triples as given, int32, xz'd: the baseline the issue names;
- bundle: what pack_graph writes (distinct triples sorted by head, relation, tail as CSR: per-head counts, then
  relations and tails in the narrowest unsigned types);
- grouped: CSR by (head, relation) groups (groups per head, relation deltas, group sizes, tails);
- grouped + tail deltas: the same with each group's sorted tails delta-coded;
- byte planes: the deltas split into byte planes (high bytes apart from low), each xz'd separately;
and, for scale, what a Bloom filter of the triples would take at 1% and 0.1% false positives (the only other way
a bundle could tell known answers, approximately).

    python bench/graph_coding.py [--datasets ../shared/datasets] [--wordnet data/wordnet-full]
"""

from __future__ import annotations

import argparse
import lzma
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, write_results

from earl_service.bundle.format import narrowest_uint, pack_graph
from earl_service.data.dataset import load_dataset

DATASETS = ("codex-s", "fb15k-237", "wn18rr")


def xz(data: bytes) -> int:
    return len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def narrow(values: np.ndarray) -> bytes:
    return values.astype(narrowest_uint(int(values.max(initial=0)))).tobytes()


def planes(values: np.ndarray) -> list[bytes]:
    wide = values.astype(narrowest_uint(int(values.max(initial=0))))
    return [bytes(p) for p in wide.view(np.uint8).reshape(len(wide), -1).T]


def codings(triples: np.ndarray, n: int, r: int) -> dict[str, int]:
    """Bytes of each coding of `triples` (distinct, any order) over n entities and r relations."""
    t = np.unique(triples.astype(np.int64), axis=0)  # sorted by head, relation, tail
    group_start = np.r_[True, (t[1:, 0] != t[:-1, 0]) | (t[1:, 1] != t[:-1, 1])]
    heads, rels = t[group_start, 0], t[group_start, 1]
    head_start = np.r_[True, heads[1:] != heads[:-1]]
    rel_deltas = np.where(head_start, rels, np.r_[0, np.diff(rels)])
    group_sizes = np.diff(np.r_[np.flatnonzero(group_start), len(t)])
    tail_deltas = np.where(group_start, t[:, 2], np.r_[0, np.diff(t[:, 2])])
    shape = [narrow(np.bincount(heads, minlength=n)), narrow(rel_deltas), narrow(group_sizes)]
    return {
        "raw ids": xz(triples.astype(np.int32).tobytes()),
        "bundle": pack_graph(t, n, r).nbytes,
        "grouped": xz(b"".join(shape) + narrow(t[:, 2])),
        "grouped + tail deltas": xz(b"".join(shape) + narrow(tail_deltas)),
        "byte planes": sum(map(xz, shape)) + sum(map(xz, planes(tail_deltas))),
    }


def bloom_bytes(count: int, false_positive: float) -> int:
    return math.ceil(-count * math.log(false_positive) / math.log(2) ** 2 / 8)


def measure(name: str, folder: Path) -> dict:
    ds = load_dataset(folder, labels=False)
    started = time.perf_counter()
    sizes = codings(ds.train, ds.num_entities, ds.num_relations)
    triples = len(np.unique(ds.train, axis=0))
    return {"dataset": name, "entities": ds.num_entities, "relations": ds.num_relations, "triples": triples,
            "bytes": sizes, "bits_per_triple": {k: 8 * v / triples for k, v in sizes.items()},
            "bloom_bytes": {"1%": bloom_bytes(triples, 0.01), "0.1%": bloom_bytes(triples, 0.001)},
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_datasets_argument(parser)
    parser.add_argument("--wordnet", type=Path, default=None, help="a WordNet-full folder (make wordnet-full)")
    args = parser.parse_args()
    rows = [measure(name, args.datasets / name) for name in DATASETS]
    if args.wordnet is not None:
        rows.append(measure("wordnet-full", args.wordnet))
    kinds = list(rows[0]["bytes"])
    table = md_table(["dataset", "entities", "triples", *kinds, "Bloom 1%", "Bloom 0.1%"],
                     [[r["dataset"], f"{r['entities']:,}", f"{r['triples']:,}",
                       *(f"{r['bits_per_triple'][k]:.2f}" for k in kinds),
                       *(f"{8 * r['bloom_bytes'][p] / r['triples']:.2f}" for p in ("1%", "0.1%"))] for r in rows])
    best = {r["dataset"]: min(r["bytes"], key=r["bytes"].get) for r in rows}
    text = ("# The graph in a bundle: bits per distinct training triple\n\n"
            "Every coding is lossless and ends in xz -9e; `bundle` is what pack_graph writes. Bloom: the bits of a "
            "filter that would answer \"is this a known fact?\" with 1% or 0.1% false positives (lossy).\n\n"
            + table + "\n\nSmallest lossless coding per dataset: "
            + ", ".join(f"{d} {k}" for d, k in best.items()) + ".\n")
    write_results("graph_coding", {"rows": rows}, text)


if __name__ == "__main__":
    main()
