"""`make demo`: start the API and a worker, train on the bundled CoDEx-S over HTTP, predict, download the bundle.

Everything runs on 127.0.0.1 with the default settings (SQLite job store, EARL_HOME or ./artifacts). Each wait is
bounded; any failure exits non-zero with the reason.

    python scripts/demo.py
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import earl_service
from earl_client import Client

DATA = Path(earl_service.__file__).parent / "demo_data" / "codex-s"
# Small enough to train in a few minutes on 2 CPU cores, large enough to give sensible predictions.
PARAMS = {"dim": "64", "steps": "800", "batch_size": "512", "negatives": "128", "lr": "0.003", "eval_every": "200"}
TRAIN_TIMEOUT_S = 15 * 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path, port: int) -> subprocess.Popen:
    """`earl serve` (API + one worker) on 127.0.0.1:port with its artifacts under `home`."""
    return subprocess.Popen([sys.executable, "-m", "earl_service.cli.main", "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], env={**os.environ, "EARL_HOME": str(home)})


def stop_server(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGINT)  # `earl serve` stops its worker too
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def progress_printer():
    """An on_progress callback that prints a job's state line whenever it changes."""
    last = ""

    def show(job: dict[str, Any]) -> None:
        nonlocal last
        progress = job.get("progress") or {}
        line = (f"  {job['state']}: step {progress.get('step', 0)}/{progress.get('total', PARAMS['steps'])}"
                f" loss {progress.get('loss') or 0:.4f} valid MRR {progress.get('valid_mrr') or 0:.3f}")
        if line != last:
            print(line, flush=True)
            last = line

    return show


def train(client: Client) -> str:
    """Upload CoDEx-S with its relation labels, train it, print the model's figures; return the model id."""
    job_id = client.submit_job(DATA / "train.txt", valid=DATA / "valid.txt", test=DATA / "test.txt",
                               relation_labels=DATA / "relations.en.json", params=PARAMS)
    print(f"job {job_id} queued with {PARAMS}")
    model_id = client.wait(job_id, on_progress=progress_printer(), timeout=TRAIN_TIMEOUT_S)["model_id"]
    model = client.model(model_id)
    test = model.get("metrics", {}).get("test", {})
    print(f"model {model_id}: {model.get('parameters')} trainable parameters, {model.get('bytes')} bytes, "
          f"test MRR {test.get('mrr', float('nan')):.3f}, Hits@10 {test.get('hits_at_10', float('nan')):.3f}")
    return model_id


def show_predictions(client: Client, model_id: str) -> None:
    """Top-5 tails and heads for the first three test triples, the held-out answer starred."""
    for line in (DATA / "test.txt").read_text().splitlines()[:3]:
        head, rel, tail = line.split("\t")
        for anchor, answer in (({"head": head}, tail), ({"tail": tail}, head)):
            body = client.predict(model_id, rel, k=5, **anchor)
            name = f"{rel} '{body['relation_label']}'" if body.get("relation_label") else rel
            asked = f"({head}, {name}, ?)" if "head" in anchor else f"(?, {name}, {tail})"
            shown = ", ".join(f"{p['entity']}{'*' if p['entity'] == answer else ''} ({p['score']:.2f})"
                              for p in body["predictions"])
            print(f"{asked}  true: {answer}\n    top-5: {shown}")
    print("(* marks the held-out true answer; entity ids are Wikidata items, e.g. https://www.wikidata.org/wiki/Q188)")


def download(client: Client, model_id: str, out: Path) -> None:
    """Download the bundle and check it loads and matches the checksum the server gave."""
    from earl_service.bundle.model_io import load_bundle

    etag = client.download(model_id, out)
    bundle = load_bundle(out)
    if bundle.sha256 != etag:
        raise RuntimeError("downloaded bundle's checksum does not match the server's ETag")
    print(f"downloaded {out} ({out.stat().st_size} bytes, sha256 {bundle.sha256[:16]}...), verified")


def run(home: Path) -> None:
    port = free_port()
    server = start_server(home, port)
    base = f"http://127.0.0.1:{port}"
    try:
        with Client(base) as client:
            client.wait_ready(alive=lambda: server.poll() is None)
            print(f"API ready at {base} (docs at {base}/docs); uploading CoDEx-S ({DATA})")
            model_id = train(client)
            show_predictions(client, model_id)
            download(client, model_id, home / "demo-bundle.safetensors")
    finally:
        stop_server(server)


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
