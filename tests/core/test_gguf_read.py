"""kael.io.read_gguf: files the `gguf` package writes read identically; every rule of
NOTE [gguf validation] refused with a FormatError naming the field.

Valid files come from `gguf.GGUFWriter` (the reference Python writer, an independent
oracle); malformed ones from `gguf_bytes`, a `struct` builder written from the spec.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

import ggml_gguf
import kael
import numpy as np
import pytest
from gguf_bytes import TYPE, array, build, info, kv, s, u32, u64
from kael.io import GGUF_TENSOR_TYPES, GGUF_VALUE_TYPES, GGUFFile, read_gguf

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402
from gguf.quants import quantize  # noqa: E402

RNG = np.random.default_rng(0)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _reference_file(path: Path, *, alignment: int | None = None, nested: bool = True) -> dict[str, Any]:
    """A file with every value type and tensor type, written by gguf.GGUFWriter.

    Returns what each tensor's data must be: {name: (type, shape, expected array)}.
    """
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("v.u8", 255)
    w.add_int8("v.i8", -128)
    w.add_uint16("v.u16", 65535)
    w.add_int16("v.i16", -32768)
    w.add_uint32("v.u32", 2**32 - 1)
    w.add_int32("v.i32", -(2**31))
    w.add_float32("v.f32", 0.1)
    w.add_bool("v.bool", False)
    w.add_string("v.str", "héllo wörld ∑ 🦙")
    w.add_uint64("v.u64", 2**64 - 1)
    w.add_int64("v.i64", -(2**63))
    w.add_float64("v.f64", math.pi)
    w.add_array("v.arr_i32", [1, -2, 3])
    w.add_array("v.arr_str", ["a", "", "ünï"])
    w.add_array("v.arr_f32", [0.5, -1.25])
    w.add_array("v.arr_bool", [True, False, True])
    w.add_key_value("v.arr_u8", [0, 7, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("v.arr_u64", [2**64 - 1, 0], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("v.arr_f64", [1e300, -0.0], V.ARRAY, sub_type=V.FLOAT64)
    if nested:
        w.add_array("v.nested", [[1, 2], [3], [4, 5, 6]])
        w.add_array("v.nested_str", [["x"], ["y", "z"]])
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    expected: dict[str, Any] = {}

    def add(name: str, arr: np.ndarray[Any, Any], gtype: Q | None, kael_type: str, shape: tuple[int, ...]) -> None:
        w.add_tensor(name, arr, raw_dtype=gtype)
        expected[name] = (kael_type, shape, arr)

    add("t.f32", x, None, "F32", (3, 64))
    add("t.f16", x.astype(np.float16), None, "F16", (3, 64))
    add("t.f64", x[:, :5].astype(np.float64), None, "F64", (3, 5))
    add("t.i8", np.arange(-5, 5, dtype=np.int8), None, "I8", (10,))
    add("t.i16", np.arange(6, dtype=np.int16).reshape(2, 3), None, "I16", (2, 3))
    add("t.i32", np.arange(24, dtype=np.int32).reshape(2, 3, 4), None, "I32", (2, 3, 4))
    add("t.i64", np.arange(16, dtype=np.int64).reshape(1, 2, 2, 4), None, "I64", (1, 2, 2, 4))
    bf16 = quantize(x, Q.BF16)  # uint8 bytes [3, 128]
    w.add_tensor("t.bf16", bf16, raw_dtype=Q.BF16)
    expected["t.bf16"] = ("BF16", (3, 64), bf16.view(np.uint16))
    for gtype, name in ((Q.Q8_0, "Q8_0"), (Q.Q4_0, "Q4_0")):
        blocks = quantize(x, gtype)
        w.add_tensor(f"t.{name.lower()}", blocks, raw_dtype=gtype)
        expected[f"t.{name.lower()}"] = (name, (3, 64), blocks)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


REFERENCE_METADATA: dict[str, tuple[Any, str]] = {
    "general.architecture": ("llama", "string"),
    "v.u8": (255, "uint8"),
    "v.i8": (-128, "int8"),
    "v.u16": (65535, "uint16"),
    "v.i16": (-32768, "int16"),
    "v.u32": (2**32 - 1, "uint32"),
    "v.i32": (-(2**31), "int32"),
    "v.f32": (float(np.float32(0.1)), "float32"),
    "v.bool": (False, "bool"),
    "v.str": ("héllo wörld ∑ 🦙", "string"),
    "v.u64": (2**64 - 1, "uint64"),
    "v.i64": (-(2**63), "int64"),
    "v.f64": (math.pi, "float64"),
    "v.arr_i32": ([1, -2, 3], "array[int32]"),
    "v.arr_str": (["a", "", "ünï"], "array[string]"),
    "v.arr_f32": ([0.5, -1.25], "array[float32]"),
    "v.arr_bool": ([True, False, True], "array[bool]"),
    "v.arr_u8": ([0, 7, 255], "array[uint8]"),
    "v.arr_u64": ([2**64 - 1, 0], "array[uint64]"),
    "v.arr_f64": ([1e300, -0.0], "array[float64]"),
    "v.nested": ([[1, 2], [3], [4, 5, 6]], "array[array[int32]]"),
    "v.nested_str": ([["x"], ["y", "z"]], "array[array[string]]"),
}


@pytest.mark.parametrize("alignment", [None, 64, 1])
def test_reads_what_the_gguf_package_writes(tmp_path: Path, alignment: int | None) -> None:
    path = tmp_path / "ref.gguf"
    expected = _reference_file(path, alignment=alignment)
    with read_gguf(path) as f:
        assert isinstance(f, GGUFFile)
        assert f.version == 3
        assert f.alignment == (alignment or 32)
        want = dict(REFERENCE_METADATA)
        if alignment is not None:
            want["general.alignment"] = (alignment, "uint32")
        assert f.metadata == {k: v for k, (v, _) in want.items()}
        assert f.metadata_types == {k: t for k, (_, t) in want.items()}
        for k, v in f.metadata.items():  # bool stays bool, ints stay ints (== alone would not tell)
            assert type(v) is type(want[k][0]), k
        assert math.copysign(1.0, f.metadata["v.arr_f64"][1]) == -1.0
        assert list(f.tensors) == list(expected)  # file order
        ref = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        for name, (gtype, shape, arr) in expected.items():
            t = f.tensors[name]
            assert (t.name, t.type, t.shape) == (name, gtype, shape)
            assert t.type in GGUF_TENSOR_TYPES
            assert t.data.dtype == arr.dtype and t.data.shape == arr.shape
            np.testing.assert_array_equal(t.data, arr)
            assert t.data.tobytes() == ref[name].data.tobytes()
            assert t.offset == ref[name].data_offset and t.nbytes == ref[name].n_bytes
            assert t.offset % f.alignment == 0
            assert not t.data.flags.writeable
    assert set(f.metadata_types.values()) >= {n for n in GGUF_VALUE_TYPES if n != "array"}


def test_tensor_data_is_a_mapped_view_and_close_releases_it(tmp_path: Path) -> None:
    path = tmp_path / "ref.gguf"
    _reference_file(path)
    f = read_gguf(path)
    arr = f.tensors["t.f32"].data
    with pytest.raises(ValueError):
        arr[0, 0] = 1.0  # read-only: the file can never be changed through it
    assert arr.base is not None  # a view, not a copy
    f.close()  # an array is still alive: the mapping stays until it goes
    assert arr.shape == (3, 64) and np.isfinite(arr).all()
    f.close()  # idempotent
    with read_gguf(path) as g:
        assert g.tensors["t.i8"].data.tolist() == list(range(-5, 5))


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads the mapping's Rss from /proc")
def test_release_pages_drops_a_copied_tensors_pages_and_the_data_reads_back(tmp_path: Path) -> None:
    # Oracle: the kernel's own count of the mapping's resident pages (/proc/self/smaps), and the gguf package's
    # reading of the same bytes after the release (the pages come back from the page cache).
    import gguf

    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "test")
    values = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    w.add_tensor("big", values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    def resident_kib() -> int:
        rss, inside = 0, False
        with open("/proc/self/smaps") as fh:
            for line in fh:
                head = line.split()
                if "-" in head[0] and not head[0].endswith(":"):
                    inside = line.rstrip().endswith(os.fspath(path))
                elif inside and head[0] == "Rss:":
                    rss += int(head[1])
        return rss

    with read_gguf(path) as f:
        data = f.tensors["big"].data
        assert float(data.sum(dtype=np.float64)) == pytest.approx(float(values.sum(dtype=np.float64)))  # touched
        before = resident_kib()
        assert before >= 4096
        f.release_pages(data)
        assert resident_kib() <= before - 4000
        np.testing.assert_array_equal(data, values)  # read again: the same bytes
        f.release_pages(np.zeros(4))  # not the file's: nothing happens
        np.testing.assert_array_equal(data, values)


def test_version_2_is_read(tmp_path: Path) -> None:
    data = build(
        [kv("a", TYPE["uint32"], u32(5))], [info("w", [4], 0, 0)], np.arange(4, dtype="<f4").tobytes(), version=2
    )
    with read_gguf(_write(tmp_path / "v2.gguf", data)) as f:
        assert f.version == 2 and f.metadata == {"a": 5}
        np.testing.assert_array_equal(f.tensors["w"].data, [0, 1, 2, 3])


def test_zero_dims_is_a_scalar_and_tensors_may_come_in_any_offset_order(tmp_path: Path) -> None:
    data = np.array([7.0], "<f4").tobytes() + b"\0" * 28 + np.array([1.0, 2.0], "<f4").tobytes()
    infos = [info("b", [2], 0, 32), info("a", [], 0, 0)]
    with read_gguf(_write(tmp_path / "order.gguf", build([], infos, data))) as f:
        assert list(f.tensors) == ["b", "a"]
        assert f.tensors["a"].shape == () and float(f.tensors["a"].data) == 7.0
        assert f.tensors["b"].data.tolist() == [1.0, 2.0]


def test_missing_padding_after_the_last_tensor_is_accepted(tmp_path: Path) -> None:
    data = build([], [info("w", [3], 0, 0)], np.ones(3, "<f4").tobytes())  # 12 bytes, no padding after
    with read_gguf(_write(tmp_path / "nopad.gguf", data)) as f:
        assert f.tensors["w"].data.tolist() == [1.0, 1.0, 1.0]


def _valid_file() -> tuple[bytes, int]:
    """A small file with metadata of several types and two tensors; and where its data ends."""
    kvs = [
        kv("general.architecture", TYPE["string"], s("llama")),
        kv("a.list", TYPE["array"], array(TYPE["string"], 2, s("x") + s("yz"))),
        kv("a.nested", TYPE["array"], array(TYPE["array"], 1, array(TYPE["int16"], 2, b"\1\0\2\0"))),
        kv("a.flag", TYPE["bool"], b"\1"),
    ]
    q = quantize(RNG.standard_normal((2, 32)).astype(np.float32), Q.Q8_0).tobytes()  # 68 bytes
    data = q + b"\0" * (-len(q) % 32) + np.arange(4, dtype="<f4").tobytes()
    out = build(kvs, [info("q", [32, 2], 8, 0), info("f", [4], 0, 96)], data)
    return out, len(out)


def test_truncated_at_every_byte_is_a_format_error(tmp_path: Path) -> None:
    full, end = _valid_file()
    path = tmp_path / "cut.gguf"
    with read_gguf(_write(path, full)) as f:
        assert f.metadata["a.nested"] == [[1, 2]] and f.tensors["f"].data.tolist() == [0, 1, 2, 3]
    for n in range(end):
        _write(path, full[:n])
        with pytest.raises(kael.FormatError, match="GGUF file"):
            read_gguf(path).close()


def _nested(depth: int) -> bytes:
    """An array nested `depth` deep, the innermost an empty uint8 array."""
    inner = array(TYPE["uint8"], 0, b"")
    for _ in range(depth - 1):
        inner = array(TYPE["array"], 1, inner)
    return inner


# Each case: (what to build, a fragment the message must hold)
def _tensor_file(ne: list[int], type_id: int = 0, offset: int = 0, data: bytes = b"\0" * 64) -> bytes:
    return build([], [info("w", ne, type_id, offset)], data)


MALFORMED: dict[str, tuple[bytes, str]] = {
    "magic": (build(magic=b"GGML"), "magic: b'GGML', expected b'GGUF'"),
    "version 1": (build(version=1), "version: 1, expected 2 or 3 (GGUF 1 is not supported)"),
    "version 4": (build(version=4), "version: 4, expected 2 or 3"),
    "big-endian": (build(version=3 << 24), "big-endian"),
    "kv count": (build(n_kv=2**40), "metadata count: 1099511627776 keys need at least"),
    "tensor count": (build(n_tensors=2**50), "tensor count: 1125899906842624 tensor infos need"),
    "string length": (build([kv("k", TYPE["string"], u64(2**60))]), "metadata 'k' (1152921504606846976 bytes)"),
    "key length": (build([u64(2**62) + bytes(16)]), "metadata key #0 (4611686018427387904 bytes)"),
    "array count": (build([kv("k", TYPE["array"], array(TYPE["uint8"], 2**40, b""))]), "metadata 'k' count"),
    "string array count": (
        build([kv("k", TYPE["array"], array(TYPE["string"], 2**61, b""))]),
        "2305843009213693952 items of string need at least",
    ),
    "value type": (build([kv("k", 13, b"\0" * 8)]), "metadata 'k' type: 13 is not a GGUF value type"),
    "element type": (build([kv("k", TYPE["array"], array(99, 0, b""))]), "metadata 'k' element type: 99"),
    "key utf-8": (build([kv(b"k\xff", TYPE["uint8"], b"\0")]), "metadata key #0: b'k\\xff' is not valid UTF-8"),
    "value utf-8": (build([kv("k", TYPE["string"], s(b"\xc3("))]), "metadata 'k': b'\\xc3(' is not valid UTF-8"),
    "string array utf-8": (
        build([kv("k", TYPE["array"], array(TYPE["string"], 2, s("ok") + s(b"\xff")))]),
        "metadata 'k'[1]: b'\\xff' is not valid UTF-8",
    ),
    "string array count truncated": (
        build([kv("k", TYPE["array"], array(TYPE["string"], 3, s("a" * 8) + s("b")))], alignment=1),
        "metadata 'k'[2] length: needs 8 bytes",
    ),
    "surrogate utf-8": (build([kv("k", TYPE["string"], s(b"\xed\xa0\x80"))]), "is not valid UTF-8"),
    "empty key": (build([kv("", TYPE["uint8"], b"\0")]), "metadata key #0: is empty"),
    "NUL in key": (build([kv("a\0b", TYPE["uint8"], b"\0")]), "contains a NUL"),
    "duplicate key": (
        build([kv("k", TYPE["uint8"], b"\0"), kv("k", TYPE["uint8"], b"\1")]),
        "metadata key #1: 'k' appears more than once",
    ),
    "bool": (build([kv("k", TYPE["bool"], b"\2")]), "metadata 'k': the bool byte 2 is neither 0 nor 1"),
    "bool array": (build([kv("k", TYPE["array"], array(TYPE["bool"], 2, b"\1\7"))]), "the bool byte 7"),
    "nesting": (build([kv("k", TYPE["array"], _nested(9))]), "arrays nest more than 8 deep"),
    "mixed nested": (
        build(
            [
                kv(
                    "k",
                    TYPE["array"],
                    array(TYPE["array"], 2, array(TYPE["int32"], 0, b"") + array(TYPE["string"], 1, s("a"))),
                )
            ]
        ),
        "metadata 'k'[1]: has type array[string], but the arrays before it are array[int32]",
    ),
    "alignment type": (
        build([kv("general.alignment", TYPE["uint64"], u64(32))]),
        "metadata 'general.alignment': has type uint64, expected uint32",
    ),
    "alignment zero": (build([kv("general.alignment", TYPE["uint32"], u32(0))]), "0 is not a power of two"),
    "alignment 48": (build([kv("general.alignment", TYPE["uint32"], u32(48))]), "48 is not a power of two"),
    "n_dims": (_tensor_file([1, 1, 1, 1, 1]), "tensor 'w' n_dims: 5, expected at most 4"),
    "ne zero": (_tensor_file([4, 0]), "tensor 'w' ne[1]: 0, expected 1 <= ne < 2**63"),
    "ne huge": (_tensor_file([2**63]), "tensor 'w' ne[0]: 9223372036854775808"),
    "numel overflow": (_tensor_file([2**32, 2**32]), "has 18446744073709551616 elements, expected fewer than 2**63"),
    "type Q8_K": (_tensor_file([256], 15, data=bytes(320)), "tensor 'w' type: GGML type 15 (Q8_K); kael reads"),
    "K-quant row": (_tensor_file([255], 12, data=bytes(160)), "ne[0]: 255 is not a multiple of Q4_K's block size 256"),
    "IQ4_XS row": (_tensor_file([32, 8], 23, data=bytes(1088)), "ne[0]: 32 is not a multiple of IQ4_XS's block size"),
    "truncated super-block": (_tensor_file([256, 2], 14, data=bytes(300)), "its 420 bytes at file offset"),
    "type unknown": (_tensor_file([4], 200), "tensor 'w' type: 200 is not a GGML type id"),
    "block multiple": (_tensor_file([33, 1], 8), "tensor 'w' ne[0]: 33 is not a multiple of Q8_0's block size 32"),
    "offset aligned": (_tensor_file([4], 0, 4), "tensor 'w' offset: 4 is not a multiple of the alignment 32"),
    "offset past end": (_tensor_file([4], 0, 64), "tensor 'w' offset: its 16 bytes at file offset"),
    "size past end": (_tensor_file([17]), "its 68 bytes at file offset"),
    "huge size": (_tensor_file([2**40, 2**20]), "run past the end of the file"),
    "long name": (build([], [info("n" * 64, [1], 0, 0)], bytes(32)), "tensor #0 name: 'nnnn"),
    "empty name": (build([], [info("", [1], 0, 0)], bytes(32)), "tensor #0 name: is empty"),
    "name utf-8": (build([], [info(b"\x80", [1], 0, 0)], bytes(32)), "tensor #0 name: b'\\x80' is not valid UTF-8"),
    "duplicate tensor": (
        build([], [info("w", [1], 0, 0), info("w", [1], 0, 32)], b"\0" * 36),
        "tensor #1 name: 'w' appears more than once",
    ),
    "overlap": (
        build([], [info("a", [16], 0, 0), info("b", [4], 0, 32)], b"\0" * 64),
        "tensor 'b' offset: its bytes [",
    ),
    "too small": (b"GGUF\3\0\0\0", "fewer than the 24-byte header"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file_is_a_format_error_naming_the_field(tmp_path: Path, case: str) -> None:
    data, fragment = MALFORMED[case]
    path = _write(tmp_path / "bad.gguf", data)
    with pytest.raises(kael.FormatError) as e:
        read_gguf(path).close()
    assert str(e.value).startswith(f"GGUF file {os.fspath(path)!r}: "), str(e.value)
    assert fragment in str(e.value)


# Rules kael keeps that llama.cpp's own parser does not (it accepts these files); a GGML
# type kael does not read; and a case where that parser aborts the process (a data section
# of 4 PiB, which it tries to allocate).
KAEL_ONLY = {"key utf-8", "value utf-8", "surrogate utf-8", "NUL in key", "bool", "bool array", "ne zero"}
KAEL_ONLY |= {"empty name", "name utf-8", "string array utf-8"}
NOT_READ_BY_KAEL = {"type Q8_K"}  # Q8_K is an activation format, not a weight format
GGML_ABORTS = {"huge size"}


@pytest.mark.parametrize("case", [c for c in MALFORMED if c not in GGML_ABORTS])
def test_llama_cpp_refuses_the_malformed_files_too_except_where_kael_is_stricter(tmp_path: Path, case: str) -> None:
    ggml_gguf.library()
    path = _write(tmp_path / "bad.gguf", MALFORMED[case][0])
    assert ggml_gguf.accepts(path) == (case in KAEL_ONLY | NOT_READ_BY_KAEL)


def test_llama_cpp_reads_the_reference_file_as_kael_does(tmp_path: Path) -> None:
    ggml_gguf.library()
    path = tmp_path / "ref.gguf"
    _reference_file(path, nested=False)  # llama.cpp refuses nested arrays
    g = ggml_gguf.read(path)
    assert g is not None
    with read_gguf(path) as f:
        assert {k: t for k, (t, _) in g.metadata.items()} == f.metadata_types
        for k, (t, v) in g.metadata.items():
            assert v == f.metadata[k], k
        assert list(g.tensors) == list(f.tensors)
        for name, (_, offset, data) in g.tensors.items():
            assert offset == f.tensors[name].offset - f.data_offset
            assert data == f.tensors[name].data.tobytes()


def test_eight_deep_nesting_is_read(tmp_path: Path) -> None:
    with read_gguf(_write(tmp_path / "deep.gguf", build([kv("k", TYPE["array"], _nested(8))]))) as f:
        assert f.metadata["k"] == [[[[[[[[]]]]]]]]
        assert f.metadata_types["k"] == "array[" * 8 + "uint8" + "]" * 8


def test_empty_array_of_arrays_has_a_type_name(tmp_path: Path) -> None:
    with read_gguf(_write(tmp_path / "e.gguf", build([kv("k", TYPE["array"], array(TYPE["array"], 0, b""))]))) as f:
        assert f.metadata == {"k": []} and f.metadata_types == {"k": "array[array]"}


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_gguf(tmp_path / "missing.gguf")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(kael.FormatError, match="not a regular file"):
        read_gguf(fifo)


def test_big_vocabulary_arrays_are_read_fast_and_exactly(tmp_path: Path) -> None:
    n = 50_000
    tokens = [f"tok{i}" for i in range(n)]
    scores = RNG.standard_normal(n).astype("<f4")
    data = build(
        [
            kv("tokenizer.ggml.tokens", TYPE["array"], array(TYPE["string"], n, b"".join(s(t) for t in tokens))),
            kv("tokenizer.ggml.scores", TYPE["array"], array(TYPE["float32"], n, scores.tobytes())),
        ]
    )
    with read_gguf(_write(tmp_path / "vocab.gguf", data)) as f:
        assert f.metadata["tokenizer.ggml.tokens"] == tokens
        assert f.metadata["tokenizer.ggml.scores"] == scores.tolist()


def test_float_metadata_bits_are_kept(tmp_path: Path) -> None:
    nan = struct.pack("<f", float("nan"))
    data = build([kv("n", TYPE["float32"], nan), kv("i", TYPE["float64"], struct.pack("<d", -math.inf))])
    with read_gguf(_write(tmp_path / "f.gguf", data)) as f:
        assert math.isnan(f.metadata["n"]) and f.metadata["i"] == -math.inf
