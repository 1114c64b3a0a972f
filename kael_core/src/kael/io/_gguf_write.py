"""Writing GGUF files (version 3, little-endian), atomically.

`write_gguf(path, metadata, tensors)` validates everything first (keys, value types and
ranges, tensor names, types, shapes and data sizes: the rules of NOTE [gguf validation]
in `_gguf_format`), then writes the header and the metadata, the tensor infos, padding
to the alignment, and each tensor's bytes followed by padding to the alignment (also
after the last one, as llama.cpp's writer does), into a temporary file beside `path`
that is fsynced and renamed over it. A failure leaves neither a partial file nor the
temporary one. `general.alignment` is written (as uint32) when the alignment is not 32.

Metadata values are Python values, typed by `GGUFValue(type, value)` where the default
mapping is not the one wanted: str -> string, bool -> bool, int -> uint32 when
0 <= v < 2**32 else int64, float -> float32, list[str] -> array[string],
list[int] -> array[int32], list[float] -> array[float32], list[bool] -> array[bool].
"""

from __future__ import annotations

import io
import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

import numpy as np

from kael._errors import FormatError

from ._atomic import atomic_write
from ._gguf_format import (
    DEFAULT_ALIGNMENT,
    MAGIC,
    MAX_ARRAY_DEPTH,
    MAX_DIMS,
    MAX_NAME_BYTES,
    SCALAR_DTYPES,
    TENSOR_TYPES,
    VALUE_TYPE_IDS,
    WRITE_VERSION,
    TensorType,
    data_shape,
    tensor_nbytes,
)

__all__ = ["GGUFValue", "write_gguf"]

_MAX_KEY_BYTES = 65535
_LIMIT = 2**63
_INT_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 2**8),
    "int8": (-(2**7), 2**7),
    "uint16": (0, 2**16),
    "int16": (-(2**15), 2**15),
    "uint32": (0, 2**32),
    "int32": (-(2**31), 2**31),
    "uint64": (0, 2**64),
    "int64": (-(2**63), 2**63),
}
_FLOAT_FORMATS = {"float32": "<f", "float64": "<d"}


@dataclass(frozen=True)
class GGUFValue:
    """A metadata value with its GGUF type pinned: `GGUFValue("uint64", 7)`.

    `type` is a scalar type name ("uint8" ... "float64", "bool"), "string", or
    "array[T]" for any such T, arrays included ("array[array[int32]]"; "array[array]" is
    an empty array of arrays). GGUF allows nested arrays and the `gguf` package reads
    them, but llama.cpp refuses a file that holds one.
    """

    type: str
    value: Any


def _fail(where: str, what: str, detail: str) -> NoReturn:
    raise FormatError(f"{where}: {what}: {detail}")


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_float(v: object) -> bool:
    return isinstance(v, (float, np.floating))


def _is_bool(v: object) -> bool:
    return isinstance(v, (bool, np.bool_))


def _infer(value: Any, where: str, what: str) -> str:
    """The type name the default mapping gives a plain Python value."""
    if isinstance(value, str):
        return "string"
    if _is_bool(value):
        return "bool"
    if _is_int(value):
        return "uint32" if 0 <= value < 2**32 else "int64"
    if _is_float(value):
        return "float32"
    if isinstance(value, (list, tuple)):
        for check, name in ((lambda x: isinstance(x, str), "string"), (_is_bool, "bool"), (_is_int, "int32")):
            if value and all(check(x) for x in value):
                return f"array[{name}]"
        if value and all(_is_float(x) or _is_int(x) for x in value):
            return "array[float32]"
        _fail(
            where,
            what,
            f"cannot infer a GGUF array type for {_describe(value)}; "
            "expected a non-empty list of str, bool, int or float, or a GGUFValue naming the type",
        )
    _fail(where, what, f"{type(value).__name__} is not a GGUF value; expected str, bool, int, float, list or GGUFValue")


def _describe(value: list[Any] | tuple[Any, ...]) -> str:
    kinds = sorted({type(x).__name__ for x in value})
    return f"a list of {len(value)} items" + (f" of {', '.join(kinds)}" if kinds else "")


