"""Precisions: parsing, bytes per row, encode/decode error bounds, and a new one registered in one class."""

from dataclasses import dataclass

import numpy as np
import pytest
from conftest import tiny_dataset

from earl_service.bundle import precision as precisions
from earl_service.bundle.codebooks import default_codes
from earl_service.bundle.model_io import load_bundle
from earl_service.bundle.precision import Fp16, Fp32, Int8, Precision, ProductQuantized
from earl_service.bundle.sizes import BundleSizes, save_exact
from earl_service.cli.main import build_parser
from earl_service.config import ModelConfig

UNIFORM = [Fp32(), Fp16(), Int8()]
# Largest |decoded - x| per row, as a share of the row's max |x|: fp16 rounds to 11 significant bits, int8 to
# half a step of max|x| / 127.
ROW_ERROR = {"fp32": 0.0, "fp16": 2**-11, "int8": 0.5 / 127 + 1e-6}


def _table(rows=300, width=32, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)


@pytest.mark.parametrize("text,expected", [("fp32", Fp32()), ("fp16", Fp16()), ("int8", Int8()),
                                           ("pq", ProductQuantized(0)), ("pq:16", ProductQuantized(16))])
def test_parse_gives_the_precision_its_name_spells(text, expected):
    parsed = Precision.parse(text)
    assert parsed == expected and parsed.name == text == str(parsed)
    assert Precision.parse(parsed) is parsed  # a Precision passes through


@pytest.mark.parametrize("text", ["fp8", "bf16", "", "PQ:8", "int8 "])
def test_an_unknown_precision_is_refused_naming_the_known_ones(text):
    with pytest.raises(ValueError, match="unknown precision") as info:
        Precision.parse(text)
    assert "'fp32', 'fp16' or 'int8', or pq[:M]" in str(info.value)


@pytest.mark.parametrize("text", ["pq:0", "pq:x", "pq:-3", "pq:", "pq:1e3", "pq:1234567"])
def test_a_malformed_pq_says_how_to_write_it(text):
    with pytest.raises(ValueError, match="write pq:M"):
        Precision.parse(text)


@pytest.mark.parametrize("precision", UNIFORM, ids=str)
def test_row_bytes_are_what_encode_writes(precision):
    for width in (1, 7, 32):
        tensors = precision.encode("w", _table(rows=50, width=width))
        assert sum(t.nbytes for t in tensors.values()) == 50 * precision.row_bytes(width)


@pytest.mark.parametrize("precision", UNIFORM, ids=str)
def test_encode_decode_round_trip_within_the_precisions_error(precision):
    x = _table()
    x[3] = 0.0  # an all-zero row keeps a usable scale
    tensors = precision.encode("param.w", x)
    back = precision.decode(tensors, "param.w")
    assert back.dtype == np.float32 and back.shape == x.shape
    row_max = np.abs(x).max(axis=1, keepdims=True)
    assert (np.abs(back - x) <= ROW_ERROR[precision.name] * row_max).all()
    assert not back[3].any()
    vector = x[0]  # vectors (biases) are stored as fp16 by int8, exactly by fp32
    assert np.abs(precision.decode(precision.encode("b", vector), "b") - vector).max() <= 2**-11 * np.abs(vector).max()


def test_pq_resolves_its_codes_and_refuses_an_m_that_does_not_divide_the_row():
    assert ProductQuantized(0).resolve(16) == ProductQuantized(default_codes(16)) == ProductQuantized(8)
    assert ProductQuantized(4).resolve(16) == ProductQuantized(4) and Int8().resolve(16) == Int8()
    with pytest.raises(ValueError, match="needs M dividing the row width 2 \\* dim = 32"):
        ProductQuantized(7).resolve(16)
    assert ProductQuantized(8).row_bytes(32) == 8 and Int8() == ProductQuantized.FALLBACK
    assert ProductQuantized(8).encode("w", _table()).keys() == Int8().encode("w", _table()).keys()


