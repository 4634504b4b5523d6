"""Bundle bytes before training: exact file sizes from shapes, a fixed-size metrics field."""

from __future__ import annotations

import builtins
import copy
import json
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earl_service.bundle.codebooks import Layout, PQTables, codes_for, manifest_text, zero_tables
from earl_service.bundle.format import PAD_KEY, pack_graph
from earl_service.bundle.model_io import Bundle
from earl_service.bundle.precision import DEFAULT, Precision, ProductQuantized
from earl_service.config import ModelConfig, ModelKind
from earl_service.data.dataset import Dataset
from earl_service.errors import BundleError
from earl_service.model.graph import choose_reserved
from earl_service.model.modules import build_model

# Plain tensors: their bytes follow from shapes alone. planes-xz would be ~15% smaller at fp16 (~5% at int8,
# bench/results/bundle_sizes.md) but its size depends on the trained values, so it cannot be known in advance.
CODING = "plain"
MIN_DIM = 8  # the smallest candidate dim worth training
# Header bytes every compress bundle gives its metrics JSON: the metrics are padded to exactly this, so the
# file size is known before training whatever the metrics turn out to be.
METRICS_ROOM = 2048


def _header_bytes(text: str) -> int:
    """Bytes a metadata string takes in the safetensors header, whose JSON escapes quotes and backslashes.
    json.dumps writes ASCII only, so no other character is escaped or widened."""
    return len(text) + text.count('"') + text.count("\\")


def padded_metrics(metrics: dict[str, Any], spare: int = 0) -> dict[str, Any]:
    """`metrics` plus a run of spaces under PAD_KEY that makes its header field exactly METRICS_ROOM bytes, less
    `spare` that another field takes beyond what the size model wrote (Bundle.to_tensors writes
    json.dumps(metrics, default=str))."""
    room = METRICS_ROOM - spare - _header_bytes(json.dumps({**metrics, PAD_KEY: ""}, default=str))
    if room < 0:
        raise BundleError(f"bundle metrics take {METRICS_ROOM - room} header bytes, more than the {METRICS_ROOM} "
                          "reserved for them")
    return {**metrics, PAD_KEY: " " * room}


def save_exact(bundle: Bundle, path: str | os.PathLike, *, precision: str | Precision, metrics: dict[str, Any],
               expected: int, pq_tables: PQTables | None = None, pq_orders: dict[str, str] | None = None) -> Path:
    """Write `bundle` at `precision` carrying `metrics`; the file must be `expected` bytes, as predicted. A table
    coded in another order than contiguous (`pq_orders`) names it in the pq manifest; the metrics give up the
    header bytes that takes, so the file keeps the size the size model predicts from contiguous tables."""
    spare = (_header_bytes(manifest_text(pq_tables, pq_orders)) - _header_bytes(manifest_text(pq_tables))
             if pq_tables else 0)
    out = replace(bundle, metrics=padded_metrics(metrics, spare)).save(path, precision=precision, coding=CODING,
                                                                       pq_tables=pq_tables, pq_orders=pq_orders)
    size = out.stat().st_size
    if size != expected:
        raise BundleError(f"{out} is {size} bytes, the size model predicted {expected}: the bundle format changed "
                          "under earl_service.bundle.sizes")
    return out