def _element_type(vtype: str) -> str | None:
    """T for "array[T]", None for scalar and string types."""
    if vtype.startswith("array[") and vtype.endswith("]"):
        return vtype[6:-1]
    return None


def _check_type(vtype: object, where: str, what: str, depth: int = 0) -> str:
    if not isinstance(vtype, str):
        _fail(where, what, f"the type {vtype!r} is not a string")
    inner = _element_type(vtype)
    if inner is not None:
        if depth >= MAX_ARRAY_DEPTH:
            _fail(where, what, f"{vtype!r} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        _check_type(inner, where, what, depth + 1)
    elif vtype == "array" and depth > 0:
        pass  # "array[array]": an empty array of arrays, as the reader names it
    elif vtype not in SCALAR_DTYPES and vtype != "string":
        _fail(where, what, f"unknown GGUF type {vtype!r}; expected one of {', '.join(VALUE_TYPE_IDS)} or array[T]")
    return vtype


def _encode_string(s: object, where: str, what: str) -> bytes:
    if not isinstance(s, str):
        _fail(where, what, f"expected a str, got {type(s).__name__}")
    try:
        raw = s.encode("utf-8")
    except UnicodeEncodeError:
        _fail(where, what, f"{s!r} is not encodable as UTF-8 (a lone surrogate)")
    return struct.pack("<Q", len(raw)) + raw


def _encode_scalar(vtype: str, v: Any, where: str, what: str) -> bytes:
    if vtype == "bool":
        if not _is_bool(v):
            _fail(where, what, f"a bool value must be True or False, got {v!r}")
        return b"\x01" if v else b"\x00"
    if vtype in _INT_RANGES:
        lo, hi = _INT_RANGES[vtype]
        if not _is_int(v) or not lo <= v < hi:
            _fail(where, what, f"{v!r} is not a {vtype} (expected an int in [{lo}, {hi - 1}])")
        return np.array(v, SCALAR_DTYPES[vtype]).tobytes()
    if not (_is_float(v) or _is_int(v)):
        _fail(where, what, f"{v!r} is not a number for {vtype}")
    x = float(v)
    if vtype == "float32" and math.isfinite(x) and abs(x) > float(np.finfo(np.float32).max):
        _fail(where, what, f"{v!r} is beyond float32's range")
    return struct.pack(_FLOAT_FORMATS[vtype], x)


def _encode_scalars(vtype: str, v: list[Any] | tuple[Any, ...], where: str, what: str) -> bytes:
    """Many values of one scalar type, checked and packed by NumPy (token ids, scores)."""
    if vtype == "bool" or not v:
        return b"".join(_encode_scalar(vtype, x, where, f"{what}[{i}]") for i, x in enumerate(v))
    if vtype in _INT_RANGES:
        if not all(_is_int(x) for x in v):
            i = next(i for i, x in enumerate(v) if not _is_int(x))
            _encode_scalar(vtype, v[i], where, f"{what}[{i}]")  # raises, naming the item
        ints = [int(x) for x in v]
        lo, hi = min(ints), max(ints)
        if lo < _INT_RANGES[vtype][0] or hi >= _INT_RANGES[vtype][1]:
            i = ints.index(lo if lo < _INT_RANGES[vtype][0] else hi)
            _encode_scalar(vtype, v[i], where, f"{what}[{i}]")
        return np.array(ints, SCALAR_DTYPES[vtype]).tobytes()
    for i, x in enumerate(v):
        if not (_is_float(x) or _is_int(x)):
            _encode_scalar(vtype, x, where, f"{what}[{i}]")
    xs = np.array([float(x) for x in v], np.float64)
    if vtype == "float32":
        big = np.isfinite(xs) & (np.abs(xs) > float(np.finfo(np.float32).max))
        if big.any():
            i = int(np.argmax(big))
            _encode_scalar(vtype, v[i], where, f"{what}[{i}]")
    return xs.astype(SCALAR_DTYPES[vtype]).tobytes()


def _encode_value(vtype: str, v: Any, where: str, what: str) -> bytes:
    """The bytes of value `v` of the checked type `vtype`, without its type id."""
    if vtype == "string":
        return _encode_string(v, where, what)
    inner = _element_type(vtype)
    if inner is None:
        return _encode_scalar(vtype, v, where, what)
    if not isinstance(v, (list, tuple)):
        _fail(where, what, f"an {vtype} value must be a list, got {type(v).__name__}")
    if inner == "array" and v:
        _fail(where, what, f"an array[array] value must be empty; name the inner type (array[array[T]]), got {v!r}")
    base = "array" if _element_type(inner) is not None else inner
    head = struct.pack("<IQ", VALUE_TYPE_IDS[base], len(v))
    if inner in SCALAR_DTYPES:
        return head + _encode_scalars(inner, v, where, what)
    return head + b"".join(_encode_value(inner, x, where, f"{what}[{i}]") for i, x in enumerate(v))


def _typed(value: Any, where: str, what: str) -> tuple[str, Any]:
    if isinstance(value, GGUFValue):
        return _check_type(value.type, where, what), value.value
    return _infer(value, where, what), value


def _encode_name(name: object, where: str, what: str, max_bytes: int) -> bytes:
    if not isinstance(name, str):
        _fail(where, what, f"expected a str, got {type(name).__name__}")
    raw = _encode_string(name, where, what)
    if len(raw) == 8:
        _fail(where, what, "is empty, expected a non-empty name")
    if len(raw) - 8 > max_bytes:
        _fail(where, what, f"{name!r} has {len(raw) - 8} bytes, more than the limit of {max_bytes}")
    if "\0" in name:
        _fail(where, what, f"{name!r} contains a NUL character")
    return raw


def _metadata_bytes(metadata: Mapping[str, Any], alignment: int, where: str) -> tuple[bytes, int]:
    """The encoded key/value pairs and their count; `general.alignment` added when not 32."""
    if not isinstance(metadata, Mapping):
        _fail(where, "metadata", f"expected a mapping of str to values, got {type(metadata).__name__}")
    items = dict(metadata)
    if "general.alignment" in items:
        vtype, v = _typed(items["general.alignment"], where, "metadata 'general.alignment'")
        if vtype != "uint32" or v != alignment:
            _fail(
                where,
                "metadata 'general.alignment'",
                f"{vtype} {v!r} disagrees with alignment={alignment} (write it as uint32, or leave it out)",
            )
    elif alignment != DEFAULT_ALIGNMENT:
        items["general.alignment"] = GGUFValue("uint32", alignment)
    out = io.BytesIO()
    for key, value in items.items():
        what = f"metadata {key!r}"
        out.write(_encode_name(key, where, f"metadata key {key!r}", _MAX_KEY_BYTES))
        vtype, v = _typed(value, where, what)
        out.write(struct.pack("<I", VALUE_TYPE_IDS["array" if _element_type(vtype) else vtype]))
        out.write(_encode_value(vtype, v, where, what))
    return out.getvalue(), len(items)


@dataclass(frozen=True)
class _Planned:
    name: str
    type: TensorType
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]
    nbytes: int


