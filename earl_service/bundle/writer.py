"""A safetensors file written block by block from the arrays (safetensors' own writer builds the whole file in
memory): the layout its writer gives, and the payload checksum a bundle carries in its metadata."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.atomic import replacing
from earl_service.errors import BundleError

# safetensors' dtype names, in its writer's order: tensors sorted by dtype (this list's order), then by name.
DTYPES = {np.dtype(k): v for k, v in (("uint64", "U64"), ("int64", "I64"), ("float64", "F64"), ("float32", "F32"),
                                      ("uint32", "U32"), ("int32", "I32"), ("float16", "F16"), ("uint16", "U16"),
                                      ("int16", "I16"), ("int8", "I8"), ("uint8", "U8"), ("bool", "BOOL"))}
RANK = {name: i for i, name in enumerate(DTYPES.values())}
WRITE_ROWS = 65_536  # rows of a tensor hashed or written at a time


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> Path:
    """Write atomically (temp file + fsync + rename) with the payload checksum in the metadata. The safetensors
    layout is written here from the arrays, block by block, so a (memory-mapped) table is never copied whole: one
    pass hashes the payload, a second writes it after the header (compact JSON, metadata keys sorted, spaces to a
    multiple of 8)."""
    unknown = [name for name, value in tensors.items() if value.dtype.newbyteorder("=") not in DTYPES]
    if unknown:
        raise BundleError(f"tensors {unknown}: dtypes with no safetensors name")
    order = sorted(tensors, key=lambda n: (RANK[DTYPES[tensors[n].dtype.newbyteorder("=")]], n))
    header: dict[str, Any] = {"__metadata__": {}}
    offset = 0
    for name in order:
        value = tensors[name]
        header[name] = {"dtype": DTYPES[value.dtype.newbyteorder("=")], "shape": list(value.shape),
                        "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    digest = hashlib.sha256()
    for block in _blocks(tensors, order):
        digest.update(block)
    header["__metadata__"] = dict(sorted({**metadata, "payload_sha256": digest.hexdigest()}.items()))
    with replacing(path, fsync=True) as tmp, open(tmp, "wb") as fh:
        fh.write(_encoded(header))
        for block in _blocks(tensors, order):
            fh.write(block)
    return Path(path)


def with_metadata(source: str | os.PathLike, path: str | os.PathLike, changes: dict[str, str]) -> Path:
    """A copy of the bundle `source` (a file this library wrote) at `path`, atomically, with metadata entries set
    from `changes`: the payload, and so its checksum, byte for byte; the header re-padded to a multiple of 8."""
    with open(source, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
        header["__metadata__"] = dict(sorted({**header.get("__metadata__", {}), **changes}.items()))
        with replacing(path, fsync=True) as tmp, open(tmp, "wb") as out:
            out.write(_encoded(header))
            shutil.copyfileobj(fh, out, 1 << 20)
    return Path(path)


def _encoded(header: dict[str, Any]) -> bytes:
    """The header as safetensors' writer lays it out: its length (u64), then compact JSON padded with spaces to a
    multiple of 8."""
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _blocks(tensors: dict[str, np.ndarray], order: list[str]) -> Iterator[memoryview]:
    """Each tensor's little-endian C-order bytes, WRITE_ROWS rows (of its first axis) at a time."""
    for name in order:
        value = tensors[name]
        if value.size == 0:
            continue
        rows = value.reshape(len(value), -1) if value.ndim > 1 else value.reshape(-1, 1)
        for start in range(0, len(rows), WRITE_ROWS):
            block = np.ascontiguousarray(rows[start : start + WRITE_ROWS], dtype=value.dtype.newbyteorder("<"))
            yield block.data.cast("B")


__all__ = ["DTYPES", "with_metadata", "write_safetensors"]
