"""GET /models/{id}/relations: a model's relations with their labels, paged; 404 for an unknown model."""

from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.bundle.model_io import load_bundle


def test_relations_are_listed_in_vocabulary_order_with_labels_and_paged(tmp_path, codex_bundle):
    names = load_bundle(codex_bundle).relations.names
    with TestClient(create_app(Settings(home=tmp_path))) as client:
        model = client.post("/models", files={"bundle": ("b.safetensors", codex_bundle.read_bytes())}).json()["id"]
        page = client.get(f"/models/{model}/relations").json()
        assert page["total"] == len(names) and [r["id"] for r in page["items"]] == names
        assert all(set(r) == {"id", "label"} for r in page["items"])
        second = client.get(f"/models/{model}/relations", params={"limit": 5, "offset": 5}).json()
        assert [r["id"] for r in second["items"]] == names[5:10] and second["limit"] == 5
        assert client.get(f"/models/{model}/relations", params={"offset": 10**6}).json()["items"] == []
        missing = client.get("/models/nope/relations")
        assert missing.status_code == 404 and missing.json()["detail"]["kind"] == "model"
        assert client.get(f"/models/{model}/relations", params={"limit": 0}).status_code == 422
