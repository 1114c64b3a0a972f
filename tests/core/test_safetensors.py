"""safetensors: round trips, interop with the reference package, mapped views, and the
validation rules (every malformed file is a FormatError naming the file, tensor and rule).

The NumPy layer (`load_arrays`, `save_arrays`, `decode_buffer`) is tested on its own; the
tensor layer (`kael.io.load_safetensors` / `save_safetensors`) once kael's Tensor works.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from kael._errors import FormatError
from kael.io._safetensors_format import DTYPES, decode_buffer
from kael.io._safetensors_load import load_arrays
from kael.io._safetensors_save import save_arrays, save_entries

# kael dtype name -> NumPy dtype of the arrays the NumPy layer takes and returns
NP_OF = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}
SHAPES = [(), (0,), (5,), (2, 3), (2, 0, 4), (1, 1, 1, 3)]


def _sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    npd: np.dtype[Any] = np.dtype(NP_OF[dtype])
    if npd == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if npd.kind == "f":
        return rng.standard_normal(shape).astype(npd)
    info = np.iinfo(npd)
    return rng.integers(info.min, info.max, shape, dtype=npd, endpoint=True)


def _raw(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A file image: 8-byte length, header (a JSON-able object, str or bytes), data."""
    if isinstance(header, bytes):
        raw = header
    else:
        raw = (header if isinstance(header, str) else json.dumps(header)).encode("utf-8")
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + data


def _write(tmp_path: Path, raw: bytes, name: str = "f.safetensors") -> Path:
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def _same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Same dtype, shape and bits (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _is_mapped(arr: np.ndarray[Any, Any]) -> bool:
    base: Any = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if hasattr(base, "base") else getattr(base, "obj", None)
    return False


# -- round trips (NumPy layer) -------------------------------------------------------------


@pytest.mark.parametrize("use_mmap", [False, True])
@pytest.mark.parametrize("dtype", list(NP_OF))
def test_round_trip_every_dtype_and_shape(tmp_path: Path, dtype: str, use_mmap: bool) -> None:
    arrays = {f"t{i}": (_sample(dtype, s, i), dtype) for i, s in enumerate(SHAPES)}
    path = tmp_path / "rt.safetensors"
    save_arrays(arrays, path, metadata={"format": "np", "ünï": "cödé"})
    loaded, meta = load_arrays(path, mmap=use_mmap)
    assert meta == {"format": "np", "ünï": "cödé"}
    assert list(loaded) == list(arrays)
    for name, (arr, d) in arrays.items():
        got, got_dtype = loaded[name]
        assert got_dtype == d
        assert _same(got, arr)


def test_no_metadata_and_no_tensors(tmp_path: Path) -> None:
    path = tmp_path / "empty.safetensors"
    save_arrays({}, path)
    assert path.read_bytes() == struct.pack("<Q", 8) + b"{}      "
    for m in (False, True):
        assert load_arrays(path, mmap=m) == ({}, None)


def test_header_is_padded_with_spaces_to_8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save_arrays({"abc": (np.arange(3, dtype=np.float32), "float32")}, path, metadata={"k": "v"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + n]
    assert n % 8 == 0
    assert json.loads(header) == {
        "__metadata__": {"k": "v"},
        "abc": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
    }
    assert header.rstrip(b" ") + b" " * (n - len(header.rstrip(b" "))) == header
    assert raw[8 + n :] == np.arange(3, dtype="<f4").tobytes()


def _tagged_arrays(dtype: str) -> st.SearchStrategy[tuple[np.ndarray[Any, Any], str]]:
    shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
    return hnp.arrays(NP_OF[dtype], shapes).map(lambda a: (a, dtype))


arrays_strategy = st.dictionaries(
    st.text(min_size=0, max_size=8).filter(lambda s: s != "__metadata__"),
    st.sampled_from(list(NP_OF)).flatmap(_tagged_arrays),
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=arrays_strategy, metadata=st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5)))
def test_round_trip_property(tmp_path: Path, arrays: dict[str, Any], metadata: dict[str, str] | None) -> None:
    path = tmp_path / "h.safetensors"
    save_arrays(arrays, path, metadata)
    for m in (False, True):
        loaded, meta = load_arrays(path, mmap=m)
        assert meta == metadata
        assert list(loaded) == list(arrays)
        for name, (arr, d) in arrays.items():
            assert loaded[name][1] == d
            assert _same(loaded[name][0], arr)
    loaded_bytes, _ = decode_buffer(path.read_bytes())
    assert all(_same(loaded_bytes[k][0], a) for k, (a, _) in arrays.items())


