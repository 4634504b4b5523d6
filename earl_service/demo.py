"""`make demo`: start the API and a worker, train on the bundled CoDEx-S over HTTP, predict, download the bundle.

Everything runs on 127.0.0.1 with the default settings (SQLite job store and artifacts under ./artifacts).
Each wait is bounded; any failure exits non-zero with the reason.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

DATA = Path(__file__).with_name("demo_data") / "codex-s"
# Small enough to train in about a minute on 2 CPU cores, large enough to give sensible predictions.
PARAMS = {"dim": "64", "steps": "800", "batch_size": "512", "negatives": "128", "lr": "0.003", "eval_every": "200"}
TRAIN_TIMEOUT_S = 15 * 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(client: httpx.Client, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"`earl serve` exited early with code {server.returncode}")
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the API did not become ready within {timeout:.0f} s")


def run(home: Path) -> None:
    port = free_port()
    env = {**os.environ, "EARL_HOME": str(home)}
    server = subprocess.Popen([sys.executable, "-m", "earl_service.cli", "serve", "--host", "127.0.0.1",
                               "--port", str(port), "--log-level", "warning"], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            wait_ready(client, server)
            print(f"API ready at {base} (docs at {base}/docs); uploading CoDEx-S ({DATA})")
            files = {split: (f"{split}.txt", (DATA / f"{split}.txt").read_bytes(), "text/plain")
                     for split in ("train", "valid", "test")}
            files["relation_labels"] = ("relations.en.json", (DATA / "relations.en.json").read_bytes(),
                                        "application/json")
            resp = client.post("/jobs", data=PARAMS, files=files)
            resp.raise_for_status()
            job_id = resp.json()["id"]
            print(f"job {job_id} queued with {PARAMS}")
            job = wait_for_job(client, job_id)
            model_id = job["model_id"]
            model = client.get(f"/models/{model_id}").json()
            test = model.get("metrics", {}).get("test", {})
            print(f"model {model_id}: {model.get('parameters')} trainable parameters, "
                  f"{model.get('bytes')} bytes, test MRR {test.get('mrr', float('nan')):.3f}, "
                  f"Hits@10 {test.get('hits_at_10', float('nan')):.3f}")
            show_predictions(client, model_id)
            out = home / "demo-bundle.safetensors"
            resp = client.get(f"/models/{model_id}/bundle")
            resp.raise_for_status()
            out.write_bytes(resp.content)
            from earl_service.bundle import load_bundle

            bundle = load_bundle(out)
            if bundle.sha256 != resp.headers.get("etag", "").strip('"'):
                raise RuntimeError("downloaded bundle's checksum does not match the server's ETag")
            print(f"downloaded {out} ({out.stat().st_size} bytes, sha256 {bundle.sha256[:16]}...), verified")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def wait_for_job(client: httpx.Client, job_id: str) -> dict:
    deadline = time.monotonic() + TRAIN_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}").json()
        progress = job.get("progress") or {}
        line = (f"  {job['state']}: step {progress.get('step', 0)}/{progress.get('total', PARAMS['steps'])}"
                f" loss {progress.get('loss') or 0:.4f} valid MRR {progress.get('valid_mrr') or 0:.3f}")
        if line != last:
            print(line, flush=True)
            last = line
        if job["state"] == "succeeded":
            return job
        if job["state"] in ("failed", "cancelled"):
            raise RuntimeError(f"job {job_id} {job['state']}: {job.get('error')}")
        time.sleep(2)
    raise TimeoutError(f"job {job_id} did not finish within {TRAIN_TIMEOUT_S} s")


def show_predictions(client: httpx.Client, model_id: str) -> None:
    lines = (DATA / "test.txt").read_text().splitlines()[:3]
    for line in lines:
        head, rel, tail = line.split("\t")
        for params, answer in (({"head": head}, tail), ({"tail": tail}, head)):
            resp = client.get("/predict", params={"model": model_id, "relation": rel, "k": 5, **params})
            resp.raise_for_status()
            body = resp.json()
            name = f"{rel} '{body['relation_label']}'" if body.get("relation_label") else rel
            asked = f"({head}, {name}, ?)" if "head" in params else f"(?, {name}, {tail})"
            preds = body["predictions"]
            shown = ", ".join(f"{p['entity']}{'*' if p['entity'] == answer else ''} ({p['score']:.2f})" for p in preds)
            print(f"{asked}  true: {answer}\n    top-5: {shown}")
    print("(* marks the held-out true answer; entity ids are Wikidata items, e.g. https://www.wikidata.org/wiki/Q188)")


def main() -> int:
    home = Path(os.environ.get("EARL_HOME", "artifacts")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    try:
        run(home)
    except Exception as exc:  # a demo: say what went wrong in one line and fail
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    print("demo finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
