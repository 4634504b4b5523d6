"""Model writes over HTTP: extends make versions (the earlier ones downloadable), a delete removes everything the
model came from, and a delete wins over an extend in flight on a live uvicorn."""

import contextlib
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import httpx
import pytest
from conftest import REPO, free_port
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.bundle.model_io import load_bundle

GOOD = b"a\tr\tb\nb\tr\tc\n"


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path))) as c:
        yield c


def new_triples(bundle_path, name: str) -> bytes:
    bundle = load_bundle(bundle_path)
    return f"{name}\t{bundle.relations.names[0]}\t{bundle.entities.names[0]}\n".encode()


def test_extends_are_versions_and_earlier_ones_stay_downloadable(client, codex_bundle):
    original = codex_bundle.read_bytes()
    first = client.post("/models", files={"bundle": ("b.safetensors", original)}).json()
    model_id = first["id"]
    assert first["version"] == 1
    for i in range(2):
        r = client.post(f"/models/{model_id}/triples", files={"triples": ("m.txt", new_triples(codex_bundle, f"N{i}"))})
        assert r.status_code == 200 and r.json()["version"] == i + 2
    latest = client.get(f"/models/{model_id}").json()
    versions = client.get(f"/models/{model_id}/versions").json()
    assert [(v["version"], v["latest"]) for v in versions] == [(1, False), (2, False), (3, True)]
    assert versions[0]["sha256"] == first["sha256"] and versions[2]["sha256"] == latest["sha256"]
    assert versions[0]["bytes"] == len(original)

    old = client.get(f"/models/{model_id}/bundle", params={"version": 1})
    assert old.status_code == 200 and old.content == original and old.headers["etag"] == f'"{first["sha256"]}"'
    assert f"{model_id}.v1.safetensors" in old.headers["content-disposition"]
    again = client.get(f"/models/{model_id}/bundle", params={"version": 1}, headers={"If-None-Match": old.headers["etag"]})
    assert again.status_code == 304
    served = client.get(f"/models/{model_id}/bundle")
    assert served.headers["etag"] == f'"{latest["sha256"]}"' and load_bundle_bytes(served.content) >= {"N0", "N1"}
    missing = client.get(f"/models/{model_id}/bundle", params={"version": 4})
    assert missing.status_code == 404 and "version 4" in missing.json()["detail"]["message"]
    assert client.get(f"/models/{model_id}/bundle", params={"version": 0}).status_code == 422
    assert client.get(f"/models/{'0' * 32}/versions").status_code == 404


def load_bundle_bytes(data: bytes) -> set[str]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "b.safetensors"
        path.write_bytes(data)
        return set(load_bundle(path).entities.names)


def test_delete_removes_what_the_model_came_from(client, codex_bundle, tmp_path):
    """The run (bundle, checkpoints), the uploads and every version go; the job stays, its model_id cleared."""
    registry, store = client.app.state.registry, client.app.state.store
    job_id = client.post("/jobs", files={"train": ("train.txt", GOOD)}).json()["id"]
    assert store.claim_job("w").id == job_id
    run = tmp_path / "runs" / job_id
    run.mkdir(parents=True)
    for name in ("bundle.safetensors", "checkpoint.pt", "best.pt"):
        (run / name).write_bytes(codex_bundle.read_bytes())
    staged = run / ".export.w.tmp"
    staged.write_bytes(codex_bundle.read_bytes())
    registry.publish(job_id, staged, job_id=job_id)
    store.finish_job(job_id, "w", "succeeded", model_id=job_id)
    client.post(f"/models/{job_id}/triples", files={"triples": ("m.txt", new_triples(codex_bundle, "NEW"))})
    assert (tmp_path / "uploads" / job_id / "train.txt").exists() and client.get(f"/jobs/{job_id}").json()[
        "model_id"] == job_id

    assert client.delete(f"/models/{job_id}").status_code == 204
    assert not run.exists() and not (tmp_path / "uploads" / job_id).exists()
    assert list((tmp_path / "models").iterdir()) == []
    job = client.get(f"/jobs/{job_id}").json()
    assert (job["state"], job["model_id"]) == ("succeeded", None)
    assert client.get(f"/models/{job_id}/versions").status_code == 404


def wait_until(predicate, what: str, proc, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_a_delete_wins_over_an_extend_in_flight(tmp_path, codex_bundle):
    """The extend is held after it read the bundle; the DELETE comes meanwhile. Whatever the order they finish in,
    once the DELETE has answered 204 the model stays gone: no record, no file."""
    gate, home, port = tmp_path / "gate", tmp_path / "home", free_port()
    gate.mkdir()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "gated_writes.py"), str(gate), "serve", str(home),
                               str(port)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: answers(base), "the server", server)
        upload = httpx.post(f"{base}/models", files={"bundle": ("b.safetensors", codex_bundle.read_bytes())},
                            timeout=120)
        model_id = upload.json()["id"]
        with ThreadPoolExecutor(2) as pool:
            extend = pool.submit(httpx.post, f"{base}/models/{model_id}/triples", timeout=300,
                                 files={"triples": ("m.txt", new_triples(codex_bundle, "NEW"))})
            wait_until(lambda: any(gate.glob("entered-*")), "the extend to reach the gate", server)
            delete = pool.submit(httpx.delete, f"{base}/models/{model_id}", timeout=300)
            with contextlib.suppress(FutureTimeout):
                delete.result(timeout=3)  # unserialised, the DELETE answers at once, before the extend publishes
            (gate / "go").touch()
            extended, deleted = extend.result(), delete.result()
        assert deleted.status_code == 204, deleted.text
        assert extended.status_code in (200, 404), extended.text
        assert httpx.get(f"{base}/models/{model_id}").status_code == 404
        assert httpx.get(f"{base}/models/{model_id}/bundle").status_code == 404
        assert [p.name for p in (home / "models").iterdir()] == []
        later = httpx.post(f"{base}/models/{model_id}/triples", files={"triples": ("m.txt", b"x\ty\tz\n")})
        assert later.status_code == 404
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
