"""Reading a safetensors payload block by block: the tensor table is checked as safetensors checks it, every byte
is read once into the array that keeps it, and the payload's checksum is taken on the way."""

import tracemalloc

import numpy as np
import pytest

from earl_service.bundle.format import FORMAT, FORMAT_VERSION, read_safetensors, write_safetensors
from earl_service.bundle.reader import LayoutError, tensor_layout
from earl_service.errors import BundleError

META = {"format": FORMAT, "format_version": str(FORMAT_VERSION)}


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_a_table_that_tiles_the_payload_is_read_in_offset_order():
    header = {"__metadata__": {}, "b": _entry("F32", [2, 3], 8, 32), "a": _entry("I64", [1], 0, 8),
              "empty": _entry("U8", [0], 32, 32)}
    layout = tensor_layout(header, 32)
    assert [(name, begin, end) for name, _, _, begin, end in layout] == [("a", 0, 8), ("b", 8, 32), ("empty", 32, 32)]
    assert layout[1][1] == np.dtype("<f4") and layout[1][2] == (2, 3)


@pytest.mark.parametrize("header,payload,message", [
    ({"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 12, 20)}, 20, "starts at byte 12"),  # a gap
    ({"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 4, 12)}, 12, "starts at byte 4"),  # an overlap
    ({"a": _entry("F32", [2], 0, 8)}, 9, "the payload holds 9"),  # bytes left over
    ({"a": _entry("F32", [2], 0, 8)}, 7, "the payload holds 7"),  # a payload cut short
    ({"a": _entry("F32", [3], 0, 8)}, 8, "needs 12 bytes"),
    ({"a": _entry("BF16", [4], 0, 8)}, 8, "dtype 'BF16'"),
    ({"a": _entry("F32", [-2], 0, 8)}, 8, "not a list of non-negative integers"),
    ({"a": _entry("F32", [True, 2], 0, 8)}, 8, "not a list of non-negative integers"),
    ({"a": _entry("F32", [2], 8, 0)}, 8, "begin <= end"),
    ({"a": "F32"}, 8, "not described by an object"),
])
def test_a_table_that_does_not_describe_the_payload_is_refused(header, payload, message):
    with pytest.raises(LayoutError, match=message):
        tensor_layout(header, payload)


def test_a_file_is_read_holding_its_tensors_once(tmp_path):
    """What reading allocates is the tensors themselves (plus small change): safetensors' load held the file's
    bytes, a sliced copy for the checksum and the arrays at once."""
    table = np.random.default_rng(0).standard_normal((1 << 20, 4)).astype(np.float32)  # 16 MiB
    path = write_safetensors(tmp_path / "t.safetensors", {"table": table, "ids": np.arange(5)}, META)
    tracemalloc.start()
    try:
        meta, tensors, size = read_safetensors(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(tensors["table"], table)
    np.testing.assert_array_equal(tensors["ids"], np.arange(5))
    assert size == path.stat().st_size and meta["format"] == FORMAT
    assert peak < table.nbytes + (1 << 20), f"peak {peak:,} bytes for a {table.nbytes:,}-byte table"


def test_a_changed_payload_byte_fails_the_checksum(tmp_path):
    path = write_safetensors(tmp_path / "t.safetensors", {"x": np.arange(1000, dtype=np.float32)}, META)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="does not match its SHA-256"):
        read_safetensors(path)


def test_a_header_promising_more_than_the_file_holds_allocates_nothing_big(tmp_path):
    """A table claiming 2**40 bytes in a tiny file is refused by the layout check before any array exists."""
    import json
    import struct

    header = json.dumps({"__metadata__": META, "x": _entry("F32", [2**38], 0, 2**40)}).encode()
    path = tmp_path / "lies.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    with pytest.raises(BundleError, match="corrupted or truncated: the tensors take"):
        read_safetensors(path)
