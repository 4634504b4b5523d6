"""The bundle: one safetensors file with everything needed to rebuild every embedding, checked on load."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earl_service.bundle.codebooks import PQTables, row_weights
from earl_service.bundle.decode import decode, decode_stored
from earl_service.bundle.format import (
    FORMAT,
    FORMAT_VERSION,
    IMPORTED_FORMAT_VERSION,
    BundleLimits,
    encode_weights,
    narrowest_uint,
    pack_graph,
    pack_labels,
    pack_strings,
    read_safetensors,
    write_safetensors,
)
from earl_service.bundle.precision import DEFAULT, Precision, ProductQuantized
from earl_service.config import GRAPH_OPTIONAL, IMPORTED, ModelConfig
from earl_service.data.dataset import load_triples_file
from earl_service.data.labels import Labels
from earl_service.data.vocab import Vocab
from earl_service.errors import BundleError
from earl_service.version import __version__

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
    precision: str = DEFAULT.name  # a Precision's name, as the file's metadata holds it
    relation_labels: dict[str, str] = field(default_factory=dict)
    entity_labels: dict[str, str] = field(default_factory=dict)
    sha256: str = ""
    num_bytes: int = 0
    path: Path | None = None
    coding: str = "plain"  # how the file stored the weights (bundle_format.CODINGS)
    stored: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # DecodedBundle.stored
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def trainable_parameters(self) -> int:
        return int(sum(v.size for v in self.params.values()))

    @property
    def scorer(self):
        from earl_service.model.modules import RotatE

        return RotatE(self.config)

    def _graph(self):
        from earl_service.model.graph import build_graph

        return build_graph(self.triples, len(self.entities), len(self.relations), torch.from_numpy(self.reserved),
                           **self.config.graph_options)

    def model(self) -> torch.nn.Module:
        """The trained module with the bundle's weights (float32, CPU, eval mode); an imported model has none."""
        from earl_service.model.modules import build_model

        if self.config.model in IMPORTED or self.config.reciprocal:
            kind = f"{self.config.model}{' with reciprocal relations' if self.config.reciprocal else ''}"
            raise BundleError(f"an imported {kind} bundle holds tables, not a module trained here")
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
        if "emb" not in self._cache and self.config.model != "earl":  # RotatE, an imported model: its tables
            entities = self.params["entities"] if "entities" in self.params else decode_stored(self.stored)
            self._cache["emb"] = (torch.from_numpy(entities), torch.from_numpy(self.params["relations"]))
        if "emb" not in self._cache:
            ent, rel = self.model()(self._graph())
            self._cache["emb"] = (ent.float().contiguous(), rel.float().contiguous())
        return self._cache["emb"]

    def entity_embeddings(self) -> torch.Tensor:
        """(N, 2*dim) float32: every entity rebuilt from the stored weights and graph."""
        return self._embed()[0]

    def relation_embeddings(self) -> torch.Tensor:
        """(R, dim) float32 relation values (phases are value * pi / embedding_range); an imported model's relation
        table as its scorer lays it out (core/scorers.py)."""
        if self.config.model != "earl":  # a stored table: no need to decode the entities for it
            return torch.from_numpy(self.params["relations"])
        return self._embed()[1]

    def row_weights(self) -> dict[str, np.ndarray]:
        """How much each row of a coded table counts when codebooks are fit (codebooks.row_weights): its entity's
        degree in the bundle's graph, or in the graph without_graph left out; none for a bundle that never had one."""
        return row_weights(self.config.model, self._cache.get("fit_triples", self.triples), len(self.entities))

    def to_tensors(self, precision: str | Precision | None = None, coding: str | None = None, *,
                   pq_tables: PQTables | None = None, pq_orders: dict[str, str] | None = None,
                   ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Tensors and metadata of the bundle file; coding (CODINGS) defaults to the precision's. A precision that
        codes tables (pq) stores `pq_tables` (each in its order of `pq_orders`, contiguous where not given), or
        codebooks faiss trains on the weights here when None (rows drawn by their degree in the bundle's graph,
        where it has one: codebooks.row_weights)."""
        chosen = Precision.parse(precision or self.precision).resolve(self.config.dim)
        if pq_tables is None and isinstance(chosen, ProductQuantized):
            pq_tables = chosen.encode_tables(self.config, self.params, weights=self.row_weights())
        tensors: dict[str, np.ndarray] = {}
        coded = set(pq_tables or ())  # replaced by their codes in with_tables: not int8-encoded only to be dropped
        for name, value in self.params.items():
            if name not in coded:
                tensors.update(chosen.encode(f"param.{name}", value))
        tensors["buffer.reserved"] = self.reserved.astype(narrowest_uint(max(len(self.entities), 1)))
        tensors.update(self._packed())
        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "library_version": __version__,
            "precision": chosen.name,
            "config": json.dumps(self.config.to_dict()),
            "metrics": json.dumps(self.metrics, default=str),
            "trainable_parameters": str(self.trainable_parameters),
            "entities": str(len(self.entities)),
            "relations": str(len(self.relations)),
            "triples": str(len(self.triples)),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tensors, metadata = chosen.with_tables(tensors, metadata, self.config, self.params, pq_tables, pq_orders)
        tensors, metadata = encode_weights(tensors, metadata, coding or chosen.coding)
        if self.config.model in IMPORTED:  # a reader before format 3 would call the model kind unknown
            metadata["format_version"] = str(IMPORTED_FORMAT_VERSION)
        return tensors, metadata

    def fixed_parts(self) -> dict[str, np.ndarray]:
        """The graph, vocabularies and labels as the file stores them (xz-packed, read-only)."""
        return self._packed()

    def with_fixed_parts(self, parts: dict[str, np.ndarray]) -> Bundle:
        """This bundle writing `parts` (another bundle's fixed_parts, of the same graph, names and labels) rather
        than packing its own: a compress search packs them once for all its candidates (3 s at 117k entities)."""
        return replace(self, _cache={**self._cache, "packed": parts})

    def _packed(self) -> dict[str, np.ndarray]:
        """The graph, vocabularies and labels, xz-packed: the same at every precision, so packed once per bundle
        (every export of a compress candidate saves one bundle several times; 0.5 s each on FB15k-237).
        `extend_with` makes a new bundle with an empty cache; the arrays are read-only (np.frombuffer)."""
        if "packed" not in self._cache:
            self._cache["packed"] = {
                "graph.packed": pack_graph(self.triples, len(self.entities), len(self.relations)),
                "vocab.entities": pack_strings(self.entities.names),
                "vocab.relations": pack_strings(self.relations.names),
                **self._label_tensors(),
            }
        return self._cache["packed"]

    def _label_tensors(self) -> dict[str, np.ndarray]:
        """labels.entities / labels.relations: xz-coded, aligned with the vocabularies; absent when none."""
        packed = {"labels.entities": pack_labels(self.entities.names, self.entity_labels),
                  "labels.relations": pack_labels(self.relations.names, self.relation_labels)}
        return {name: blob for name, blob in packed.items() if blob is not None}

    def save(self, path: str | os.PathLike, *, precision: str | Precision | None = None, coding: str | None = None,
             pq_tables: PQTables | None = None, pq_orders: dict[str, str] | None = None) -> Path:
        tensors, metadata = self.to_tensors(precision, coding, pq_tables=pq_tables, pq_orders=pq_orders)
        return write_safetensors(path, tensors, metadata)

    @property
    def has_graph(self) -> bool:
        """False for a bundle written without its training graph (RotatE's only use of it is to tell known
        answers apart, so such a bundle's answers include facts the graph held)."""
        return len(self.triples) > 0

    def without_graph(self) -> Bundle:
        """This bundle with no graph: its bytes go to the weights (a RotatE bundle only; EARL rebuilds every entity
        from the graph). Its pq codebooks are still fit by the graph's degrees (row_weights): the file leaves the
        graph out, not the codebooks' fit."""
        if self.config.model not in GRAPH_OPTIONAL:
            raise BundleError(f"a {self.config.model} bundle needs its graph: its encoder rebuilds each entity from "
                              "its neighbours")
        left_out = self._cache.get("fit_triples", self.triples)  # a reference, counted only if pq codebooks are fit
        return replace(self, triples=np.zeros((0, 3), dtype=np.int64), sha256="", num_bytes=0, path=None,
                       _cache={"fit_triples": left_out})

    def extend(self, triples_path: str | os.PathLike) -> Bundle:
        """A new bundle whose graph also holds the triples of `triples_path`; unseen entities join the
        vocabulary and are embedded by the trained encoders. No parameter changes."""
        new, new_names = load_triples_file(triples_path, self.entities, self.relations, allow_new_entities=True)
        return self.extend_with(new, new_names)

    def extend_with(self, new_triples: np.ndarray, new_names: list[str]) -> Bundle:
        if self.config.model != "earl":
            raise BundleError(f"only EARL bundles can embed new entities; a {self.config.model} bundle has one row "
                              "per entity")
        triples = np.unique(np.concatenate([self.triples, np.asarray(new_triples, dtype=np.int64).reshape(-1, 3)]), axis=0)
        entities = Vocab(self.entities.names + list(new_names))
        return replace(self, entities=entities, triples=triples, sha256="", num_bytes=0, path=None, _cache={})


def load_bundle(path: str | os.PathLike, *, limits: BundleLimits | None = None, keep_codes: bool = False) -> Bundle:
    """Read and verify a bundle: format and version, checksum, then every check of core.decode (vocabularies,
    graph and reserved ids, tensor shapes against the config; sizes within `limits`). keep_codes (a server's
    load): a RotatE entity table stored as int8 or pq (an imported one as pq) stays coded in `stored` (decode's
    keep_codes), its floats
    decoded only if entity_embeddings() is asked for; such a bundle is read, not saved again."""
    meta, tensors, size = read_safetensors(path)
    decoded = decode(meta, tensors, source=str(path), limits=limits, keep_codes=keep_codes)
    return Bundle(**vars(decoded), num_bytes=size, path=Path(path))  # every DecodedBundle field is a Bundle field


def bundle_from_model(
    model: torch.nn.Module, config: ModelConfig, entities: Vocab, relations: Vocab, triples: np.ndarray,
    *, metrics: dict | None = None, labels: Labels | None = None,
) -> Bundle:
    state = model.state_dict()
    reserved = state.pop("reserved", torch.zeros(0, dtype=torch.long)).cpu().numpy().astype(np.int64)
    # Copies, never views of the model's parameters: a caller that loads other weights into the model afterwards
    # (compress validating its quantized exports) must not change the bundle.
    params = {k: v.detach().to("cpu", torch.float32, copy=True).numpy() for k, v in state.items()}
    labels = labels or Labels()
    return Bundle(config, params, reserved, entities, relations, np.asarray(triples, dtype=np.int64), metrics or {},
                  DEFAULT.name, relation_labels=labels.relations, entity_labels=labels.entities)


def export_bundle(run_dir: str | os.PathLike, out_path: str | os.PathLike, *,
                  precision: str | Precision = DEFAULT, coding: str | None = None, graph: bool = True) -> Path:
    """Re-export the bundle of a trained run (RUN_DIR/bundle.safetensors) at another precision (and weight
    coding: plain tensors, or byte planes + xz; the precision's own when None); graph=False leaves the graph out
    (Bundle.without_graph)."""
    source = Path(run_dir) / "bundle.safetensors"
    if not source.exists():
        raise BundleError(f"{run_dir} holds no bundle.safetensors: is it a run directory written by `earl train`?")
    bundle = load_bundle(source)
    return (bundle if graph else bundle.without_graph()).save(out_path, precision=precision, coding=coding)
