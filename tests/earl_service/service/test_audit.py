"""The audit log in the store (SQLite and Redis): appended, read newest first, filtered by tenant, bounded."""

from earl_service.service.audit import AuditEntry


def entry(i: int, tenant: str = "acme") -> AuditEntry:
    return AuditEntry(time=float(i), tenant=tenant, key="ci", method="POST", path="/jobs", status=202,
                      target=f"job{i}", key_id="0123456789ab")


def test_entries_come_back_newest_first_and_by_tenant(store):
    for i in range(5):
        store.append_audit(entry(i, "acme" if i % 2 else "other"), keep=100)
    assert [e.target for e in store.list_audit()] == ["job4", "job3", "job2", "job1", "job0"]
    assert [e.target for e in store.list_audit(tenant="acme")] == ["job3", "job1"]
    assert store.list_audit(limit=1) == [entry(4, "other")]


def test_the_log_keeps_the_latest_entries_only(store):
    for i in range(30):
        store.append_audit(entry(i), keep=10)
    kept = store.list_audit(limit=100)
    assert len(kept) == 10 and [e.target for e in kept] == [f"job{i}" for i in range(29, 19, -1)]
