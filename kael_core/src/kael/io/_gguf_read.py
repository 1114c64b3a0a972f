"""Reading GGUF files: a strict parser over a read-only memory map.

`read_gguf(path)` maps the file, validates the header, the metadata and the tensor
infos against every rule of NOTE [gguf validation] (in `_gguf_format`) and returns a
`GGUFFile` whose tensors' `data` are read-only NumPy views of the mapping: nothing but
the metadata is copied. Every count and length read from the file is compared with
the bytes that remain before anything is allocated for it, so a hostile file costs at
most about its own size in memory.

The mapping stays open while the `GGUFFile` is open; `close()` (or leaving its `with`
block) releases it, unless arrays taken from it are still alive, in which case the
mapping goes when the last of them does (an open mapping can never be unmapped under a
live array, so reading one never faults on account of close()).
"""

from __future__ import annotations

import mmap
import os
import reprlib
import stat
import struct
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NoReturn

import numpy as np

from kael._errors import FormatError

from ._gguf_format import (
    DEFAULT_ALIGNMENT,
    MAGIC,
    MAX_ARRAY_DEPTH,
    MAX_DIMS,
    MAX_NAME_BYTES,
    OTHER_GGML_TYPES,
    SCALAR_DTYPES,
    TENSOR_TYPE_NAMES,
    TENSOR_TYPES_BY_ID,
    VALUE_TYPES,
    VERSIONS,
    data_shape,
    tensor_nbytes,
)

__all__ = ["GGUFFile", "GGUFTensor", "read_gguf"]

_HEADER_BYTES = 24  # magic, version, tensor count, kv count
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a one-byte key, value type, a one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length, a one-byte name, n_dims, type, offset
_MAX_KEY_BYTES = 65535  # the specification's limit
_U64 = struct.Struct("<Q")
_LIMIT = 2**63  # ne, element counts and byte counts must fit a signed 64-bit integer (llama.cpp's int64_t)

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother = 120, 120


