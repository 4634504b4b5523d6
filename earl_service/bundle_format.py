"""The bundle file format, with numpy and safetensors only (shared by the torch library and the edge reader)."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import struct
from pathlib import Path

import numpy as np

from . import __version__
from .errors import BundleError

FORMAT = "earl-bundle"
FORMAT_VERSION = 1
PRECISIONS = ("fp32", "fp16", "int8")
_HEADER_LIMIT = 100 * 1024 * 1024  # a sane bundle header is a few KB


def pack_strings(names: list[str]) -> np.ndarray:
    """NUL-joined UTF-8, xz-compressed, as a uint8 array (names never contain NUL: the reader rejects it)."""
    return np.frombuffer(lzma.compress("\0".join(names).encode("utf-8"), preset=9), dtype=np.uint8)


def _decompress(blob: np.ndarray, what: str) -> bytes:
    """xz-decompress with a ratio cap: honest graphs and names shrink 2-4x, a decompression bomb 1000x."""
    limit = max(64 * blob.size, 16 << 20)
    decompressor = lzma.LZMADecompressor()
    raw = decompressor.decompress(blob.tobytes(), max_length=limit)
    if not decompressor.eof:
        raise BundleError(f"the bundle's {what} decompresses to more than {limit} bytes: refusing a possible bomb")
    return raw


def unpack_strings(blob: np.ndarray) -> list[str]:
    text = _decompress(blob, "vocabulary").decode("utf-8")
    return text.split("\0") if text else []


def narrowest_uint(max_value: int) -> np.dtype:
    for dt in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.uint64)


def pack_graph(triples: np.ndarray, num_entities: int, num_relations: int) -> np.ndarray:
    """Triples sorted by (head, relation, tail) as CSR (per-head counts, relations, tails) in the narrowest
    unsigned types, xz-compressed. Edge order does not matter to the encoder (sums are order-free up to
    float rounding, and the CSR build sorts anyway), so sorting loses nothing."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    t = t[np.lexsort((t[:, 2], t[:, 1], t[:, 0]))]
    counts = np.bincount(t[:, 0], minlength=num_entities)
    count_type = narrowest_uint(int(counts.max(initial=0)))
    header = np.array([num_entities, num_relations, len(t), count_type.itemsize], dtype=np.uint64)
    parts = [
        header.tobytes(),
        counts.astype(count_type).tobytes(),
        t[:, 1].astype(narrowest_uint(num_relations)).tobytes(),
        t[:, 2].astype(narrowest_uint(num_entities)).tobytes(),
    ]
    return np.frombuffer(lzma.compress(b"".join(parts), preset=9 | lzma.PRESET_EXTREME), dtype=np.uint8)


def unpack_graph(blob: np.ndarray) -> np.ndarray:
    raw = _decompress(blob, "graph")
    n, num_rel, e, count_size = (int(x) for x in np.frombuffer(raw[:32], dtype=np.uint64))
    count_type = np.dtype(f"uint{8 * count_size}")
    pos = 32
    out = []
    for count, dt in ((n, count_type), (e, narrowest_uint(num_rel)), (e, narrowest_uint(n))):
        arr = np.frombuffer(raw, dtype=dt, count=count, offset=pos)
        pos += count * dt.itemsize
        out.append(arr.astype(np.int64))
    counts, rel, tail = out
    heads = np.repeat(np.arange(n, dtype=np.int64), counts)
    return np.stack([heads, rel, tail], 1)


def quantize(name: str, value: np.ndarray, precision: str) -> dict[str, np.ndarray]:
    """fp32 as is; fp16 halves; int8 keeps per-row scales (max |x| / 127) for matrices, fp16 for vectors."""
    value = np.ascontiguousarray(value, dtype=np.float32)
    if precision == "fp32":
        return {name: value}
    if precision == "fp16" or value.ndim < 2:
        return {name: value.astype(np.float16)}
    scale = np.abs(value).max(axis=1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    return {name: np.round(value / scale).astype(np.int8), name + ".scale": scale.astype(np.float32).ravel()}


def dequantize(tensors: dict[str, np.ndarray], name: str) -> np.ndarray:
    value = tensors[name]
    if value.dtype == np.int8:
        return value.astype(np.float32) * tensors[name + ".scale"][:, None]
    return value.astype(np.float32)


def payload_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, np.ndarray], int]:
    """Parse and verify a bundle file without trusting it: (metadata, tensors, size in bytes)."""
    from safetensors.numpy import load as st_load

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc
    if len(data) < 8:
        raise BundleError(f"{path} is not an EARL bundle: {len(data)} bytes, too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > min(_HEADER_LIMIT, len(data) - 8):
        raise BundleError(f"{path} is not an EARL bundle (truncated, or not a safetensors file)")
    try:
        header = json.loads(data[8 : 8 + header_len])
        meta = header.get("__metadata__") or {}
    except (ValueError, AttributeError) as exc:
        raise BundleError(f"{path} is not an EARL bundle: unreadable safetensors header") from exc
    if meta.get("format") != FORMAT:
        raise BundleError(f"{path} is a safetensors file but not an EARL bundle (format={meta.get('format')!r})")
    try:
        version = int(meta.get("format_version", ""))
    except ValueError as exc:
        raise BundleError(f"{path}: bad format_version {meta.get('format_version')!r}") from exc
    if version > FORMAT_VERSION:
        raise BundleError(
            f"{path} uses bundle format {version}, newer than this library's {FORMAT_VERSION} "
            f"(earl_service {__version__}); upgrade earl_service to read it"
        )
    payload = data[8 + header_len :]
    if payload_digest(payload) != meta.get("payload_sha256"):
        raise BundleError(f"{path} is corrupted or truncated: the tensor payload does not match its SHA-256")
    try:
        tensors = st_load(data)
    except Exception as exc:  # safetensors raises its own error types for malformed files
        raise BundleError(f"{path} is corrupted: {exc}") from exc
    return meta, tensors, len(data)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> Path:
    """Write atomically (temp file + fsync + rename) with the payload checksum in the metadata."""
    from safetensors.numpy import save as st_save

    path = Path(path)
    # The payload bytes do not depend on the metadata, so serialise once without, hash, then with.
    probe = st_save(tensors, metadata={})
    (hl,) = struct.unpack("<Q", probe[:8])
    metadata = {**metadata, "payload_sha256": payload_digest(probe[8 + hl :])}
    blob = st_save(tensors, metadata=metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
