"""Product-quantized tables in a bundle (numpy only): which tables a `pq:M` bundle may code, their layout, the gather.

What pq means as a precision (its spelling, its fallback for the weights it does not code, which tables are worth
coding) is ProductQuantized's, in bundle/precision.py; this module is the codebook machinery under it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from earl_service.core.scorers import IMPORTED
from earl_service.errors import BundleError
from earl_service.safe_json import parse_json

CENTROIDS = 256  # per subspace: one code byte
TRAIN_ROWS = 256 * CENTROIDS  # the most rows k-means fits a subspace on: faiss's own cap (256 a centroid)
# k-means rounds per subspace from random rows (faiss's default). A warm start from codebooks of the same table a
# little earlier in training (compress, rung after rung) needs few: on FB15k-237's RotatE d292 pq:73 entities, 3
# rounds from the old codebooks reached the relative error of 25 from scratch (0.2132 vs 0.2135) in 0.95 s vs 11.9 s.
ITERATIONS = 25
# Numbers per code byte that `--precision pq` tries (compress: each that fits); 4 when no budget chooses.
NUMBERS_PER_CODE = (2, 4, 8)
DEFAULT_NUMBERS_PER_CODE = 4
# The per-entity (RotatE, imported models) and embedding tables (EARL) worth coding; every other weight is a dense
# map, or an imported model's relation table (a few hundred rows at most in the published models; int8 keeps it).
CODABLE: dict[str, tuple[str, ...]] = {"rotate": ("entities",),
                                        "earl": ("reserved_embeddings", "relation_ends", "relations"),
                                        **{kind: ("entities",) for kind in IMPORTED}}
MANIFEST_KEY = "pq_manifest"
TENSOR_PREFIX = "pq."
# The order a coded table's numbers go to its codes in: "contiguous", each code s consecutive numbers of the row (for
# RotatE's [re | im], s reals or s imaginary parts); "pairs", the row's complex coordinates (re_j, im_j) in turn, so
# each code holds s / 2 whole complex numbers (s even). On WordNet-full's RotatE d22 at pq:11 post-hoc codes
# validated 0.4742 paired against 0.4610 contiguous; on FB15k-237's d182 at pq:91 0.2884 against 0.2897
# (bench/results/pq_layout_*.md): the better order depends on the table, so compress chooses it per export.
ORDERS = ("contiguous", "pairs")


@dataclass(frozen=True)
class Layout:
    """One coded table: rows x width floats as `codes` one-byte codes per row, codebooks (codes, 256, width/codes),
    the row's numbers taken in `order` (ORDERS)."""

    rows: int
    width: int
    codes: int
    order: str = "contiguous"

    @property
    def sub(self) -> int:
        return self.width // self.codes

    @property
    def columns(self) -> np.ndarray | None:
        """The row's column each coded number is (order_columns)."""
        return order_columns(self.width, self.order)

    @property
    def nbytes(self) -> int:
        """Codes plus fp16 codebooks."""
        return self.rows * self.codes + self.codes * CENTROIDS * self.sub * 2


def order_columns(width: int, order: str) -> np.ndarray | None:
    """For `order`, the column of a [re | im] row of `width` numbers that each coded number is, in code order
    (None: contiguous, the row's own order): "pairs" takes [re_0, im_0, re_1, im_1, ...]."""
    if order == "contiguous":
        return None
    if order != "pairs" or width % 2:
        raise ValueError(f"pq order {order!r} is not one of {ORDERS} for rows of {width} numbers")
    half = width // 2
    return np.stack([np.arange(half), np.arange(half) + half], 1).reshape(-1)


