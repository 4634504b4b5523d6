"""Tenants against a live `earl serve --no-worker` on 127.0.0.1 (issue 56's second half): another tenant's key on
every route of a job and a model (each should be 404), anonymous clients once keys exist (401), concurrent
uploads and job submissions against a tenant's quotas (the cap should hold exactly, round after round), a
tenant's rate, and what identical uploads and extends store.

    python bench/tenants.py [--rounds 3] [--threads 16]

Results in bench/results/tenants.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import api_server, md_table, write_results
from harness.hostile import source_bundle

TOKEN = "bench-tenants-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TRAIN = {"train": ("train.txt", b"a\tr\tb\nb\tr\tc\n")}
MODEL_QUOTA, JOB_QUOTA, RATE, BURST = 3, 4, 5, 10


def make_key(client: httpx.Client, tenant: str, scope: str = "write", name: str = "bench") -> dict[str, str]:
    r = client.post("/keys", json={"name": name, "tenant": tenant, "scopes": [scope]}, headers=ADMIN)
    r.raise_for_status()
    return {"Authorization": f"Bearer {r.json()['key']}"}


def operations(model: str, job: str) -> list[tuple[str, str, dict]]:
    """Every route on one model or job, as (method, url, request kwargs)."""
    q = f"model={model}&relation=P27&head=Q1"
    return [("GET", f"/models/{model}", {}), ("GET", f"/models/{model}/versions", {}),
            ("GET", f"/models/{model}/bundle", {}), ("GET", f"/models/{model}/entities?q=a", {}),
            ("GET", f"/models/{model}/relations", {}), ("GET", f"/models/{model}/report", {}),
            ("GET", f"/models/{model}/frontier.png", {}), ("GET", f"/predict?{q}", {}),
            ("GET", f"/score?model={model}&head=Q1&relation=P27&tail=Q2", {}),
            ("POST", "/predict", {"json": {"model": model, "queries": [{"relation": "P27", "head": "Q1"}]}}),
            ("POST", f"/models/{model}/triples", {"files": {"triples": ("t.txt", b"a\tP27\tb\n")}}),
            ("DELETE", f"/models/{model}", {}), ("GET", f"/jobs/{job}", {}), ("GET", f"/jobs/{job}/events", {}),
            ("POST", f"/jobs/{job}/cancel", {})]


def cross_tenant(client: httpx.Client, bundle: bytes) -> dict:
    """Tenant B's key, an anonymous client and a read-only key of A against A's model and job."""
    owner, other, reader = make_key(client, "acme"), make_key(client, "globex"), make_key(client, "acme", "read")
    model = client.post("/models", files={"bundle": ("b.safetensors", bundle)}, headers=owner).json()["id"]
    job = client.post("/jobs", files=TRAIN, headers=owner).json()["id"]
    seen: dict[str, collections.Counter] = {}
    for who, headers in (("other tenant", other), ("anonymous", {})):
        seen[who] = collections.Counter(client.request(m, u, headers=headers, **kw).status_code
                                        for m, u, kw in operations(model, job))
    writes = [(m, u, kw) for m, u, kw in operations(model, job) if m in ("POST", "DELETE") and u != "/predict"]
    seen["read-only key, writes"] = collections.Counter(client.request(m, u, headers=reader, **kw).status_code
                                                       for m, u, kw in writes)
    intact = (client.get(f"/models/{model}", headers=owner).status_code, client.get(f"/jobs/{job}",
                                                                                  headers=owner).json()["state"])
    listed = {"other tenant's /models": len(client.get("/models", headers=other).json()),
              "other tenant's /jobs": len(client.get("/jobs", headers=other).json())}
    return {"attempts": {k: dict(v) for k, v in seen.items()}, "owner_after": intact, "listed": listed}


def model_race(base: str, client: httpx.Client, bundle: bytes, *, rounds: int, threads: int) -> list[dict]:
    """`threads` concurrent uploads by one fresh tenant per round under a quota of MODEL_QUOTA models."""
    out = []
    for i in range(rounds):
        headers = make_key(client, f"race{i}")
        with ThreadPoolExecutor(threads) as pool:
            answers = list(pool.map(lambda _, h=headers: httpx.post(f"{base}/models", headers=h, timeout=300,
                                                                    files={"bundle": ("b.safetensors", bundle)}), range(threads)))
        out.append({"sent": threads, "statuses": dict(collections.Counter(r.status_code for r in answers)),
                    "registered": len(client.get("/models", headers=headers).json())})
    return out


def job_race(base: str, client: httpx.Client, *, rounds: int, threads: int) -> list[dict]:
    """`threads` concurrent POST /jobs from two keys of one fresh tenant per round, under JOB_QUOTA."""
    out = []
    for i in range(rounds):
        keys = [make_key(client, f"jobs{i}", name="a"), make_key(client, f"jobs{i}", name="b")]
        with ThreadPoolExecutor(threads) as pool:
            answers = list(pool.map(lambda n, k=keys: httpx.post(f"{base}/jobs", files=TRAIN, headers=k[n % 2],
                                                                 timeout=120), range(threads)))
        out.append({"sent": threads, "statuses": dict(collections.Counter(r.status_code for r in answers)),
                    "queued": len(client.get("/jobs", headers=keys[0]).json())})
    return out


def rate(base: str, client: httpx.Client, *, requests: int = 50) -> dict:
    """`requests` GET /models as fast as one client sends them, by a key bound to RATE a second (bursts BURST)."""
    headers = make_key(client, "rated")
    start = time.monotonic()
    statuses = collections.Counter(client.get("/models", headers=headers).status_code for _ in range(requests))
    return {"sent": requests, "seconds": round(time.monotonic() - start, 3), "statuses": dict(statuses)}


def new_triple(bundle: bytes) -> bytes:
    """A triple with a new entity and the bundle's first relation and entity: what an extend adds."""
    from earl_service.bundle.model_io import load_bundle

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "b.safetensors").write_bytes(bundle)
        loaded = load_bundle(Path(tmp) / "b.safetensors")
    return f"NewEntity\t{loaded.relations.names[0]}\t{loaded.entities.names[0]}\n".encode()


