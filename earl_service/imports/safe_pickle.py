"""Unpickling another library's files without running its code: only numpy arrays, builtin containers and named
stand-in classes are built; any other global the pickle asks for is a ModelImportError naming it."""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from earl_service.errors import ModelImportError

# What numpy's ndarray pickling needs (numpy 1 spells the module numpy.core, numpy 2 numpy._core).
NUMPY = {(module, name) for root in ("numpy.core", "numpy._core")
         for module, name in ((f"{root}.multiarray", "_reconstruct"), (f"{root}.multiarray", "scalar"),
                              (f"{root}.numeric", "_frombuffer"))} | {("numpy", "ndarray"), ("numpy", "dtype")}
BUILTINS = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes",
                                      "bytearray", "complex", "bool", "slice")} | {
    ("collections", "OrderedDict"), ("copyreg", "_reconstructor"), ("builtins", "object")}


class Record(dict):
    """A stand-in for a dict subclass or plain object of another library: its items and attributes, no code."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)

    def field(self, name: str, default: Any = None) -> Any:
        """An item, else an attribute (EasyDict keeps both), else default."""
        return self[name] if name in self else self.__dict__.get(name, default)


def _unpickler(stand_ins: Mapping[tuple[str, str], type], source: str) -> type[pickle.Unpickler]:
    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in stand_ins:
                return stand_ins[(module, name)]
            if (module, name) in NUMPY or (module, name) in BUILTINS:
                return super().find_class(module, name)
            raise ModelImportError(f"{source}: the pickle asks for {module}.{name}, which is not read here (only "
                                   "numpy arrays, builtin containers and known records are: nothing in the file "
                                   "is run)")

    return Restricted


def load(path: Path, stand_ins: Mapping[tuple[str, str], type] | None = None) -> Any:
    """The object pickled in `path`, built from numpy, builtins and `stand_ins` ((module, name) -> class) only."""
    try:
        with open(path, "rb") as fh:
            return restricted_load(fh, stand_ins or {}, str(path))
    except OSError as exc:
        raise ModelImportError(f"{path}: cannot read ({exc.strerror or exc})") from None


def restricted_load(fh: IO[bytes], stand_ins: Mapping[tuple[str, str], type], source: str) -> Any:
    try:
        return _unpickler(stand_ins, source)(fh).load()
    except ModelImportError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed pickle fails in any of many ways
        raise ModelImportError(f"{source}: not a pickle that can be read ({type(exc).__name__}: {exc})") from None


def loads(data: bytes, stand_ins: Mapping[tuple[str, str], type], source: str) -> Any:
    return restricted_load(io.BytesIO(data), stand_ins, source)


__all__ = ["Record", "load", "loads", "restricted_load"]