# -- interoperability with the reference implementation ------------------------------------

REF_DTYPES = [d for d in NP_OF if d != "bfloat16"]  # safetensors.numpy has no bfloat16


def test_kael_file_reads_in_safetensors_and_back(tmp_path: Path) -> None:
    stnp = pytest.importorskip("safetensors.numpy")
    arrays = {f"{d}_{i}": (_sample(d, s, i), d) for d in REF_DTYPES for i, s in enumerate(SHAPES)}
    ours = tmp_path / "kael.safetensors"
    save_arrays(arrays, ours, metadata={"who": "kael"})
    ref = stnp.load_file(str(ours))
    assert set(ref) == set(arrays)
    for name, (arr, _) in arrays.items():
        assert ref[name].dtype == arr.dtype and ref[name].shape == arr.shape
        assert np.array_equal(ref[name], arr)
    again = tmp_path / "ref.safetensors"
    stnp.save_file(ref, str(again), metadata={"who": "ref"})
    for m in (False, True):
        loaded, meta = load_arrays(again, mmap=m)
        assert meta == {"who": "ref"}
        for name, (arr, d) in arrays.items():
            assert loaded[name][1] == d
            assert np.array_equal(loaded[name][0], arr)


def test_reference_written_file_maps_every_tensor(tmp_path: Path) -> None:
    stnp = pytest.importorskip("safetensors.numpy")
    ref: dict[str, np.ndarray[Any, Any]] = {
        "a": np.ones(3, np.int8),
        "b": np.arange(5, dtype=np.float64),
        "c": np.zeros((2, 2), np.float16),
    }
    path = tmp_path / "ref.safetensors"
    stnp.save_file(ref, str(path))
    loaded, meta = load_arrays(path, mmap=True)
    assert meta is None
    for name, arr in ref.items():
        assert np.array_equal(loaded[name][0], arr)
        assert _is_mapped(loaded[name][0]), name  # the reference writer keeps every tensor aligned


def test_bfloat16_interop_through_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    stt = pytest.importorskip("safetensors.torch")
    bits = _sample("bfloat16", (3, 4), 7)
    ours = tmp_path / "bf16.safetensors"
    save_arrays({"h": (bits, "bfloat16"), "f": (np.arange(3, dtype=np.float32), "float32")}, ours)
    ref = stt.load_file(str(ours))
    assert ref["h"].dtype == torch.bfloat16 and tuple(ref["h"].shape) == (3, 4)
    assert np.array_equal(ref["h"].view(torch.int16).numpy().view(np.uint16), bits)
    again = tmp_path / "torch.safetensors"
    stt.save_file({"h": ref["h"], "z": torch.zeros(0, 2, dtype=torch.bfloat16)}, str(again))
    for m in (False, True):
        loaded, _ = load_arrays(again, mmap=m)
        assert loaded["h"][1] == "bfloat16" and _same(loaded["h"][0], bits)
        assert loaded["z"][1] == "bfloat16" and loaded["z"][0].shape == (0, 2)


# -- mapped mode: zero-copy views when aligned, copies otherwise ---------------------------


