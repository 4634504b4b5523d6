"""The bundle file format, with numpy and safetensors only (shared by the torch library and the edge reader)."""

from __future__ import annotations

import json
import lzma
import math
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from earl_service.bundle.reader import LayoutError, read_tensors, tensor_layout
from earl_service.bundle.writer import write_safetensors as write_safetensors  # where readers have imported it
from earl_service.data.labels import MAX_LABEL_BYTES, MAX_LABEL_CHARS
from earl_service.errors import BundleError
from earl_service.safe_json import parse_json
from earl_service.version import __version__

FORMAT = "earl-bundle"
# 1: weights as plain safetensors tensors. 2: weights may be entropy-coded into one "weights.packed" blob
# (see pack_weights); a version-1 reader meeting one says "newer format" instead of "missing tensor". 3: the model
# may be an imported one (config model a scorer: transe-l1, complex, ...); only such bundles say 3, so a version-2
# reader meeting one says "newer format" instead of "unknown model". Each file says the least version it needs.
IMPORTED_FORMAT_VERSION = 3  # the least version a bundle of an imported model needs
FORMAT_VERSION = IMPORTED_FORMAT_VERSION  # the newest this library reads
CODINGS = ("plain", "planes-xz")
_CODED_DTYPES = {"float32": np.float32, "float16": np.float16, "int8": np.int8}
# Bounds on what a bundle may declare, so that a small file cannot make its reader (or the API's listings) big.
# A trained bundle's header is a few KB: its metrics about 2.5 KB, its config 250 bytes.
HEADER_LIMIT = 4 * 2**20  # the whole safetensors header: metadata, weight manifest and tensor table
METADATA_LIMITS = {"config": 16 * 2**10, "metrics": 64 * 2**10, "relation_labels": 2 * 2**20}  # bytes per entry
RATIO_LIMIT = 64  # xz output per input byte: honest graphs and names shrink 2-4x, weights 1-2x, a bomb 1000x
RATIO_FLOOR = 16 << 20  # bytes any xz part may decode to, whatever its packed size


def joined_strings(names: list[str]) -> bytes:
    """NUL-joined UTF-8 (names never contain NUL: the reader rejects it): what pack_strings compresses."""
    return "\0".join(names).encode("utf-8")


def xz(data: bytes, preset: int) -> bytes:
    """`data` xz-compressed at `preset` with a dictionary no larger than the data needs (the next power of two, at
    least 4 KiB): the same matches, and the compressor's memory follows the input, not the preset's 64 MiB
    dictionary (xz -9 allocates ~674 MiB whatever it packs; packing a 1M-entity bundle's names peaked at hundreds
    of MiB beside its table)."""
    dictionary = min(max(1 << max(len(data) - 1, 1).bit_length(), 4096), 64 << 20)
    return lzma.compress(data, format=lzma.FORMAT_XZ,
                         filters=[{"id": lzma.FILTER_LZMA2, "preset": preset, "dict_size": dictionary}])


def pack_strings(names: list[str]) -> np.ndarray:
    """joined_strings xz-compressed, as a uint8 array."""
    return np.frombuffer(xz(joined_strings(names), 9), dtype=np.uint8)


def _ratio_limit(blob: np.ndarray) -> int:
    return max(RATIO_LIMIT * blob.size, RATIO_FLOOR)


@dataclass(frozen=True)
class BundleLimits:
    """The largest bundle a reader takes: names per vocabulary and edges in the graph (None: no limit). Checked
    while the xz streams decompress, so a file that holds more is refused before its names or edges are built;
    `origin` says where the numbers come from (a server's settings), for the message."""

    max_names: int | None = None
    max_triples: int | None = None
    max_label_bytes: int | None = None  # per kind (entity, relation) of labels, as they decompress
    origin: str = "the reader's limit"


_INFLATE_CHUNK = 1 << 22  # bytes of xz output per step: limits are checked between steps


def _decompress(blob: np.ndarray, what: str, watch: Callable[[bytearray], None] | None = None) -> bytearray:
    """xz-decompress with a ratio cap (RATIO_LIMIT): a decompression bomb stops at the cap. `watch` sees the
    output after every step and raises to stop early (BundleLimits)."""
    limit = _ratio_limit(blob)
    decompressor = lzma.LZMADecompressor()
    data, out = blob.tobytes(), bytearray()
    while not decompressor.eof and len(out) < limit:
        chunk = decompressor.decompress(data, max_length=min(_INFLATE_CHUNK, limit - len(out)))
        data = b""
        if not chunk and decompressor.needs_input:  # truncated: no more output will come
            break
        out += chunk
        if watch is not None:
            watch(out)
    if not decompressor.eof:
        raise BundleError(f"the bundle's {what} decompresses to more than {limit} bytes: refusing a possible bomb")
    return out


