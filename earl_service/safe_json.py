"""JSON read with bounds: nesting at most JSON_DEPTH deep, no NaN or Infinity, the expected top-level type."""

from __future__ import annotations

import json
from typing import Any

# How deep any JSON we read may nest (a trained bundle's metrics: 3): what a JSON answer can still carry.
JSON_DEPTH = 32
_JSON_NAMES: dict[type, str] = {dict: "object", list: "array", str: "string"}


def parse_json(text: str | bytes, what: str, kind: type = dict, *, nonfinite_as_null: bool = False) -> Any:
    """`text` as JSON of type `kind`, nested at most JSON_DEPTH deep; ValueError naming `what` if not. NaN and
    Infinity are refused (no JSON answer can carry them) or, with `nonfinite_as_null`, read as None."""
    def constant(name: str) -> None:
        if not nonfinite_as_null:
            raise ValueError(f"{what} holds {name}, which JSON does not allow")

    too_deep = ValueError(f"{what} is nested more than {JSON_DEPTH} deep")
    try:
        value = json.loads(text, parse_constant=constant)
    except RecursionError:  # deeper than the interpreter's own limit
        raise too_deep from None
    if _depth(value) > JSON_DEPTH:
        raise too_deep
    if not isinstance(value, kind):
        raise ValueError(f"{what} must be a JSON {_JSON_NAMES.get(kind, kind.__name__)}, "
                         f"not {_JSON_NAMES.get(type(value), type(value).__name__)}")
    return value


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in a parsed JSON value (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            todo.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
