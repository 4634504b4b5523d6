"""Restarting the API (a new app over the same home) keeps every job, its state and every model."""

from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings

GOOD = b"a\tr\tb\nb\tr\tc\n"


def test_restart_keeps_jobs_and_models(tmp_path, codex_bundle):
    settings = Settings(home=tmp_path)
    with TestClient(create_app(settings)) as before:
        queued = before.post("/jobs", files={"train": ("train.txt", GOOD)}, data={"dim": "8"}).json()["id"]
        cancelled = before.post("/jobs", files={"train": ("train.txt", GOOD)}).json()["id"]
        assert before.post(f"/jobs/{cancelled}/cancel").json()["state"] == "cancelled"
        model = before.post("/models", files={"bundle": ("m.safetensors", codex_bundle.read_bytes())}).json()
        query = {"model": model["id"], "head": "Q7604", "relation": "P1412", "k": 5}
        predicted = before.get("/predict", params=query).json()["predictions"]
        jobs, models = before.get("/jobs").json(), before.get("/models").json()

    with TestClient(create_app(Settings(home=tmp_path))) as after:
        assert after.get("/jobs").json() == jobs
        assert {j["id"]: j["state"] for j in jobs} == {queued: "queued", cancelled: "cancelled"}
        assert after.get(f"/jobs/{queued}").json()["params"]["dim"] == 8
        assert after.get("/models").json() == models
        assert after.get("/predict", params=query).json()["predictions"] == predicted
        download = after.get(f"/models/{model['id']}/bundle")
        assert download.content == codex_bundle.read_bytes() and download.headers["etag"] == f'"{model["sha256"]}"'