class BundleSizes:
    """Exact bundle file bytes for (model, dim, precision) over one dataset: an untrained bundle written to a
    temporary file. Plain-coded weights and a padded metrics field make the size independent of training."""

    def __init__(self, dataset: Dataset, *, seed: int = 0, base: ModelConfig | None = None,
                 graphless: tuple[ModelKind, ...] = ()) -> None:
        # What train() puts in its bundle: the training entities, every relation, the training graph, the labels;
        # bundles of the `graphless` models leave the graph out (Bundle.without_graph).
        self.entities = dataset.train_entities()
        self.relations = dataset.relations
        self.triples = dataset.train
        self.graphless = graphless
        self.labels = dataset.labels
        self.base = replace(base or ModelConfig(), seed=seed)
        self._bytes: dict[tuple[str, int, str], int] = {}
        self._packed: dict[str, tuple[dict[str, np.ndarray], dict[str, str]]] = {}
        self._fixed: dict[bool, dict[str, np.ndarray]] = {}  # by graphless: the packed graph, names, labels

    def leaving_out_graph(self, models: tuple[ModelKind, ...]) -> BundleSizes:
        """These sizes with `models`' bundles left without the graph too: the packed parts are shared (fixed_parts
        packs only the graph where the other packing has the vocabularies), the sizes asked are not."""
        return self._variant(graphless=tuple(dict.fromkeys((*self.graphless, *models))))

    def with_reserved_ratio(self, ratio: float) -> BundleSizes:
        """These sizes with EARL's reserved share `ratio` (its reserved table and ids grow with it): the packed
        graph, names and labels are shared, the sizes asked are not."""
        return self if ratio == self.base.reserved_ratio else self._variant(base=replace(self.base,
                                                                                          reserved_ratio=ratio))

    def _variant(self, **changes: Any) -> BundleSizes:
        """A copy with `changes` to its attributes that shares the packed fixed parts (graph, names, labels:
        fixed_parts' cache) and nothing that depends on the changes (the sizes, the packed bundles)."""
        variant = copy.copy(self)
        for name, value in changes.items():
            setattr(variant, name, value)
        variant._bytes, variant._packed = {}, {}
        return variant

    def config(self, model: ModelKind, dim: int) -> ModelConfig:
        return replace(self.base, model=model, dim=dim)

    def untrained(self, config: ModelConfig) -> Bundle:
        """A bundle with zero weights of the shapes `config` implies (no weights are initialised)."""
        n = len(self.entities)
        reserved = (choose_reserved(n, config.reserved_ratio, config.seed)
                    if config.model == "earl" and config.uses_reserved else torch.zeros(0, dtype=torch.long))
        with torch.device("meta"):  # shapes without storage
            shapes = build_model(config, n, len(self.relations), reserved).state_dict()
        params = {name: np.zeros(tuple(t.shape), np.float32) for name, t in shapes.items() if name != "reserved"}
        bundle = Bundle(config, params, reserved.numpy().astype(np.int64), self.entities, self.relations,
                        self.triples, padded_metrics({}), relation_labels=self.labels.relations,
                        entity_labels=self.labels.entities)
        return bundle.without_graph() if config.model in self.graphless else bundle

    def bytes(self, model: ModelKind, dim: int, precision: str | Precision) -> int:
        """Bytes of the file a bundle of (model, dim) at `precision` takes (any registered precision; pq with M)."""
        chosen = Precision.parse(precision)
        key = (model, dim, chosen.name)
        if key not in self._bytes:
            self._bytes[key] = len(self._serialise(self.untrained(self.config(model, dim)), chosen))
        return self._bytes[key]

    def _serialise(self, bundle: Bundle, precision: Precision) -> builtins.bytes:  # the method `bytes` shadows it
        """The file write_safetensors would write for `bundle` (checksum zeroed: same length)."""
        from safetensors.numpy import save as st_save

        # Bundle.to_tensors xz-packs the graph and vocabularies at preset 9 (tenths of a second even for a tiny
        # graph), and only the weights and the config change with dim: pack once per model, then swap those in.
        if bundle.config.model not in self._packed:
            parts = self.fixed_parts(bundle.config.model in self.graphless)
            self._packed[bundle.config.model] = bundle.with_fixed_parts(parts).to_tensors(DEFAULT, CODING)
        tensors, metadata = self._packed[bundle.config.model]
        tensors = {name: t for name, t in tensors.items() if not name.startswith("param.")}
        for name, value in bundle.params.items():
            tensors.update(_encoded_zeros(precision, f"param.{name}", value))
        metadata = {**metadata, "precision": precision.name, "config": json.dumps(bundle.config.to_dict()),
                    "trainable_parameters": str(bundle.trainable_parameters), "payload_sha256": "0" * 64}
        if isinstance(precision, ProductQuantized):  # codes and codebooks of the planned shapes: bytes need no values
            tables = zero_tables(self.pq_layouts(bundle, precision))
            tensors, metadata = precision.with_tables(tensors, metadata, bundle.config, bundle.params, tables)
        return st_save(tensors, metadata=metadata)

    def pq_layouts(self, bundle: Bundle, precision: str | Precision) -> dict[str, Layout]:
        chosen = Precision.parse(precision)
        assert isinstance(chosen, ProductQuantized) and chosen.codes, f"{precision}: give pq:M to know the bytes"
        return chosen.plan(bundle.config.model, bundle.config.dim, {n: v.shape for n, v in bundle.params.items()})

    def pq_codes(self, model: ModelKind, dim: int, precision: str | Precision) -> int:
        """How many tables a bundle of (model, dim) at `precision` (pq:M) codes: 0 makes it int8 in all but name."""
        return len(self.pq_layouts(self.untrained(self.config(model, dim)), precision))

    def fixed_bytes(self, model: ModelKind | None = None) -> int:
        """Bytes of the graph, vocabularies and labels, which every candidate (of `model`) carries whatever its
        weights; a graphless model's carry an empty graph."""
        return int(sum(part.nbytes for part in self.fixed_parts(model in self.graphless).values()))

    def fixed_parts(self, graphless: bool) -> dict[str, np.ndarray]:
        """The graph (or, `graphless`, an empty one), vocabularies and labels as every bundle here stores them:
        xz-packed once for all models (2.5 s a packing at WordNet-full's 117k entities, one core)."""
        if graphless not in self._fixed:
            other = self._fixed.get(not graphless)
            triples = self.triples[:0] if graphless else self.triples
            if other is not None:  # the vocabularies and labels are the same packed: pack only the graph
                self._fixed[graphless] = {**other, "graph.packed": pack_graph(triples, len(self.entities),
                                                                              len(self.relations))}
            else:
                bundle = Bundle(self.base, {}, np.zeros(0, np.int64), self.entities, self.relations, triples,
                                relation_labels=self.labels.relations, entity_labels=self.labels.entities)
                self._fixed[graphless] = bundle.fixed_parts()
        return self._fixed[graphless]

    def max_dim(self, model: ModelKind, precision: str | Precision, max_bytes: int) -> int | None:
        """The largest dim whose bundle fits in `max_bytes` (None below MIN_DIM)."""
        return _largest(lambda dim: self.bytes(model, dim, precision) <= max_bytes, step=1)

    def max_pq_dim(self, model: ModelKind, numbers_per_code: int, max_bytes: int) -> int | None:
        """The largest dim whose bundle at `numbers_per_code` floats per code byte (pq:M, M = 2 * dim / that) fits
        in `max_bytes`: dims step so that M is whole; bytes still grow with dim (each table takes the cheaper of
        pq and int8, both growing)."""
        step = numbers_per_code // math.gcd(numbers_per_code, 2)
        return _largest(lambda dim: self.bytes(model, dim, ProductQuantized(codes_for(dim, numbers_per_code) or 0))
                        <= max_bytes, step=step)

    def max_pq_codes_dim(self, model: ModelKind, codes: int, max_bytes: int) -> int | None:
        """The largest dim whose bundle at pq:`codes` fits in `max_bytes` (dims where `codes` divides 2 * dim)."""
        step = codes // math.gcd(codes, 2)
        return _largest(lambda dim: self.bytes(model, dim, ProductQuantized(codes)) <= max_bytes, step=step)