def storage(client: httpx.Client, home: Path, bundle: bytes, *, copies: int = 10) -> dict:
    """`copies` identical uploads and `copies` identical extends (by the token: no model quota), files, distinct
    inodes and bytes on disk."""
    headers = ADMIN
    ids = [client.post("/models", files={"bundle": ("b.safetensors", bundle)}, headers=headers).json()["id"]
           for _ in range(copies)]
    line = new_triple(bundle)
    versions = [client.post(f"/models/{ids[0]}/triples", files={"triples": ("t.txt", line)},
                            headers=headers).json()["version"] for _ in range(copies)]
    files = [p for i in ids for p in (home / "models" / i).glob("v*.safetensors")]
    inodes = {p.stat().st_ino: p.stat().st_size for p in files}
    return {"uploads": copies, "extends": copies, "versions_after_extends": versions[-1], "files": len(files),
            "distinct_files": len(inodes), "bytes_on_disk": sum(inodes.values()),
            "bytes_as_copies": sum(p.stat().st_size for p in files)}


def report(results: dict) -> str:
    cross = results["cross_tenant"]
    rows = [[who, ", ".join(f"{n} x {status}" for status, n in sorted(seen.items()))]
            for who, seen in cross["attempts"].items()]
    races = [["models", i + 1, r["sent"], MODEL_QUOTA, r["statuses"], r["registered"]]
             for i, r in enumerate(results["model_race"])]
    races += [["jobs", i + 1, r["sent"], JOB_QUOTA, r["statuses"], r["queued"]] for i, r in enumerate(results["job_race"])]
    st, rt = results["storage"], results["rate"]
    return "\n\n".join([
        "# Tenants against a live server (issue 56)",
        "`earl serve --no-worker` on 127.0.0.1, SQLite store, `bench/tenants.py`. Another tenant's key, an anonymous "
        "client and a read-only key of the owner against the 15 routes of one model and one job:",
        md_table(["who", "answers"], rows),
        f"The owner's model and job afterwards: {cross['owner_after'][0]}, {cross['owner_after'][1]}; the other "
        f"tenant lists {cross['listed']['other tenant' + chr(39) + 's /models']} models and "
        f"{cross['listed']['other tenant' + chr(39) + 's /jobs']} jobs.",
        "Concurrent requests of one tenant against its quota (a fresh tenant each round; jobs from two keys):",
        md_table(["quota", "round", "sent at once", "cap", "answers", "kept"], races),
        f"Rate: {rt['sent']} requests in {rt['seconds']} s by one key bound to {RATE}/s (bursts of {BURST}): "
        f"{rt['statuses']}.",
        f"Storage: {st['uploads']} identical uploads and {st['extends']} identical extends left {st['files']} files "
        f"({st['versions_after_extends']} versions of the extended model), {st['distinct_files']} distinct on disk: "
        f"{st['bytes_on_disk']:,} bytes instead of {st['bytes_as_copies']:,} as copies.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    bundle = source_bundle()
    env = {"EARL_TENANT_MAX_MODELS": str(MODEL_QUOTA), "EARL_MAX_QUEUED_JOBS": str(JOB_QUOTA),
           "EARL_TENANT_RATE": "0", "EARL_TENANT_MAX_MB": "10240"}
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        with api_server(home, token=TOKEN, env=env, serve=True) as (base, _), httpx.Client(base_url=base,
                                                                                        timeout=300) as client:
            results["cross_tenant"] = cross_tenant(client, bundle)
            results["model_race"] = model_race(base, client, bundle, rounds=args.rounds, threads=args.threads)
            results["job_race"] = job_race(base, client, rounds=args.rounds, threads=2 * args.threads)
            results["storage"] = storage(client, home, bundle)
        rated = {**env, "EARL_TENANT_RATE": str(RATE), "EARL_TENANT_BURST": str(BURST)}
        with api_server(Path(tmp) / "rated", token=TOKEN, env=rated, serve=True) as (base, _), \
                httpx.Client(base_url=base, timeout=60) as client:
            results["rate"] = rate(base, client)
    write_results("tenants", {"rounds": args.rounds, "threads": args.threads, "results": results}, report(results))
    print(report(results))


if __name__ == "__main__":
    main()
