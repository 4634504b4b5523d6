"""A tenant's quotas over real HTTP on 127.0.0.1: models (429), stored bytes (413), requests per second (429) and
unfinished jobs (429, shared by the tenant's keys), each with what is left in X-Quota-* / X-RateLimit-* headers,
and kept exactly by concurrent requests (the count and the insert are one step)."""

import functools
from concurrent.futures import ThreadPoolExecutor

import httpx
from live import live
from tenants import ADMIN, TOKEN, TRAIN, make_key

from api.limits import TenantRates
from api.main import create_app
from api.settings import Settings


def upload(base: str, headers: dict, data: bytes) -> httpx.Response:
    return httpx.post(f"{base}/models", files={"bundle": ("b.safetensors", data)}, headers=headers, timeout=120)


def distinct_bundles(codex_bundle, count: int, tmp_path) -> list[bytes]:
    """`count` bundles that differ in content (one more triple each), so that none is deduplicated."""
    from earl_service.bundle.model_io import load_bundle

    bundle, made = load_bundle(codex_bundle), []
    for i in range(count):
        triples = tmp_path / f"t{i}.txt"
        triples.write_text(f"new{i}\t{bundle.relations.names[0]}\t{bundle.entities.names[0]}\n")
        made.append(bundle.extend(triples).save(tmp_path / f"b{i}.safetensors").read_bytes())
    return made


def test_concurrent_uploads_keep_the_model_quota_exactly(tmp_path, codex_bundle):
    """Issue 56: 15 POST /models in 0.8 s with no quota. 8 threads upload 8 different bundles under a quota of 3."""
    bundles = distinct_bundles(codex_bundle, 8, tmp_path)
    settings = Settings(home=tmp_path / "home", api_token=TOKEN, tenant_max_models=3, tenant_rate=0)
    with live(create_app(settings)) as base, httpx.Client(base_url=base) as client, ThreadPoolExecutor(8) as pool:
        acme = make_key(client, "acme")
        answers = list(pool.map(lambda data: upload(base, acme, data), bundles))
        listed = client.get("/models", headers=acme).json()
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [201] * 3 + [429] * 5 and len(listed) == 3
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["x-quota-models-left"] == "0" and "quota of 3" in refused.json()["detail"]
    assert "EARL_TENANT_MAX_MODELS" in refused.json()["detail"]
    assert sorted(p.name for p in (tmp_path / "home" / "models").iterdir() if not p.name.startswith(".")) == sorted(
        m["id"] for m in listed)  # a refused upload left no files


def test_stored_bytes_past_the_quota_are_413_with_what_is_left(tmp_path, codex_bundle):
    size = codex_bundle.stat().st_size
    settings = Settings(home=tmp_path, api_token=TOKEN, tenant_max_mb=(size * 1.5) / 2**20, tenant_rate=0)
    with live(create_app(settings)) as base, httpx.Client(base_url=base) as client:
        acme = make_key(client, "acme")
        first = upload(base, acme, codex_bundle.read_bytes())
        assert first.status_code == 201 and int(first.headers["x-quota-bytes-left"]) == int(size * 1.5) - size
        assert first.headers["x-quota-models-left"] == "99"
        second = upload(base, acme, distinct_bundles(codex_bundle, 1, tmp_path)[0])
        assert second.status_code == 413 and "EARL_TENANT_MAX_MB" in second.json()["detail"]
        assert int(second.headers["x-quota-bytes-left"]) == int(size * 1.5) - size
        assert upload(base, ADMIN, codex_bundle.read_bytes()).status_code == 201  # the admin is not bound


def test_a_tenants_rate_is_bounded_with_headers(tmp_path, monkeypatch):
    # The buckets' clock stands still: on a loaded machine eight requests can take more than the second that
    # refills a token, and the count would depend on it.
    monkeypatch.setattr(TenantRates, "take", functools.partialmethod(TenantRates.take, now=0.0))
    settings = Settings(home=tmp_path, api_token=TOKEN, tenant_rate=1, tenant_burst=5)
    with live(create_app(settings)) as base, httpx.Client(base_url=base) as client:
        acme, other = make_key(client, "acme"), make_key(client, "other")
        answers = [client.get("/models", headers=acme) for _ in range(8)]
        statuses = [r.status_code for r in answers]
        assert statuses == [200] * 5 + [429] * 3  # the burst, then nothing refilled
        assert answers[0].headers["x-ratelimit-limit"] == "1" and answers[0].headers["x-ratelimit-remaining"] == "4"
        assert answers[-1].headers["retry-after"] == "1" and "EARL_TENANT_RATE" in answers[-1].json()["detail"]
        assert client.get("/models", headers=other).status_code == 200  # another tenant has its own bucket
        assert all(client.get("/models", headers=ADMIN).status_code == 200 for _ in range(8))


def test_a_tenants_keys_share_one_job_quota_under_concurrency(tmp_path):
    """30 concurrent POST /jobs from two keys of one tenant under EARL_MAX_QUEUED_JOBS=4: exactly 4 queued."""
    settings = Settings(home=tmp_path, api_token=TOKEN, max_queued_jobs=4, tenant_rate=0)
    with live(create_app(settings)) as base, httpx.Client(base_url=base) as client, ThreadPoolExecutor(30) as pool:
        keys = [make_key(client, "acme", name="a"), make_key(client, "acme", name="b")]
        answers = list(pool.map(lambda i: httpx.post(f"{base}/jobs", files=TRAIN, headers=keys[i % 2], timeout=60),
                                range(30)))
        other = client.post("/jobs", files=TRAIN, headers=make_key(client, "globex"))
    statuses = [r.status_code for r in answers]
    assert statuses.count(202) == 4 and statuses.count(429) == 26
    assert all(r.headers["x-quota-jobs-left"] == "0" for r in answers if r.status_code == 429)
    assert other.status_code == 202 and other.headers["x-quota-jobs-left"] == "3"
