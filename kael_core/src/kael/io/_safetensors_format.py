"""The safetensors format on bytes: header parsing and validation, header writing.

Everything here works on `bytes` and NumPy, never on kael tensors, so the rules can
be tested (and fuzzed) on their own. A file is

    [8 bytes: header length n, little-endian u64] [n bytes: UTF-8 JSON header] [data]

and the header maps each tensor name to `{"dtype", "shape", "data_offsets"}`, plus an
optional `"__metadata__"` object of strings. NOTE [safetensors validation]: the whole
header is validated before a single data byte is read or any buffer is allocated for
it: every offset is checked against the data section's size (known from fstat), so a
hostile header can never make the loader allocate more than the file holds. Every
violation is a `FormatError` that names the file, the tensor and the rule.
"""

from __future__ import annotations

import json
import reprlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from kael._errors import FormatError

__all__ = [
    "DTYPES",
    "KAEL_TO_ST",
    "MAX_HEADER_BYTES",
    "Entry",
    "Header",
    "build_header",
    "decode_buffer",
    "decode_tensor",
    "fail",
    "finish_tensor",
    "header_length",
    "parse_header",
]

MAX_HEADER_BYTES = 100_000_000
MAX_NDIM = 64  # NumPy's limit; a kael tensor has no more dims than its NumPy storage view
_MAX_NBYTES = 2**63 - 1  # sizes must fit a signed 64-bit integer (NumPy's intp)


@dataclass(frozen=True)
class StDType:
    """One safetensors dtype: its kael dtype name and the little-endian NumPy storage dtype."""

    kael: str
    np: np.dtype[Any]

    @property
    def itemsize(self) -> int:
        return self.np.itemsize


# bfloat16 is stored as its uint16 bit patterns; BOOL as bytes checked to be 0 or 1.
DTYPES: dict[str, StDType] = {
    "F64": StDType("float64", np.dtype("<f8")),
    "F32": StDType("float32", np.dtype("<f4")),
    "F16": StDType("float16", np.dtype("<f2")),
    "BF16": StDType("bfloat16", np.dtype("<u2")),
    "I64": StDType("int64", np.dtype("<i8")),
    "I32": StDType("int32", np.dtype("<i4")),
    "I16": StDType("int16", np.dtype("<i2")),
    "I8": StDType("int8", np.dtype("i1")),
    "U8": StDType("uint8", np.dtype("u1")),
    "BOOL": StDType("bool", np.dtype("u1")),
}
KAEL_TO_ST: dict[str, str] = {v.kael: k for k, v in DTYPES.items()}
# Dtypes of the format that kael has no type for: named in the error, not called "unknown".
_UNSUPPORTED = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "E8M0", "U16", "U32", "U64", "C64", "C128")
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxlist, _REPR.maxdict, _REPR.maxother = 200, 8, 8, 200


def _short(x: object) -> str:
    """A repr that stays short for huge lists and strings from a hostile header."""
    return _REPR.repr(x)


def fail(where: str, rule: str, detail: str, tensor: str | None = None) -> NoReturn:
    """Raise the FormatError for one broken rule: `<file>: tensor 'x': <rule>: <detail>`."""
    subject = f"tensor {_short(tensor)}: " if tensor is not None else ""
    raise FormatError(f"{where}: {subject}{rule}: {detail}")


@dataclass(frozen=True)
class Entry:
    """One validated tensor entry; offsets are relative to the start of the data section."""

    name: str
    dtype: str  # safetensors name, a key of DTYPES
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Header:
    """A validated header: entries in data order, metadata, where the data section starts."""

    entries: tuple[Entry, ...]
    metadata: dict[str, str] | None
    data_start: int  # absolute file offset of the data section: 8 + header length


