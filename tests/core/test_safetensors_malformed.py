"""safetensors' validation rules (kael/io/_safetensors_format.py, _safetensors_load.py): every malformed file
(the header's length, start, UTF-8 and JSON, duplicate keys, the metadata, each entry's dtype, shape and data
offsets, gaps, overlaps, coverage, BOOL values) is a FormatError naming the file, the tensor and the rule,
from ``load_arrays`` (mapped or copied) and ``decode_buffer`` alike; validation happens before any allocation,
and arbitrary or mutated bytes give a FormatError or a result, never another exception.
"""

from __future__ import annotations

import contextlib
import json
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael._errors import FormatError
from kael.io._safetensors_format import decode_buffer
from kael.io._safetensors_load import load_arrays
from safetensors_files import file_image as _raw
from safetensors_files import packed_file as _packed
from safetensors_files import write_file as _write

# -- malformed files ------------------------------------------------------------------------


def _entry(dtype: Any = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets,
    }


def _one(entry: dict[str, Any], data: bytes = b"\0" * 8, name: str = "w") -> bytes:
    return _raw({name: entry}, data)


ZERO8 = b"\0" * 8
MALFORMED: list[tuple[str, bytes, str]] = [
    ("empty file", b"", "header too small"),
    ("short prefix", b"\x02\0\0\0", "header too small"),
    ("header over the limit", struct.pack("<Q", 100_000_001) + b"{}", "header too large"),
    ("header at the limit past the end", struct.pack("<Q", 100_000_000) + b"{}", "header length"),
    ("header past the end", _raw("{}", length=3), "header length"),
    ("huge header length", struct.pack("<Q", 2**64 - 1) + b"{}", "header too large"),
    ("zero header length", _raw(b"", b"{}"), "header start"),
    ("array header", _raw("[]"), "header start"),
    ("leading space", _raw(" {}"), "header start"),
    ("BOM", _raw("\ufeff{}"), "header start"),
    ("not UTF-8", _raw(b'{"\xff": 1}'), "header UTF-8"),
    ("encoded surrogate", _raw(b'{"\xed\xa0\x80": 1}'), "header UTF-8"),
    ("truncated JSON", _raw("{"), "header JSON"),
    ("trailing garbage", _raw("{}x"), "header JSON"),
    ("NUL padding", _raw(b"{}\0\0"), "header JSON"),
    ("single quotes", _raw("{'a': 1}"), "header JSON"),
    ("NaN in metadata", _raw('{"__metadata__": {"a": NaN}}'), "header JSON"),
    ("deep nesting", _raw('{"a":' + "[" * 100_000 + "]" * 100_000 + "}"), "header JSON"),
    (
        "huge integer literal",
        _raw('{"w": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 0]}}'),
        "header JSON",
    ),
    (
        "duplicate tensor",
        _raw('{"w": ' + json.dumps(_entry()) + ', "w": ' + json.dumps(_entry()) + "}", ZERO8),
        "duplicate key",
    ),
    ("duplicate __metadata__", _raw('{"__metadata__": {}, "__metadata__": {}}'), "duplicate key"),
    (
        "duplicate key in entry",
        _raw('{"w": {"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', ZERO8),
        "duplicate key",
    ),
    ("duplicate metadata key", _raw('{"__metadata__": {"a": "1", "a": "2"}}'), "duplicate key"),
    ("metadata not an object", _raw({"__metadata__": ["a"]}), "__metadata__"),
    ("metadata null", _raw({"__metadata__": None}), "__metadata__"),
    ("metadata int value", _raw({"__metadata__": {"a": 1}}), "__metadata__"),
    ("metadata null value", _raw({"__metadata__": {"a": None}}), "__metadata__"),
    ("metadata nested value", _raw({"__metadata__": {"a": {"b": "c"}}}), "__metadata__"),
    ("lone surrogate in name", _raw('{"\\ud800": ' + json.dumps(_entry()) + "}", ZERO8), "invalid string"),
    ("lone surrogate in metadata", _raw('{"__metadata__": {"a": "\\udfff"}}'), "invalid string"),
    ("entry not an object", _raw({"w": [1, 2]}), "entry"),
    ("entry missing key", _raw({"w": {"dtype": "F32", "shape": [0]}}), "entry keys"),
    ("entry extra key", _one({**_entry(), "extra": 1}), "entry keys"),
    ("lowercase dtype", _one(_entry("f32")), "dtype"),
    ("unknown dtype", _one(_entry("F128")), "dtype"),
    ("dtype not a string", _one(_entry(4)), "dtype"),
    ("F8_E4M3", _one(_entry("F8_E4M3", (8,))), "dtype"),
    ("U16", _one(_entry("U16", (4,))), "dtype"),
    ("U32", _one(_entry("U32")), "dtype"),
    ("U64", _one(_entry("U64", (1,))), "dtype"),
    ("C64", _one(_entry("C64", (1,))), "dtype"),
    ("shape not a list", _one(_entry(shape="2")), "shape"),
    ("shape null", _one(_entry(shape=None)), "shape"),
    ("shape of bools", _one(_entry("U8", shape=[True] * 8)), "shape"),
    ("shape of floats", _one(_entry(shape=[2.0])), "shape"),
    ("negative dim", _one(_entry(shape=[-2])), "shape"),
    ("too many dims", _one(_entry(shape=[1] * 65, offsets=(0, 4)), b"\0" * 4), "shape"),
    ("size overflow", _one(_entry(shape=[2**62, 4], offsets=(0, 2**64))), "size overflow"),
    ("size overflow with a zero dim", _one(_entry(shape=[0, 2**63], offsets=(0, 0)), b""), "size overflow"),
    ("offsets not a list", _one(_entry(offsets="0,8")), "data_offsets"),
    ("three offsets", _one(_entry(offsets=[0, 4, 8])), "data_offsets"),
    ("float offsets", _one(_entry(offsets=[0.0, 8.0])), "data_offsets"),
    ("bool offsets", _one(_entry("U8", shape=[1], offsets=[False, True]), b"\0"), "data_offsets"),
    ("negative begin", _one(_entry(offsets=[-8, 0])), "data_offsets"),
    ("begin after end", _one(_entry(shape=[0], offsets=[8, 0])), "data_offsets"),
    ("size mismatch", _one(_entry(shape=[3])), "data_offsets"),
    ("end past the data", _one(_entry(shape=[4], offsets=(0, 16))), "data_offsets"),
    ("huge claim in a small file", _one(_entry(shape=[2**40], offsets=(0, 2**42))), "data_offsets"),
    ("gap at the start", _one(_entry(offsets=(8, 16)), b"\0" * 16), "gap"),
    (
        "gap between",
        _raw({"a": _entry(shape=[1], offsets=(0, 4)), "b": _entry(shape=[1], offsets=(5, 9))}, b"\0" * 9),
        "gap",
    ),
    ("overlap", _raw({"a": _entry(), "b": _entry(shape=[1], offsets=(4, 8))}, ZERO8), "overlap"),
    ("same range twice", _raw({"a": _entry(), "b": _entry()}, ZERO8), "overlap"),
    ("trailing data", _one(_entry(), b"\0" * 9), "coverage"),
    ("data without tensors", _raw("{}", b"\0"), "coverage"),
    ("BOOL byte 2", _one(_entry("BOOL", (3,), (0, 3)), b"\1\0\2"), "BOOL values"),
    ("BOOL byte 255", _one(_entry("BOOL", (), (0, 1)), b"\xff"), "BOOL values"),
]


