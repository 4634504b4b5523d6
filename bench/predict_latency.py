"""Latency of top-10 predictions from a bundle: in the library, and over HTTP through uvicorn on 127.0.0.1.

    python bench/predict_latency.py BUNDLE [--queries 300] [--concurrency 32 --requests 3000] [--name predict_latency]
    # writes bench/results/<name>.{json,md}

The API runs as `uvicorn api.main:app` in a subprocess (1 torch/FAISS thread, as deployed) with a throwaway
EARL_HOME; the bundle is registered through POST /models. Queries are (head, relation) and (tail, relation)
pairs drawn from the bundle's own triples: first sent one after another (one client), then by `--concurrency`
client threads at once for `--requests` requests (throughput), then in POST /predict batches of BATCH (queries/s).
The library's top-10 is also checked against exact brute force (recall@10). The API's VmRSS is read once the
model is loaded; an int8 or pq RotatE bundle is served from its codes (earl_service/serve/codes.py).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import LoadWatch, api_server, cpu_seconds, percentiles, rss_mib, write_results

from earl_service.bundle.model_io import load_bundle
from earl_service.serve.predictor import LinkPredictor, configure_threads


def library_latency(predictor: LinkPredictor, queries: list) -> tuple[list[float], float]:
    """Milliseconds of each predict_tails / predict_heads call, and recall@10 against exact brute force."""
    library, hits, total = [], 0, 0
    for head, rel, tail in queries:
        for call, exact, anchor in ((predictor.predict_tails, predictor.brute_force_tails, head),
                                    (predictor.predict_heads, predictor.brute_force_heads, tail)):
            t0 = time.perf_counter()
            got = call(anchor, rel, 10)
            library.append((time.perf_counter() - t0) * 1e3)
            truth = {name for name, _ in exact(anchor, rel, 10)}
            hits += len(truth & {name for name, _ in got})
            total += len(truth)
    return library, hits / max(total, 1)


def http_latency(base: str, pid: int, bundle: Path, queries: list) -> tuple[str, float, list[float], dict]:
    """Register `bundle`, then one client's GET /predict calls: (model id, first query s, ms per call, the server's
    own ms per call: `mean_ms` from its /metrics, `cpu_ms` the CPU time process `pid` used per call)."""
    http_ms = []
    with httpx.Client(base_url=base, timeout=30) as http:
        model = http.post("/models", files={"bundle": (bundle.name, bundle.read_bytes())}).json()["id"]
        t0 = time.perf_counter()
        http.get("/predict", params={"model": model, "head": queries[0][0], "relation": queries[0][1]})
        first_s = time.perf_counter() - t0  # includes loading the bundle and building the index
        server_before, cpu_before = server_seconds(http), cpu_seconds(pid)
        for head, rel, tail in queries:
            for side, anchor in (("head", head), ("tail", tail)):
                t0 = time.perf_counter()
                r = http.get("/predict", params={"model": model, side: anchor, "relation": rel, "k": 10})
                http_ms.append((time.perf_counter() - t0) * 1e3)
                r.raise_for_status()
        cpu_ms = (cpu_seconds(pid) - cpu_before) / len(http_ms) * 1e3  # before /metrics renders its reply
        server_after = server_seconds(http)
    server_ms = (server_after[0] - server_before[0]) / (server_after[1] - server_before[1]) * 1e3
    return model, first_s, http_ms, {"mean_ms": round(server_ms, 3), "cpu_ms": round(cpu_ms, 3)}


def markdown(result: dict) -> str:
    lib, web, con, load = result["library"], result["http"], result["concurrent"], result["one_client_load"]
    md = (f"# Top-10 prediction latency ({result['entities']} entities, dim {result['dim']}, "
          f"{result['precision']}, {result['index']} index)\n\n{result['queries']} sequential queries (tails and heads) from one client, then {con['requests']} "
          f"requests from {con['concurrency']} concurrent clients; API with 1 thread.\n\n"
          "| path | p50 ms | p95 ms | p99 ms | requests/s |\n|---|---:|---:|---:|---:|\n"
          f"| library (LinkPredictor) | {lib['p50_ms']} | {lib['p95_ms']} | {lib['p99_ms']} | |\n"
          f"| HTTP GET /predict, 1 client | {web['p50_ms']} | {web['p95_ms']} | {web['p99_ms']} | |\n"
          f"| HTTP GET /predict, {con['concurrency']} clients | {con['p50_ms']} | {con['p95_ms']} | {con['p99_ms']} | "
          f"{con['requests_per_s']:.1f} |\n"
          f"| HTTP POST /predict, batches of {result['batched']['batch']} | | | | "
          f"{result['batched']['queries_per_s']} queries/s |\n\n"
          f"Bundle {result['bundle_bytes'] / 2**20:.2f} MiB; the predictor holds {result['resident_bytes'] / 2**20:.1f} "
          f"MiB (LinkPredictor.resident_bytes); API VmRSS with it loaded {result['api_rss_mib']} MiB.\n\n"
          f"One client: the server's own mean time per request (ASGI middleware to last byte, from its "
          f"/metrics histogram) was {result['server_mean_ms']} ms, and the API process used {result['server_cpu_ms']} ms "
          "of CPU per request (utime + stime over those requests, the figure a loaded machine inflates least); the rest "
          f"of the HTTP figure is the client (httpx) and the loopback socket. Load average (1 min) during it: "
          f"{load['load_average_1min']['start']} -> {load['load_average_1min']['end']}, CPU steal "
          f"{load['cpu_steal_share']}.\n\n"
          f"Errors under load: {con['errors']}. Recall@10 of the library's top-10 against exact brute force: "
          f"{result['recall_at_10']:.4f}. Building the predictor (rebuild embeddings + index): "
          f"{result['predictor_build_s']} s; first HTTP query (cache miss, includes that): "
          f"{result['first_http_query_s']} s.\n")
    return md


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--name", default="predict_latency", help="results file stem under bench/results/")
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
    library, recall = library_latency(predictor, queries)
    with api_server(Path(tempfile.mkdtemp())) as (base, proc):  # the API's default SQLite store, 1 thread
        watch = LoadWatch()
        model, first_s, http_ms, server = http_latency(base, proc.pid, args.bundle, queries)
        load_during = watch.summary()
        rss = rss_mib(proc.pid)
        batch = batched(base, model, queries)
        load = concurrent_load(base, model, queries, args.concurrency, args.requests)
    result = {"bundle": args.bundle.name, "entities": len(names), "dim": bundle.config.dim,
              "index": predictor.index_kind, "precision": bundle.precision, "bundle_bytes": args.bundle.stat().st_size,
              "api_rss_mib": round(rss, 1), "resident_bytes": predictor.resident_bytes, "batched": batch,
              "queries": len(library), "arch": platform.machine(),
              "library": percentiles(library), "http": percentiles(http_ms),
              "server_mean_ms": server["mean_ms"], "server_cpu_ms": server["cpu_ms"], "one_client_load": load_during,
              "recall_at_10": recall,
              "predictor_build_s": round(load_s, 3), "first_http_query_s": round(first_s, 3), "concurrent": load}
    md = markdown(result)
    write_results(args.name, result, md)
    print(md)


BATCH = 100  # queries per POST /predict


def batched(base: str, model: str, queries: list) -> dict:
    """Both directions of every query in POST /predict batches of BATCH: queries per second."""
    items = [{"relation": rel, side: anchor, "k": 10} for head, rel, tail in queries
             for side, anchor in (("head", head), ("tail", tail))]
    with httpx.Client(base_url=base, timeout=600) as http:
        t0 = time.perf_counter()
        for start in range(0, len(items), BATCH):
            http.post("/predict", json={"model": model, "queries": items[start : start + BATCH]}).raise_for_status()
        wall = time.perf_counter() - t0
    return {"batch": BATCH, "queries": len(items), "seconds": round(wall, 3), "queries_per_s": round(len(items) / wall, 1)}


def server_seconds(http: httpx.Client) -> tuple[float, float]:
    """(sum of seconds, count) of GET /predict in the API's Prometheus histogram."""
    text = http.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith("earl_http_request_duration_seconds_") and 'route="/predict"' in line:
            name = line.split("{")[0].rsplit("_", 1)[1]
            if name in ("sum", "count"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values.get("sum", 0.0), values.get("count", 0.0)


def concurrent_load(base: str, model: str, queries: list, concurrency: int, requests: int,
                    max_seconds: float = 0.0) -> dict:
    """`requests` GET /predict calls spread over `concurrency` threads, each with its own connection; with
    `max_seconds`, clients stop sending when that much time has passed (`requests` then reports what was sent)."""
    from concurrent.futures import ThreadPoolExecutor

    per_thread = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    stop_at = time.perf_counter() + max_seconds if max_seconds else float("inf")

    def client(i: int) -> tuple[list[float], int]:
        ms, errors = [], 0
        with httpx.Client(base_url=base, timeout=60) as http:
            for j in range(per_thread[i]):
                if time.perf_counter() > stop_at:
                    break
                head, rel, tail = queries[(i * 7919 + j) % len(queries)]
                params = {"model": model, "relation": rel, "k": 10, **({"head": head} if j % 2 else {"tail": tail})}
                t0 = time.perf_counter()
                try:
                    ok = http.get("/predict", params=params).status_code == 200
                except httpx.HTTPError:
                    ok = False
                ms.append((time.perf_counter() - t0) * 1e3)
                errors += not ok
        return ms, errors

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(client, range(concurrency)))
    wall = time.perf_counter() - t0
    ms = [x for r, _ in results for x in r]
    return {"concurrency": concurrency, "requests": len(ms), "errors": sum(e for _, e in results),
            "seconds": round(wall, 3), "requests_per_s": len(ms) / wall, **percentiles(ms)}


if __name__ == "__main__":
    main()
