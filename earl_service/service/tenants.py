"""Tenants: who owns a model or a job, and the quotas that bound what one tenant may store."""

from __future__ import annotations

import re
from dataclasses import dataclass

from earl_service.errors import ConfigError

DEFAULT_TENANT = "default"  # the owner of what was made without a key: the shared token, open servers, older records
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a tenant's or a key's name: safe in a header, a path, a log


def checked_name(value: str, what: str) -> str:
    """`value` when it is a valid tenant or key name, else ConfigError saying what one may hold."""
    if not NAME.fullmatch(value):
        raise ConfigError(f"{what} {value[:80]!r} is not a name: 1 to 64 letters, digits, '_', '.' or '-', "
                          "starting with a letter or digit")
    return value


@dataclass(frozen=True)
class Quota:
    """What one tenant may keep registered: `max_models` models and `max_bytes` bytes of bundle files over all
    their versions (None: no bound). Checked by the store with the insert it allows, in one step."""

    max_models: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class Usage:
    """What a tenant holds now: its registered models and their bundle files' bytes (every version)."""

    models: int = 0
    bytes: int = 0

    def left(self, quota: Quota) -> dict[str, int]:
        """The room left under `quota`, by what is bounded: {"models": n, "bytes": n} (an unbounded one absent)."""
        room = {}
        if quota.max_models is not None:
            room["models"] = max(0, quota.max_models - self.models)
        if quota.max_bytes is not None:
            room["bytes"] = max(0, quota.max_bytes - self.bytes)
        return room


__all__ = ["DEFAULT_TENANT", "NAME", "Quota", "Usage", "checked_name"]