def _packed(tmp_path: Path) -> Path:
    # F32 [2] at 0, BOOL [1] at 8, I64 [1, 1] at 9: the last is misaligned for 8-byte items.
    header = {
        "__metadata__": {"seed": "fuzz"},
        "f": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "BOOL", "shape": [1], "data_offsets": [8, 9]},
        "i": {"dtype": "I64", "shape": [1, 1], "data_offsets": [9, 17]},
    }
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    data = np.array([1.5, -2.0], "<f4").tobytes() + b"\x01" + np.array([123456789], "<i8").tobytes()
    return _write(tmp_path, _raw(h, data))


def test_mapped_aligned_views_and_misaligned_copies(tmp_path: Path) -> None:
    path = _packed(tmp_path)
    loaded, meta = load_arrays(path, mmap=True)
    assert meta == {"seed": "fuzz"}
    f, b, i = (loaded[k][0] for k in "fbi")
    assert f.tolist() == [1.5, -2.0] and b.tolist() == [True] and i.tolist() == [[123456789]]
    assert _is_mapped(f) and _is_mapped(b)
    assert not _is_mapped(i) and i.flags.aligned
    # ACCESS_COPY: writable, and writes never reach the file
    before = path.read_bytes()
    f[0] = 42.0
    assert path.read_bytes() == before
    copied, _ = load_arrays(path, mmap=False)
    assert not any(_is_mapped(a) for a, _ in copied.values())
    assert all(a.flags.aligned and a.flags.writeable for a, _ in copied.values())


def test_mapping_outlives_the_file_handle(tmp_path: Path) -> None:
    path = _packed(tmp_path)
    loaded, _ = load_arrays(path, mmap=True)
    os.unlink(path)
    assert loaded["f"][0].tolist() == [1.5, -2.0]


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


# -- saving -----------------------------------------------------------------------------------


def _only(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    ("arrays", "metadata", "rule"),
    [
        ({"w": [1, 2, 3]}, None, "value"),
        ({"w": (np.zeros(2, np.float32), "float32"), "x": ("nope", "float32")}, None, "value"),
        ({"__metadata__": (np.zeros(2, np.float32), "float32")}, None, "tensor name"),
        ({"\ud800": (np.zeros(2, np.float32), "float32")}, None, "invalid string"),
        ({"w": (np.zeros(2, np.complex64), "complex64")}, None, "dtype"),
        ({}, {"a": 1}, "__metadata__"),
        ({}, {1: "a"}, "__metadata__"),
        ({}, ["a"], "__metadata__"),
        ({}, {"a": "\udc00"}, "invalid string"),
    ],
)
def test_invalid_save_leaves_no_file(tmp_path: Path, arrays: Any, metadata: Any, rule: str) -> None:
    with pytest.raises(FormatError, match=f": {rule}: "):
        save_arrays(arrays, tmp_path / "out.safetensors", metadata)
    assert _only(tmp_path) == []


def test_failure_while_writing_removes_the_temp_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"old")

    def boom() -> np.ndarray[Any, Any]:
        raise RuntimeError("device lost")

    entries = [("a", "float32", (2,), lambda: np.zeros(2, np.float32)), ("b", "float32", (2,), boom)]
    with pytest.raises(RuntimeError, match="device lost"):
        save_entries(entries, target, None, "test")
    assert _only(tmp_path) == ["out.safetensors"]
    assert target.read_bytes() == b"old"
    wrong = [("a", "float32", (2,), lambda: np.zeros(3, np.float32))]
    with pytest.raises(FormatError, match="data size"):
        save_entries(wrong, target, None, "test")
    assert _only(tmp_path) == ["out.safetensors"]


def test_saved_file_has_ordinary_permissions(tmp_path: Path) -> None:
    path = tmp_path / "perm.safetensors"
    save_arrays({}, path)
    mask = os.umask(0o022)
    os.umask(mask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~mask)


def test_dtype_table_matches_the_format() -> None:
    assert set(DTYPES) == {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}
    assert {v.kael for v in DTYPES.values()} == set(NP_OF)


# -- the tensor layer -----------------------------------------------------------------------


