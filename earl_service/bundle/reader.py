"""A safetensors payload read block by block into the tensors' own arrays, hashed as it is read.

safetensors' `load` takes the whole file as bytes, and read_safetensors then held three copies of the payload at
once: the bytes read, the slice hashed for the checksum, and the arrays made from them. `earl compress --from` on a
1,000,000 x 256 fp32 import (1.02 GB) peaked at 5,460 MiB. Here every byte is read once, straight into the array
that keeps it (never a second copy of the payload), so reading a bundle holds its tensors and one block.

The tensor table is checked as safetensors' own reader checks it: known dtypes, non-negative shapes, each tensor's
bytes equal to its shape's, the tensors tiling the payload from its first byte to its last with no gap or overlap.
The arrays are allocated only once the table is proven to fit in the file's size.
"""

from __future__ import annotations

import hashlib
import io
import math
from typing import Any

import numpy as np

from earl_service.bundle.writer import DTYPES

NUMPY = {name: dtype.newbyteorder("<") for dtype, name in DTYPES.items()}  # safetensors' dtypes, little-endian
READ_BLOCK = 16 << 20  # bytes read (and hashed) at a time


class LayoutError(ValueError):
    """The tensor table does not describe the payload (the caller names the file)."""


def tensor_layout(header: dict[str, Any], payload: int) -> list[tuple[str, np.dtype, tuple[int, ...], int, int]]:
    """(name, dtype, shape, begin, end) of each tensor in a parsed safetensors header, by offset; LayoutError
    unless they tile exactly the `payload` bytes after the header."""
    layout = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise LayoutError(f"tensor {name!r} is not described by an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in NUMPY:
            raise LayoutError(f"tensor {name!r} has dtype {dtype!r}, not one of {', '.join(NUMPY)}")
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise LayoutError(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise LayoutError(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with begin <= end")
        size = math.prod(shape) * NUMPY[dtype].itemsize
        if offsets[1] - offsets[0] != size:
            raise LayoutError(f"tensor {name!r} of shape {shape} {dtype} needs {size:,} bytes, its offsets give "
                              f"{offsets[1] - offsets[0]:,}")
        layout.append((name, NUMPY[dtype], tuple(shape), offsets[0], offsets[1]))
    layout.sort(key=lambda t: (t[3], t[4]))
    end = 0
    for name, _, _, begin, stop in layout:
        if begin != end:
            raise LayoutError(f"tensor {name!r} starts at byte {begin:,} of the payload where {end:,} was expected")
        end = stop
    if end != payload:
        raise LayoutError(f"the tensors take {end:,} bytes and the payload holds {payload:,}")
    return layout


def read_tensors(fh: io.BufferedIOBase, layout: list[tuple[str, np.dtype, tuple[int, ...], int, int]],
                 ) -> tuple[dict[str, np.ndarray], str]:
    """The tensors of `layout` read from `fh` (at the payload's first byte) and the payload's SHA-256 hex digest;
    LayoutError if the file ends early."""
    digest, tensors = hashlib.sha256(), {}
    for name, dtype, shape, begin, end in layout:
        array = np.empty(shape, dtype=dtype)
        raw = memoryview(array.reshape(-1).view(np.uint8).data)
        for start in range(0, end - begin, READ_BLOCK):
            block = raw[start : start + READ_BLOCK]
            got = fh.readinto(block)
            if got != len(block):
                raise LayoutError(f"the file ends inside tensor {name!r}")
            digest.update(block)
        tensors[name] = array
    return tensors, digest.hexdigest()


__all__ = ["LayoutError", "NUMPY", "READ_BLOCK", "read_tensors", "tensor_layout"]
