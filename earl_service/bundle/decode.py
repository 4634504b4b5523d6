"""Decode a bundle's metadata and tensors into numpy values, refusing anything inconsistent (BundleError)."""

from __future__ import annotations

import dataclasses
import lzma
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from earl_service.bundle.codebooks import Layout, declared_shapes, decode_table, decode_tables, read_layouts
from earl_service.bundle.format import (
    CODINGS,
    BundleLimits,
    parse_json,
    unpack_graph,
    unpack_labels,
    unpack_strings,
    unpack_weights,
    weights_manifest,
)
from earl_service.bundle.precision import DEFAULT, Precision, ProductQuantized
from earl_service.config import IMPORTED, ModelConfig
from earl_service.core import scorers
from earl_service.data.vocab import Vocab
from earl_service.errors import BundleError

F32_MAX = float(np.finfo(np.float32).max)
Manifest = list[tuple[str, np.dtype, tuple[int, ...]]]  # bundle_format.weights_manifest: (name, dtype, shape)


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
    relation_labels: dict[str, str]  # readable labels by id: only ids with one
    entity_labels: dict[str, str]
    precision: str  # as stored: a Precision's name (fp32, fp16, int8, pq:M)
    coding: str  # how the file stored the weights (bundle_format.CODINGS)
    sha256: str  # of the tensor payload
    # The entity table of a RotatE bundle as the file stores it, for serving from its codes (serve/tables.py): pq's
    # {"codes", "codebooks"}, int8's {"values", "scale"}; empty for a float table or another model.
    stored: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def decode(meta: dict[str, str], tensors: dict[str, np.ndarray], *, source: str = "bundle",
           limits: BundleLimits | None = None, keep_codes: bool = False) -> DecodedBundle:
    """The parts of a bundle (bundle_format.read_safetensors' metadata and tensors), checked: content present and
    well-formed, vocabularies valid, graph and reserved ids within them, every tensor the config implies present
    with its shape and no other, then every weight finite (and RotatE's scores finite in float32).

    Sizes come before contents: every declared weight shape is held against the config before any coded weight is
    decoded, so what a small file can make this function allocate is bounded by what its config implies; `limits`
    bounds the vocabularies and the graph while they decompress.

    keep_codes: a RotatE entity table stored as int8 rows or pq codes (an imported model's as pq codes) is left
    coded (in `stored` only, params without "entities"; decode_stored rebuilds the floats): a server scans the
    codes, and a 1M x 128 table takes 512 MB as floats. Its values are checked on the codes (stored_extent)."""
    bundle = _parse(meta, tensors, source, limits)
    n, num_rel = len(bundle.entities), len(bundle.relations)
    triples, reserved = bundle.triples, bundle.reserved
    if triples.size and (triples[:, [0, 2]].max() >= n or triples[:, 1].max() >= num_rel):
        raise BundleError(f"{source}: the graph refers to entities or relations outside the vocabulary")
    if reserved.size and (reserved.max() >= n or reserved.min() < 0):
        raise BundleError(f"{source}: reserved entity ids outside the vocabulary")
    bundle = _with_labels(bundle, tensors, source, limits)
    manifest = _manifest(meta, tensors, bundle.coding, source)
    precision = Precision.parse(bundle.precision)
    layouts = read_layouts(meta, tensors, bundle.precision, source, coded=precision.codes_tables)
    stored = _stored_weights(tensors, manifest, source)
    if set(stored) & set(declared_shapes(layouts)):
        raise BundleError(f"{source} holds a weight both product-quantized and not")
    _check_shapes(bundle, stored | declared_shapes(layouts), coded=manifest is not None or bool(layouts))
    if isinstance(precision, ProductQuantized):
        cfg = bundle.config
        precision.check_plan(layouts, cfg.model, cfg.dim, expected_shapes(cfg, n, num_rel, len(reserved)), source)
    tensors = _unpacked(tensors, manifest)
    coded = _stored_entities(bundle.config, tensors, layouts)
    lazy = keep_codes and bool(coded)
    params = (_weights(tensors, precision, skip={"param.entities"} if lazy else set())
              | decode_tables(tensors, {name: lay for name, lay in layouts.items() if not (lazy and name == "entities")}))
    _check_values(bundle.config, params, source, entities=stored_extent(coded, source) if lazy else None)
    return dataclasses.replace(bundle, params=params, stored=coded)