def _plan(entry: object, where: str, names: set[str]) -> _Planned:
    if not (isinstance(entry, tuple) and len(entry) == 4):
        _fail(where, "tensors", f"each tensor must be (name, type, shape, data), got {type(entry).__name__}")
    name, tname, shape, data = entry
    _encode_name(name, where, "tensor name", MAX_NAME_BYTES)
    what = f"tensor {name!r}"
    if name in names:
        _fail(where, what, "appears more than once")
    names.add(name)
    if tname not in TENSOR_TYPES:
        _fail(where, f"{what} type", f"{tname!r} is not one of {', '.join(TENSOR_TYPES)}")
    t = TENSOR_TYPES[tname]
    if not (isinstance(shape, (tuple, list)) and all(_is_int(d) for d in shape)):
        _fail(where, f"{what} shape", f"expected a tuple of ints, got {shape!r}")
    shape = tuple(int(d) for d in shape)
    if len(shape) > MAX_DIMS or not all(1 <= d < _LIMIT for d in shape):
        _fail(where, f"{what} shape", f"{shape}: expected at most {MAX_DIMS} dims, each >= 1 and < 2**63")
    numel = math.prod(shape)
    if numel >= _LIMIT:
        _fail(where, f"{what} shape", f"{shape} has {numel} elements, expected fewer than 2**63")
    last = shape[-1] if shape else 1
    if last % t.block_size:
        _fail(where, f"{what} shape", f"the last dim {last} is not a multiple of {tname}'s block size {t.block_size}")
    if not isinstance(data, np.ndarray):
        _fail(where, f"{what} data", f"expected a NumPy array, got {type(data).__name__}")
    if data.dtype.kind != t.dtype.kind or data.dtype.itemsize != t.dtype.itemsize:
        _fail(where, f"{what} data", f"dtype {data.dtype} does not hold {tname}; expected {t.dtype.name}")
    nbytes = tensor_nbytes(t, shape)
    if data.nbytes != nbytes:
        _fail(
            where,
            f"{what} data",
            f"{data.nbytes} bytes (shape {data.shape}), but {tname} {list(shape)} needs {nbytes} "
            f"(an array of shape {data_shape(t, shape)})",
        )
    return _Planned(name, t, shape, data, nbytes)


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def _zeros(f: BinaryIO, n: int) -> None:
    """Padding of n zero bytes, skipped over (a hole the file system reads as zeros), not built in memory:
    a file's alignment may be as large as 2**31, and a 62-byte input must not cost gigabytes."""
    if n:
        f.seek(n, io.SEEK_CUR)


