"""Tenants in the store (SQLite and Redis): models and jobs by owner, usage, and quotas of models and bytes kept
with the insert in one step, also by concurrent processes."""

import json
import subprocess
import sys
import time

import pytest

from earl_service.errors import TenantQuotaError
from earl_service.service.records import ModelRecord
from earl_service.service.tenants import Quota, Usage


def model(model_id: str, owner: str, stored: int = 100) -> ModelRecord:
    return ModelRecord(id=model_id, path=f"models/{model_id}/v1.safetensors", sha256="ab" * 32, bytes=stored,
                       owner=owner, stored=stored, created=time.time())


def test_models_and_jobs_list_by_owner(store):
    store.add_model(model("a", "acme"))
    store.add_model(model("b", "other"))
    store.add_model(ModelRecord(id="old", path="models/old.safetensors", sha256="0" * 64, bytes=1))  # before tenants
    assert [m.id for m in store.list_models(owner="acme")] == ["a"]
    assert {m.id for m in store.list_models(owner="default")} == {"old"} and len(store.list_models()) == 3
    mine, theirs, old = (store.create_job({"tenant": "acme"}, {}), store.create_job({"tenant": "other"}, {}),
                         store.create_job({}, {}))
    assert [j.id for j in store.list_jobs(tenant="acme")] == [mine.id]
    assert [j.id for j in store.list_jobs(tenant="default")] == [old.id] and theirs.id not in {
        j.id for j in store.list_jobs(tenant="acme")}
    assert store.tenant_usage("acme") == Usage(models=1, bytes=100) and store.tenant_usage("none") == Usage()


def test_the_quotas_of_models_and_bytes(store):
    quota = Quota(max_models=2, max_bytes=250)
    store.add_model(model("a", "acme"), quota=quota)
    store.add_model(model("b", "acme"), quota=quota)
    with pytest.raises(TenantQuotaError) as refused:
        store.add_model(model("c", "acme", stored=1), quota=quota)
    assert (refused.value.what, refused.value.used, refused.value.limit) == ("models", 2, 2)
    store.add_model(model("c", "other"), quota=quota)  # another tenant's models do not count
    with pytest.raises(TenantQuotaError) as refused:
        store.add_model(model("a", "acme", stored=151), quota=quota)  # a new version of a: bytes only
    assert (refused.value.what, refused.value.used, refused.value.adding) == ("bytes", 100, 151)
    store.add_model(model("a", "acme", stored=150), quota=quota)
    assert store.tenant_usage("acme") == Usage(models=2, bytes=250) and store.get_model("a").stored == 150
    assert Usage(models=2, bytes=250).left(quota) == {"models": 0, "bytes": 0}


REGISTRAR = """
import json, os, sys, time
from earl_service.errors import TenantQuotaError
from earl_service.service.records import ModelRecord
from earl_service.service.store import open_store
from earl_service.service.tenants import Quota
store = open_store(sys.argv[1])
store.ping()
open(sys.argv[3] + "." + sys.argv[2], "w").close()  # ready
while not os.path.exists(sys.argv[3]):  # start together
    time.sleep(0.005)
made = refused = 0
for i in range(15):
    record = ModelRecord(id=f"{sys.argv[2]}-{i}", path="x", sha256="0" * 64, bytes=1, owner="acme", stored=1)
    try:
        store.add_model(record, quota=Quota(max_models=10, max_bytes=None))
        made += 1
    except TenantQuotaError:
        refused += 1
print(json.dumps([made, refused]))
"""


def test_the_model_quota_holds_against_concurrent_registrations(store, store_url, tmp_path):
    """Issue 56: 15 POST /models in 0.8 s, no quota. Four processes register 15 models each for one tenant at
    once under a quota of 10: exactly 10 are recorded."""
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", REGISTRAR, store_url, f"p{i}", str(go)], stdout=subprocess.PIPE,
                              text=True) for i in range(4)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.p{i}").exists() for i in range(4)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert sum(made for made, _ in results) == 10 and sum(refused for _, refused in results) == 50
    assert store.tenant_usage("acme").models == 10