def _parse(meta: dict[str, str], tensors: dict[str, np.ndarray], source: str,
           limits: BundleLimits | None) -> DecodedBundle:
    """Every part but the weights (params left empty): those are decoded once their shapes are known to fit."""
    try:
        bundle = DecodedBundle(  # in the order load_bundle has always read them: the first fault is the one named
            config=_config(meta["config"]),
            # Metrics are informational: a NaN a training run wrote reads as null rather than refusing the model.
            metrics=parse_json(meta.get("metrics", "{}"), "metrics", nonfinite_as_null=True),
            # Bundles before labels.relations kept the relation labels in their metadata.
            relation_labels=parse_json(meta.get("relation_labels", "{}"), "relation_labels"),
            entity_labels={},
            entities=_vocab(unpack_strings(tensors["vocab.entities"], limits), "entity"),
            relations=_vocab(unpack_strings(tensors["vocab.relations"], limits), "relation"),
            triples=unpack_graph(tensors["graph.packed"], limits),
            reserved=tensors["buffer.reserved"].astype(np.int64),
            params={},
            precision=_precision(meta.get("precision", DEFAULT.name)),
            coding=meta.get("weights_coding", "plain"),
            sha256=meta["payload_sha256"],
        )
        return bundle
    except (KeyError, ValueError, lzma.LZMAError, TypeError, AttributeError) as exc:
        raise BundleError(f"{source} is an EARL bundle with missing or malformed content: {exc}") from exc


def _with_labels(bundle: DecodedBundle, tensors: dict[str, np.ndarray], source: str,
                 limits: BundleLimits | None) -> DecodedBundle:
    """The bundle with its labels tensors decoded (after the vocabularies are known to fit the graph)."""
    try:
        entity_labels = _labels(tensors, "entities", bundle.entities, limits)
        relation_labels = _labels(tensors, "relations", bundle.relations, limits)
    except (ValueError, lzma.LZMAError) as exc:
        raise BundleError(f"{source} is an EARL bundle with malformed labels: {exc}") from exc
    return dataclasses.replace(bundle, entity_labels=entity_labels,
                               relation_labels=relation_labels or bundle.relation_labels)


def _labels(tensors: dict[str, np.ndarray], kind: str, vocab: Vocab, limits: BundleLimits | None) -> dict[str, str]:
    """The labels.<kind> tensor as {name: label} for the names that have one ({} when the bundle holds none)."""
    blob = tensors.get(f"labels.{kind}")
    if blob is None:
        return {}
    labels = unpack_labels(blob, len(vocab), f"{vocab.kind} labels", limits)
    return {name: label for name, label in zip(vocab.names, labels, strict=True) if label}


def _config(text: str) -> ModelConfig:
    """The bundle's ModelConfig; ValueError unless every field has its type (finite numbers) and the RotatE phase
    scale pi / ((gamma + epsilon) / dim) is a finite float32, as the scorers compute it."""
    values = parse_json(text, "config")
    for f in dataclasses.fields(ModelConfig):
        if f.name in values and not _fits(values[f.name], type(f.default)):
            raise ValueError(f"config {f.name} must be a finite {type(f.default).__name__}, not {values[f.name]!r}")
    config = ModelConfig.from_dict(values)
    # gamma > 0, yet (gamma + epsilon) / dim may underflow to 0 (no scale at all) or overflow to infinity.
    scale = config.phase_scale if config.embedding_range > 0 else math.inf
    if not (math.isfinite(config.embedding_range) and scale < F32_MAX):
        raise ValueError(f"config gamma {config.gamma}, epsilon {config.epsilon} and dim {config.dim} give a RotatE "
                         "phase scale that float32 cannot hold")
    return config


