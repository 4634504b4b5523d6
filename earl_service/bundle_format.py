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
# 1: weights as plain safetensors tensors. 2: weights may be entropy-coded into one "weights.packed" blob
# (see pack_weights); a version-1 reader meeting one says "newer format" instead of "missing tensor".
FORMAT_VERSION = 2
PRECISIONS = ("fp32", "fp16", "int8")
CODINGS = ("plain", "planes-xz")
_CODED_DTYPES = {"float32": np.float32, "float16": np.float16, "int8": np.int8}
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


def default_coding(precision: str) -> str:
    """fp32 bundles keep plain tensors (any safetensors tool reads them, nothing to decode); the fp16 and
    int8 bundles are the small download, so their weights are entropy-coded."""
    return "plain" if precision == "fp32" else "planes-xz"


def pack_weights(tensors: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    """Losslessly code every `param.*` tensor into one xz blob: (blob, JSON manifest of names, dtypes, shapes).

    Byte planes first (byte 0 of every value, then byte 1, ...): a float's high byte holds its sign and
    exponent, which trained weights use sparsely (5.3 bits of entropy per byte on FB15k-237 fp16 weights)
    while the low mantissa byte is noise (8.0 bits). Kept apart, xz shrinks the high plane by a third; mixed,
    it barely finds the pattern. Decoding gives back the exact bytes.
    """
    names = sorted(n for n in tensors if n.startswith("param."))
    raws = [np.ascontiguousarray(tensors[n]).reshape(-1).view(np.uint8).reshape(-1, tensors[n].dtype.itemsize)
            for n in names]
    width = max((r.shape[1] for r in raws), default=0)
    planes = b"".join(np.ascontiguousarray(r[:, b]).tobytes() for b in range(width) for r in raws if r.shape[1] > b)
    manifest = [[n, str(tensors[n].dtype), list(tensors[n].shape)] for n in names]
    return np.frombuffer(lzma.compress(planes, preset=9), dtype=np.uint8), json.dumps(manifest)


def unpack_weights(blob: np.ndarray, manifest_json: str) -> dict[str, np.ndarray]:
    """Inverse of pack_weights. The manifest fixes the decoded size, so no decompression bomb gets through."""
    try:
        manifest = [(str(n), _CODED_DTYPES[d], tuple(int(x) for x in shape)) for n, d, shape in json.loads(manifest_json)]
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"the bundle's weight manifest is malformed: {exc}") from exc
    counts = [int(np.prod(shape, dtype=np.int64)) for _, _, shape in manifest]
    sizes = [np.dtype(dt).itemsize for _, dt, _ in manifest]
    if any(c < 0 for c in counts):
        raise BundleError("the bundle's weight manifest has a negative shape")
    expected = sum(c * w for c, w in zip(counts, sizes, strict=True))
    decompressor = lzma.LZMADecompressor()
    raw = decompressor.decompress(blob.tobytes(), max_length=expected + 1)
    if len(raw) != expected or not decompressor.eof:
        raise BundleError(f"the bundle's coded weights decode to {len(raw)}+ bytes, the manifest says {expected}")
    cols = [np.empty((c, w), dtype=np.uint8) for c, w in zip(counts, sizes, strict=True)]
    pos = 0
    for b in range(max(sizes, default=0)):
        for col, c, w in zip(cols, counts, sizes, strict=True):
            if w > b:
                col[:, b] = np.frombuffer(raw, dtype=np.uint8, count=c, offset=pos)
                pos += c
    return {name: col.view(dt).reshape(shape) for (name, dt, shape), col in zip(manifest, cols, strict=True)}


def encode_weights(tensors: dict[str, np.ndarray], metadata: dict[str, str], coding: str,
                   ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Apply a weight coding (CODINGS) to a bundle's tensors and metadata before writing."""
    if coding not in CODINGS:
        raise ValueError(f"weight coding must be one of {CODINGS}, not {coding!r}")
    if coding == "plain":
        return tensors, {**metadata, "format_version": "1", "weights_coding": "plain"}
    blob, manifest = pack_weights(tensors)
    rest = {n: t for n, t in tensors.items() if not n.startswith("param.")}
    return {**rest, "weights.packed": blob}, {**metadata, "format_version": "2", "weights_coding": coding,
                                              "weights_manifest": manifest}


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
    meta, header_len = _header(data, path)
    if payload_digest(data[8 + header_len :]) != meta.get("payload_sha256"):
        raise BundleError(f"{path} is corrupted or truncated: the tensor payload does not match its SHA-256")
    try:
        tensors = st_load(data)
    except Exception as exc:  # safetensors raises its own error types for malformed files
        raise BundleError(f"{path} is corrupted: {exc}") from exc
    return meta, _decode_weights(meta, tensors, path), len(data)


def _header(data: bytes, path: Path) -> tuple[dict[str, str], int]:
    """The metadata of an EARL bundle of a version this library reads, and the header's length."""
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
    return meta, header_len


def _decode_weights(meta: dict[str, str], tensors: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    """The tensors with coded weights (meta's weights_coding) decoded back into `param.*` tensors."""
    coding = meta.get("weights_coding", "plain")
    if coding not in CODINGS:
        raise BundleError(f"{path} uses weight coding {coding!r}, unknown to earl_service {__version__}")
    if coding == "plain":
        return tensors
    if "weights.packed" not in tensors or "weights_manifest" not in meta:
        raise BundleError(f"{path} says its weights are {coding}-coded but holds no coded weights")
    try:
        decoded = unpack_weights(tensors.pop("weights.packed"), meta["weights_manifest"])
    except lzma.LZMAError as exc:
        raise BundleError(f"{path} is corrupted: its coded weights do not decompress ({exc})") from exc
    if set(decoded) & set(tensors):
        raise BundleError(f"{path} holds weights both coded and plain")
    return tensors | decoded


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
