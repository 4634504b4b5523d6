"""Load: many top-10 /predict requests at once against one model, served by uvicorn on 127.0.0.1.

    python bench/load.py BUNDLE [--requests 10000] [--concurrency 32] [--max-seconds 600] [--name load]
    # writes bench/results/<name>.{json,md}

The API runs as `uvicorn api.main:app` (1 torch/FAISS thread, as deployed) over a throwaway EARL_HOME; BUNDLE is
registered through POST /models and one query loads it. Then `--concurrency` client threads, each with its own
connection, send `--requests` GET /predict (tails and heads of (entity, relation) pairs drawn from the bundle's
own triples, k=10) and stop early if `--max-seconds` pass. Reported: errors (any answer but 200, or no answer),
latency percentiles, throughput, and the server's resident memory (VmRSS) idle, with the model loaded before the
load, and after it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import api_server, md_table, rss_mib, write_results
from predict_latency import concurrent_load

from earl_service.bundle.model_io import load_bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop sending after this long")
    parser.add_argument("--queries", type=int, default=2000, help="distinct (entity, relation) pairs drawn")
    parser.add_argument("--name", default="load", help="results file name under bench/results/")
    args = parser.parse_args()

    bundle = load_bundle(args.bundle)
    names, rels = bundle.entities.names, bundle.relations.names
    rng = np.random.default_rng(0)
    picked = bundle.triples[rng.choice(len(bundle.triples), args.queries, replace=len(bundle.triples) < args.queries)]
    queries = [(names[h], rels[r], names[t]) for h, r, t in picked]

    with tempfile.TemporaryDirectory() as home, api_server(Path(home)) as (base, server):
        rss_idle = rss_mib(server.pid)
        with httpx.Client(base_url=base, timeout=120) as http:
            model = http.post("/models", files={"bundle": (args.bundle.name, args.bundle.read_bytes())}).json()["id"]
            t0 = time.perf_counter()
            http.get("/predict", params={"model": model, "head": queries[0][0], "relation": queries[0][1]})
            first_s = time.perf_counter() - t0  # loads the bundle, rebuilds the embeddings, builds the index
        rss_before = rss_mib(server.pid)
        load = concurrent_load(base, model, queries, args.concurrency, args.requests, max_seconds=args.max_seconds)
        rss_after = rss_mib(server.pid)
        alive = httpx.get(f"{base}/healthz", timeout=10).status_code == 200

    result = {"bundle": args.bundle.name, "entities": len(names), "relations": len(rels), "dim": bundle.config.dim,
              "requested": args.requests, "max_seconds": args.max_seconds, **load,
              "completed_all": load["requests"] == args.requests, "first_query_s": round(first_s, 3),
              "server_rss_mib": {"idle": round(rss_idle, 1), "before": round(rss_before, 1),
                                 "after": round(rss_after, 1)}, "healthy_after": alive}
    md = (f"# Load: {load['requests']} GET /predict at concurrency {args.concurrency}\n\n"
          f"One uvicorn process (1 thread) serving {args.bundle.name} ({len(names)} entities, dim "
          f"{bundle.config.dim}); top-10 tails and heads for {len(queries)} (entity, relation) pairs from its "
          "triples; clients on the same machine.\n\n"
          + md_table(["requests", "errors", "p50 ms", "p95 ms", "p99 ms", "requests/s", "seconds"],
                     [[load["requests"], load["errors"], load["p50_ms"], load["p95_ms"], load["p99_ms"],
                       round(load["requests_per_s"], 1), load["seconds"]]])
          + "\n\nServer memory (VmRSS): "
          f"{rss_idle:.0f} MiB idle, {rss_before:.0f} MiB with the model loaded, {rss_after:.0f} MiB after the load "
          f"({rss_after - rss_before:+.0f} MiB). First query (cache miss: load + index) {first_s:.2f} s. "
          f"/healthz after the load: {'ok' if alive else 'FAILED'}.\n")
    write_results(args.name, result, md)
    print(md)
    if load["errors"] or not alive:
        sys.exit(1)


if __name__ == "__main__":
    main()