def _fits(value: Any, kind: type) -> bool:
    if kind is bool or isinstance(value, bool):
        return isinstance(value, kind)
    if kind is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, kind)


def _precision(value: str) -> str:
    """A registered precision as a bundle writes it: pq:M with its M (checked against the config with the tables'
    layout), never a bare pq, whose M is chosen when the bundle is written."""
    try:
        precision = Precision.parse(value)
    except ValueError as exc:
        raise ValueError(f"precision must be one of the registered ones: {exc}") from exc
    if isinstance(precision, ProductQuantized) and not precision.codes:
        raise ValueError(f"precision must be one of the registered ones with its parameter, not {value!r}: a bundle "
                         "stores pq:M")
    return value


def _vocab(names: list[str], kind: str) -> Vocab:
    try:
        return Vocab(names, kind=kind)
    except ValueError as exc:
        raise BundleError(f"bundle {kind} vocabulary is invalid: {exc}") from exc


def _manifest(meta: dict[str, str], tensors: dict[str, np.ndarray], coding: str, source: str) -> Manifest | None:
    """The coded weights' manifest, parsed once (None when the weights are plain tensors)."""
    if coding not in CODINGS:
        raise BundleError(f"{source} uses weight coding {coding!r}, unknown to this earl_service")
    if coding == "plain":
        return None
    if "weights.packed" not in tensors or "weights_manifest" not in meta:
        raise BundleError(f"{source} says its weights are {coding}-coded but holds no coded weights")
    return weights_manifest(meta["weights_manifest"])


def _stored_weights(tensors: dict[str, np.ndarray], manifest: Manifest | None, source: str,
                    ) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """dtype and shape of every `param.*` tensor as the file declares it (coded ones from the manifest), unread."""
    stored = {name: (t.dtype, t.shape) for name, t in tensors.items() if name.startswith("param.")}
    if manifest is None:
        return stored
    coded = {name: (dtype, shape) for name, dtype, shape in manifest}
    if set(coded) & set(stored):
        raise BundleError(f"{source} holds weights both coded and plain")
    return stored | coded


def _check_shapes(bundle: DecodedBundle, stored: dict[str, tuple[np.dtype, tuple[int, ...]]], *,
                  coded: bool) -> None:
    """Every tensor the config implies is stored with its shape, and no other; int8 matrices with their scales."""
    cfg = bundle.config
    shapes = {name[len("param.") :]: shape for name, (_, shape) in stored.items() if not name.endswith(".scale")}
    if cfg.gnn_layers > len(shapes):  # every layer has weights; refuse before listing a huge layer count
        raise BundleError(f"bundle config asks for {cfg.gnn_layers} GNN layers but holds {len(shapes)} tensors")
    expected = expected_shapes(cfg, len(bundle.entities), len(bundle.relations), len(bundle.reserved))
    where = " in its coded weights" if coded else ""
    for name, shape in expected.items():
        if shapes.get(name) != shape:
            raise BundleError(f"bundle tensor {name!r} has shape {shapes.get(name)}{where}, the config implies {shape}")
    extra = set(shapes) - set(expected)
    if extra:
        raise BundleError(f"bundle holds tensors its config does not use: {sorted(extra)}")
    for name, (dtype, shape) in stored.items():
        if not _stored_as_quantize_writes(name, dtype, shape, stored):
            raise BundleError(f"bundle tensor {name!r} has missing or malformed content: {dtype} {shape}, "
                              f"{'with' if name + '.scale' in stored else 'without'} a scale")