def header_length(prefix: bytes, file_size: int, where: str) -> int:
    """Check the 8-byte prefix against the limit and the file size; return the header length."""
    if len(prefix) < 8 or file_size < 8:
        fail(where, "header too small", f"the file has {file_size} bytes, fewer than the 8-byte length prefix")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        fail(where, "header too large", f"the header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if 8 + n > file_size:
        fail(where, "header length", f"the header length {n} runs past the end of the file ({file_size} bytes)")
    return int(n)


def _no_duplicates(where: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                fail(where, "duplicate key", f"the key {_short(key)} appears more than once in a JSON object")
            out[key] = value
        return out

    return hook


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _load_json(raw: bytes, where: str) -> Any:
    if not raw.startswith(b"{"):
        fail(where, "header start", f"the header must start with '{{', got {raw[:1]!r}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(where, "header UTF-8", f"the header is not valid UTF-8 ({e.reason} at byte {e.start})")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(where), parse_constant=_reject_constant)
    except FormatError:
        raise
    except RecursionError:
        fail(where, "header JSON", "the header is nested too deeply")
    except ValueError as e:  # json.JSONDecodeError, over-long integer literals, NaN/Infinity
        fail(where, "header JSON", f"the header is not valid JSON ({e})")


def _check_unicode(s: str, where: str, what: str, tensor: str | None = None) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        fail(where, "invalid string", f"the {what} {_short(s)} contains a lone surrogate", tensor)


def _is_int(x: object) -> bool:
    return type(x) is int  # excludes bool (a subclass of int) and floats


def _metadata(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        fail(where, "__metadata__", f"expected an object of strings, got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(v, str):
            fail(where, "__metadata__", f"the value of {_short(k)} must be a string, got {type(v).__name__}")
        _check_unicode(k, where, "metadata key")
        _check_unicode(v, where, "metadata value")
    return dict(value)


def _entry(name: str, value: object, data_size: int, where: str) -> Entry:
    _check_unicode(name, where, "tensor name")
    if not isinstance(value, dict):
        fail(where, "entry", f"expected an object, got {type(value).__name__}", name)
    if set(value) != _ENTRY_KEYS:
        missing, extra = sorted(_ENTRY_KEYS - set(value)), sorted(set(value) - _ENTRY_KEYS)
        fail(
            where, "entry keys", f"expected exactly dtype, shape, data_offsets (missing {missing}, extra {extra})", name
        )
    dtype = value["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        if isinstance(dtype, str) and dtype in _UNSUPPORTED:
            fail(where, "dtype", f"{_short(dtype)} is a safetensors dtype that kael does not support", name)
        fail(where, "dtype", f"unknown dtype {_short(dtype)}; expected one of {', '.join(DTYPES)}", name)
    shape = value["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        fail(where, "shape", f"expected a list of non-negative integers, got {_short(shape)}", name)
    if len(shape) > MAX_NDIM:
        fail(where, "shape", f"{len(shape)} dimensions, more than the limit of {MAX_NDIM}", name)
    itemsize = DTYPES[dtype].itemsize
    nonzero = itemsize  # NumPy rejects shapes whose non-zero dims overflow, even when numel is 0
    for d in shape:
        nonzero *= max(d, 1)
        if nonzero > _MAX_NBYTES:
            fail(where, "size overflow", f"shape {shape} of {dtype} overflows 64-bit sizes", name)
    nbytes = itemsize
    for d in shape:
        nbytes *= d
    offsets = value["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        fail(where, "data_offsets", f"expected [begin, end] integers, got {_short(offsets)}", name)
    begin, end = offsets
    if not 0 <= begin <= end:
        fail(where, "data_offsets", f"expected 0 <= begin <= end, got [{begin}, {end}]", name)
    if end - begin != nbytes:
        fail(
            where,
            "data_offsets",
            f"[{begin}, {end}] spans {end - begin} bytes but shape {shape} of {dtype} needs {nbytes}",
            name,
        )
    if end > data_size:
        fail(where, "data_offsets", f"end {end} is past the end of the data section ({data_size} bytes)", name)
    return Entry(name, dtype, tuple(shape), begin, end)


def parse_header(raw: bytes, data_size: int, where: str) -> Header:
    """Validate the JSON header `raw` for a data section of `data_size` bytes."""
    obj = _load_json(raw, where)
    if not isinstance(obj, dict):
        fail(where, "header JSON", f"the header must be a JSON object, got {type(obj).__name__}")
    metadata: dict[str, str] | None = None
    entries: list[Entry] = []
    for name, value in obj.items():
        if name == "__metadata__":
            metadata = _metadata(value, where)
        else:
            entries.append(_entry(name, value, data_size, where))
    entries.sort(key=lambda e: (e.begin, e.end))
    expected, previous = 0, None
    for e in entries:
        if e.begin < expected:
            fail(where, "overlap", f"[{e.begin}, {e.end}] overlaps tensor {previous!r} ending at {expected}", e.name)
        if e.begin > expected:
            fail(
                where,
                "gap",
                f"begins at {e.begin}, but the previous tensor ends at {expected}: offsets must be contiguous from 0",
                e.name,
            )
        expected, previous = e.end, e.name
    if expected != data_size:
        fail(where, "coverage", f"the tensors cover {expected} bytes of the {data_size}-byte data section")
    return Header(tuple(entries), metadata, 8 + len(raw))


def finish_tensor(arr: np.ndarray[Any, Any], entry: Entry, where: str) -> np.ndarray[Any, Any]:
    """Shape the flat array of `entry`: check and view BOOL bytes, make the byte order native."""
    arr = arr.reshape(entry.shape)
    if entry.dtype == "BOOL":
        if arr.size and int(arr.max()) > 1:
            fail(where, "BOOL values", "every byte of a BOOL tensor must be 0 or 1", entry.name)
        return arr.view(np.bool_)
    if not arr.dtype.isnative:  # big-endian hosts only
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def decode_tensor(buf: Any, offset: int, entry: Entry, where: str, *, copy: bool) -> np.ndarray[Any, Any]:
    """The array of `entry`, whose bytes start at absolute `offset` in the buffer `buf`.

    A view into `buf` when `copy` is false and `offset` is aligned for the dtype; an
    owned copy otherwise. BOOL bytes other than 0 and 1 are a FormatError. bfloat16
    comes back as uint16 bits.
    """
    st = DTYPES[entry.dtype]
    if entry.numel == 0:
        return finish_tensor(np.empty(0, st.np), entry, where)
    arr = np.frombuffer(buf, dtype=st.np, count=entry.numel, offset=offset)
    if copy or offset % st.itemsize:
        arr = arr.copy()
    return finish_tensor(arr, entry, where)


def decode_buffer(
    buf: bytes | bytearray | memoryview, where: str = "safetensors buffer", *, copy: bool = True
) -> tuple[dict[str, tuple[np.ndarray[Any, Any], str]], dict[str, str] | None]:
    """Parse a whole file held in memory: `{name: (array, kael dtype name)}` and the metadata."""
    view = memoryview(buf).cast("B")
    n = header_length(bytes(view[:8]), len(view), where)
    header = parse_header(bytes(view[8 : 8 + n]), len(view) - 8 - n, where)
    out = {
        e.name: (decode_tensor(view, header.data_start + e.begin, e, where, copy=copy), DTYPES[e.dtype].kael)
        for e in header.entries
    }
    return out, header.metadata


def build_header(
    entries: Sequence[tuple[str, str, tuple[int, ...]]], metadata: Mapping[str, str] | None, where: str
) -> tuple[bytes, list[int]]:
    """Validate names and metadata; return the padded header (prefix included) and byte sizes.

    `entries` is `(name, kael dtype name, shape)` in the order the data will follow.
    The JSON is padded with spaces to a multiple of 8 bytes, as the reference writer does,
    so the data section starts 8-aligned.
    """
    obj: dict[str, Any] = {}
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            fail(where, "__metadata__", f"expected a dict of strings, got {type(metadata).__name__}")
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                fail(where, "__metadata__", f"keys and values must be strings, got {_short(k)}: {_short(v)}")
            _check_unicode(k, where, "metadata key")
            _check_unicode(v, where, "metadata value")
        obj["__metadata__"] = dict(metadata)
    sizes: list[int] = []
    offset = 0
    for name, kael_dtype, shape in entries:
        if not isinstance(name, str):
            fail(where, "tensor name", f"names must be strings, got {_short(name)}")
        if name == "__metadata__":
            fail(where, "tensor name", "'__metadata__' is reserved for the metadata", name)
        _check_unicode(name, where, "tensor name")
        if kael_dtype not in KAEL_TO_ST:
            fail(where, "dtype", f"kael dtype {kael_dtype!r} has no safetensors equivalent", name)
        st = KAEL_TO_ST[kael_dtype]
        nbytes = DTYPES[st].itemsize
        for d in shape:
            nbytes *= d
        sizes.append(nbytes)
        obj[name] = {"dtype": st, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, sizes
