"""Time from POST /jobs to a model answering /predict, for CoDEx-S through the real service.

Starts `earl serve` (API + one worker, SQLite, throwaway EARL_HOME) on 127.0.0.1, uploads the bundled CoDEx-S
with the demo's settings (or yours), polls the job every 0.25 s and then asks one prediction.

    python bench/service_ready.py [--steps 800 --dim 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from demo import DATA, PARAMS, free_port
from harness import md_table, write_results

from earl_client import Client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, value in PARAMS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, default=value)
    args = parser.parse_args()
    params = {k: str(getattr(args, k)) for k in PARAMS}
    import subprocess

    with tempfile.TemporaryDirectory() as home:
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "earl_service.cli.main", "serve", "--home", home, "--port",
                                   str(port), "--log-level", "warning"], stderr=subprocess.DEVNULL)
        try:
            with Client(f"http://127.0.0.1:{port}", timeout=60) as api:
                api.wait_ready(alive=lambda: server.poll() is None)
                client = api.http
                files = {s: (f"{s}.txt", (DATA / f"{s}.txt").read_bytes()) for s in ("train", "valid", "test")}
                t0 = time.perf_counter()
                job_id = client.post("/jobs", data=params, files=files).raise_for_status().json()["id"]
                started = None
                while True:
                    job = client.get(f"/jobs/{job_id}").json()
                    if job["state"] == "running" and started is None:
                        started = time.perf_counter() - t0
                    if job["state"] in ("succeeded", "failed", "cancelled"):
                        break
                    if time.perf_counter() - t0 > 1800:
                        raise TimeoutError("job did not finish in 30 minutes")
                    time.sleep(0.25)
                trained = time.perf_counter() - t0
                if job["state"] != "succeeded":
                    raise RuntimeError(f"job {job['state']}: {job.get('error')}")
                head, rel, _ = (DATA / "test.txt").read_text().splitlines()[0].split("\t")
                client.get("/predict", params={"model": job["model_id"], "head": head, "relation": rel}
                           ).raise_for_status()
                ready = time.perf_counter() - t0
                metrics = client.get(f"/models/{job['model_id']}").json()["metrics"]
        finally:
            server.terminate()
            server.wait(timeout=60)
    result = {"params": params, "seconds_to_running": started, "seconds_to_succeeded": trained,
              "seconds_to_first_prediction": ready, "test": metrics.get("test"),
              "median_step_seconds": metrics.get("median_step_seconds")}
    md = "\n".join(["# CoDEx-S through the service: POST /jobs to a model answering /predict", "",
                    f"Settings: {params}", "",
                    md_table(["POST -> running (s)", "POST -> succeeded (s)", "POST -> first /predict answered (s)",
                              "test MRR", "test Hits@10"],
                             [[started, trained, ready, (metrics.get("test") or {}).get("mrr"),
                               (metrics.get("test") or {}).get("hits_at_10")]])])
    write_results("service_ready", result, md)
    print(md)


if __name__ == "__main__":
    main()
