"""Measure LinkPredictor latency and exactness with a flat and an HNSW FAISS index over N entities.

    python bench/predict_index.py                      # writes bench/results/predict_index.{json,md}
    python bench/predict_index.py --sizes 2000 10000 --queries 100

Synthetic embeddings (uniform in the RotatE init range, dim 150 as in the paper), one thread for torch
and FAISS as in the API process. For each size: index build time, median and p95 latency of one
predict_tails call (shortlist + exact re-rank), and the share of queries whose top-10 equals the exact
brute-force top-10. It also records how deep the exact top-10 sits in L2 and in L1 order, the reason the
index searches L1 over rotated copies. HNSW_THRESHOLD in earl_service/serve/index.py is read off these rows:
the flat index is always exact (its shortlist is certified); HNSW is only worth its build time and its
misses once flat search costs tens of milliseconds (clustered data is the default; --uniform is harder).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, percentiles, write_results

from earl_service.data.vocab import Vocab
from earl_service.serve.index import PROXY_ROTATIONS, lift
from earl_service.serve.predictor import LinkPredictor, configure_threads


def synthetic(n: int, num_rel: int, dim: int, *, clustered: bool = True, seed: int = 0):
    """Entities in the RotatE init range; `clustered`: around n/50 centres, as trained embeddings group by type."""
    rng = np.random.default_rng(seed)
    bound = 12.0 / dim  # (gamma + epsilon) / dim, the init range of training
    ent = rng.uniform(-bound, bound, (n, 2 * dim)).astype(np.float32)
    if clustered:
        centres = ent[: max(1, n // 50)]
        ent = (centres[rng.integers(len(centres), size=n)] + 0.3 * bound * rng.standard_normal((n, 2 * dim)))
        ent = ent.astype(np.float32)
    rel = rng.uniform(-bound, bound, (num_rel, dim)).astype(np.float32)
    return ent, rel, Vocab([f"e{i}" for i in range(n)]), Vocab([f"r{i}" for i in range(num_rel)], kind="relation")


def depth(pred: LinkPredictor, queries: int, rng: np.random.Generator) -> dict[str, list[int]]:
    """Worst rank (0-based) of the exact top-10 in L2, L1 and lifted-L1 (the index's proxy) order, per query."""
    x = pred.entity_embeddings
    lifted = lift(x, pred.dim, PROXY_ROTATIONS["hnsw"])
    out: dict[str, list[int]] = {"l2": [], "l1": [], "lifted_l1": []}
    for _ in range(queries):
        q = pred.query_vector("tail", int(rng.integers(pred.num_entities)), int(rng.integers(len(pred.relations))))
        top = np.argsort(pred.distances(q))[:10]
        lq = lift(q, pred.dim, PROXY_ROTATIONS["hnsw"])
        for name, proxy in (("l2", np.linalg.norm(x - q, axis=1)), ("l1", np.abs(x - q).sum(1)),
                            ("lifted_l1", np.abs(lifted - lq).sum(1))):
            rank = np.empty(len(proxy), dtype=np.int64)
            rank[np.argsort(proxy)] = np.arange(len(proxy))
            out[name].append(int(rank[top].max()))
    return out


def measure(n: int, dim: int, queries: int, kinds: list[str], clustered: bool) -> dict:
    ent, rel, entities, relations = synthetic(n, 10, dim, clustered=clustered)
    rng = np.random.default_rng(1)
    pairs = [(f"e{rng.integers(n)}", f"r{rng.integers(10)}") for _ in range(queries)]
    row: dict = {"entities": n, "dim": dim, "queries": queries, "data": "clustered" if clustered else "uniform"}
    reference = None
    for kind in kinds:
        t0 = time.perf_counter()
        pred = LinkPredictor(ent, rel, entities, relations, np.zeros((0, 3)), gamma=10.0, epsilon=2.0, index=kind)
        build = time.perf_counter() - t0
        if reference is None:
            reference = [pred.brute_force_tails(h, r) for h, r in pairs]
        times, exact = [], 0
        for (h, r), want in zip(pairs, reference, strict=True):
            t0 = time.perf_counter()
            got = pred.predict_tails(h, r)
            times.append((time.perf_counter() - t0) * 1e3)
            exact += [name for name, _ in got] == [name for name, _ in want]
        row[kind] = {"build_s": round(build, 3), **percentiles(times), "exact_share": exact / queries}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000, 20000, 50000, 100000])
    parser.add_argument("--uniform", action="store_true", help="unclustered entities (the hard case for HNSW)")
    parser.add_argument("--dim", type=int, default=150)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    configure_threads(1)
    ent, rel, entities, relations = synthetic(3000, 10, args.dim, clustered=False)
    ranks = depth(LinkPredictor(ent, rel, entities, relations, np.zeros((0, 3)), gamma=10.0, epsilon=2.0,
                                index="exact"), 300, np.random.default_rng(2))
    proxy = {name: {"median": int(np.median(v)), "p99": int(np.percentile(v, 99)), "max": int(max(v))}
             for name, v in ranks.items()}
    rows = []
    for n in args.sizes:
        rows.append(measure(n, args.dim, args.queries, ["flat", "hnsw"], not args.uniform))
        print(json.dumps(rows[-1]), flush=True)
    result = {"threads": 1, "proxy_depth_3000": proxy, "rows": rows}  # machine, command, date: the writer's
    data = "uniform" if args.uniform else "clustered"
    lines = [f"# LinkPredictor: flat vs HNSW (METRIC_L1), 1 thread, synthetic {data} dim-{args.dim} embeddings", "",
             ("Depth (0-based rank) of the exact top-10 in proxy order, 3000 uniform entities, 300 queries: "
              f"L2 {proxy['l2']}, L1 {proxy['l1']}, L1 over {PROXY_ROTATIONS['hnsw']} rotated copies {proxy['lifted_l1']}."),
             "",
             ("| entities | flat build s | flat p50 ms | flat p95 ms | flat exact | HNSW build s | HNSW p50 ms "
              "| HNSW p95 ms | HNSW exact |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f, h = r["flat"], r["hnsw"]
        lines.append(f"| {r['entities']} | {f['build_s']} | {f['p50_ms']} | {f['p95_ms']} | {f['exact_share']:.3f} "
                     f"| {h['build_s']} | {h['p50_ms']} | {h['p95_ms']} | {h['exact_share']:.3f} |")
    lines += ["", "`exact`: share of queries whose top-10 equals the brute-force top-10 (names and order).", ""]
    stem = "predict_index_uniform" if args.uniform else "predict_index"
    write_results(stem, result, "\n".join(lines), folder=args.out)


if __name__ == "__main__":
    main()