def unpack_strings(blob: np.ndarray, limits: BundleLimits | None = None) -> list[str]:
    most = limits.max_names if limits is not None else None

    def watch(out: bytearray) -> None:  # names = separators + 1
        if most is not None and out.count(0) >= most:
            assert limits is not None
            raise BundleError(f"the bundle's vocabulary holds more than {most:,} names; at most {most:,} are taken "
                              f"({limits.origin})")

    text = _decompress(blob, "vocabulary", watch).decode("utf-8")
    return text.split("\0") if text else []


def pack_labels(names: list[str], labels: dict[str, Any]) -> np.ndarray | None:
    """The labels of `names` in their order, "" where a name has none, as pack_strings packs names; None when no
    name has a label (the bundle then holds no labels tensor). Only string labels are kept."""
    aligned = [label if isinstance(label := labels.get(name), str) else "" for name in names]
    return pack_strings(aligned) if any(aligned) else None


def unpack_labels(blob: np.ndarray, names: int, what: str, limits: BundleLimits | None = None) -> list[str]:
    """Inverse of pack_labels for a vocabulary of `names` names. Refused while it inflates as soon as it holds more
    labels than names, or more bytes than MAX_LABEL_BYTES per name or `limits.max_label_bytes`, so what a hostile
    blob makes the reader hold is bounded by the vocabulary it already holds."""
    most = names * (MAX_LABEL_BYTES + 1)
    if limits is not None and limits.max_label_bytes is not None:
        most = min(most, limits.max_label_bytes)

    def watch(out: bytearray) -> None:
        if len(out) > most:
            origin = f" ({limits.origin})" if limits is not None and most == limits.max_label_bytes else ""
            raise BundleError(f"the bundle's {what} take more than {most:,} bytes{origin}")
        if out and out.count(0) >= names:  # labels = separators + 1
            raise BundleError(f"the bundle holds more {what} than names ({names:,})")

    labels = _decompress(blob, what, watch).decode("utf-8").split("\0")
    if len(labels) != names:
        raise BundleError(f"the bundle holds {len(labels):,} {what} for {names:,} names")
    if max(map(len, labels), default=0) > MAX_LABEL_CHARS:
        raise BundleError(f"the bundle's {what} include one longer than {MAX_LABEL_CHARS:,} characters")
    return labels


def narrowest_uint(max_value: int) -> np.dtype:
    for dt in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.uint64)


