"""Decode a bundle's metadata and tensors into numpy values, refusing anything inconsistent (BundleError)."""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..bundle_format import dequantize, unpack_graph, unpack_strings
from ..config import ModelConfig
from ..data import Vocab
from ..errors import BundleError


@dataclass(frozen=True)
class DecodedBundle:
    """Everything a bundle file holds, checked against itself: what the torch and the edge readers rebuild from."""

    config: ModelConfig
    entities: Vocab
    relations: Vocab
    triples: np.ndarray  # (E, 3) int64, the graph the encoder reads
    reserved: np.ndarray  # (N_res,) int64 entity ids
    params: dict[str, np.ndarray]  # float32 (dequantized) trainable tensors by state_dict name
    metrics: dict[str, Any]
    relation_labels: dict[str, str]
    precision: str  # as stored: fp32, fp16 or int8
    coding: str  # how the file stored the weights (bundle_format.CODINGS)
    sha256: str  # of the tensor payload


def decode(meta: dict[str, str], tensors: dict[str, np.ndarray], *, source: str = "bundle") -> DecodedBundle:
    """The parts of a bundle (bundle_format.read_safetensors' metadata and tensors), checked: content present and
    well-formed, vocabularies valid, graph and reserved ids within them, every tensor the config implies present
    with its shape and no other. `source` (the file) prefixes the messages."""
    bundle = _parse(meta, tensors, source)
    n, num_rel = len(bundle.entities), len(bundle.relations)
    triples, reserved = bundle.triples, bundle.reserved
    if triples.size and (triples[:, [0, 2]].max() >= n or triples[:, 1].max() >= num_rel):
        raise BundleError(f"{source}: the graph refers to entities or relations outside the vocabulary")
    if reserved.size and (reserved.max() >= n or reserved.min() < 0):
        raise BundleError(f"{source}: reserved entity ids outside the vocabulary")
    _check_shapes(bundle)
    return bundle


def _parse(meta: dict[str, str], tensors: dict[str, np.ndarray], source: str) -> DecodedBundle:
    try:
        return DecodedBundle(  # in the order load_bundle has always read them: the first fault is the one named
            config=ModelConfig.from_dict(json.loads(meta["config"])),
            metrics=json.loads(meta.get("metrics", "{}")),
            relation_labels=json.loads(meta.get("relation_labels", "{}")),
            entities=_vocab(unpack_strings(tensors["vocab.entities"]), "entity"),
            relations=_vocab(unpack_strings(tensors["vocab.relations"]), "relation"),
            triples=unpack_graph(tensors["graph.packed"]),
            reserved=tensors["buffer.reserved"].astype(np.int64),
            params={name[len("param.") :]: dequantize(tensors, name) for name in tensors
                    if name.startswith("param.") and not name.endswith(".scale")},
            precision=meta.get("precision", "fp32"),
            coding=meta.get("weights_coding", "plain"),
            sha256=meta["payload_sha256"],
        )
    except (KeyError, ValueError, lzma.LZMAError, TypeError, AttributeError) as exc:
        raise BundleError(f"{source} is an EARL bundle with missing or malformed content: {exc}") from exc


def _vocab(names: list[str], kind: str) -> Vocab:
    try:
        return Vocab(names, kind=kind)
    except ValueError as exc:
        raise BundleError(f"bundle {kind} vocabulary is invalid: {exc}") from exc


def _check_shapes(bundle: DecodedBundle) -> None:
    """Every tensor the config implies is present with its shape, and no other."""
    cfg = bundle.config
    if cfg.gnn_layers > len(bundle.params):  # every layer has weights; refuse before listing a huge layer count
        raise BundleError(f"bundle config asks for {cfg.gnn_layers} GNN layers but holds {len(bundle.params)} tensors")
    expected = expected_shapes(cfg, len(bundle.entities), len(bundle.relations), len(bundle.reserved))
    for name, shape in expected.items():
        got = bundle.params.get(name)
        if got is None or got.shape != shape:
            raise BundleError(f"bundle tensor {name!r} has shape {None if got is None else got.shape}, "
                              f"the config implies {shape}")
    extra = set(bundle.params) - set(expected)
    if extra:
        raise BundleError(f"bundle holds tensors its config does not use: {sorted(extra)}")


def expected_shapes(config: ModelConfig, num_entities: int, num_relations: int, num_reserved: int,
                    ) -> dict[str, tuple[int, ...]]:
    """The shape of every trainable tensor of build_model(config, ...), by state_dict name and in its order
    (the `reserved` buffer aside): what a bundle must hold, known without building the module."""
    d, w = config.dim, 2 * config.dim
    if config.model == "rotate":
        return {"entities": (num_entities, w), "relations": (num_relations, d)}
    shapes: dict[str, tuple[int, ...]] = {}
    if config.uses_reserved and num_reserved:
        shapes["reserved_embeddings"] = (num_reserved, w)
    if config.uses_conrel:
        shapes["relation_ends"] = (2 * num_relations, w)
    shapes["relations"] = (num_relations, d)
    if config.uses_conrel:
        shapes.update(_mlp("conrel_mlp", w, w))
    inputs = int(config.uses_conrel) + int(config.uses_knn)
    if inputs:
        shapes.update(_mlp("combine", inputs * w, w))
    for i in range(config.gnn_layers):
        layer = {"out_ent": (w, w), "out_rel": (w, d), "in_ent": (w, w), "in_rel": (w, d), "self_loop": (w, w),
                 "rel_update": (d, d)}
        for name, (rows, cols) in layer.items():
            shapes.update(_linear(f"gnn.{i}.{name}", cols, rows))
    return shapes


def _linear(name: str, width_in: int, width_out: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (width_out, width_in), f"{name}.bias": (width_out,)}


def _mlp(name: str, width_in: int, width: int) -> dict[str, tuple[int, ...]]:
    """model._mlp: Linear(width_in, width), ReLU, Linear(width, width)."""
    return _linear(f"{name}.0", width_in, width) | _linear(f"{name}.2", width, width)