def test_pq_round_trip_codes_the_entity_table_and_stores_the_rest_as_int8():
    """2000 rows near 64 centres: 256 centroids per subspace find them, so the coded table comes back within the
    noise; the relation table (under 256 rows: codebooks outweigh it) goes through int8."""
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((64, 32)).astype(np.float32)
    entities = centres[rng.integers(0, 64, 2000)] + 0.01 * rng.standard_normal((2000, 32)).astype(np.float32)
    params = {"entities": entities, "relations": _table(rows=40, width=16)}
    pq = ProductQuantized(8)
    layouts = pq.plan("rotate", 16, {n: v.shape for n, v in params.items()})
    assert list(layouts) == ["entities"] and layouts["entities"].nbytes < 2000 * Int8().row_bytes(32)
    tables = pq.encode_tables(ModelConfig(model="rotate", dim=16), params)
    codes, books = tables["entities"]
    assert codes.shape == (2000, 8) and codes.dtype == np.uint8 and books.shape == (8, 256, 4)
    stored = ProductQuantized.stored_values(params, tables)
    assert np.mean((stored["entities"] - entities) ** 2) < 0.01 * np.var(entities)
    int8 = Int8()
    np.testing.assert_array_equal(stored["relations"], int8.decode(int8.encode("r", params["relations"]), "r"))


# ---------------------------------------------------------------- a new precision is one class


@dataclass(frozen=True)
class Int4(Precision):
    """A toy: two numbers a byte (signed nibbles), a float32 scale per row; vectors as fp16."""

    family = "int4"
    syntax = "int4"
    summary = "toy: half a byte a number"

    def row_bytes(self, width: int) -> int:
        return (width + 1) // 2 + 4

    def encode(self, name, value):
        value = np.ascontiguousarray(value, dtype=np.float32)
        if value.ndim < 2:
            return {name: value.astype(np.float16)}
        scale = np.abs(value).max(axis=1, keepdims=True) / 7.0
        scale[scale == 0] = 1.0
        nibbles = (np.clip(np.round(value / scale), -8, 7).astype(np.int8) & 0xF).astype(np.uint8)
        nibbles = np.pad(nibbles, ((0, 0), (0, nibbles.shape[1] % 2)))
        return {name: nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), name + ".scale": scale.ravel()}


@pytest.fixture
def int4():
    precisions.register(Int4)
    try:
        yield Int4()
    finally:
        precisions.unregister("int4")
    assert "int4" not in precisions.names()


def _help(*argv):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])


def test_a_registered_precision_is_known_everywhere(int4, capsys):
    assert Precision.parse("int4") == int4 and "int4" in precisions.names()
    assert {"name": "int4", "syntax": "int4", "summary": "toy: half a byte a number",
            "codes_tables": False} in precisions.catalogue()
    assert "'int8' or 'int4'" in precisions.choices()
    _help("export")
    assert "int4 (toy: half a byte a number)" in " ".join(capsys.readouterr().out.split())
    _help("compress")
    assert "int4 (toy: half a byte a number)" in " ".join(capsys.readouterr().out.split())
    x = _table(rows=10, width=7)
    assert sum(t.nbytes for t in int4.encode("w", x).values()) == 10 * int4.row_bytes(7)


def test_a_registered_precision_has_exact_budget_bytes(int4, tmp_path):
    """The budget counts its bytes from its encoder: fewer than int8 by half a byte a number (the header aside),
    and the file written at it is exactly as predicted."""
    sizes = BundleSizes(tiny_dataset())
    config = sizes.config("rotate", 16)
    bundle = sizes.untrained(config)
    matrices = [v.shape for v in bundle.params.values() if v.ndim == 2]
    saved = sum(rows * (Int8().row_bytes(w) - int4.row_bytes(w)) for rows, w in matrices)
    difference = sizes.bytes("rotate", 16, "int8") - sizes.bytes("rotate", 16, "int4")
    assert saved > 0 and abs(difference - saved) <= 64  # the header's dtype and shape strings differ a little
    budget = sizes.bytes("rotate", 16, "int4")
    assert sizes.max_dim("rotate", "int4", budget) == 16 and sizes.max_dim("rotate", "int8", budget) < 16
    path = save_exact(bundle, tmp_path / "int4.safetensors", precision="int4", metrics={}, expected=budget)
    assert path.stat().st_size == budget


def test_the_built_in_precisions_and_no_other():
    assert precisions.names() == ("fp32", "fp16", "int8", "pq")  # a test's throwaway one is gone again
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        Precision.parse("int4")


def test_register_refuses_a_second_class_for_a_name():
    @dataclass(frozen=True)
    class Other(Int4):
        family = "int8"

    with pytest.raises(ValueError, match="already registered"):
        precisions.register(Other)


def test_a_bundle_written_at_each_precision_reads_back_at_it(tmp_path):
    sizes = BundleSizes(tiny_dataset())
    bundle = sizes.untrained(sizes.config("rotate", 16))
    for precision in UNIFORM:
        path = bundle.save(tmp_path / f"{precision}.safetensors", precision=precision)
        back = load_bundle(path)
        assert back.precision == precision.name and back.coding == precision.coding
