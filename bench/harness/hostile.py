"""Hostile bundles made from a good one (issue 34): bench/abuse.py uploads them to a live server and
tests/api/test_bad_inputs.py to a test client."""

from __future__ import annotations

import functools
import json
import lzma
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness.machine import REPO

MB = 2**20
NESTED = "[" * 100_000 + "]" * 100_000  # deeper than any JSON parser's recursion limit


def good_bundle(path: Path, *, model: str = "earl") -> Path:
    """An untrained CoDEx-S bundle (dim 16, fp32, plain tensors): its vocabularies and graph are real."""
    import torch

    from earl_service.bundle.model_io import bundle_from_model
    from earl_service.config import ModelConfig
    from earl_service.data.dataset import load_dataset
    from earl_service.model.graph import choose_reserved
    from earl_service.model.modules import build_model

    ds = load_dataset(REPO / "earl_service" / "demo_data" / "codex-s")
    config = ModelConfig(model=model, dim=16)
    reserved = choose_reserved(ds.num_entities, config.reserved_ratio, 0) if model == "earl" else torch.zeros(
        0, dtype=torch.long)
    built = build_model(config, ds.num_entities, ds.num_relations, reserved)
    return bundle_from_model(built, config, ds.entities, ds.relations, ds.train).save(path)


@functools.cache
def source_bundle(model: str = "earl") -> bytes:
    """good_bundle's bytes, made once per process."""
    with tempfile.TemporaryDirectory() as tmp:
        return good_bundle(Path(tmp) / "bundle.safetensors", model=model).read_bytes()


def _parts(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors (coded weights left coded) and metadata of a bundle file's bytes, checksum dropped."""
    from earl_service.bundle.format import read_safetensors

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "b").write_bytes(data)
        meta, tensors, _ = read_safetensors(Path(tmp) / "b")
    meta.pop("payload_sha256")
    return dict(tensors), meta


def _write(tensors: dict[str, np.ndarray], meta: dict[str, str]) -> bytes:
    from earl_service.bundle.format import write_safetensors

    with tempfile.TemporaryDirectory() as tmp:
        return write_safetensors(Path(tmp) / "b", tensors, meta).read_bytes()


def weights_bomb(data: bytes, *, decoded_mib: int = 512) -> bytes:
    """Item 1: the weights coded as byte planes + xz, whose manifest declares its first tensor `decoded_mib` MiB
    large and whose xz stream does decode to that many zero bytes (about 80 KB per 512 MiB)."""
    from earl_service.bundle.model_io import load_bundle

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "b").write_bytes(data)
        tensors, meta = load_bundle(Path(tmp) / "b").to_tensors("fp16", "planes-xz")
    manifest = json.loads(meta["weights_manifest"])
    cols = manifest[0][2][-1]
    manifest[0][2] = [decoded_mib * MB // (2 * cols), cols]  # float16: 2 bytes a value
    total = sum(np.dtype(d).itemsize * int(np.prod(shape)) for _, d, shape in manifest)
    packer = lzma.LZMACompressor(preset=0)
    chunk = bytes(64 * MB)
    blob = b"".join(packer.compress(chunk[: min(len(chunk), total - at)]) for at in range(0, total, len(chunk)))
    blob += packer.flush()
    tensors = {**tensors, "weights.packed": np.frombuffer(blob, dtype=np.uint8)}
    return _write(tensors, {**meta, "weights_manifest": json.dumps(manifest)})


def _graph(data: bytes, make: Callable[[int, int, int], bytes]) -> bytes:
    """The bundle with its graph replaced by xz(make(entities, relations, edges)), the raw CSR bytes."""
    from earl_service.bundle.format import unpack_graph, unpack_strings

    tensors, meta = _parts(data)
    n, num_rel = len(unpack_strings(tensors["vocab.entities"])), len(unpack_strings(tensors["vocab.relations"]))
    raw = make(n, num_rel, len(unpack_graph(tensors["graph.packed"])))
    tensors["graph.packed"] = np.frombuffer(lzma.compress(raw, preset=1), dtype=np.uint8)  # ~10 MB to pack
    return _write(tensors, meta)


def graph_bomb(data: bytes) -> bytes:
    """Item 3: a graph whose per-entity counts give entity 0 2**27 edges while its header (and arrays) hold E."""
    def make(n: int, num_rel: int, edges: int) -> bytes:
        counts = np.zeros(n, dtype=np.uint32)
        counts[0] = 2**27
        rel, tail = np.zeros(edges, dtype=np.uint8), np.zeros(edges, dtype=np.uint16)
        header = np.array([n, num_rel, edges, 4], dtype=np.uint64)
        return header.tobytes() + counts.tobytes() + rel.tobytes() + tail.tobytes()
    return _graph(data, make)


def duplicate_edges(data: bytes, edges: int = 5_500_000) -> bytes:
    """Item 4: one edge repeated `edges` times (16.5 MB raw: inside the 16 MiB floor of the xz ratio cap)."""
    def make(n: int, num_rel: int, _: int) -> bytes:
        counts = np.zeros(n, dtype=np.uint32)
        counts[0] = edges
        tail = np.ones(edges, dtype=np.uint16)
        header = np.array([n, num_rel, edges, 4], dtype=np.uint64)
        return header.tobytes() + counts.tobytes() + np.zeros(edges, dtype=np.uint8).tobytes() + tail.tobytes()
    return _graph(data, make)


def with_tensor(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[bytes], bytes]:
    def make(data: bytes) -> bytes:
        tensors, meta = _parts(data)
        return _write({**tensors, name: change(tensors[name].copy())}, meta)
    return make


def with_header(change: Callable[[dict], object]) -> Callable[[bytes], bytes]:
    """The bundle with its safetensors header replaced by change(header) (JSON, or bytes as they are); the
    payload and its checksum stay as they were."""
    def make(data: bytes) -> bytes:
        (n,) = struct.unpack("<Q", data[:8])
        header = change(json.loads(data[8 : 8 + n]))
        raw = header if isinstance(header, bytes) else json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + data[8 + n :]
    return make


def with_metadata(**values: str) -> Callable[[bytes], bytes]:
    return with_header(lambda h: {**h, "__metadata__": {**h["__metadata__"], **values}})


def with_config(**values: object) -> Callable[[bytes], bytes]:
    def change(header: dict) -> dict:
        meta = header["__metadata__"]
        return {**header, "__metadata__": {**meta, "config": json.dumps({**json.loads(meta["config"]), **values})}}
    return with_header(change)


def _nan_row(values: np.ndarray) -> np.ndarray:
    values[0] = np.nan
    return values