@pytest.mark.parametrize("use_mmap", [False, True])
@pytest.mark.parametrize(("case", "raw", "rule"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_file_is_a_format_error(tmp_path: Path, case: str, raw: bytes, rule: str, use_mmap: bool) -> None:
    path = _write(tmp_path, raw, "bad.safetensors")
    with pytest.raises(FormatError) as info:
        load_arrays(path, mmap=use_mmap)
    msg = str(info.value)
    assert f": {rule}: " in msg, msg
    assert str(path) in msg
    with pytest.raises(FormatError, match=f": {rule}: "):
        decode_buffer(raw)


@pytest.mark.parametrize(
    ("raw", "tensor"),
    [
        (_one(_entry("F8_E4M3", (8,)), name="layer.0.w"), "layer.0.w"),
        (_one(_entry(shape=[3]), name="bias"), "bias"),
        (_one(_entry("BOOL", (1,), (0, 1)), b"\7", name="mask"), "mask"),
        (_raw({"a": _entry(), "b": _entry()}, ZERO8), "b"),
    ],
)
def test_error_names_the_tensor(tmp_path: Path, raw: bytes, tensor: str) -> None:
    with pytest.raises(FormatError, match=f"tensor {tensor!r}"):
        load_arrays(_write(tmp_path, raw), mmap=False)


def test_validation_happens_before_allocation(tmp_path: Path) -> None:
    # A 64 MiB file whose last tensor is broken: nothing of the data is read or allocated.
    size = 1 << 26
    header = {"big": _entry("U8", (size,), (0, size)), "bad": _entry("F32", (1,), (size, size + 3))}
    path = _write(tmp_path, _raw(header, b"\0" * (size + 3)))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="data_offsets"):
            load_arrays(path, mmap=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size // 8


def test_unsorted_header_order_is_accepted(tmp_path: Path) -> None:
    header = {
        "second": _entry("I32", (1,), (4, 8)),
        "first": _entry("I32", (1,), (0, 4)),
        "empty": _entry("I32", (0,), (8, 8)),
    }
    data = np.array([1, 2], "<i4").tobytes()
    loaded, _ = load_arrays(_write(tmp_path, _raw(header, data)), mmap=True)
    assert loaded["first"][0].tolist() == [1] and loaded["second"][0].tolist() == [2]
    assert list(loaded) == ["first", "second", "empty"]  # data order


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises((FormatError, IsADirectoryError, PermissionError)):
        load_arrays(tmp_path)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_format_error_or_a_result(raw: bytes) -> None:
    with contextlib.suppress(FormatError):
        decode_buffer(raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_valid_file_gives_format_error_or_a_result(tmp_path: Path, data: st.DataObject) -> None:
    raw = bytearray(_packed(tmp_path).read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = _write(tmp_path, bytes(raw), "mut.safetensors")
    for m in (False, True):
        try:
            loaded, _ = load_arrays(path, mmap=m)
        except FormatError:
            continue
        for arr, _ in loaded.values():  # touch the first and last byte of each tensor
            if arr.size:
                flat = arr.reshape(-1)
                _ = (flat[0], flat[-1])
