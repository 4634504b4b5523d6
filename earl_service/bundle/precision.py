"""Precisions: how a bundle stores its weights. One class per kind owns its name, parsing, bytes, encode and decode.

`Precision.parse("pq:16")` turns a spelling into one; `str(p)` is the bundle's `precision` metadata value. A new
kind (say int4) is one class with `@register` and its tests: the command line, the API, the console and the byte
budget list and use what is registered. Numpy only (the device reader decodes with it); faiss, which trains pq
codebooks, is imported only when a codebook is trained (bundle/codebooks.encode_table).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from earl_service.bundle import codebooks
from earl_service.bundle.codebooks import Layout, PQTables
from earl_service.config import ModelConfig
from earl_service.errors import BundleError

_REGISTRY: dict[str, type[Precision]] = {}
# The models whose pq tables may be coded in pairs order (codebooks.ORDERS): RotatE's entity table, served from its
# codes (serve/tables.PQTable), and EARL's tables, decoded whole. An imported model's entity codes are scanned by its
# scorer's metric in stored order (serve/metric.py), so its tables stay contiguous.
PAIRED_MODELS = ("rotate", "earl")
BLOCK_ROWS = 65_536  # rows int8 encodes at a time  # family name -> class, in registration order


def register(cls: type[Precision]) -> type[Precision]:
    """Make `cls` a known precision (a class decorator); its `family` must be new."""
    if cls.family in _REGISTRY and _REGISTRY[cls.family] is not cls:
        raise ValueError(f"precision {cls.family!r} is already registered ({_REGISTRY[cls.family].__name__})")
    _REGISTRY[cls.family] = cls
    return cls


def unregister(family: str) -> None:
    """Forget a registered precision (tests that register a throwaway one)."""
    _REGISTRY.pop(family, None)


def registered() -> tuple[type[Precision], ...]:
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    """Every registered family name ('fp32', ..., 'pq'): what `earl compress` searches by default."""
    return tuple(_REGISTRY)


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def choices() -> str:
    """The registered spellings for a message: "'fp32', 'fp16' or 'int8', or pq[:M] (...)"."""
    plain = [repr(cls.family) for cls in _REGISTRY.values() if cls.syntax == cls.family]
    families = [f"{cls.syntax} ({cls.summary})" for cls in _REGISTRY.values() if cls.syntax != cls.family]
    return ", or ".join(part for part in (_either(plain) if plain else "", _either(families) if families else "")
                        if part)


def describe() -> str:
    """Help text listing every registered precision with what it stores (the CLI's --precision help)."""
    return _either([f"{cls.syntax} ({cls.summary})" for cls in _REGISTRY.values()])


def catalogue() -> list[dict[str, Any]]:
    """The registered precisions as the API lists them (GET /precisions)."""
    return [{"name": cls.family, "syntax": cls.syntax, "summary": cls.summary, "codes_tables": cls.codes_tables}
            for cls in _REGISTRY.values()]


class Precision(ABC):
    """How a bundle stores a float32 weight: one instance per spelling ('int8', 'pq:16'); equal when spelled alike."""

    family: ClassVar[str]  # the registry key and the spelling's head: 'fp32', 'pq'
    syntax: ClassVar[str]  # how it is written in help text: 'fp32', 'pq[:M]'
    summary: ClassVar[str]  # what it stores, in a few words
    coding: ClassVar[str] = "planes-xz"  # the weight coding a bundle gets by default (format.CODINGS)
    codes_tables: ClassVar[bool] = False  # some tables are stored as codes and codebooks (pq), not per weight

    @staticmethod
    def parse(value: str | Precision) -> Precision:
        """The precision `value` spells (a Precision is returned as is); ValueError naming the known ones."""
        if isinstance(value, Precision):
            return value
        text = str(value)
        for cls in _REGISTRY.values():
            found = cls.from_text(text)
            if found is not None:
                return found
        raise ValueError(f"unknown precision {text[:40]!r}: choose {choices()}")

    @classmethod
    def from_text(cls, text: str) -> Precision | None:
        """This kind's precision `text` spells, None when it spells another kind (ValueError if malformed)."""
        return cls() if text == cls.family else None

    @property
    def name(self) -> str:
        """The spelling, as the bundle's `precision` metadata holds it."""
        return self.family

    def __str__(self) -> str:
        return self.name

    @abstractmethod
    def row_bytes(self, width: int) -> int:
        """Bytes one row of a (rows, width) matrix takes in the file (what the byte budget counts)."""

    @abstractmethod
    def encode(self, name: str, value: np.ndarray) -> dict[str, np.ndarray]:
        """The tensors that store weight `name` (any shape, float32): `name` itself, and any side tensor."""

    def decode(self, tensors: dict[str, np.ndarray], name: str) -> np.ndarray:
        """Weight `name` as float32 from the stored tensors. Told by the stored dtype, so any built-in precision's
        weights read back whatever the bundle's metadata says (bundles have always been read so)."""
        value = tensors[name]
        if value.dtype == np.int8:
            return value.astype(np.float32) * tensors[name + ".scale"][:, None]
        return value.astype(np.float32, copy=False)  # read_safetensors' own array: no second table

    def resolve(self, dim: int) -> Precision:
        """The precision a bundle of this dim is written at (pq picks its M); ValueError if it cannot be."""
        return self

    def with_tables(self, tensors: dict[str, np.ndarray], metadata: dict[str, str], config: ModelConfig,
                    params: dict[str, np.ndarray], tables: PQTables | None = None,
                    orders: dict[str, str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The bundle's tensors and metadata with the tables this precision codes (none but for pq)."""
        return tensors, metadata


@dataclass(frozen=True)
class _Float(Precision):
    dtype: ClassVar[type[np.floating]]

    def row_bytes(self, width: int) -> int:
        return width * np.dtype(self.dtype).itemsize

    def encode(self, name: str, value: np.ndarray) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(value, dtype=np.float32).astype(self.dtype, copy=False)}  # fp32: as is


@register
@dataclass(frozen=True)
class Fp32(_Float):
    family = "fp32"
    syntax = "fp32"
    summary = "4 bytes a number, as trained"
    coding = "plain"  # any safetensors tool reads plain tensors, nothing to decode; fp32 is not the small download
    dtype = np.float32


@register
@dataclass(frozen=True)
class Fp16(_Float):
    family = "fp16"
    syntax = "fp16"
    summary = "2 bytes a number"
    dtype = np.float16


@register
@dataclass(frozen=True)
class Int8(Precision):
    """One byte a number with a float32 scale per row (max |x| / 127) for matrices; vectors as fp16."""

    family = "int8"
    syntax = "int8"
    summary = "1 byte a number, a scale per row"

    def row_bytes(self, width: int) -> int:
        return width + 4

    def encode(self, name: str, value: np.ndarray) -> dict[str, np.ndarray]:
        value = np.ascontiguousarray(value, dtype=np.float32)
        if value.ndim < 2:
            return {name: value.astype(np.float16)}
        codes, scales = np.empty(value.shape, dtype=np.int8), np.empty(len(value), dtype=np.float32)
        for start in range(0, len(value), BLOCK_ROWS):  # in blocks: no float copy of a (memory-mapped) table
            block = value[start : start + BLOCK_ROWS]
            scale = np.abs(block).max(axis=1, keepdims=True) / 127.0
            scale[scale == 0] = 1.0
            codes[start : start + BLOCK_ROWS] = np.round(block / scale).astype(np.int8)
            scales[start : start + BLOCK_ROWS] = scale.ravel()
        return {name: codes, name + ".scale": scales}


@register
@dataclass(frozen=True)
class ProductQuantized(Precision):
    """pq:M: the embedding tables as M one-byte codes per row of 2 * dim floats and fp16 codebooks (bundle/codebooks),
    every other weight as FALLBACK stores it. M = 0 ('pq'): chosen per dim (codebooks.default_codes)."""

    family = "pq"
    syntax = "pq[:M]"
    summary = "M one-byte codes per row of the entity tables, faiss codebooks; pq alone: 4 numbers a code"
    codes_tables = True
    # The weights a pq bundle does not code (MLP and GNN weights, small tables) are stored as int8 does: fp16 would
    # double their bytes for no measurable MRR (bench/results/bundle_sizes.md).
    FALLBACK: ClassVar[Precision] = Int8()
    codes: int = 0

    @classmethod
    def from_text(cls, text: str) -> Precision | None:
        if text == cls.family:
            return cls()
        if not text.startswith(cls.family + ":"):
            return None
        m = text[len(cls.family) + 1 :]
        if not m.isdigit() or int(m) < 1 or len(m) > 6:
            raise ValueError(f"precision {text[:40]!r}: write pq:M with M, the one-byte codes per row, a positive "
                             "integer")
        return cls(int(m))

    @property
    def name(self) -> str:
        return f"{self.family}:{self.codes}" if self.codes else self.family

    def row_bytes(self, width: int) -> int:
        """A coded row: one byte a code (the codebooks are the table's, not the row's: Layout.nbytes)."""
        assert self.codes, "pq: resolve(dim) first to know M"
        return self.codes

    def encode(self, name: str, value: np.ndarray) -> dict[str, np.ndarray]:
        return self.FALLBACK.encode(name, value)  # coded tables replace theirs in with_tables

    def resolve(self, dim: int) -> ProductQuantized:
        m = self.codes or codebooks.default_codes(dim)
        if (2 * dim) % m:
            raise ValueError(f"precision pq:{m} needs M dividing the row width 2 * dim = {2 * dim}")
        return ProductQuantized(m)

    def plan(self, model: str, dim: int, shapes: dict[str, tuple[int, ...]]) -> dict[str, Layout]:
        """The tables this precision codes: those codebooks.codable lays out whose codes and codebooks take fewer
        bytes than FALLBACK would (a table of 256 rows or fewer never does). Known from shapes alone."""
        return {name: lay for name, lay in codebooks.codable(model, dim, self.codes, shapes).items()
                if lay.nbytes < lay.rows * self.FALLBACK.row_bytes(lay.width)}

    def encode_tables(self, config: ModelConfig, params: dict[str, np.ndarray], *, seed: int = 0,
                      iterations: int = codebooks.ITERATIONS, start: PQTables | None = None,
                      weights: dict[str, np.ndarray] | None = None, orders: dict[str, str] | None = None,
                      ) -> PQTables:
        """Post-hoc faiss codebooks for every table a bundle of these weights codes at this M: k-means for
        `iterations` rounds, warm from `start`'s codebooks for each table it holds at the same layout, on rows
        drawn by `weights` (codebooks.row_weights) for each table it weighs, each table's numbers in its order of
        `orders` (contiguous where not given: codebooks.ORDERS)."""
        layouts = self.resolve(config.dim).plan(config.model, config.dim, _shapes(params))
        start, weights, orders = start or {}, weights or {}, orders or {}
        return {name: codebooks.encode_table(params[name], lay.codes, seed=seed, iterations=iterations,
                                             start=_fitting(start.get(name), lay), weights=weights.get(name),
                                             order=orders.get(name, "contiguous"))
                for name, lay in layouts.items()}

    def with_tables(self, tensors: dict[str, np.ndarray], metadata: dict[str, str], config: ModelConfig,
                    params: dict[str, np.ndarray], tables: PQTables | None = None,
                    orders: dict[str, str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Codes and codebooks in place of each coded table: `tables` (in `orders`), or faiss trained here on
        `params` (contiguous)."""
        if tables is None:
            tables, orders = self.encode_tables(config, params), None
        return codebooks.with_tables(tensors, metadata, tables, orders)

    def check_plan(self, layouts: dict[str, Layout], model: str, dim: int, shapes: dict[str, tuple[int, ...]],
                   source: str) -> None:
        """BundleError unless the coded tables a bundle declares are exactly those `plan` codes for its config."""
        assert self.codes, self
        if (2 * dim) % self.codes:
            raise BundleError(f"{source}: precision {self} needs M dividing the row width 2 * dim = {2 * dim}")
        wanted = self.plan(model, dim, shapes)
        if {n: replace(lay, order="contiguous") for n, lay in layouts.items()} != wanted:
            raise BundleError(f"{source}: its pq tables {codebooks.describe(layouts)} are not what {self} codes for "
                              f"{model} dim {dim}: {codebooks.describe(wanted)}")
        paired = [n for n, lay in layouts.items() if lay.order != "contiguous"]
        if paired and model not in PAIRED_MODELS:
            raise BundleError(f"{source}: its pq tables {paired} are in pairs order, which a {model} bundle does not "
                              f"take (only {', '.join(PAIRED_MODELS)})")

    @classmethod
    def stored_values(cls, params: dict[str, np.ndarray], tables: PQTables,
                      orders: dict[str, str] | None = None) -> dict[str, np.ndarray]:
        """The float32 weights a pq bundle of `params` decodes to: coded tables gathered (each in its order of
        `orders`, contiguous where not given), the rest through FALLBACK."""
        fallback, orders = cls.FALLBACK, orders or {}
        return {name: codebooks.decode_table(*tables[name], codebooks.order_columns(value.shape[1],
                                                                                      orders.get(name, "contiguous")))
                if name in tables else fallback.decode(fallback.encode(name, value), name)
                for name, value in params.items()}


def _fitting(table: tuple[np.ndarray, np.ndarray] | None, layout: codebooks.Layout) -> np.ndarray | None:
    """The codebooks of `table` when they have `layout`'s shape (codes, 256, width / codes), else None."""
    if table is None:
        return None
    books = table[1]
    return books if books.shape == (layout.codes, codebooks.CENTROIDS, layout.sub) else None


def _shapes(params: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(value.shape) for name, value in params.items()}


DEFAULT: Precision = Fp32()  # what training writes, and a bundle without `precision` metadata holds

__all__ = ["DEFAULT", "Fp16", "Fp32", "Int8", "Precision", "ProductQuantized", "catalogue", "choices", "describe",
           "names", "register", "registered", "unregister"]
