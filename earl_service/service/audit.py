"""The audit log's entry: who wrote what, when, and how it ended. The store keeps the latest entries (a bounded,
append-only log: nothing rewrites or removes one but the trim of the oldest)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

KEEP = 100_000  # entries a store keeps by default; the oldest go first (EARL_AUDIT_KEEP)


@dataclass(frozen=True)
class AuditEntry:
    """One write: `key` (its name, or "token" / "anonymous") of `tenant` sent `method` `path` at `time`, about
    `target` (the job or model id, when there is one) and got `status`."""

    time: float
    tenant: str
    key: str
    method: str
    path: str
    status: int
    target: str | None = None
    key_id: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> AuditEntry:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


__all__ = ["KEEP", "AuditEntry"]