def _stored_as_quantize_writes(name: str, dtype: np.dtype, shape: tuple[int, ...],
                               stored: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> bool:
    """float32 or float16; or an int8 matrix with a float32 scale per row (bundle_format.quantize)."""
    if name.endswith(".scale"):
        base = stored.get(name.removesuffix(".scale"))
        return base is not None and base[0] == np.int8 and dtype == np.float32 and shape == base[1][:1]
    if dtype == np.int8:
        return len(shape) == 2 and name + ".scale" in stored
    return dtype in (np.float32, np.float16) and name + ".scale" not in stored


def _unpacked(tensors: dict[str, np.ndarray], manifest: Manifest | None) -> dict[str, np.ndarray]:
    """The tensors with coded weights unpacked to the `param.*` tensors they stand for (shapes already checked)."""
    if manifest is None:
        return tensors
    decoded = unpack_weights(tensors["weights.packed"], manifest)
    return {name: t for name, t in tensors.items() if name != "weights.packed"} | decoded


def coded_entities(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The entity table among a file's (unpacked) tensors as stored when it is coded: pq {"codes", "codebooks"} or
    int8 {"values", "scale"}, the file's own arrays; empty for a float table."""
    if "pq.entities.codes" in tensors:
        return {"codes": tensors["pq.entities.codes"], "codebooks": tensors["pq.entities.codebooks"]}
    if tensors["param.entities"].dtype == np.int8:
        return {"values": tensors["param.entities"], "scale": tensors["param.entities.scale"]}
    return {}


def _stored_entities(config: ModelConfig, tensors: dict[str, np.ndarray], layouts: dict[str, Layout]) -> dict:
    """A RotatE entity table as stored when it is coded, an imported model's when it is pq codes (its server scans
    them by its scorer's metric, serve/metric.MetricCodes; its int8 rows are decoded, for the float index of that
    metric), copied out of the file's buffer (DecodedBundle.stored); pq codes in pairs order with their "columns"."""
    coded = coded_entities(tensors) if config.model == "rotate" or config.model in IMPORTED else {}
    if config.model in IMPORTED and "codes" not in coded:
        return {}
    columns = layouts["entities"].columns if "codes" in coded and "entities" in layouts else None
    return {name: value.copy() for name, value in coded.items()} | ({} if columns is None else {"columns": columns})


def _weights(tensors: dict[str, np.ndarray], precision: Precision, skip: set[str]) -> dict[str, np.ndarray]:
    """The float32 trainable tensors by state_dict name (coded weights already unpacked), but those in `skip`."""
    return {name[len("param.") :]: precision.decode(tensors, name) for name in tensors
            if name.startswith("param.") and not name.endswith(".scale") and name not in skip}


class StoredRows:
    """A stored table read like a float32 (N, w) array, rows decoded only when asked for: pq codes ({"codes",
    "codebooks"}, "columns" if paired), int8 rows and scales ({"values", "scale"}), or a float16 / float32 array. What
    core.scorers.filtered_ranks scores block by block, so that a coded table is never decoded whole."""

    def __init__(self, stored: dict[str, np.ndarray] | np.ndarray) -> None:
        self.stored = stored

    def __len__(self) -> int:
        return len(self.stored["codes"] if "codes" in self.stored else self.stored["values"]) \
            if isinstance(self.stored, dict) else len(self.stored)

    def __getitem__(self, rows: slice | np.ndarray) -> np.ndarray:
        stored = self.stored
        if not isinstance(stored, dict):
            return np.asarray(stored[rows], dtype=np.float32)
        if "codes" in stored:
            return decode_table(stored["codes"][rows], stored["codebooks"], stored.get("columns"))
        return stored["values"][rows].astype(np.float32) * stored["scale"][rows, None]


def decode_stored(stored: dict[str, np.ndarray]) -> np.ndarray:
    """(N, 2d) float32: the entity table `stored` codes (DecodedBundle.stored), as decode would have decoded it."""
    if "codes" in stored:
        return decode_table(stored["codes"], stored["codebooks"], stored.get("columns"))
    return stored["values"].astype(np.float32) * stored["scale"][:, None]


def stored_extent(stored: dict[str, np.ndarray], source: str, block: int = 65_536) -> np.ndarray:
    """A (1, 2d) stand-in for the table `stored` codes, every entry its largest magnitude, for _check_values; the
    table's values are checked finite here without decoding it: pq's are the codebook entries its codes use,
    int8's each row's values times its scale."""
    if "codes" in stored:
        codes, books = stored["codes"], stored["codebooks"]  # (N, M), (M, 256, s)
        used = np.zeros(books.shape[:2], dtype=bool)
        for m in range(books.shape[0]):
            used[m, np.flatnonzero(np.bincount(codes[:, m], minlength=books.shape[1]))] = True
        values = books[used].astype(np.float64)
        width = books.shape[0] * books.shape[2]
    else:
        scale, rows = stored["scale"].astype(np.float64), stored["values"]
        peaks = np.concatenate([np.abs(rows[i : i + block].astype(np.int16)).max(1, initial=0)
                                for i in range(0, len(rows), block)] or [np.zeros(0, np.int16)])
        values, width = scale * peaks, rows.shape[1]
    if not np.isfinite(values).all():
        raise BundleError(f"bundle tensor 'entities' is not finite: the rebuilt embeddings hold NaN or infinite "
                          f"values ({source})")
    return np.full((1, width), np.abs(values).max(initial=0.0))


def _check_values(config: ModelConfig, params: dict[str, np.ndarray], source: str, *,
                  entities: np.ndarray | None = None) -> None:
    """Every weight finite; RotatE's and an imported model's, which are its embeddings, small enough that its scores
    stay finite in float32 (`entities`: the entity table's stand-in when it is left coded, stored_extent)."""
    for name, value in params.items():
        if not math.isfinite(scorers.largest_magnitude(value)):
            raise BundleError(f"bundle tensor {name!r} is not finite: the rebuilt embeddings hold NaN or infinite "
                              "values")
    if config.model != "earl":  # finite, as just checked: only their range is left to check
        _check_score_range(config, params["entities"] if entities is None else entities, params["relations"], source)


def check_embeddings(config: ModelConfig, entities: np.ndarray, relations: np.ndarray, *,
                     source: str = "bundle") -> None:
    """BundleError unless every score of these embeddings is finite in float32: entities (N, 2d), relations (R, d)
    values (an imported model's as its scorer lays them out) finite, and within _check_score_range's bounds."""
    if not (np.isfinite(entities).all() and np.isfinite(relations).all()):
        raise BundleError(f"{source}: the rebuilt embeddings hold NaN or infinite values")
    _check_score_range(config, entities, relations, source)


def _check_score_range(config: ModelConfig, entities: np.ndarray, relations: np.ndarray, source: str) -> None:
    """BundleError unless these finite embeddings keep every float32 score finite. A rotated query's reals are at most
    sqrt(2) * max |x|, so each real of e - q is under 3 * max |x|, and a row's sum of squares (what an L2 index adds
    up over all 2d reals) under 9 * max|x|^2 * 2d: that must stay below float32's max. Relation values times the
    phase scale must too. An imported scorer bounds its own numbers (core.scorers.Scorer.largest)."""
    fits, bound = scorers.fits_float32(config.scorer(), entities, relations)
    if config.model in IMPORTED:
        if not fits:
            raise BundleError(f"{source}: the embeddings' magnitudes let {config.model} scores reach {bound:.3g}, "
                              "past float32's range")
        return
    if not fits:
        limit = math.sqrt(F32_MAX / (9 * max(entities.shape[-1], 1)))  # where scorers.RotatE.largest reaches F32_MAX
        raise BundleError(f"{source}: the entity embeddings reach {scorers.largest_magnitude(entities):.3g}; scores "
                          f"stay finite in float32 only up to {limit:.3g}")
    phase = scorers.largest_magnitude(relations) * config.phase_scale
    if phase >= F32_MAX:
        raise BundleError(f"{source}: the relation embeddings give phases up to {phase:.3g}, past float32's range")


def expected_shapes(config: ModelConfig, num_entities: int, num_relations: int, num_reserved: int,
                    ) -> dict[str, tuple[int, ...]]:
    """The shape of every trainable tensor of build_model(config, ...), by state_dict name and in its order
    (the `reserved` buffer aside): what a bundle must hold, known without building the module."""
    d, w = config.dim, 2 * config.dim
    if config.model == "rotate" or config.model in IMPORTED:
        scorer = config.scorer()
        return {"entities": (num_entities, w),
                "relations": (scorer.relation_rows(num_relations), scorer.relation_width(d))}
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