def graph_csr(triples: np.ndarray, num_entities: int, num_relations: int) -> bytes:
    """Distinct triples sorted by (head, relation, tail) as CSR (per-head counts, relations, tails) in the
    narrowest unsigned types, after a header: what pack_graph compresses. Edge order does not matter to the
    encoder (sums are order-free up to float rounding, and the CSR build sorts anyway), so sorting loses nothing;
    a repeated triple is dropped, since unpack_graph refuses repeats (a graph is a set: every reader of this
    library dedupes its triples)."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    t = t[np.lexsort((t[:, 2], t[:, 1], t[:, 0]))]
    t = t[np.concatenate([[True], (t[1:] != t[:-1]).any(axis=1)])] if len(t) else t
    counts = np.bincount(t[:, 0], minlength=num_entities)
    count_type = narrowest_uint(int(counts.max(initial=0)))
    header = np.array([num_entities, num_relations, len(t), count_type.itemsize], dtype=np.uint64)
    parts = [
        header.tobytes(),
        counts.astype(count_type).tobytes(),
        t[:, 1].astype(narrowest_uint(num_relations)).tobytes(),
        t[:, 2].astype(narrowest_uint(num_entities)).tobytes(),
    ]
    return b"".join(parts)


def pack_graph(triples: np.ndarray, num_entities: int, num_relations: int) -> np.ndarray:
    """graph_csr xz-compressed, as a uint8 array."""
    raw = graph_csr(triples, num_entities, num_relations)
    return np.frombuffer(xz(raw, 9 | lzma.PRESET_EXTREME), dtype=np.uint8)


def unpack_graph(blob: np.ndarray, limits: BundleLimits | None = None) -> np.ndarray:
    """Inverse of pack_graph: (E, 3) int64. Every size is checked against the decoded bytes before anything the
    header declares is built, and the edges must come as pack_graph writes them: sorted, without repeats."""

    def watch(out: bytearray) -> None:  # the header's edge count, as soon as it has streamed in
        if limits is not None and limits.max_triples is not None and len(out) >= 32:
            edges = int(np.frombuffer(bytes(out[16:24]), dtype=np.uint64)[0])
            if edges > limits.max_triples:
                raise BundleError(f"the bundle's graph holds {edges:,} triples; at most {limits.max_triples:,} are "
                                  f"taken ({limits.origin})")

    raw = _decompress(blob, "graph", watch)
    if len(raw) < 32:
        raise BundleError(f"the bundle's graph is {len(raw)} bytes, shorter than its 32-byte header")
    n, num_rel, e, count_size = (int(x) for x in np.frombuffer(raw[:32], dtype=np.uint64))
    if count_size not in (1, 2, 4, 8):
        raise BundleError(f"the bundle's graph header gives {count_size}-byte counts (1, 2, 4 or 8)")
    rel_type, tail_type = narrowest_uint(num_rel), narrowest_uint(n)
    size = 32 + n * count_size + e * (rel_type.itemsize + tail_type.itemsize)
    if size != len(raw):
        raise BundleError(f"the bundle's graph header declares {size} bytes, the graph holds {len(raw)}")
    counts = np.frombuffer(raw, dtype=f"uint{8 * count_size}", count=n, offset=32)
    rel = np.frombuffer(raw, dtype=rel_type, count=e, offset=32 + n * count_size)
    tail = np.frombuffer(raw, dtype=tail_type, count=e, offset=32 + n * count_size + e * rel_type.itemsize)
    if int(counts.sum(dtype=np.uint64)) != e or (n and int(counts.max()) > e):  # the max: a sum that wrapped
        raise BundleError(f"the bundle's graph counts {int(counts.sum(dtype=np.uint64))} edges, its header {e}")
    _check_edge_order(counts, rel, tail)
    triples = np.empty((e, 3), dtype=np.int64)
    triples[:, 0] = np.repeat(np.arange(n, dtype=np.int64), counts.astype(np.int64))
    triples[:, 1], triples[:, 2] = rel, tail
    return triples


def _check_edge_order(counts: np.ndarray, rel: np.ndarray, tail: np.ndarray) -> None:
    """Within each head, (relation, tail) strictly increase: pack_graph's order, and no edge twice. A repeated
    edge is malformed (it would count twice in every sum of the encoder, and cost the server per copy).
    Compared in the stored narrow types, so checking costs a few bytes per edge."""
    if len(rel) < 2:
        return
    new_head = np.zeros(len(rel), dtype=bool)
    new_head[np.cumsum(counts[counts > 0], dtype=np.int64)[:-1]] = True
    later_rel, later_tail = rel[1:], tail[1:]
    increasing = (later_rel > rel[:-1]) | ((later_rel == rel[:-1]) & (later_tail > tail[:-1]))
    if not (increasing | new_head[1:]).all():
        raise BundleError("the bundle's graph holds a repeated edge or is out of order; a bundle's graph is a "
                          "set of distinct triples sorted by head, relation and tail (as pack_graph writes it)")


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
    return np.frombuffer(xz(planes, 9), dtype=np.uint8), json.dumps(manifest)


def weights_manifest(manifest_json: str) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """pack_weights' manifest as (name, dtype, shape) per coded tensor; BundleError if malformed."""
    try:
        manifest = [(str(n), np.dtype(_CODED_DTYPES[d]), tuple(int(x) for x in shape))
                    for n, d, shape in parse_json(manifest_json, "the weight manifest", list)]
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"the bundle's weight manifest is malformed: {exc}") from exc
    if any(x < 0 for _, _, shape in manifest for x in shape):
        raise BundleError("the bundle's weight manifest has a negative shape")
    return manifest


