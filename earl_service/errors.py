"""Named errors raised by earl_service, so callers can catch them by kind."""

from __future__ import annotations

import os
from collections.abc import Sequence


class EarlError(Exception):
    """Base class for every error earl_service raises on purpose."""


class TripleFileError(EarlError):
    """A triple file cannot be read: bad format, bad encoding, binary content, no triples, ..."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, message: str, *, unit: str = "line") -> None:
        self.path = str(path)
        self.line = line  # the line, or with unit="row" the row of a table (Parquet, a DataFrame), from 1
        self.reason = message
        self.unit = unit
        where = self.path if line is None else f"{self.path}, {unit} {line}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # keep pickling working despite the custom __init__
        return _triple_file_error, (type(self), self.path, self.line, self.reason, self.unit)


def _triple_file_error(cls: type[TripleFileError], path: str, line: int | None, reason: str,
                       unit: str) -> TripleFileError:
    error = cls.__new__(cls)
    TripleFileError.__init__(error, path, line, reason, unit=unit)
    return error


class LabelFileError(TripleFileError):
    """A label file (entities.tsv, relations.en.json, ...) cannot be read; it names the file and line as
    TripleFileError does (and is one, so every caller that reports a bad input file reports it)."""


class QueryFileError(TripleFileError):
    """A query file (`earl predict --queries`) holds a line that is not a query, or a name that is not known; it
    names the file and line as TripleFileError does."""


class ConfigError(EarlError, ValueError):
    """A setting is out of range or settings contradict each other (also a ValueError, for older callers)."""


class RunError(EarlError, FileNotFoundError):
    """A run directory is missing or is not one that `earl train` wrote."""


class StoreError(EarlError):
    """The job store is unreachable or its URL is not understood."""


class QuotaError(EarlError):
    """A client already has as many unfinished jobs as the server allows; nothing was queued."""

    def __init__(self, client: str, count: int, limit: int) -> None:
        super().__init__(f"client {client} already has {count} unfinished (queued or running) jobs, at most {limit}")
        self.client, self.count, self.limit = client, count, limit


class TenantQuotaError(EarlError):
    """Registering a model would take a tenant past its quota of models (`what` = "models") or of stored bytes
    ("bytes"); nothing was registered."""

    def __init__(self, tenant: str, what: str, used: int, adding: int, limit: int) -> None:
        held = f"{used:,} {what}" if what == "models" else f"{used:,} bytes of bundles"
        super().__init__(f"tenant {tenant} holds {held}; adding {adding:,} more would pass its quota of {limit:,}")
        self.tenant, self.what, self.used, self.adding, self.limit = tenant, what, used, adding, limit


class DatasetError(EarlError):
    """A dataset folder is unusable (missing folder or train file, missing split, ...)."""


class BundleError(EarlError):
    """A saved model bundle is missing, incomplete or incompatible."""


class ModelImportError(EarlError):
    """A model to import (`earl import`) cannot be read: a missing file, a malformed table, shapes or vocabulary
    sizes that disagree, a model kind no scorer here computes; the message names the file."""


class _UnknownNameError(EarlError, KeyError):
    kind = "name"

    def __init__(self, name: str, suggestions: Sequence[str] = ()) -> None:
        self.name = name
        self.suggestions = list(suggestions)
        message = f"unknown {self.kind} {name!r}"
        if self.suggestions:
            message += "; did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?"
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:  # KeyError's default str() would wrap the message in quotes
        return self.message

    def __reduce__(self):
        return type(self), (self.name, self.suggestions)


class UnknownEntityError(_UnknownNameError):
    """An entity name is not in the vocabulary; ``suggestions`` holds close matches."""

    kind = "entity"


class UnknownRelationError(_UnknownNameError):
    """A relation name is not in the vocabulary; ``suggestions`` holds close matches."""

    kind = "relation"


class AmbiguousNameError(EarlError, KeyError):
    """A label names several entities (or relations); ``candidates`` holds their ids, to ask by id instead."""

    def __init__(self, kind: str, name: str, candidates: Sequence[str], total: int | None = None) -> None:
        self.kind, self.name, self.candidates = kind, name, list(candidates)
        self.total = len(self.candidates) if total is None else total
        more = f" and {self.total - len(self.candidates)} more" if self.total > len(self.candidates) else ""
        self.message = (f"{kind} label {name!r} names {self.total} {kind} ids: "
                        + ", ".join(repr(c) for c in self.candidates) + f"{more}; give one of them by id")
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return type(self), (self.kind, self.name, self.candidates, self.total)


class _NotFoundError(_UnknownNameError):
    """An id the service does not hold; the message reads "<kind> 'id' not found"."""

    def __init__(self, name: str, suggestions: Sequence[str] = ()) -> None:
        super().__init__(name, suggestions)
        hint = "; did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?" if self.suggestions else ""
        self.message = f"{self.kind} {name!r} not found{hint}"
        self.args = (self.message,)


class UnknownModelError(_NotFoundError):
    """No registered model has this id; ``suggestions`` holds close ids."""

    kind = "model"


class UnknownJobError(_NotFoundError):
    """No job has this id."""

    kind = "job"


class TripleLimitError(TripleFileError):
    """A triple file holds more distinct triples than the reader was allowed to count (``limit``)."""

    def __init__(self, path: str | os.PathLike[str], limit: int) -> None:
        self.limit = limit
        super().__init__(path, None, f"has more than {limit:,} distinct triples (max_triples={limit})")

    def __reduce__(self):
        return type(self), (self.path, self.limit)


class UnknownReportError(_NotFoundError):
    """The model exists but has no compress report (only a compress job's model has one); ``name`` is its id."""

    kind = "report"

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.message = f"model {model_id!r} has no compress report: only a compress job (max_bytes) leaves one"
        self.args = (self.message,)


class UnknownKeyError(_NotFoundError):
    """No API key has this id."""

    kind = "key"
