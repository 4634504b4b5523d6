"""Per-tenant storage (issue 56): identical uploads and extends make no copies, and a cancelled job's uploads go
at once rather than after the retention days."""

from fastapi.testclient import TestClient
from tenants import TOKEN, TRAIN, make_key

from api.main import create_app
from api.settings import Settings


def test_identical_uploads_and_extends_store_one_copy(tmp_path, codex_bundle):
    """Issue 56: 10 identical extends made 12 full copies. An identical upload is a new model whose file is a
    link to the first one's; an extend by triples the graph holds already makes no new version."""
    from earl_service.bundle.model_io import load_bundle

    bundle = load_bundle(codex_bundle)
    triples = f"N1\t{bundle.relations.names[0]}\t{bundle.entities.names[0]}\n".encode()
    with TestClient(create_app(Settings(home=tmp_path, api_token=TOKEN, tenant_rate=0))) as client:
        acme, globex = make_key(client, "acme"), make_key(client, "globex")
        data = codex_bundle.read_bytes()
        made = [client.post("/models", files={"bundle": ("b.safetensors", data)}, headers=headers).json()
                for headers in (acme, acme, globex)]
        assert len({m["id"] for m in made}) == 3 and {m["owner"] for m in made} == {"acme", "globex"}
        files = [tmp_path / "models" / m["id"] / "v1.safetensors" for m in made]
        assert len({f.stat().st_ino for f in files}) == 1 and files[0].stat().st_nlink == 3  # one file, three names
        model = made[0]["id"]
        extends = [client.post(f"/models/{model}/triples", files={"triples": ("t.txt", triples)}, headers=acme)
                   for _ in range(10)]
        assert [r.json()["version"] for r in extends] == [2] * 10
        assert sorted(p.name for p in (tmp_path / "models" / model).iterdir()) == ["v1.safetensors", "v2.safetensors"]
        assert client.delete(f"/models/{made[1]['id']}", headers=acme).status_code == 204
        assert client.get(f"/models/{model}/bundle", headers=acme).status_code == 200 and files[0].stat().st_nlink == 2
        stored = client.get(f"/models/{model}", headers=acme).json()["stored"]
        assert stored == sum(p.stat().st_size for p in (tmp_path / "models" / model).glob("v*.safetensors"))


def test_a_cancelled_jobs_uploads_go_at_once(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path, api_token=TOKEN))) as client:
        acme = make_key(client, "acme")
        job = client.post("/jobs", files=TRAIN, headers=acme).json()["id"]
        assert (tmp_path / "uploads" / job).is_dir()
        assert client.post(f"/jobs/{job}/cancel", headers=acme).json()["state"] == "cancelled"
        assert not (tmp_path / "uploads" / job).exists()
