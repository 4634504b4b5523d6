"""The bundle: one safetensors file with everything needed to rebuild every embedding, checked on load."""

from __future__ import annotations

import json
import lzma
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import __version__
from .bundle_format import (
    FORMAT,
    FORMAT_VERSION,
    PRECISIONS,
    default_coding,
    dequantize,
    encode_weights,
    narrowest_uint,
    pack_graph,
    pack_strings,
    quantize,
    read_safetensors,
    unpack_graph,
    unpack_strings,
    write_safetensors,
)
from .config import ModelConfig
from .data import Vocab, load_triples_file
from .errors import BundleError

# ---------------------------------------------------------------- the torch-side bundle


@dataclass
class Bundle:
    """A trained model, its graph and vocabularies; rebuilds embeddings with the trained encoder."""

    config: ModelConfig
    params: dict[str, np.ndarray]  # float32 (dequantized) trainable tensors by state_dict name
    reserved: np.ndarray  # (N_res,) entity ids
    entities: Vocab
    relations: Vocab
    triples: np.ndarray  # (E, 3) int64, the graph the encoder reads
    metrics: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    relation_labels: dict[str, str] = field(default_factory=dict)
    sha256: str = ""
    num_bytes: int = 0
    path: Path | None = None
    coding: str = "plain"  # how the file stored the weights (bundle_format.CODINGS)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def trainable_parameters(self) -> int:
        return int(sum(v.size for v in self.params.values()))

    @property
    def scorer(self):
        from .model import RotatE

        return RotatE(self.config)

    def _graph(self):
        from .graph import build_graph

        return build_graph(self.triples, len(self.entities), len(self.relations), torch.from_numpy(self.reserved),
                           **self.config.graph_options)

    def model(self) -> torch.nn.Module:
        """The trained module with the bundle's weights (float32, CPU, eval mode)."""
        from .model import build_model

        model = build_model(self.config, len(self.entities), len(self.relations), torch.from_numpy(self.reserved))
        state = {k: torch.from_numpy(v) for k, v in self.params.items()}
        state["reserved"] = torch.from_numpy(self.reserved.astype(np.int64))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if m != "reserved"]
        if missing or unexpected:
            raise BundleError(f"bundle tensors do not match its config: missing {missing}, unexpected {unexpected}")
        return model.eval()

    @torch.no_grad()
    def _embed(self) -> tuple[torch.Tensor, torch.Tensor]:
        if "emb" not in self._cache and self.config.model == "rotate":
            self._cache["emb"] = (torch.from_numpy(self.params["entities"]), torch.from_numpy(self.params["relations"]))
        if "emb" not in self._cache:
            ent, rel = self.model()(self._graph())
            self._cache["emb"] = (ent.float().contiguous(), rel.float().contiguous())
        return self._cache["emb"]

    def entity_embeddings(self) -> torch.Tensor:
        """(N, 2*dim) float32: every entity rebuilt from the stored weights and graph."""
        return self._embed()[0]

    def relation_embeddings(self) -> torch.Tensor:
        """(R, dim) float32 relation values (phases are value * pi / embedding_range)."""
        return self._embed()[1]

    def to_tensors(self, precision: str | None = None, coding: str | None = None,
                   ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Tensors and metadata of the bundle file; coding (CODINGS) defaults to default_coding(precision)."""
        precision = precision or self.precision
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
        tensors: dict[str, np.ndarray] = {}
        for name, value in self.params.items():
            tensors.update(quantize(f"param.{name}", value, precision))
        tensors["buffer.reserved"] = self.reserved.astype(narrowest_uint(max(len(self.entities), 1)))
        tensors["graph.packed"] = pack_graph(self.triples, len(self.entities), len(self.relations))
        tensors["vocab.entities"] = pack_strings(self.entities.names)
        tensors["vocab.relations"] = pack_strings(self.relations.names)
        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "library_version": __version__,
            "precision": precision,
            "config": json.dumps(self.config.to_dict()),
            "metrics": json.dumps(self.metrics, default=str),
            "relation_labels": json.dumps(self.relation_labels),
            "trainable_parameters": str(self.trainable_parameters),
            "entities": str(len(self.entities)),
            "relations": str(len(self.relations)),
            "triples": str(len(self.triples)),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        return encode_weights(tensors, metadata, coding or default_coding(precision))

    def save(self, path: str | os.PathLike, *, precision: str | None = None, coding: str | None = None) -> Path:
        tensors, metadata = self.to_tensors(precision, coding)
        return write_safetensors(path, tensors, metadata)

    def extend(self, triples_path: str | os.PathLike) -> Bundle:
        """A new bundle whose graph also holds the triples of `triples_path`; unseen entities join the
        vocabulary and are embedded by the trained encoders. No parameter changes."""
        new, new_names = load_triples_file(triples_path, self.entities, self.relations, allow_new_entities=True)
        return self.extend_with(new, new_names)

    def extend_with(self, new_triples: np.ndarray, new_names: list[str]) -> Bundle:
        if self.config.model != "earl":
            raise BundleError("only EARL bundles can embed new entities; a RotatE bundle has one row per entity")
        triples = np.unique(np.concatenate([self.triples, np.asarray(new_triples, dtype=np.int64).reshape(-1, 3)]), axis=0)
        entities = Vocab(self.entities.names + list(new_names))
        return replace(self, entities=entities, triples=triples, sha256="", num_bytes=0, path=None, _cache={})


def _vocab(names: list[str], kind: str) -> Vocab:
    try:
        return Vocab(names, kind=kind)
    except ValueError as exc:
        raise BundleError(f"bundle {kind} vocabulary is invalid: {exc}") from exc


def load_bundle(path: str | os.PathLike) -> Bundle:
    """Read and verify a bundle: format and version, checksum, tensor shapes against the config."""
    meta, tensors, size = read_safetensors(path)
    try:
        config = ModelConfig.from_dict(json.loads(meta["config"]))
        metrics = json.loads(meta.get("metrics", "{}"))
        labels = json.loads(meta.get("relation_labels", "{}"))
        entities = _vocab(unpack_strings(tensors["vocab.entities"]), "entity")
        relations = _vocab(unpack_strings(tensors["vocab.relations"]), "relation")
        triples = unpack_graph(tensors["graph.packed"])
        reserved = tensors["buffer.reserved"].astype(np.int64)
        params = {name[len("param.") :]: dequantize(tensors, name) for name in tensors
                  if name.startswith("param.") and not name.endswith(".scale")}
    except (KeyError, ValueError, lzma.LZMAError, TypeError) as exc:
        raise BundleError(f"{path} is an EARL bundle with missing or malformed content: {exc}") from exc
    n, num_rel = len(entities), len(relations)
    if triples.size and (triples[:, [0, 2]].max() >= n or triples[:, 1].max() >= num_rel):
        raise BundleError(f"{path}: the graph refers to entities or relations outside the vocabulary")
    if reserved.size and (reserved.max() >= n or reserved.min() < 0):
        raise BundleError(f"{path}: reserved entity ids outside the vocabulary")
    bundle = Bundle(config, params, reserved, entities, relations, triples, metrics, meta.get("precision", "fp32"),
                    labels, meta["payload_sha256"], size, Path(path), meta.get("weights_coding", "plain"))
    _check_shapes(bundle)
    return bundle


def _check_shapes(bundle: Bundle) -> None:
    """Every tensor the config implies is present with its shape (builds the module; no graph needed)."""
    from .model import build_model

    cfg = bundle.config
    if cfg.gnn_layers > len(bundle.params):  # every layer has weights; refuse before building a huge module list
        raise BundleError(f"bundle config asks for {cfg.gnn_layers} GNN layers but holds {len(bundle.params)} tensors")
    # On the meta device: shapes without storage, so a config claiming dim=10**6 costs nothing to check.
    with torch.device("meta"):
        expected = build_model(cfg, len(bundle.entities), len(bundle.relations),
                               torch.from_numpy(bundle.reserved)).state_dict()
    expected.pop("reserved", None)
    for name, tensor in expected.items():
        got = bundle.params.get(name)
        if got is None or tuple(got.shape) != tuple(tensor.shape):
            shape = None if got is None else tuple(got.shape)
            raise BundleError(f"bundle tensor {name!r} has shape {shape}, the config implies {tuple(tensor.shape)}")
    extra = set(bundle.params) - set(expected)
    if extra:
        raise BundleError(f"bundle holds tensors its config does not use: {sorted(extra)}")


def bundle_from_model(
    model: torch.nn.Module, config: ModelConfig, entities: Vocab, relations: Vocab, triples: np.ndarray,
    *, metrics: dict | None = None, relation_labels: dict[str, str] | None = None,
) -> Bundle:
    state = model.state_dict()
    reserved = state.pop("reserved", torch.zeros(0, dtype=torch.long)).cpu().numpy().astype(np.int64)
    params = {k: v.detach().float().cpu().numpy() for k, v in state.items()}
    return Bundle(config, params, reserved, entities, relations, np.asarray(triples, dtype=np.int64), metrics or {},
                  "fp32", relation_labels or {})


def export_bundle(run_dir: str | os.PathLike, out_path: str | os.PathLike, *, precision: str = "fp32",
                  coding: str | None = None) -> Path:
    """Re-export the bundle of a trained run (RUN_DIR/bundle.safetensors) at another precision (and weight
    coding: plain tensors, or byte planes + xz; default_coding(precision) when None)."""
    source = Path(run_dir) / "bundle.safetensors"
    if not source.exists():
        raise BundleError(f"{run_dir} holds no bundle.safetensors: is it a run directory written by `earl train`?")
    return load_bundle(source).save(out_path, precision=precision, coding=coding)
