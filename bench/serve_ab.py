"""GET /predict from one client against two API trees at once, the requests alternated: a before/after that both
sides measure under the same load (on shared, loaded cores two separate runs differ by more than most changes).

    python bench/serve_ab.py BUNDLE BEFORE_TREE [AFTER_TREE (default: this checkout)] [--requests 600]
    # BEFORE_TREE: e.g. `git archive <commit> | tar -x -C /tmp/before`; prints, writes nothing

Both trees serve `uvicorn api.main:app` (harness.api_server, 1 thread) with the bundle registered; after 30
warm-up queries each (head, relation) / (tail, relation) query from the bundle's graph goes to both, in turn first.
Reported per tree: wall p50 / p99 ms, and the server process's CPU ms per request (utime + stime from /proc: the
figure the machine's load inflates least).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import api_server, cpu_seconds

from earl_service.bundle.model_io import load_bundle

REPO = Path(__file__).resolve().parents[1]


def queries(bundle_path: Path, n: int) -> list[dict[str, str]]:
    bundle = load_bundle(bundle_path, keep_codes=True)
    rng = np.random.default_rng(0)
    picked = bundle.triples[rng.choice(len(bundle.triples), n // 2, replace=len(bundle.triples) < n // 2)]
    names, rels = bundle.entities.names, bundle.relations.names
    return [{side: names[a], "relation": rels[r], "k": "10"} for h, r, t in picked for side, a in (("head", h),
                                                                                                     ("tail", t))]


def compare(bundle: Path, trees: list[Path], asked: list[dict[str, str]]) -> dict[str, dict[str, float]]:
    with ExitStack() as stack:
        servers = []
        for tree in trees:
            base, proc = stack.enter_context(api_server(Path(tempfile.mkdtemp()), tree=tree))
            http = stack.enter_context(httpx.Client(base_url=base, timeout=60))
            model = http.post("/models", files={"bundle": (bundle.name, bundle.read_bytes())}).json()["id"]
            for params in asked[:30]:
                http.get("/predict", params={"model": model, **params}).raise_for_status()
            servers.append((str(tree), http, model, proc.pid))
        ms: dict[str, list[float]] = {name: [] for name, *_ in servers}
        cpu = {name: cpu_seconds(pid) for name, _, _, pid in servers}
        for i, params in enumerate(asked):
            for name, http, model, _ in servers if i % 2 == 0 else servers[::-1]:
                t0 = time.perf_counter()
                http.get("/predict", params={"model": model, **params}).raise_for_status()
                ms[name].append((time.perf_counter() - t0) * 1e3)
        cpu = {name: cpu_seconds(pid) - cpu[name] for name, _, _, pid in servers}
    return {name: {"p50_ms": float(np.percentile(ms[name], 50)), "p99_ms": float(np.percentile(ms[name], 99)),
                   "server_cpu_ms": cpu[name] / len(ms[name]) * 1e3} for name in ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path, nargs="?", default=REPO)
    parser.add_argument("--requests", type=int, default=600)
    args = parser.parse_args()
    asked = queries(args.bundle, args.requests)
    print("load average", Path("/proc/loadavg").read_text().split()[:3], flush=True)
    for name, r in compare(args.bundle, [args.before, args.after], asked).items():
        print(f"{name}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, server CPU {r['server_cpu_ms']:.3f} ms "
              "a request")
    print("load average", Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
