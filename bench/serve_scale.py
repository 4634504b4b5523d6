"""Serving a 1,000,000-entity pq bundle: load time, GET /predict latency, recall@10 against brute force, API RSS.

    python bench/serve_scale.py [--entities 1000000] [--dim 64] [--codes 32] [--queries 100] [--bundle PATH]
    # writes bench/results/serve_scale.{json,md}

The bundle is made once and kept at --bundle: its graph is earl_service/data/synthetic.py's (typed, power-law
degrees; 2 triples per entity, 50 relations); its RotatE entity table is random and clustered (CLUSTERS centres
uniform in +-RANGE, each entity its centre plus Gaussian noise of NOISE x RANGE), its relations small rotations
(phases ~ N(0, PHASE_SD)), so that h o r lands near the data as a trained model's queries do; the entity table is
product-quantized by faiss (bundle/codebooks.encode_table) at --codes codes a row.

The API runs as `uvicorn api.main:app` (1 torch/FAISS thread); the bundle is registered by POST /models. Measured:
the first GET /predict (bundle load + IVF build, the index then written beside the bundle), the first one again
after a restart (load with the cached index), --queries (head, relation) and (tail, relation) pairs from the graph
sent one after another, then POST /predict batches; recall@10 of the API's answers against an exact scan of the
decoded table in this process; VmRSS of the API process with the model loaded, against the same API holding a
tiny bundle (the fixed overhead: Python, torch, FAISS, FastAPI).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import LoadWatch, api_server, percentiles, rss_mib, write_results

from earl_service.bundle.model_io import Bundle, load_bundle
from earl_service.config import ModelConfig
from earl_service.data.vocab import Vocab

CLUSTERS, RANGE, NOISE, PHASE_SD = 4096, 0.15, 0.25, 0.15
BATCH = 100  # queries per POST /predict


def make_bundle(path: Path, entities: int, dim: int, codes: int) -> Path:
    """The synthetic RotatE bundle of the module doc, at precision pq:codes."""
    from earl_service.bundle.codebooks import encode_table
    from earl_service.data.synthetic import SyntheticConfig, generate

    kg = generate(SyntheticConfig(entities=entities, triples_per_entity=2.0, relations=50, valid=1, test=1))
    rng = np.random.default_rng(0)
    centres = rng.uniform(-RANGE, RANGE, (CLUSTERS, 2 * dim)).astype(np.float32)
    table = centres[rng.integers(0, CLUSTERS, entities)]
    table += (NOISE * RANGE * rng.standard_normal(table.shape)).astype(np.float32)
    config = ModelConfig(model="rotate", dim=dim)
    phases = rng.normal(0.0, PHASE_SD, (kg.num_relations, dim)).astype(np.float32)
    relations = (phases / config.phase_scale).astype(np.float32)
    tables = {"entities": encode_table(table, codes, iterations=10)}
    bundle = Bundle(config, {"entities": table, "relations": relations}, np.zeros(0, dtype=np.int64),
                    Vocab([f"e{i}" for i in range(entities)]),
                    Vocab([f"r{i}" for i in range(kg.num_relations)], kind="relation"), kg.train)
    return bundle.save(path, precision=f"pq:{codes}", pq_tables=tables)


def first_query(base: str, model: str, query: tuple[str, str, str]) -> float:
    """Seconds of the first GET /predict of `model` (it loads the bundle)."""
    with httpx.Client(base_url=base, timeout=600) as http:
        t0 = time.perf_counter()
        http.get("/predict", params={"model": model, "head": query[0], "relation": query[1]}).raise_for_status()
        return time.perf_counter() - t0


def sequential(base: str, model: str, queries: list) -> tuple[list[float], list[list[str]]]:
    """ms of each GET /predict (tails of each head, then heads of each tail) and the entities each returned."""
    ms, answers = [], []
    with httpx.Client(base_url=base, timeout=60) as http:
        for side, anchor, rel in _directions(queries):
            t0 = time.perf_counter()
            r = http.get("/predict", params={"model": model, side: anchor, "relation": rel, "k": 10})
            ms.append((time.perf_counter() - t0) * 1e3)
            r.raise_for_status()
            answers.append([p["entity"] for p in r.json()["predictions"]])
    return ms, answers


def batched(base: str, model: str, queries: list) -> dict:
    """POST /predict in batches of BATCH: queries per second."""
    items = [{"relation": rel, side: anchor, "k": 10} for side, anchor, rel in _directions(queries)]
    with httpx.Client(base_url=base, timeout=600) as http:
        t0 = time.perf_counter()
        for start in range(0, len(items), BATCH):
            body = {"model": model, "queries": items[start : start + BATCH]}
            http.post("/predict", json=body).raise_for_status()
        wall = time.perf_counter() - t0
    return {"batch": BATCH, "queries": len(items), "seconds": round(wall, 3), "queries_per_s": round(len(items) / wall, 1)}


def _directions(queries: list) -> list[tuple[str, str, str]]:
    return [d for h, r, t in queries for d in (("head", h, r), ("tail", t, r))]


def recall(bundle_path: Path, queries: list, answers: list[list[str]]) -> float:
    """recall@10 of `answers` against the exact top-10 over the decoded table (known answers left out)."""
    from earl_service.serve.predictor import LinkPredictor

    exact = LinkPredictor.from_bundle(load_bundle(bundle_path), from_codes=False, index="exact")
    hits = 0
    for (side, anchor, rel), got in zip(_directions(queries), answers, strict=True):
        call = exact.brute_force_tails if side == "head" else exact.brute_force_heads
        hits += len({name for name, _ in call(anchor, rel, 10)} & set(got))
    return hits / (10 * len(answers))


def register(base: str, bundle: Path) -> str:
    with httpx.Client(base_url=base, timeout=600) as http, bundle.open("rb") as f:
        r = http.post("/models", files={"bundle": (bundle.name, f)})
        r.raise_for_status()
        return r.json()["id"]


def overhead_mib(tiny: Path) -> float:
    """VmRSS of the API holding a tiny bundle: the fixed part of a served model's memory."""
    with api_server(Path(tempfile.mkdtemp())) as (base, proc):
        model = register(base, tiny)
        bundle = load_bundle(tiny)
        first_query(base, model, (bundle.entities.names[0], bundle.relations.names[0], ""))
        return rss_mib(proc.pid)


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def serve(bundle_path: Path, queries: list, env: dict[str, str]) -> dict:
    """Register, first query (builds the IVF), restart, first query again, then the timed queries and batches."""
    home = Path(tempfile.mkdtemp())
    with api_server(home, env=env, timeout=300) as (base, _):
        model = register(base, bundle_path)
        build_s = first_query(base, model, queries[0])
    with api_server(home, env=env, timeout=300) as (base, proc):
        cached_s = first_query(base, model, queries[0])
        rss = rss_mib(proc.pid)
        ms, answers = sequential(base, model, queries)
        batch = batched(base, model, queries)
        rss_after, peak = rss_mib(proc.pid), peak_mib(proc.pid)
    index_files = [p.name for p in home.glob("models/*/*.npz")]
    return {"first_query_building_index_s": round(build_s, 2), "first_query_cached_index_s": round(cached_s, 2),
            "http": percentiles(ms), "batched": batch, "answers": answers, "index_files": index_files,
            "rss_mib": round(rss, 1), "rss_after_queries_mib": round(rss_after, 1), "peak_rss_mib": round(peak, 1)}


