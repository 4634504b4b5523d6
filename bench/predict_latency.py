"""Latency of top-10 predictions from a bundle: in the library, and over HTTP through uvicorn on 127.0.0.1.

    python bench/predict_latency.py BUNDLE [--queries 300]     # writes bench/results/predict_latency.{json,md}

The API runs as `uvicorn api.main:app` in a subprocess (1 torch/FAISS thread, as deployed) with a throwaway
EARL_HOME; the bundle is registered through POST /models. Queries are (head, relation) and (tail, relation)
pairs drawn from the bundle's own triples, sent one after another (no concurrency).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from earl_service.bundle import load_bundle
from earl_service.predict import LinkPredictor, configure_threads

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"


def percentiles(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {"p50_ms": round(statistics.median(ms), 3), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3),
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 3)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    configure_threads(1)
    bundle = load_bundle(args.bundle)
    t0 = time.perf_counter()
    predictor = LinkPredictor.from_bundle(bundle)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    names, rels = bundle.entities.names, bundle.relations.names
    picked = bundle.triples[rng.choice(len(bundle.triples), args.queries, replace=len(bundle.triples) < args.queries)]
    queries = [(names[h], rels[r], names[t]) for h, r, t in picked]

    library = []
    for head, rel, tail in queries:
        for call, anchor in ((predictor.predict_tails, head), (predictor.predict_heads, tail)):
            t0 = time.perf_counter()
            call(anchor, rel, 10)
            library.append((time.perf_counter() - t0) * 1e3)

    home, port = Path(tempfile.mkdtemp()), free_port()
    env = {**os.environ, "EARL_HOME": str(home), "EARL_API_TOKEN": ""}
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:app", "--port", str(port),
                               "--log-level", "warning"], cwd=ROOT, env=env)
    http_ms = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for _ in range(300):
                try:
                    if http.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            files = {"bundle": (args.bundle.name, args.bundle.read_bytes())}
            model = http.post("/models", files=files).json()["id"]
            t0 = time.perf_counter()
            http.get("/predict", params={"model": model, "head": queries[0][0], "relation": queries[0][1]})
            first_s = time.perf_counter() - t0  # includes loading the bundle and building the index
            for head, rel, tail in queries:
                for side, anchor in (("head", head), ("tail", tail)):
                    t0 = time.perf_counter()
                    r = http.get("/predict", params={"model": model, side: anchor, "relation": rel, "k": 10})
                    http_ms.append((time.perf_counter() - t0) * 1e3)
                    r.raise_for_status()
    finally:
        server.terminate()
        server.wait(timeout=30)

    result = {"bundle": args.bundle.name, "entities": len(names), "dim": bundle.config.dim,
              "index": predictor.index_kind, "queries": len(library), "machine": platform.machine(),
              "library": percentiles(library), "http": percentiles(http_ms),
              "predictor_build_s": round(load_s, 3), "first_http_query_s": round(first_s, 3)}
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predict_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    lib, web = result["library"], result["http"]
    (args.out / "predict_latency.md").write_text(
        f"# Top-10 prediction latency ({result['entities']} entities, dim {result['dim']}, {result['index']} index)\n\n"
        f"Command: `python bench/predict_latency.py {args.bundle.name}`, {len(library)} sequential queries "
        f"(tails and heads), 1 thread, {time.strftime('%Y-%m-%d')}.\n\n"
        "| path | p50 ms | p95 ms | p99 ms |\n|---|---:|---:|---:|\n"
        f"| library (LinkPredictor) | {lib['p50_ms']} | {lib['p95_ms']} | {lib['p99_ms']} |\n"
        f"| HTTP GET /predict (uvicorn, 127.0.0.1) | {web['p50_ms']} | {web['p95_ms']} | {web['p99_ms']} |\n\n"
        f"Building the predictor (rebuild embeddings + index): {result['predictor_build_s']} s; first HTTP query "
        f"(cache miss, includes that): {result['first_http_query_s']} s.\n")


if __name__ == "__main__":
    main()