def _encoded_zeros(precision: Precision, name: str, value: np.ndarray) -> dict[str, np.ndarray]:
    """Tensors of the names, dtypes and shapes `precision.encode(name, value)` gives for an all-zero `value`, without
    its arithmetic: every precision encodes a matrix row by row, so one row's encoding gives each tensor's dtype and
    row shape (the values may differ, the bytes not). Encoding zero tables took 6.6 of the 16 s that WordNet-full's
    8 MB search spent finding what fits (one core)."""
    if value.ndim < 2 or len(value) < 2:
        return precision.encode(name, value)
    rows = precision.encode(name, value[:1])
    if any(row.ndim == 0 or len(row) != 1 for row in rows.values()):  # not row by row after all: encode it all
        return precision.encode(name, value)
    return {key: np.zeros((len(value), *row.shape[1:]), row.dtype) for key, row in rows.items()}


def _largest(fits: Callable[[int], bool], *, step: int) -> int | None:
    """The largest multiple of `step` from MIN_DIM up for which `fits` holds (None if none does), `fits` being
    monotone: double until it no longer fits, then bisect."""
    first = -(-MIN_DIM // step)  # in units of step
    if not fits(first * step):
        return None
    good, bad = first, 2 * first
    while fits(bad * step):
        good, bad = bad, 2 * bad
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid * step) else (good, mid)
    return good * step


__all__ = ["CODING", "METRICS_ROOM", "MIN_DIM", "BundleSizes", "padded_metrics", "save_exact"]
