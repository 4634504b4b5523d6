"""API keys: several per service, each with a name, a tenant and scopes, stored only as a salted hash.

A key reads `earl_<id>_<secret>`: the id (public, in listings and the audit log) finds the record, the secret is
checked against HMAC-SHA256(salt, secret) in constant time. The secret is 256 random bits, so a slow hash (scrypt,
PBKDF2) would add nothing against guessing but a cost to every request; the salt makes equal secrets (never drawn)
hash apart and keeps a stolen store's digests from matching any precomputed table.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from earl_service.errors import ConfigError
from earl_service.service.tenants import checked_name

SCOPES = ("read", "write", "admin")  # each grants the ones before it: write reads, admin writes and reads
PREFIX = "earl_"
ID_CHARS = 12  # hex digits of a key's id


@dataclass(frozen=True)
class ApiKey:
    """One key's record: never the key itself."""

    id: str
    name: str
    tenant: str
    scopes: tuple[str, ...]
    salt: str  # hex
    digest: str  # hex HMAC-SHA256(salt, secret)
    created: float = 0.0
    revoked: float | None = None

    @property
    def granted(self) -> frozenset[str]:
        """The scopes this key has, the implied ones included (admin: all three; write: write and read)."""
        top = max((SCOPES.index(s) for s in self.scopes if s in SCOPES), default=-1)
        return frozenset(SCOPES[: top + 1])

    def matches(self, secret: bytes) -> bool:
        """Whether `secret` is this key's, compared in constant time; a revoked key matches nothing."""
        return self.revoked is None and hmac.compare_digest(_digest(bytes.fromhex(self.salt), secret),
                                                            bytes.fromhex(self.digest))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> ApiKey:
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in values.items() if k in names}
        return cls(**{**known, "scopes": tuple(known.get("scopes") or ())})

    def shown(self) -> dict:
        """What a listing shows: everything but the salt and the digest."""
        return {"id": self.id, "name": self.name, "tenant": self.tenant, "scopes": list(self.scopes),
                "created": self.created, "revoked": self.revoked}


def _digest(salt: bytes, secret: bytes) -> bytes:
    return hmac.new(salt, secret, hashlib.sha256).digest()


def new_key(name: str, tenant: str, scopes: Sequence[str], *, now: float | None = None,
            ) -> tuple[ApiKey, str]:
    """A new key's record and the key itself (shown once: only its hash is kept)."""
    checked_name(name, "key name")
    checked_name(tenant, "tenant")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise ConfigError(f"scopes must be some of {', '.join(SCOPES)}, not {', '.join(unknown) or 'none'}")
    key_id, secret, salt = secrets.token_hex(ID_CHARS // 2), secrets.token_urlsafe(32), secrets.token_bytes(16)
    record = ApiKey(id=key_id, name=name, tenant=tenant, scopes=tuple(s for s in SCOPES if s in scopes),
                    salt=salt.hex(), digest=_digest(salt, secret.encode()).hex(),
                    created=time.time() if now is None else now)
    return record, f"{PREFIX}{key_id}_{secret}"


def split_key(presented: bytes) -> tuple[str, bytes] | None:
    """(id, secret) of a presented `earl_<id>_<secret>`, or None when it does not have that shape."""
    head = PREFIX.encode()
    if not presented.startswith(head) or len(presented) < len(head) + ID_CHARS + 2:
        return None
    key_id, sep, secret = presented[len(head):len(head) + ID_CHARS], presented[len(head) + ID_CHARS:][:1], \
        presented[len(head) + ID_CHARS + 1:]
    try:
        return (key_id.decode("ascii"), secret) if sep == b"_" else None
    except UnicodeDecodeError:
        return None


def find_key(keys: list[ApiKey], presented: bytes) -> ApiKey | None:
    """The unrevoked key among `keys` whose key `presented` is, or None."""
    parts = split_key(presented)
    if parts is None:
        return None
    key = next((k for k in keys if k.id == parts[0] and k.revoked is None), None)
    return key if key is not None and key.matches(parts[1]) else None


__all__ = ["PREFIX", "SCOPES", "ApiKey", "find_key", "new_key", "split_key"]
