"""kael.io.write_gguf: files that the `gguf` package's reader and llama.cpp's own parser
(ggml, through llama-cpp-python) read as written; round trips through read_gguf over
generated metadata and tensors (hypothesis); bad input refused before the file exists.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import ggml_gguf
import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.io import (
    GGUFValue,
    _gguf_write,  # internal: the data writer, replaced to fail mid-file
    read_gguf,
    write_gguf,
)

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402
from gguf.quants import quantize  # noqa: E402

RNG = np.random.default_rng(1)
X = RNG.standard_normal((4, 64)).astype(np.float32)

TYPED: dict[str, GGUFValue] = {
    "v.u8": GGUFValue("uint8", 200),
    "v.i8": GGUFValue("int8", -100),
    "v.u16": GGUFValue("uint16", 60000),
    "v.i16": GGUFValue("int16", -30000),
    "v.u32": GGUFValue("uint32", 4000000000),
    "v.i32": GGUFValue("int32", -2000000000),
    "v.f32": GGUFValue("float32", 0.25),
    "v.bool": GGUFValue("bool", True),
    "v.str": GGUFValue("string", "ünïcødé ✓"),
    "v.u64": GGUFValue("uint64", 2**64 - 1),
    "v.i64": GGUFValue("int64", -(2**63)),
    "v.f64": GGUFValue("float64", math.e),
    "v.a_u8": GGUFValue("array[uint8]", [1, 2, 255]),
    "v.a_i64": GGUFValue("array[int64]", [-(2**63), 2**63 - 1]),
    "v.a_f64": GGUFValue("array[float64]", [0.1, -2.5]),
    "v.a_bool": GGUFValue("array[bool]", [False, True]),
    "v.a_str": GGUFValue("array[string]", ["", "a b", "ç"]),
    "v.a_empty": GGUFValue("array[int32]", []),
}
TYPED_TYPES = {k: v.type for k, v in TYPED.items()}

INFERRED: dict[str, tuple[Any, str]] = {
    "general.architecture": ("llama", "string"),
    "i.small": (7, "uint32"),
    "i.big": (2**32, "int64"),
    "i.neg": (-1, "int64"),
    "i.flag": (False, "bool"),
    "i.float": (0.5, "float32"),
    "i.strs": (["a", "b"], "array[string]"),
    "i.ints": ([1, -2, 3], "array[int32]"),
    "i.floats": ([0.5, 1], "array[float32]"),
    "i.bools": ([True, False], "array[bool]"),
    "i.np": (np.int64(3), "uint32"),
}


def _tensors() -> list[tuple[str, str, tuple[int, ...], np.ndarray[Any, Any]]]:
    return [
        ("w.f32", "F32", (4, 64), X),
        ("w.f16", "F16", (4, 64), X.astype(np.float16)),
        ("w.bf16", "BF16", (4, 64), quantize(X, Q.BF16).view(np.uint16)),
        ("w.q8_0", "Q8_0", (4, 64), quantize(X, Q.Q8_0)),
        ("w.q4_0", "Q4_0", (4, 64), quantize(X, Q.Q4_0)),
        ("w.f64", "F64", (3,), np.array([1.0, -2.0, 3.5])),
        ("w.i8", "I8", (5,), np.arange(5, dtype=np.int8)),
        ("w.i16", "I16", (2, 2), np.arange(4, dtype=np.int16).reshape(2, 2)),
        ("w.i32", "I32", (1, 1, 3), np.arange(3, dtype=np.int32).reshape(1, 1, 3)),
        ("w.i64", "I64", (2, 1, 1, 1), np.array([5, -5], dtype=np.int64).reshape(2, 1, 1, 1)),
        ("w.f32_t", "F32", (3, 4), X[:4, :3].T),  # not contiguous: written in row-major order
    ]


GGUF_TYPE = {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16, "Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0}
GGUF_TYPE |= {"F64": Q.F64, "I8": Q.I8, "I16": Q.I16, "I32": Q.I32, "I64": Q.I64}


def _write_all(path: Path, alignment: int = 32) -> None:
    metadata: dict[str, Any] = {k: v for k, (v, _) in INFERRED.items()} | TYPED
    write_gguf(path, metadata, _tensors(), alignment=alignment)


def _gguf_value(field: Any) -> Any:
    return field.contents()


def _kael_value(v: Any) -> Any:
    return v.value if isinstance(v, GGUFValue) else v


@pytest.mark.parametrize("alignment", [32, 64, 1, 4096])
def test_the_gguf_package_reads_what_kael_writes(tmp_path: Path, alignment: int) -> None:
    path = tmp_path / "k.gguf"
    _write_all(path, alignment)
    r = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    want_types = {k: t for k, (_, t) in INFERRED.items()} | TYPED_TYPES
    if alignment != 32:
        want_types["general.alignment"] = "uint32"
    assert list(fields) == list(want_types)  # order kept; general.alignment added last
    for key, f in fields.items():
        names = [t.name.lower() for t in f.types]
        t = want_types[key]
        if t.startswith("array["):
            assert names[0] == "array" and f"array[{names[1]}]" == t if len(names) > 1 else t == "array[int32]"
        else:
            assert names == [t], key
        want = INFERRED[key][0] if key in INFERRED else (alignment if key == "general.alignment" else TYPED[key].value)
        got = f.contents()
        if t == "float32":
            want = float(np.float32(want))
        if t == "array[float32]":
            want = [float(np.float32(x)) for x in want]
        assert got == (int(want) if isinstance(want, np.integer) else want), key
    assert r.alignment == alignment
    ours = {name: (gtype, shape, data) for name, gtype, shape, data in _tensors()}
    assert [t.name for t in r.tensors] == list(ours)
    for t in r.tensors:
        gtype, shape, data = ours[t.name]
        assert t.tensor_type == GGUF_TYPE[gtype]
        assert tuple(reversed(t.shape.tolist())) == shape  # GGUF's ne: innermost first
        assert t.data.tobytes() == np.ascontiguousarray(data).tobytes()
        assert t.data_offset % alignment == 0
    assert path.stat().st_size % alignment == 0  # the last tensor is padded too


@pytest.mark.parametrize("alignment", [32, 256])
def test_llama_cpp_reads_what_kael_writes(tmp_path: Path, alignment: int) -> None:
    ggml_gguf.library()
    path = tmp_path / "k.gguf"
    _write_all(path, alignment)
    g = ggml_gguf.read(path)
    assert g is not None, "ggml's gguf_init_from_file refused the file (see stderr)"
    assert (g.version, g.alignment) == (3, alignment)
    with read_gguf(path) as f:
        assert {k: t for k, (t, _) in g.metadata.items()} == f.metadata_types
        for k, (t, v) in g.metadata.items():
            want = f.metadata[k]
            assert v == want if t != "float32" else v == pytest.approx(want, abs=0), k
        assert list(g.tensors) == list(f.tensors)
        for name, (type_id, offset, data) in g.tensors.items():
            t = f.tensors[name]
            assert type_id == int(GGUF_TYPE[t.type])
            assert offset == t.offset - f.data_offset
            assert data == t.data.tobytes()


def test_round_trip_through_read_gguf(tmp_path: Path) -> None:
    path = tmp_path / "k.gguf"
    _write_all(path)
    with read_gguf(path) as f:
        assert f.version == 3 and f.alignment == 32
        for k, (v, t) in INFERRED.items():
            want = [float(np.float32(x)) for x in v] if t == "array[float32]" else v
            assert f.metadata[k] == want and f.metadata_types[k] == t, k
        for k, v in TYPED.items():
            want = float(np.float32(v.value)) if v.type == "float32" else v.value
            assert f.metadata[k] == want and f.metadata_types[k] == v.type, k
        for name, gtype, shape, data in _tensors():
            t = f.tensors[name]
            assert (t.type, t.shape) == (gtype, shape)
            np.testing.assert_array_equal(t.data, data)


def test_nested_arrays_round_trip(tmp_path: Path) -> None:
    # GGUF allows them and the gguf package reads them; llama.cpp does not (it refuses the file)
    v = GGUFValue("array[array[int16]]", [[1, 2], [], [-3]])
    write_gguf(tmp_path / "n.gguf", {"n": v, "s": GGUFValue("array[array[string]]", [["a"], ["b", "c"]])}, [])
    with read_gguf(tmp_path / "n.gguf") as f:
        assert f.metadata == {"n": [[1, 2], [], [-3]], "s": [["a"], ["b", "c"]]}
        assert f.metadata_types == {"n": "array[array[int16]]", "s": "array[array[string]]"}
    assert gguf.GGUFReader(str(tmp_path / "n.gguf")).fields["s"].contents() == ["a", "b", "c"]  # it flattens


def test_an_empty_array_of_arrays_round_trips_under_the_name_the_reader_gives(tmp_path: Path) -> None:
    write_gguf(
        tmp_path / "e.gguf", {"e": GGUFValue("array[array]", []), "f": GGUFValue("array[array[array]]", [[]])}, []
    )
    with read_gguf(tmp_path / "e.gguf") as f:
        assert f.metadata == {"e": [], "f": [[]]}
        assert f.metadata_types == {"e": "array[array]", "f": "array[array[array]]"}
    with pytest.raises(kael.FormatError, match=r"an array\[array\] value must be empty"):
        write_gguf(tmp_path / "x.gguf", {"e": GGUFValue("array[array]", [[1]])}, [])
    with pytest.raises(kael.FormatError, match="unknown GGUF type 'array'"):
        write_gguf(tmp_path / "x.gguf", {"e": GGUFValue("array", [])}, [])


# --- hypothesis: generated metadata and tensors ------------------------------------------

_INT_RANGES = {
    "uint8": (0, 2**8 - 1),
    "int8": (-(2**7), 2**7 - 1),
    "uint16": (0, 2**16 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint32": (0, 2**32 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint64": (0, 2**64 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_NAME = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=16)


def _scalar(t: str) -> st.SearchStrategy[Any]:
    if t in _INT_RANGES:
        return st.integers(*_INT_RANGES[t])
    if t == "float32":
        return st.floats(width=32, allow_nan=False)
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "bool":
        return st.booleans()
    return _TEXT


_SCALAR_TYPES = [*_INT_RANGES, "float32", "float64", "bool", "string"]


@st.composite
def _typed_value(draw: st.DrawFn) -> GGUFValue:
    t = draw(st.sampled_from(_SCALAR_TYPES))
    shape = draw(st.sampled_from(["scalar", "array", "nested"]))
    if shape == "scalar":
        return GGUFValue(t, draw(_scalar(t)))
    if shape == "array":
        return GGUFValue(f"array[{t}]", draw(st.lists(_scalar(t), max_size=6)))
    return GGUFValue(f"array[array[{t}]]", draw(st.lists(st.lists(_scalar(t), max_size=3), min_size=1, max_size=3)))


_METADATA = st.dictionaries(_NAME.filter(lambda k: k != "general.alignment"), _typed_value(), max_size=6)
_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "F64", "I8", "I16", "I32", "I64"]


@st.composite
def _tensor_set(draw: st.DrawFn) -> list[tuple[str, str, tuple[int, ...], np.ndarray[Any, Any]]]:
    from kael.io._gguf_format import TENSOR_TYPES, data_shape, tensor_nbytes  # internal: sizes per type

    names = draw(st.lists(_NAME.filter(lambda n: len(n.encode()) <= 63), unique=True, max_size=4))
    out = []
    for name in names:
        t = TENSOR_TYPES[draw(st.sampled_from(_TYPES))]
        # a 0-dim BF16 tensor is valid, but the gguf package's reader fails on it (IndexError)
        shape = list(draw(st.lists(st.integers(1, 4), min_size=int(t.name == "BF16"), max_size=4)))
        if t.is_block:
            shape = [*shape[:-1], 32 * draw(st.integers(1, 2))] if shape else [32]
        nbytes = tensor_nbytes(t, tuple(shape))
        raw = np.frombuffer(draw(st.binary(min_size=nbytes, max_size=nbytes)), np.uint8)
        out.append((name, t.name, tuple(shape), raw.view(t.dtype).reshape(data_shape(t, tuple(shape)))))
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal, with floats compared by value and -0.0 told from 0.0."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return isinstance(b, float) and a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


def _flat(v: Any) -> list[Any]:
    return [y for x in v for y in _flat(x)] if isinstance(v, list) else [v]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metadata=_METADATA, tensors=_tensor_set(), alignment=st.sampled_from([1, 8, 32, 64]))
def test_generated_files_round_trip(
    tmp_path: Path, metadata: dict[str, GGUFValue], tensors: list[Any], alignment: int
) -> None:
    path = tmp_path / "h.gguf"
    write_gguf(path, metadata, tensors, alignment=alignment)
    with read_gguf(path) as f:
        assert f.alignment == alignment
        got = {k: v for k, v in f.metadata.items() if k != "general.alignment"}
        assert list(got) == list(metadata)
        for k, v in metadata.items():
            assert f.metadata_types[k] == v.type
            assert _same(v.value, got[k]), (k, v, got[k])
        assert [(t.name, t.type, t.shape) for t in f.tensors.values()] == [(n, t, s) for n, t, s, _ in tensors]
        for name, _, _, data in tensors:
            assert f.tensors[name].data.tobytes() == data.tobytes()
    reader = gguf.GGUFReader(str(path))
    for k, v in metadata.items():
        if k.startswith("GGUF."):
            continue  # the gguf package's own pseudo-fields use these names
        field = reader.fields[k]
        if v.type.startswith("array[array[") and field.types[-1].name.lower() != v.type[12:-2]:
            continue  # it takes the leaf type from the first inner array, so an empty one hides it
        want = _flat(v.value) if v.type.startswith("array[array[") else v.value
        assert _same(want, field.contents()) or (isinstance(want, list) and want == field.contents()), k
    assert [t.name for t in reader.tensors] == [n for n, _, _, _ in tensors]
    for t, (_, _, _, data) in zip(reader.tensors, tensors, strict=True):
        assert t.data.tobytes() == data.tobytes()


# --- bad input ---------------------------------------------------------------------------

Q8 = quantize(X, Q.Q8_0)
BAD: dict[str, tuple[dict[str, Any], list[Any], dict[str, Any], str]] = {
    "type name": ({}, [("w", "Q8_K", (4, 256), Q8)], {}, "tensor 'w' type: 'Q8_K' is not one of"),
    "nbytes": ({}, [("w", "Q8_0", (4, 32), Q8)], {}, "tensor 'w' data: 272 bytes (shape (4, 68)), but Q8_0 [4, 32]"),
    "dtype": ({}, [("w", "F16", (4, 64), X)], {}, "tensor 'w' data: dtype float32 does not hold F16"),
    "bf16 as float": ({}, [("w", "BF16", (4, 32), X.astype(np.float16))], {}, "does not hold BF16"),
    "block dim": ({}, [("w", "Q8_0", (2, 48), np.zeros((2, 51), np.uint8))], {}, "the last dim 48 is not a multiple"),
    "zero dim": ({}, [("w", "F32", (0, 4), np.zeros((0, 4), np.float32))], {}, "each >= 1"),
    "five dims": ({}, [("w", "F32", (1,) * 5, np.zeros((1,) * 5, np.float32))], {}, "at most 4 dims"),
    "not an array": ({}, [("w", "F32", (2,), [1.0, 2.0])], {}, "expected a NumPy array, got list"),
    "duplicate": ({}, [("w", "F32", (1,), X[0, :1]), ("w", "F32", (1,), X[0, :1])], {}, "appears more than once"),
    "long name": ({}, [("x" * 64, "F32", (1,), X[0, :1])], {}, "has 64 bytes, more than the limit of 63"),
    "NUL name": ({}, [("a\0b", "F32", (1,), X[0, :1])], {}, "contains a NUL"),
    "not a tuple": ({}, [("w", "F32")], {}, "each tensor must be (name, type, shape, data)"),
    "alignment": ({}, [], {"alignment": 48}, "alignment: 48 is not a power of two"),
    "alignment key": ({"general.alignment": 64}, [], {}, "disagrees with alignment=32"),
    "uint8 range": ({"k": GGUFValue("uint8", 256)}, [], {}, "metadata 'k': 256 is not a uint8"),
    "int32 array range": ({"k": [1, 2**31]}, [], {}, "metadata 'k'[1]: 2147483648 is not a int32"),
    "empty list": ({"k": []}, [], {}, "cannot infer a GGUF array type for a list of 0 items"),
    "mixed list": ({"k": [1, "a"]}, [], {}, "cannot infer a GGUF array type for a list of 2 items of int, str"),
    "unknown type": ({"k": GGUFValue("uint128", 1)}, [], {}, "unknown GGUF type 'uint128'"),
    "bool type": ({"k": GGUFValue("bool", 1)}, [], {}, "a bool value must be True or False, got 1"),
    "string type": ({"k": GGUFValue("string", 5)}, [], {}, "expected a str, got int"),
    "surrogate": ({"k": "\ud800"}, [], {}, "is not encodable as UTF-8"),
    "float32 range": ({"k": GGUFValue("float32", 1e39)}, [], {}, "1e+39 is beyond float32's range"),
    "object": ({"k": object()}, [], {}, "object is not a GGUF value"),
    "empty key": ({"": 1}, [], {}, "is empty"),
    "key type": ({1: 1}, [], {}, "expected a str, got int"),
    "array value": ({"k": GGUFValue("array[int8]", 3)}, [], {}, "an array[int8] value must be a list, got int"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_before_the_file_exists(tmp_path: Path, case: str) -> None:
    metadata, tensors, kwargs, fragment = BAD[case]
    path = tmp_path / "bad.gguf"
    with pytest.raises(kael.FormatError) as e:
        write_gguf(path, metadata, tensors, **kwargs)
    assert str(e.value).startswith(f"write_gguf {os.fspath(path)!r}: ")
    assert fragment in str(e.value), str(e.value)
    assert os.listdir(tmp_path) == []


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"old")

    def broken(f: Any, a: np.ndarray[Any, Any]) -> None:
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(_gguf_write, "_write_array", broken)
    with pytest.raises(OSError, match="disk full"):
        write_gguf(path, {"a": 1}, [("w", "F32", (2,), np.ones(2, np.float32))])
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["m.gguf"]


def test_replaces_an_existing_file_with_ordinary_permissions(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"old")
    write_gguf(path, {"a": 1}, [])
    with read_gguf(path) as f:
        assert f.metadata == {"a": 1} and f.tensors == {}
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert os.listdir(tmp_path) == ["m.gguf"]


def test_tensors_may_be_a_generator_and_data_any_shape_of_the_right_size(tmp_path: Path) -> None:
    blocks = quantize(X, Q.Q4_0)
    write_gguf(tmp_path / "g.gguf", {}, (t for t in [("w", "Q4_0", (4, 64), blocks.reshape(-1))]))
    with read_gguf(tmp_path / "g.gguf") as f:
        np.testing.assert_array_equal(f.tensors["w"].data, blocks)
        assert f.tensors["w"].data.shape == (4, 36)


def test_big_endian_arrays_are_written_little_endian(tmp_path: Path) -> None:
    write_gguf(tmp_path / "b.gguf", {}, [("w", "I32", (3,), np.array([1, 2, 3], ">i4"))])
    with read_gguf(tmp_path / "b.gguf") as f:
        assert f.tensors["w"].data.tolist() == [1, 2, 3]


def test_v_enum_matches_kael_type_names() -> None:
    from kael.io import GGUF_VALUE_TYPES

    assert GGUF_VALUE_TYPES == tuple(t.name.lower() for t in sorted(V, key=int))


@pytest.mark.parametrize("tname", ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_every_registry_block_type_round_trips_as_its_blocks(tmp_path: Path, tname: str) -> None:
    """Blocks are written and read back as they are; gguf's reader sees the same type, shape and values."""
    import gguf
    from gguf.quants import dequantize
    from kael.quant.formats import get_format

    fmt = get_format(tname.lower())
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (3, 2 * fmt.block_bytes), dtype=np.uint8)
    blocks.reshape(-1, fmt.block_bytes)[:, :2] = np.float16(0.25).reshape(1).view(np.uint8)  # finite leading half
    path = tmp_path / "t.gguf"
    write_gguf(path, {}, [("w", tname, (3, 2 * fmt.block_values), blocks)])
    back = read_gguf(path).tensors["w"]
    assert back.type == tname and back.shape == (3, 2 * fmt.block_values)
    np.testing.assert_array_equal(back.data, blocks)
    theirs = gguf.GGUFReader(path).tensors[0]
    assert theirs.tensor_type == Q[tname]
    with np.errstate(all="ignore"):
        want = dequantize(theirs.data, Q[tname])
        got = fmt.dequantize(np.asarray(back.data), 2 * fmt.block_values)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want))