def unpack_weights(blob: np.ndarray, manifest: list[tuple[str, np.dtype, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """Inverse of pack_weights. The manifest (check its shapes first) fixes the decoded size, and that size must
    stay within the ratio cap, so a bomb is refused before one byte is decoded."""
    counts = [math.prod(shape) for _, _, shape in manifest]
    sizes = [dt.itemsize for _, dt, _ in manifest]
    expected = sum(c * w for c, w in zip(counts, sizes, strict=True))
    if expected > _ratio_limit(blob):
        raise BundleError(f"the bundle's coded weights would decode to {expected} bytes from {blob.size}: "
                          f"more than {RATIO_LIMIT}x, refusing a possible bomb")
    decompressor = lzma.LZMADecompressor()
    try:
        raw = decompressor.decompress(blob.tobytes(), max_length=expected + 1)
    except lzma.LZMAError as exc:
        raise BundleError(f"the bundle is corrupted: its coded weights do not decompress ({exc})") from exc
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


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, np.ndarray], int]:
    """Parse and verify a bundle file without trusting it: (metadata, tensors, size in bytes). Coded weights stay
    coded ("weights.packed"): core.decode decodes them once their shapes agree with the config. The payload is read
    once, block by block into the tensors' arrays, and hashed as it is read (bundle/reader.py)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            meta, header_len, data = _read_header(fh, path, size)
            try:
                layout = tensor_layout(parse_json(data[8 : 8 + header_len], "the safetensors header"),
                                       size - 8 - header_len)
                tensors, digest = read_tensors(fh, layout)
            except (LayoutError, ValueError) as exc:
                raise BundleError(f"{path} is corrupted or truncated: {exc}") from None
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc
    if digest != meta.get("payload_sha256"):
        raise BundleError(f"{path} is corrupted or truncated: the tensor payload does not match its SHA-256")
    return meta, tensors, size


def tensor_bytes(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, int]]:
    """(metadata, bytes of each tensor) from a bundle's header alone: what a size check needs without reading,
    verifying or decoding the weights (the API checks a compress job over a registered, already verified one)."""
    path = Path(path)
    with path.open("rb") as fh:
        meta, header_len, data = _read_header(fh, path, os.fstat(fh.fileno()).st_size)
    table = parse_json(data[8 : 8 + header_len], "the safetensors header")
    try:
        return meta, {name: int(entry["data_offsets"][1]) - int(entry["data_offsets"][0])
                      for name, entry in table.items() if name != "__metadata__"}
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BundleError(f"{path}: malformed safetensors tensor table ({exc})") from exc


def _read_header(fh: BinaryIO, path: Path, size: int) -> tuple[dict[str, str], int, bytes]:
    """_header of the open file `fh` of `size` bytes, and the bytes read (the file's position: the payload)."""
    head = fh.read(8)
    (header_len,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
    data = head + fh.read(min(header_len, HEADER_LIMIT + 1))
    meta, header_len = _header(data, path, size)
    return meta, header_len, data


def _header(data: bytes, path: Path, size: int) -> tuple[dict[str, str], int]:
    """The metadata of an EARL bundle of a version this library reads, and the header's length, from the file's
    first bytes (`data`: its 8-byte length and at most HEADER_LIMIT + 1 bytes after) and its `size`."""
    if size < 8:
        raise BundleError(f"{path} is not an EARL bundle: {size} bytes, too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > size - 8:
        raise BundleError(f"{path} is not an EARL bundle (truncated, or not a safetensors file)")
    if header_len > HEADER_LIMIT:
        raise BundleError(f"{path}: its header takes {header_len:,} bytes, more than a bundle may "
                          f"(bundle_format.HEADER_LIMIT = {HEADER_LIMIT:,})")
    meta = _metadata(data[8 : 8 + header_len], path)
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


def _metadata(header: bytes, path: Path) -> dict[str, str]:
    """The `__metadata__` of a safetensors header: an object of strings, each entry within METADATA_LIMITS."""
    try:
        meta = parse_json(header, "the safetensors header").get("__metadata__") or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ValueError("__metadata__ must be a JSON object of strings")
    except ValueError as exc:
        raise BundleError(f"{path} is not an EARL bundle: unreadable safetensors header ({exc})") from exc
    for key, limit in METADATA_LIMITS.items():
        size = len(meta.get(key, "").encode("utf-8"))
        if size > limit:
            raise BundleError(f"{path}: its {key!r} metadata takes {size:,} bytes, more than a bundle's {key!r} "
                              f"may ({limit:,}, bundle_format.METADATA_LIMITS)")
    return meta


# The metrics entry that pads a bundle's metrics field to a fixed size (bundle.sizes), never shown.
PAD_KEY = "pad"


def shown_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A bundle's metrics as `earl info` and the API show them: without the padding."""
    return {k: v for k, v in metrics.items() if k != PAD_KEY}


def graph_bytes(triples: np.ndarray, entities: Sequence[str], relations: Sequence[str]) -> int:
    """Bytes of the packed graph and vocabularies in a bundle of these training triples and names: what every
    candidate carries whatever its weights, so no budget below it can be met."""
    parts = (pack_graph(triples, len(entities), len(relations)), pack_strings(list(entities)),
             pack_strings(list(relations)))
    return int(sum(part.nbytes for part in parts))