def pairable(width: int, codes: int) -> bool:
    """Whether rows of `width` numbers in `codes` codes can be coded in "pairs" order: whole complex numbers a code."""
    return width % 2 == 0 and width % codes == 0 and (width // codes) % 2 == 0


def codes_for(dim: int, numbers_per_code: int) -> int | None:
    """M for a dim at `numbers_per_code` floats per code byte (the row width 2 * dim must divide)."""
    return 2 * dim // numbers_per_code if (2 * dim) % numbers_per_code == 0 else None


def default_codes(dim: int) -> int:
    """M for `--precision pq` without a budget: the divisor of 2 * dim nearest 2 * dim / DEFAULT_NUMBERS_PER_CODE."""
    width = 2 * dim
    return min((m for m in range(1, width + 1) if width % m == 0),
               key=lambda m: abs(m - width / DEFAULT_NUMBERS_PER_CODE))


def codable(model: str, dim: int, codes: int, shapes: dict[str, tuple[int, ...]]) -> dict[str, Layout]:
    """The tables of CODABLE a `pq:codes` bundle could code: those whose width holds whole subvectors of
    2 * dim / codes floats (ProductQuantized.plan keeps those worth coding). Known from shapes alone."""
    sub = 2 * dim // codes
    layouts = {}
    for name in CODABLE.get(model, ()):
        shape = shapes.get(name)
        if shape is None or len(shape) != 2 or shape[1] % sub:
            continue
        layouts[name] = Layout(shape[0], shape[1], shape[1] // sub)
    return layouts


def zero_tables(layouts: dict[str, Layout]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Tables of the given layouts, all zero: what BundleSizes writes to know a file's bytes before training."""
    return {name: (np.zeros((lay.rows, lay.codes), np.uint8), np.zeros((lay.codes, CENTROIDS, lay.sub), np.float16))
            for name, lay in layouts.items()}


def with_tables(tensors: dict[str, np.ndarray], metadata: dict[str, str],
                tables: dict[str, tuple[np.ndarray, np.ndarray]], orders: dict[str, str] | None = None,
                ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A bundle's tensors with each coded table's `param.NAME` (and its int8 scale) replaced by its codes
    (rows, M) uint8 and codebooks (M, 256, width/M) fp16; the layout goes in the metadata: [rows, width, M], and
    the table's order (`orders`, ORDERS) where it is not contiguous."""
    out = dict(tensors)
    for name, (codes, books) in sorted(tables.items()):
        out.pop(f"param.{name}", None)
        out.pop(f"param.{name}.scale", None)
        out[f"{TENSOR_PREFIX}{name}.codes"] = np.ascontiguousarray(codes, dtype=np.uint8)
        out[f"{TENSOR_PREFIX}{name}.codebooks"] = np.ascontiguousarray(books, dtype=np.float16)
    return out, {**metadata, MANIFEST_KEY: manifest_text(tables, orders)}


def manifest_text(tables: dict[str, tuple[np.ndarray, np.ndarray]], orders: dict[str, str] | None = None) -> str:
    """The pq manifest with_tables writes for `tables` in `orders`: each table's [rows, width, M], and its order
    where it is not contiguous."""
    orders, manifest = orders or {}, {}
    for name, (codes, books) in sorted(tables.items()):
        order = orders.get(name, "contiguous")
        manifest[name] = [int(codes.shape[0]), int(books.shape[0] * books.shape[2]), int(books.shape[0]),
                          *([] if order == "contiguous" else [order])]
    return json.dumps(manifest)


def read_layouts(meta: dict[str, str], tensors: dict[str, np.ndarray], precision: str, source: str, *,
                 coded: bool) -> dict[str, Layout]:
    """The coded tables a bundle at `precision` declares (none unless the precision is `coded`), each checked against
    its codes and codebooks tensors (dtype and shape) before anything is decoded; the declared (rows, width) are
    then held against the config like any weight."""
    stray = [n for n in tensors if n.startswith(TENSOR_PREFIX)]
    if not coded:
        if stray or MANIFEST_KEY in meta:
            raise BundleError(f"{source} holds product-quantized tables but its precision is {precision}")
        return {}
    if MANIFEST_KEY not in meta:
        raise BundleError(f"{source} has precision {precision} but no {MANIFEST_KEY}")
    try:
        declared = parse_json(meta[MANIFEST_KEY], "the pq manifest")
        layouts = {str(name): _layout(value) for name, value in declared.items()}
    except (ValueError, TypeError) as exc:
        raise BundleError(f"{source}: its pq manifest is malformed ({exc}); it maps each coded table to "
                          f"[rows, width, codes] or [rows, width, codes, order] with order one of {ORDERS}") from exc
    for name, lay in layouts.items():
        _check_layout(tensors, name, lay, source)
    expected = {f"{TENSOR_PREFIX}{n}.{part}" for n in layouts for part in ("codes", "codebooks")}
    if set(stray) != expected:
        raise BundleError(f"{source} holds pq tensors its manifest does not declare: {sorted(set(stray) - expected)}")
    return layouts


def _layout(value: object) -> Layout:
    if not isinstance(value, list) or len(value) not in (3, 4):
        raise ValueError(f"{str(value)[:40]!r} is not [rows, width, codes(, order)]")
    order = value[3] if len(value) == 4 else "contiguous"
    if order not in ORDERS:
        raise ValueError(f"order {str(order)[:20]!r} is not one of {ORDERS}")
    rows, width, codes = (_count(x) for x in value[:3])
    return Layout(rows, width, codes, str(order))


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def _check_layout(tensors: dict[str, np.ndarray], name: str, lay: Layout, source: str) -> None:
    if lay.codes < 1 or lay.width % lay.codes:
        raise BundleError(f"{source}: pq table {name!r} declares {lay.codes} codes for rows of {lay.width} floats; "
                          "the codes must divide the width")
    if lay.order == "pairs" and not pairable(lay.width, lay.codes):
        raise BundleError(f"{source}: pq table {name!r} declares pairs order for rows of {lay.width} floats in "
                          f"{lay.codes} codes; pairs need an even number of floats a code")
    wanted = {"codes": (np.uint8, (lay.rows, lay.codes)), "codebooks": (np.float16, (lay.codes, CENTROIDS, lay.sub))}
    for part, (dtype, shape) in wanted.items():
        tensor = tensors.get(f"{TENSOR_PREFIX}{name}.{part}")
        if tensor is None or tensor.dtype != dtype or tensor.shape != shape:
            got = "missing" if tensor is None else f"{tensor.dtype} {tensor.shape}"
            raise BundleError(f"{source}: pq table {name!r} {part} are {got}, its manifest implies "
                              f"{np.dtype(dtype)} {shape}")


def describe(layouts: dict[str, Layout]) -> str:
    return "{" + ", ".join(f"{n}: {lay.rows}x{lay.width} in {lay.codes} codes"
                           + ("" if lay.order == "contiguous" else f", {lay.order}") for n, lay in layouts.items()) + "}"


def declared_shapes(layouts: dict[str, Layout]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """What each coded table decodes to, as core.decode lists stored weights: float32 (rows, width), by param name."""
    return {f"param.{name}": (np.dtype(np.float32), (lay.rows, lay.width)) for name, lay in layouts.items()}


def decode_table(codes: np.ndarray, codebooks: np.ndarray, columns: np.ndarray | None = None) -> np.ndarray:
    """(N, M) uint8 codes and (M, 256, s) codebooks -> (N, M * s) float32: row i, subspace j is codebooks[j, codes[i, j]],
    its numbers put back in the row's columns `columns` (Layout.columns; None: in code order)."""
    m = codebooks.shape[0]
    rows = codebooks[np.arange(m)[None, :], codes].astype(np.float32).reshape(len(codes), m * codebooks.shape[2])
    if columns is None:
        return rows
    out = np.empty_like(rows)
    out[:, columns] = rows
    return out


def decode_tables(tensors: dict[str, np.ndarray], layouts: dict[str, Layout]) -> dict[str, np.ndarray]:
    """Every coded table decoded (its layout already checked against the tensors and the config)."""
    return {name: decode_table(tensors[f"{TENSOR_PREFIX}{name}.codes"], tensors[f"{TENSOR_PREFIX}{name}.codebooks"],
                               lay.columns) for name, lay in layouts.items()}


PQTables = dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (codes (N, M) uint8, codebooks (M, 256, w/M) fp16)


def stored_tables(tensors: dict[str, np.ndarray]) -> PQTables:
    """The codes and codebooks of every coded table among a bundle file's tensors, as with_tables wrote them
    (empty for a precision that codes none): what re-saving that file's weights must carry to stay the same."""
    names = {key[len(TENSOR_PREFIX):].rsplit(".", 1)[0] for key in tensors if key.startswith(TENSOR_PREFIX)}
    return {name: (tensors[f"{TENSOR_PREFIX}{name}.codes"], tensors[f"{TENSOR_PREFIX}{name}.codebooks"])
            for name in sorted(names)}


def stored_orders(meta: dict[str, str]) -> dict[str, str]:
    """Each coded table's order as a file's pq manifest declares it (read_layouts checks the manifest; this reads a
    file the search wrote itself), contiguous where the manifest gives none."""
    declared = json.loads(meta.get(MANIFEST_KEY, "{}"))
    return {name: _layout(value).order for name, value in declared.items()}


CODE_BLOCK_BYTES = 64 << 20  # the most faiss's distance table may take while encode_table codes a block of rows


def row_weights(model: str, triples: np.ndarray, num_entities: int) -> dict[str, np.ndarray]:
    """How much each row of a coded per-entity table counts when its codebooks are fit: the entity's degree in
    `triples` (how often it is a head or a tail), since queries and their answers are drawn as the triples are.
    No weights (an empty dict) for EARL, whose coded rows (reserved entities, relations) every entity reads
    (unmeasured), or without triples. Post-hoc codebooks fit on rows drawn by degree rather than uniformly, valid
    MRR (bench/results/pq_rows_*.md): RotatE d50 on FB15k-237 at pq:25 0.2704 -> 0.2785, d16 on WordNet-full at
    pq:4 0.0538 -> 0.0635, d20 on a synthetic 1M graph at pq:5 0.0023 -> 0.0048, where a uniform draw spends the
    centroids on rows that barely trained (docs/design.md#codebooks-the-pq-precision)."""
    if not len(triples) or "entities" not in CODABLE.get(model, ()):
        return {}
    heads, tails = (np.bincount(triples[:, i], minlength=num_entities)[:num_entities] for i in (0, 2))
    return {"entities": heads + tails}  # two counts, not one of a 2E-long copy (1.1 s and 340 MB at 20M triples)


def training_rows(x: np.ndarray, weights: np.ndarray | None, seed: int) -> np.ndarray:
    """The rows k-means fits on: all of `x` (faiss then draws at most 256 a centroid itself, uniformly), or with
    `weights`, as many rows drawn with replacement in proportion to them (a row's weight is its share of the draws,
    up to faiss's cap)."""
    if weights is None or len(weights) != len(x) or not weights.sum() > 0:
        return x
    p = np.asarray(weights, dtype=np.float64)
    draws = min(len(x), TRAIN_ROWS)
    return x[np.random.default_rng(seed).choice(len(x), size=draws, p=p / p.sum())]


def encode_table(table: np.ndarray, codes: int, *, seed: int = 0, iterations: int = ITERATIONS,
                 start: np.ndarray | None = None, weights: np.ndarray | None = None,
                 order: str = "contiguous") -> tuple[np.ndarray, np.ndarray]:
    """faiss ProductQuantizer over the rows of `table` (N, w), N >= 256, their numbers taken in `order` (ORDERS):
    (codes (N, M) uint8, codebooks fp16).
    k-means runs `iterations` rounds per subspace on training_rows (all rows, or drawn by `weights`: row_weights),
    from `start` codebooks (M, 256, w/M) when given (a warm start from the same table's codebooks before its
    weights moved on) or from faiss's random rows. Every row is coded, against the fp16-rounded centroids, the
    ones the bundle stores."""
    import faiss

    columns = order_columns(table.shape[1], order)
    x = np.ascontiguousarray(table if columns is None else table[:, columns], dtype=np.float32)
    pq = faiss.ProductQuantizer(x.shape[1], codes, 8)
    pq.cp.seed, pq.cp.niter = seed, iterations
    pq.cp.min_points_per_centroid = 1  # a few thousand rows are all a table has: no warning for each subspace
    pq.verbose = False
    if start is not None:
        if start.shape != (codes, CENTROIDS, x.shape[1] // codes):
            raise ValueError(f"start codebooks {start.shape} do not fit pq:{codes} over rows of {x.shape[1]}")
        faiss.copy_array_to_vector(np.ascontiguousarray(start, dtype=np.float32).ravel(), pq.centroids)
        pq.train_type = faiss.ProductQuantizer.Train_hot_start
    pq.train(np.ascontiguousarray(training_rows(x, weights, seed)))
    books = faiss.vector_to_array(pq.centroids).reshape(codes, CENTROIDS, x.shape[1] // codes).astype(np.float16)
    faiss.copy_array_to_vector(books.astype(np.float32).ravel(), pq.centroids)
    # faiss codes up to 262,144 rows at once through a distance table of rows x 256 x M floats where a subspace
    # has 16 numbers or more: 4.3 GB for pq:16 over 256 numbers a row, whatever the table's size. Rows go to it
    # in blocks whose table takes at most CODE_BLOCK_BYTES.
    step = max(1, CODE_BLOCK_BYTES // (CENTROIDS * codes * 4))
    out = np.empty((len(x), codes), dtype=np.uint8)
    for begin in range(0, len(x), step):
        out[begin : begin + step] = pq.compute_codes(x[begin : begin + step]).reshape(-1, codes)
    return out, books


__all__ = ["CENTROIDS", "CODABLE", "NUMBERS_PER_CODE", "ORDERS", "Layout", "PQTables", "codable", "codes_for",
           "decode_table", "decode_tables", "declared_shapes", "default_codes", "describe", "encode_table",
           "manifest_text", "order_columns", "pairable", "read_layouts", "row_weights", "stored_orders", "training_rows", "with_tables",
           "zero_tables"]