@pytest.fixture
def kael_mod() -> Any:
    try:
        import kael
        import kael.io
        from kael._tensor import from_numpy

        from_numpy(np.zeros(2, np.float32))
    except Exception as e:  # the core is still being written
        pytest.skip(f"kael tensors not available yet: {e!r}")
    return kael


def _bits(t: Any) -> np.ndarray[Any, Any]:
    from kael._tensor import numpy_bits

    out: np.ndarray[Any, Any] = numpy_bits(t)
    return out


@pytest.mark.parametrize("use_mmap", [False, True])
def test_tensor_round_trip(tmp_path: Path, kael_mod: Any, use_mmap: bool) -> None:
    from kael._dtype import BY_NAME
    from kael._tensor import from_numpy_bits

    tensors = {f"{d}{i}": from_numpy_bits(_sample(d, s, i), BY_NAME[d]) for d in NP_OF for i, s in enumerate(SHAPES)}
    path = tmp_path / "t.safetensors"
    kael_mod.io.save_safetensors(tensors, path, metadata={"a": "b"})
    loaded, meta = kael_mod.io.load_safetensors_with_metadata(path, mmap=use_mmap)
    assert meta == {"a": "b"}
    assert list(loaded) == list(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype is t.dtype and tuple(loaded[name].shape) == tuple(t.shape)
        assert _same(_bits(loaded[name]), _bits(t))
    plain = kael_mod.io.load_safetensors(path, mmap=use_mmap)
    assert list(plain) == list(tensors)


def test_tensor_mapped_views(tmp_path: Path, kael_mod: Any) -> None:
    loaded = kael_mod.io.load_safetensors(_packed(tmp_path), mmap=True)
    assert _bits(loaded["f"]).tolist() == [1.5, -2.0]
    assert _bits(loaded["i"]).tolist() == [[123456789]]
    assert _is_mapped(loaded["f"]._storage.data)
    assert not _is_mapped(loaded["i"]._storage.data)


def test_tensor_save_rejects_non_tensors(tmp_path: Path, kael_mod: Any) -> None:
    with pytest.raises(FormatError, match="value"):
        kael_mod.io.save_safetensors({"w": np.zeros(2)}, tmp_path / "x.safetensors")
    with pytest.raises(FormatError, match="value"):
        kael_mod.io.save_safetensors([1], tmp_path / "x.safetensors")
    assert _only(tmp_path) == []


def test_tensor_round_trip_through_the_reference_package(tmp_path: Path, kael_mod: Any) -> None:
    stnp = pytest.importorskip("safetensors.numpy")
    tensors = {f"{d}{i}": kael_mod.from_numpy(_sample(d, s, i)) for d in REF_DTYPES for i, s in enumerate(SHAPES)}
    ours = tmp_path / "kael.safetensors"
    kael_mod.save_safetensors(tensors, ours)
    ref = stnp.load_file(str(ours))
    theirs = tmp_path / "ref.safetensors"
    stnp.save_file(ref, str(theirs))
    for m in (False, True):
        back = kael_mod.load_safetensors(theirs, mmap=m)
        assert set(back) == set(tensors)
        for name, t in tensors.items():
            assert back[name].dtype is t.dtype and _same(_bits(back[name]), _bits(t))


def test_tensor_save_of_non_contiguous_tensors(tmp_path: Path, kael_mod: Any) -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kael_mod.transpose(kael_mod.from_numpy(base), 0, 1)
    path = tmp_path / "nc.safetensors"
    kael_mod.save_safetensors({"t": t}, path)
    loaded, _ = load_arrays(path)
    assert _same(loaded["t"][0], np.ascontiguousarray(base.T))


def test_tensor_load_rejects_a_bad_device_before_reading(tmp_path: Path, kael_mod: Any) -> None:
    with pytest.raises(kael_mod.DeviceError):
        kael_mod.load_safetensors(tmp_path / "missing.safetensors", device="not a device")
