"""End to end over real HTTP on 127.0.0.1: uvicorn + a worker process train CoDEx-S, serve it, ship the bundle.

Run alone with: pytest tests/api/test_api_e2e.py
"""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from conftest import REPO, codex_s_path, free_port

from earl_service.bundle.model_io import load_bundle
from earl_service.serve.predictor import LinkPredictor

TOKEN = "e2e-token"


def _wait_ready(base: str, procs, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args} exited early with {p.returncode}"
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{base} not ready after {timeout} s")


def _wait_for_line(path, *parts: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until a line of the log at `path` holds every one of `parts` (bounded; fails if `proc` exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(all(part in line for part in parts) for line in path.read_text().splitlines()):
            return
        assert proc.poll() is None, f"{proc.args} exited early with {proc.returncode}: {path.read_text()}"
        time.sleep(0.2)
    raise AssertionError(f"no line with {parts} in {path} after {timeout} s: {path.read_text()}")


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{proc.args} ignored {sig!r}") from None
    return proc.returncode


@pytest.fixture
def service(tmp_path):
    """uvicorn api.main:app and `earl worker` sharing HOME (SQLite store), as two processes."""
    port = free_port()
    env = {**os.environ, "EARL_HOME": str(tmp_path), "EARL_STORE": "sqlite", "EARL_API_TOKEN": TOKEN}
    log = (tmp_path / "service.log").open("w")
    api = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:app", "--host", "127.0.0.1", "--port",
                            str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    worker = subprocess.Popen([sys.executable, "-m", "earl_service.cli.main", "worker", "--poll", "0.2", "--threads", "1"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, [api, worker])
        yield base, tmp_path
    finally:
        codes = [_stop(api), _stop(worker)]
        log.close()
        print((tmp_path / "service.log").read_text()[-3000:])
    assert codes[0] in (0, -signal.SIGTERM) and codes[1] == 0  # uvicorn re-raises the signal it handled


def test_train_predict_download_over_http(service, tmp_path):
    base, _ = service
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, timeout=30) as http:
        train = (codex_s_path() / "train.txt").read_bytes()
        form = {"dim": "16", "steps": "30", "batch_size": "256", "negatives": "16", "eval_every": "0"}
        assert http.post("/jobs", files={"train": ("train.txt", train)}, data=form).status_code == 401
        r = http.post("/jobs", files={"train": ("train.txt", train)}, data=form, headers=auth)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]

        deadline = time.monotonic() + 300  # generous: CI machines can be much slower than this one
        while (job := http.get(f"/jobs/{job_id}").json())["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, f"job still {job['state']}: {job['progress']}"
            time.sleep(0.5)
        assert job["state"] == "succeeded", job["error"]
        assert job["progress"]["step"] == 30 and job["model_id"]
        model_id = job["model_id"]

        query = {"model": model_id, "head": "Q7604", "relation": "P1412", "k": 10}  # first line of train.txt
        served = http.get("/predict", params=query)
        assert served.status_code == 200, served.text
        served = [(p["entity"], p["score"]) for p in served.json()["predictions"]]
        assert len(served) == 10
        heads = http.get("/predict", params={"model": model_id, "tail": "Q188", "relation": "P1412", "k": 5})
        assert heads.status_code == 200 and len(heads.json()["predictions"]) == 5

        download = http.get(f"/models/{model_id}/bundle")
        assert download.status_code == 200
        assert download.headers["etag"] == f'"{http.get(f"/models/{model_id}").json()["sha256"]}"'
        assert http.get(f"/models/{model_id}/bundle",
                        headers={"If-None-Match": download.headers["etag"]}).status_code == 304
        metrics = http.get("/metrics").text
        assert 'earl_jobs{state="succeeded"} 1' in metrics and "earl_models_cached 1" in metrics

    path = tmp_path / "downloaded.safetensors"
    path.write_bytes(download.content)
    local = LinkPredictor.from_bundle(load_bundle(path))
    assert [(e, pytest.approx(s, abs=1e-5)) for e, s in local.predict_tails("Q7604", "P1412", 10)] == served


def test_earl_serve_stops_api_and_worker_on_sigint(tmp_path):
    port = free_port()
    env = {**os.environ, "EARL_API_TOKEN": ""}
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "earl_service.cli.main", "serve", "--home", str(tmp_path / "home"),
                                 "--port", str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", [proc])
        # The API can be ready before the worker child has imported torch: stop only once it has said it runs,
        # so that the stop below is the one of a running worker.
        _wait_for_line(log_path, "worker ", "home", proc=proc)
    finally:
        code = _stop(proc, signal.SIGINT)
    output = log_path.read_text()
    assert code == 0, output
    assert "Application shutdown complete" in output
    # Nothing is left listening or running: the worker child exited with the server.
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
    children = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True,
                              check=False).stdout.split()
    assert children == []
