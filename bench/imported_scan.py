"""Does a FAISS flat index answer an imported model's query faster than the exact scan the server runs? One query
at a time (what `GET /predict` does), one thread, random float32 tables at the shapes of published models.

    python bench/imported_scan.py                        # 14,505 x 400 (FB15k-237 ComplEx) and 200,000 x 256
    python bench/imported_scan.py --shapes 1000000x256   # more rows

For each shape and scorer metric: the server's exact scan (core/scorers.py: every row's distance, numpy, in blocks
of 1,024 rows) plus its top-k selection, FAISS's IndexFlat search of the same metric (inner product, L2 or L1) for
k + 30 candidates (what a certified shortlist would ask for), and a numpy BLAS matrix-vector product with the same
selection: median of `--repeats` queries. With `--hnsw`, also the server's HNSW index of the metric (serve/metric.py,
what it builds from 100,000 rows): its build seconds, a query's shortlist and exact re-rank, and its top-k recall
against the exact scan over `--repeats` queries (random rows are HNSW's hard case: no clusters to walk).
Writes bench/results/imported_scan.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import md_table, median_seconds, write_results  # noqa: E402

METRICS = {"distmult": "inner product", "transe-l2": "L2", "transe-l1": "L1"}


def median_ms(fn, repeats: int) -> float:
    return round(1e3 * median_seconds(fn, repeats), 2)


def hnsw_row(table: np.ndarray, kind: str, k: int, repeats: int) -> dict:
    """serve/metric.MetricIndex as an HNSW graph: build seconds, median query ms (shortlist + exact re-rank + top-k),
    top-k recall against the exact scan over `repeats` random queries."""
    import time

    from earl_service.core import rotate, scorers
    from earl_service.serve.metric import MetricIndex

    scorer = scorers.SCORERS[kind]
    start = time.perf_counter()
    index = MetricIndex.build(table, scorer, kind="hnsw")
    built = time.perf_counter() - start
    queries = np.random.default_rng(1).standard_normal((repeats, table.shape[1])).astype(np.float32)
    none, found, seconds = np.zeros(0, np.int64), 0, []
    for q in queries:
        start = time.perf_counter()
        ids, dist = index.certified_shortlist(q, k, none)
        top = rotate.top_k(ids, dist, k)
        seconds.append(time.perf_counter() - start)
        found += len(set(np.asarray(top[0]).tolist()) & set(rotate.top_k(np.arange(len(table)), scorer.distances(
            q, table), k)[0].tolist()))
    return {"hnsw_build_s": round(built, 1), "hnsw_ms": round(1e3 * float(np.median(seconds)), 2),
            "hnsw_recall": round(found / (k * repeats), 3)}


def measure(rows: int, width: int, kind: str, k: int, repeats: int, hnsw: bool = False) -> dict:
    import faiss

    from earl_service.core import rotate, scorers

    rng = np.random.default_rng(0)
    table = rng.standard_normal((rows, width)).astype(np.float32)
    query = rng.standard_normal(width).astype(np.float32)
    scorer = scorers.SCORERS[kind]
    ids = np.arange(rows)
    metric = {"distmult": faiss.METRIC_INNER_PRODUCT, "transe-l2": faiss.METRIC_L2, "transe-l1": faiss.METRIC_L1}[kind]
    index = faiss.IndexFlat(width, metric)
    index.add(table)
    size = k + 30
    exact = median_ms(lambda: rotate.top_k(ids, scorer.distances(query, table), k), repeats)
    flat = median_ms(lambda: index.search(query[None], size), repeats)
    row = {"rows": rows, "width": width, "scorer": kind, "metric": METRICS[kind], "exact_scan_ms": exact,
           "faiss_flat_ms": flat}
    if kind == "distmult":
        row["numpy_matvec_ms"] = median_ms(lambda: np.argpartition(-(table @ query), size)[:size], repeats)
    if hnsw:
        row.update(hnsw_row(table, kind, k, repeats))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="14505x400,200000x256", help="ROWSxWIDTH, comma-separated")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--hnsw", action="store_true", help="also the HNSW index of the metric (build, query, recall)")
    a = p.parse_args()
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    results = [measure(*map(int, shape.split("x")), kind, a.k, a.repeats, a.hnsw)
               for shape in a.shapes.split(",") for kind in METRICS]
    md = ("# An imported model's query: exact scan or a FAISS flat index\n\n"
          f"One query at a time, one thread, random float32 tables; median of {a.repeats} queries. Exact scan: what "
          f"the server runs for an imported model (every row's distance in numpy, then the top {a.k}); FAISS: "
          f"IndexFlat of the scorer's metric, {a.k + 30} candidates; numpy matvec: one BLAS product and the same "
          "selection (inner product only).\n\n"
          + md_table(["rows", "width", "scorer", "metric", "exact scan ms", "FAISS flat ms", "numpy matvec ms",
                      *(["HNSW build s", "HNSW query ms", f"HNSW recall@{a.k}"] if a.hnsw else [])],
                     [[r["rows"], r["width"], r["scorer"], r["metric"], r["exact_scan_ms"], r["faiss_flat_ms"],
                       r.get("numpy_matvec_ms", "-"),
                       *([r["hnsw_build_s"], r["hnsw_ms"], r["hnsw_recall"]] if a.hnsw else [])] for r in results]))
    write_results("imported_scan", {"k": a.k, "repeats": a.repeats, "results": results}, md)
    print(md)


if __name__ == "__main__":
    main()
