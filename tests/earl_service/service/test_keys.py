"""API keys: made with a salted hash only, found by id and checked in constant time, revoked for good; the
store contract for keys on SQLite and Redis."""

import hmac

import pytest

from earl_service.errors import ConfigError
from earl_service.service.keys import ApiKey, find_key, new_key, split_key


def test_a_key_is_stored_as_a_salted_hash_never_itself():
    record, key = new_key("ci", "acme", ["write"])
    assert key.startswith(f"earl_{record.id}_") and len(key) > 50
    secret = key.split("_", 2)[2]
    stored = str(record.to_dict())
    assert secret not in stored and key not in stored
    again, other = new_key("ci", "acme", ["write"])
    assert again.salt != record.salt and other != key  # equal names make different keys, salts and digests


@pytest.mark.parametrize("scopes,granted", [(["read"], {"read"}), (["write"], {"read", "write"}),
                                            (["admin"], {"read", "write", "admin"}),
                                            (["read", "admin"], {"read", "write", "admin"})])
def test_a_scope_grants_the_ones_below_it(scopes, granted):
    assert new_key("k", "t", scopes)[0].granted == granted


def test_find_key_takes_the_right_key_only(monkeypatch):
    (a, key_a), (b, key_b) = new_key("a", "t1", ["read"]), new_key("b", "t2", ["admin"])
    keys = [a, b]
    assert find_key(keys, key_a.encode()) == a and find_key(keys, key_b.encode()) == b
    calls = []
    compare = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda x, y: calls.append(1) or compare(x, y))
    for wrong in (key_a[:-1], key_a + "x", key_a.replace(a.id, b.id), "earl_", "earl_" + "0" * 12 + "_x", "",
                  "Bearer x", "earl_\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9_secret"):
        assert find_key(keys, wrong.encode()) is None, wrong
    assert calls  # secrets of a known id were compared with compare_digest
    assert split_key(b"earl_0123456789ab_s") == ("0123456789ab", b"s")


def test_a_revoked_key_matches_nothing():
    record, key = new_key("a", "t", ["write"])
    revoked = ApiKey.from_dict({**record.to_dict(), "revoked": 1.0})
    assert find_key([revoked], key.encode()) is None and not revoked.matches(key.split("_", 2)[2].encode())


@pytest.mark.parametrize("name,tenant,scopes", [("", "t", ["read"]), ("a b", "t", ["read"]), ("k", "../x", ["read"]),
                                                ("k", "t", []), ("k", "t", ["root"]), ("k", "t" * 65, ["read"])])
def test_bad_names_and_scopes_are_refused(name, tenant, scopes):
    with pytest.raises(ConfigError):
        new_key(name, tenant, scopes)


def test_the_store_keeps_lists_and_revokes_keys(store):
    (a, key_a), (b, _) = new_key("a", "t1", ["read"]), new_key("b", "t2", ["admin"])
    store.add_key(a)
    store.add_key(b)
    assert [k.id for k in store.list_keys()] == [a.id, b.id] and store.list_keys()[0] == a
    assert find_key(store.list_keys(), key_a.encode()) == a
    revoked = store.revoke_key(a.id)
    assert revoked.revoked is not None and store.revoke_key(a.id).revoked == revoked.revoked  # the first time stays
    assert find_key(store.list_keys(), key_a.encode()) is None and store.revoke_key("0" * 12) is None