def markdown(r: dict) -> str:
    web, bundle_mib = r["http"], r["bundle_bytes"] / 2**20
    return (f"# Serving {r['entities']:,} entities from pq codes (dim {r['dim']}, pq:{r['codes']}, IVF)\n\n"
            f"Synthetic bundle ({bundle_mib:.1f} MiB): {r['how_made']}\n\n"
            "| measure | value |\n|---|---:|\n"
            f"| first GET /predict, building the IVF (s) | {r['first_query_building_index_s']} |\n"
            f"| first GET /predict after a restart, IVF read from disk (s) | {r['first_query_cached_index_s']} |\n"
            f"| GET /predict, 1 client: p50 / p95 / p99 ms | {web['p50_ms']} / {web['p95_ms']} / {web['p99_ms']} |\n"
            f"| POST /predict, batches of {r['batched']['batch']}: queries/s | {r['batched']['queries_per_s']} |\n"
            f"| recall@10 against brute force on the decoded table | {r['recall_at_10']:.4f} |\n"
            f"| API VmRSS with the model loaded (MiB) | {r['rss_mib']} (after the queries {r['rss_after_queries_mib']}) |\n"
            f"| API VmRSS with a tiny bundle: fixed overhead (MiB) | {r['overhead_mib']} |\n"
            f"| (RSS - overhead) / bundle size | {r['rss_over_bundle']:.2f} |\n"
            f"| API peak RSS (VmHWM, load included; MiB) | {r['peak_rss_mib']} |\n\n"
            f"{len(r['answers_sample'])} of {r['requests']} answers kept in the JSON. Index cached beside the bundle: "
            f"{', '.join(r['index_files'])}. Load during the run: {r['load']}.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--codes", type=int, default=32)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--bundle", type=Path, default=Path("runs/serve_scale/synthetic-1m.safetensors"))
    parser.add_argument("--tiny", type=Path, default=Path("artifacts/demo-bundle.safetensors"))
    args = parser.parse_args()
    if not args.bundle.exists():
        args.bundle.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        make_bundle(args.bundle, args.entities, args.dim, args.codes)
        print(f"made {args.bundle} in {time.perf_counter() - t0:.0f} s", flush=True)
    bundle = load_bundle(args.bundle)
    rng = np.random.default_rng(1)
    picked = bundle.triples[rng.choice(len(bundle.triples), args.queries, replace=False)]
    names, rels = bundle.entities.names, bundle.relations.names
    queries = [(names[h], rels[r], names[t]) for h, r, t in picked]
    del bundle
    env = {"EARL_MAX_UPLOAD_MB": str(max(100, 2 * args.bundle.stat().st_size // 2**20)),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    watch = LoadWatch()
    served = serve(args.bundle, queries, env)
    overhead = overhead_mib(args.tiny)
    answers = served.pop("answers")
    size = args.bundle.stat().st_size
    result = {"entities": args.entities, "dim": args.dim, "codes": args.codes, "bundle_bytes": size,
              "how_made": __doc__.split("\n\n")[2].replace("\n", " "),
              **served, "requests": len(answers), "answers_sample": answers[:5],
              "recall_at_10": recall(args.bundle, queries, answers), "overhead_mib": round(overhead, 1),
              "rss_over_bundle": (served["rss_mib"] - overhead) / (size / 2**20), "load": watch.summary()}
    md = markdown(result)
    write_results("serve_scale", result, md)
    print(md)


if __name__ == "__main__":
    main()