def _write_array(f: BinaryIO, a: np.ndarray[Any, Any]) -> None:
    flat = np.ascontiguousarray(a.reshape(-1), dtype=a.dtype.newbyteorder("<"))
    f.write(flat.view(np.uint8).data)


def write_gguf(
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any],
    tensors: Iterable[tuple[str, str, tuple[int, ...], np.ndarray[Any, Any]]],
    *,
    alignment: int = DEFAULT_ALIGNMENT,
) -> None:
    """Write a GGUF v3 file: `metadata` (values or `GGUFValue`s), then `tensors` in order.

    Each tensor is (name, GGUF type name, row-major shape, data): uint8 blocks
    [..., K/32*B] for Q8_0/Q4_0, uint16 bit patterns for BF16, an array of the element
    type otherwise (any shape with the right number of bytes). Atomic; every input is
    validated (a `kael.FormatError` naming the field) before the file is created.
    """
    where = f"write_gguf {os.fspath(path)!r}"
    if not _is_int(alignment) or alignment < 1 or alignment & (alignment - 1) or alignment >= 2**32:
        _fail(where, "alignment", f"{alignment!r} is not a power of two below 2**32")
    alignment = int(alignment)
    kv, n_kv = _metadata_bytes(metadata, alignment, where)
    names: set[str] = set()
    planned = [_plan(e, where, names) for e in tensors]
    header = io.BytesIO()
    header.write(MAGIC + struct.pack("<IQQ", WRITE_VERSION, len(planned), n_kv) + kv)
    offset = 0
    for p in planned:
        header.write(_encode_string(p.name, where, "tensor name"))
        header.write(struct.pack("<I", len(p.shape)))
        header.write(struct.pack(f"<{len(p.shape)}Q", *reversed(p.shape)))
        header.write(struct.pack("<IQ", p.type.id, offset))
        offset += p.nbytes + _pad(p.nbytes, alignment)
    head = header.getvalue()
    with atomic_write(path) as f:
        f.write(head)
        _zeros(f, _pad(len(head), alignment))
        for p in planned:
            _write_array(f, p.data)
            _zeros(f, _pad(p.nbytes, alignment))
        f.truncate()  # the file ends after the last padding, skipped or not
