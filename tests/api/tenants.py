"""Helpers for the tenant tests: keys made through the admin route with the shared token."""

from __future__ import annotations

TOKEN = "tenants-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TRAIN = {"train": ("train.txt", b"a\tr\tb\nb\tr\tc\n")}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def make_key(client, tenant: str, scope: str = "write", name: str = "k") -> dict[str, str]:
    """A new key of `tenant` with `scope`, as the headers that send it; `client` is a TestClient or httpx.Client."""
    r = client.post("/keys", json={"name": name, "tenant": tenant, "scopes": [scope]}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return bearer(r.json()["key"])