def _short(x: object) -> str:
    return _REPR.repr(x)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file.

    `shape` is NumPy's row-major order (GGUF's ne reversed); `data` is a read-only view
    of the file: uint8 [..., K/QK*B] for the block types of kael.quant.formats (QK values
    in B bytes per block: 32 for the legacy types and IQ4_NL, 256 for K-quants and IQ4_XS), uint16
    bit patterns of `shape` for BF16, and an array of `shape` of the element type
    otherwise. `offset` is the absolute file offset of its first byte.
    """

    name: str
    type: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    data: np.ndarray[Any, Any] = field(repr=False, compare=False)


class GGUFFile:
    """A parsed GGUF file: version, alignment, metadata (values and type names), tensors.

    A context manager: `with read_gguf(path) as f: ...` closes the mapping at the end.
    """

    def __init__(
        self,
        path: str,
        version: int,
        alignment: int,
        metadata: dict[str, Any],
        metadata_types: dict[str, str],
        tensors: dict[str, GGUFTensor],
        data_offset: int,
        mapping: mmap.mmap | None,
    ) -> None:
        self.path = path
        self.version = version
        self.alignment = alignment
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors
        self.data_offset = data_offset  # absolute offset of the data section
        self._mapping = mapping
        self._address: int | None = None  # where the mapping starts in memory (release_pages)

    def close(self) -> None:
        """Release the mapping (at once, or when the last array from it goes)."""
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # arrays still reference it: they keep it alive until they go
                pass

    def release_pages(self, arr: np.ndarray | None = None) -> None:
        """Drop the pages of the mapping under ``arr`` (a view of this file's data; None: the whole file) from
        the process's memory.

        For a loader that has copied ``arr``: the pages stay in the page cache and come back if read again,
        but the process no longer counts them, so a copying load peaks at its copy and the file's pages not yet
        copied, not at both whole. A no-op for an array from elsewhere, or where the OS has no MADV_DONTNEED."""
        m = self._mapping
        if m is None or not hasattr(mmap, "MADV_DONTNEED") or (arr is not None and arr.nbytes == 0):
            return
        if arr is None:
            m.madvise(mmap.MADV_DONTNEED)
            return
        if self._address is None:
            view = np.frombuffer(m, np.uint8)  # (an export of the mapping: dropped at once)
            self._address = int(view.ctypes.data)
            del view
        start = int(arr.ctypes.data) - self._address
        if not 0 <= start < len(m):
            return
        page = mmap.PAGESIZE
        lo, hi = start // page * page, min(len(m), -(-(start + arr.nbytes) // page) * page)
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GGUFFile({self.path!r}, version={self.version}, alignment={self.alignment}, "
            f"{len(self.metadata)} metadata keys, {len(self.tensors)} tensors)"
        )


class _Parser:
    """A cursor over the mapped bytes; every read checks the bytes that remain first."""

    def __init__(self, buf: Any, size: int, where: str) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0
        self.where = where

    def fail(self, what: str, detail: str) -> NoReturn:
        raise FormatError(f"{self.where}: {what}: {detail}")

    def need(self, n: int, what: str) -> None:
        left = self.size - self.pos
        if n > left:
            self.fail(what, f"needs {n} bytes at offset {self.pos}, but the file ends {left} bytes later (truncated?)")

    def unpack(self, fmt: str, n: int, what: str) -> int:
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return int(v)

    def u32(self, what: str) -> int:
        return self.unpack("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        self.need(n, f"{what} ({n} bytes)")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(what, f"{_short(raw)} is not valid UTF-8 ({e.reason} at byte {e.start})")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row: string() inlined, as vocabularies hold 10**5 of them."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for i in range(count):
                if size - pos < 8:
                    self.pos = pos
                    self.need(8, f"{what}[{i}] length")
                (n,) = unpack(buf, pos)
                pos += 8
                if n > size - pos:
                    self.pos = pos
                    self.need(n, f"{what}[{i}] ({n} bytes)")
                append(buf[pos : pos + n].decode("utf-8"))
                pos += n
        except UnicodeDecodeError as e:
            raw = bytes(buf[pos : pos + n])
            self.fail(f"{what}[{len(out)}]", f"{_short(raw)} is not valid UTF-8 ({e.reason} at byte {e.start})")
        self.pos = pos
        return out

    def name(self, what: str, max_bytes: int) -> str:
        """A key or tensor name: a non-empty string without NUL of at most `max_bytes` bytes."""
        start = self.pos
        s = self.string(what)
        n = self.pos - start - 8
        if n == 0:
            self.fail(what, "is empty, expected a non-empty name")
        if n > max_bytes:
            self.fail(what, f"{_short(s)} has {n} bytes, more than the limit of {max_bytes}")
        if "\0" in s:
            self.fail(what, f"{_short(s)} contains a NUL character")
        return s

    def value_type(self, what: str) -> str:
        t = self.u32(what)
        if t not in VALUE_TYPES:
            self.fail(what, f"{t} is not a GGUF value type; expected 0 to {len(VALUE_TYPES) - 1}")
        return VALUE_TYPES[t]

    def value(self, vtype: str, what: str, depth: int = 0) -> tuple[Any, str]:
        """Read one value of type `vtype`; return it and its full type name."""
        if vtype == "string":
            return self.string(what), "string"
        if vtype == "array":
            return self.array(what, depth + 1)
        dt = SCALAR_DTYPES[vtype]
        v = self.scalars(dt, 1, what)[0]
        if vtype == "bool":
            return self.check_bools([v], what)[0], "bool"
        return v, vtype

    def scalars(self, dt: np.dtype[Any], count: int, what: str) -> list[Any]:
        self.need(count * dt.itemsize, what)
        values: list[Any] = np.frombuffer(self.buf, dt, count, self.pos).tolist()
        self.pos += count * dt.itemsize
        return values

    def check_bools(self, values: list[int], what: str) -> list[bool]:
        for v in values:
            if v > 1:
                self.fail(what, f"the bool byte {v} is neither 0 nor 1")
        return [bool(v) for v in values]

    def array(self, what: str, depth: int) -> tuple[list[Any], str]:
        if depth > MAX_ARRAY_DEPTH:
            self.fail(what, f"arrays nest more than {MAX_ARRAY_DEPTH} deep")
        etype = self.value_type(f"{what} element type")
        count = self.u64(f"{what} count")
        smallest = SCALAR_DTYPES[etype].itemsize if etype in SCALAR_DTYPES else (8 if etype == "string" else 12)
        left = self.size - self.pos
        if count * smallest > left:
            self.fail(
                f"{what} count",
                f"{count} items of {etype} need at least {count * smallest} bytes, but only {left} remain",
            )
        if etype in SCALAR_DTYPES:
            items = self.scalars(SCALAR_DTYPES[etype], count, what)
            return (self.check_bools(items, what) if etype == "bool" else items), f"array[{etype}]"
        if etype == "string":
            return self.strings(count, what), "array[string]"
        out: list[Any] = []
        inner = "array"
        for i in range(count):
            v, name = self.value(etype, f"{what}[{i}]", depth)
            if i == 0:
                inner = name
            elif name != inner:
                self.fail(f"{what}[{i}]", f"has type {name}, but the arrays before it are {inner}")
            out.append(v)
        return out, f"array[{inner}]"


def _alignment(metadata: dict[str, Any], types: dict[str, str], p: _Parser) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    a, t = metadata["general.alignment"], types["general.alignment"]
    if t != "uint32":
        p.fail("metadata 'general.alignment'", f"has type {t}, expected uint32")
    if a == 0 or a & (a - 1):
        p.fail("metadata 'general.alignment'", f"{a} is not a power of two")
    return int(a)


@dataclass(frozen=True)
class _Info:
    name: str
    ne: tuple[int, ...]
    type_id: int
    offset: int


def _tensor_info(p: _Parser, index: int) -> _Info:
    name = p.name(f"tensor #{index} name", MAX_NAME_BYTES)
    what = f"tensor {name!r}"
    n_dims = p.u32(f"{what} n_dims")
    if n_dims > MAX_DIMS:
        p.fail(f"{what} n_dims", f"{n_dims}, expected at most {MAX_DIMS}")
    ne = tuple(p.u64(f"{what} ne[{j}]") for j in range(n_dims))
    for j, d in enumerate(ne):
        if not 1 <= d < _LIMIT:
            p.fail(f"{what} ne[{j}]", f"{d}, expected 1 <= ne < 2**63")
    type_id = p.u32(f"{what} type")
    offset = p.u64(f"{what} offset")
    return _Info(name, ne, type_id, offset)


def _tensor(p: _Parser, info: _Info, data_start: int, alignment: int) -> GGUFTensor:
    what = f"tensor {info.name!r}"
    t = TENSOR_TYPES_BY_ID.get(info.type_id)
    if t is None:
        known = OTHER_GGML_TYPES.get(info.type_id)
        detail = f"GGML type {info.type_id} ({known})" if known else f"{info.type_id} is not a GGML type id"
        p.fail(f"{what} type", f"{detail}; kael reads {', '.join(TENSOR_TYPE_NAMES)}")
    numel = 1
    for d in info.ne:
        numel *= d
    if numel >= _LIMIT:
        p.fail(f"{what} ne", f"{list(info.ne)} has {numel} elements, expected fewer than 2**63")
    ne0 = info.ne[0] if info.ne else 1
    if ne0 % t.block_size:
        p.fail(f"{what} ne[0]", f"{ne0} is not a multiple of {t.name}'s block size {t.block_size}")
    shape = tuple(reversed(info.ne))
    nbytes = tensor_nbytes(t, shape)
    if info.offset % alignment:
        p.fail(f"{what} offset", f"{info.offset} is not a multiple of the alignment {alignment}")
    begin = data_start + info.offset
    if begin + nbytes > p.size:
        p.fail(
            f"{what} offset",
            f"its {nbytes} bytes at file offset {begin} run past the end of the file ({p.size} bytes)",
        )
    count = nbytes // t.dtype.itemsize
    data = np.frombuffer(p.buf, t.dtype, count, begin).reshape(data_shape(t, shape))
    return GGUFTensor(info.name, t.name, shape, begin, nbytes, data)


def _check_overlaps(p: _Parser, tensors: dict[str, GGUFTensor]) -> None:
    previous: GGUFTensor | None = None
    for t in sorted(tensors.values(), key=lambda t: t.offset):
        if previous is not None and t.offset < previous.offset + previous.nbytes:
            p.fail(
                f"tensor {t.name!r} offset",
                f"its bytes [{t.offset}, {t.offset + t.nbytes}) overlap tensor {previous.name!r}'s "
                f"[{previous.offset}, {previous.offset + previous.nbytes})",
            )
        previous = t


def _parse(p: _Parser) -> tuple[int, int, dict[str, Any], dict[str, str], dict[str, GGUFTensor], int]:
    p.need(_HEADER_BYTES, "header")
    magic = bytes(p.buf[0:4])
    if magic != MAGIC:
        p.fail("magic", f"{magic!r}, expected {MAGIC!r} (not a GGUF file)")
    p.pos = 4
    version = p.u32("version")
    if version not in VERSIONS:
        hint = " (GGUF 1 is not supported)" if version == 1 else ""
        if version > 0xFFFF and version & 0xFFFF == 0:
            hint = " (a big-endian file? kael reads little-endian GGUF only)"
        p.fail("version", f"{version}, expected 2 or 3{hint}")
    n_tensors = p.u64("tensor count")
    n_kv = p.u64("metadata count")
    left = p.size - p.pos
    if n_kv * _MIN_KV_BYTES > left:
        p.fail("metadata count", f"{n_kv} keys need at least {n_kv * _MIN_KV_BYTES} bytes, but {left} remain")
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for i in range(n_kv):
        key = p.name(f"metadata key #{i}", _MAX_KEY_BYTES)
        if key in metadata:
            p.fail(f"metadata key #{i}", f"{key!r} appears more than once")
        vtype = p.value_type(f"metadata {key!r} type")
        metadata[key], types[key] = p.value(vtype, f"metadata {key!r}")
    alignment = _alignment(metadata, types, p)
    left = p.size - p.pos
    if n_tensors * _MIN_TENSOR_INFO_BYTES > left:
        p.fail(
            "tensor count",
            f"{n_tensors} tensor infos need at least {n_tensors * _MIN_TENSOR_INFO_BYTES} bytes, but {left} remain",
        )
    infos: dict[str, _Info] = {}
    for i in range(n_tensors):
        info = _tensor_info(p, i)
        if info.name in infos:
            p.fail(f"tensor #{i} name", f"{info.name!r} appears more than once")
        infos[info.name] = info
    data_start = -(-p.pos // alignment) * alignment
    tensors = {name: _tensor(p, info, data_start, alignment) for name, info in infos.items()}
    _check_overlaps(p, tensors)
    return version, alignment, metadata, types, tensors, data_start


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse and validate the GGUF file at `path` (NOTE [gguf validation]); map its data.

    Any violation is a `kael.FormatError` naming the file, the field, the value and
    what was expected; nothing sized by the file is allocated before it is checked.
    """
    where = f"GGUF file {os.fspath(path)!r}"
    if not stat.S_ISREG(os.stat(path).st_mode):  # before open: opening a FIFO would block
        raise FormatError(f"{where}: not a regular file")
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{where}: not a regular file")
        size = st.st_size
        if size < _HEADER_BYTES:
            raise FormatError(f"{where}: header: the file has {size} bytes, fewer than the {_HEADER_BYTES}-byte header")
        try:
            mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        except ValueError as e:  # the file shrank below the size fstat gave
            raise FormatError(f"{where}: cannot map {size} bytes: {e}") from None
    try:
        version, alignment, metadata, types, tensors, data_start = _parse(_Parser(mapping, size, where))
    except BaseException:
        _release(mapping)
        raise
    return GGUFFile(os.fspath(path), version, alignment, metadata, types, tensors, data_start, mapping)


def _release(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:  # a traceback may still hold an array view; it frees the map later
        pass
