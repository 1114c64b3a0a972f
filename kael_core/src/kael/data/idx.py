"""The IDX format of MNIST: readers and a writer.

A file is a 4-byte magic (two zero bytes, a type code, the number of dimensions),
one big-endian uint32 per dimension, then exactly prod(dims) big-endian elements:

    type code  0x08 uint8   0x09 int8   0x0B int16   0x0C int32   0x0D float32   0x0E float64

NOTE [IDX validation]: the header is checked against the file's size (fstat) with
Python integers before the payload is allocated, so no file can make the reader
allocate more than it holds. A file with zero dimensions is malformed; dimensions of
size 0 are allowed by `read_idx` (an empty array), but an image file must have non-empty
images. Every violation is a `kael.FormatError` naming the file and the problem.
`parse_idx` is the same parser over bytes in memory (for tests and fuzzing).
"""

from __future__ import annotations

import io
import os
import stat
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from kael._errors import FormatError
from kael.io._atomic import atomic_write

if TYPE_CHECKING:
    from kael._tensor import Tensor

__all__ = [
    "TYPE_CODES",
    "parse_idx",
    "read_idx",
    "read_idx_array",
    "read_idx_dataset",
    "read_idx_images",
    "read_idx_labels",
    "write_idx",
]

TYPE_CODES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODE_OF: dict[str, int] = {dt.newbyteorder("=").name: code for code, dt in TYPE_CODES.items()}
_MAX_NDIM = 64  # NumPy's limit
_MAX_NBYTES = 2**63 - 1


def _fail(where: str, problem: str, detail: str) -> NoReturn:
    raise FormatError(f"{where}: {problem}: {detail}")


def _parse_header(
    head: bytes, size: int, where: str, read_dims: Callable[[int], bytes]
) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """Check the magic and dims; return (big-endian dtype, dims, header length).

    `head` holds the first (up to) 4 bytes, `read_dims(n)` returns the next n bytes.
    """
    if len(head) < 4:
        _fail(where, "truncated header", f"the file has {size} bytes, fewer than the 4-byte magic number")
    if head[0] != 0 or head[1] != 0:
        _fail(where, "wrong magic", f"the magic number must start with two zero bytes, got {head[:2].hex()}")
    code, ndim = head[2], head[3]
    if code not in TYPE_CODES:
        _fail(
            where, "unknown type code", f"0x{code:02X}; expected one of " + ", ".join(f"0x{c:02X}" for c in TYPE_CODES)
        )
    if ndim == 0:
        _fail(where, "zero dimensions", "the magic number declares 0 dimensions; expected at least 1")
    if ndim > _MAX_NDIM:
        _fail(where, "too many dimensions", f"{ndim}, more than the limit of {_MAX_NDIM}")
    header_len = 4 + 4 * ndim
    raw = read_dims(4 * ndim)
    if len(raw) != 4 * ndim:
        _fail(where, "truncated header", f"{ndim} dimensions need {header_len} header bytes; the file has {size}")
    dims = struct.unpack(f">{ndim}I", raw)
    dtype = TYPE_CODES[code]
    nonzero = dtype.itemsize  # NumPy rejects shapes whose non-zero dims overflow, even when empty
    for d in dims:
        nonzero *= max(d, 1)
    if nonzero > _MAX_NBYTES:
        _fail(where, "size overflow", f"dimensions {list(dims)} of {dtype.name} overflow 64-bit sizes")
    payload = dtype.itemsize
    for d in dims:
        payload *= d
    actual = size - header_len
    if actual < payload:
        _fail(
            where, "truncated payload", f"dimensions {list(dims)} need {payload} bytes of data, the file has {actual}"
        )
    if actual > payload:
        _fail(where, "trailing bytes", f"{actual - payload} bytes after the {payload} bytes of data")
    return dtype, dims, header_len


def parse_idx(data: bytes | bytearray | memoryview, where: str = "IDX buffer") -> np.ndarray[Any, Any]:
    """Parse a whole IDX file held in memory into a native-byte-order NumPy array (a copy)."""
    view = memoryview(data).cast("B")
    dtype, dims, start = _parse_header(bytes(view[:4]), len(view), where, lambda n: bytes(view[4 : 4 + n]))
    arr = np.frombuffer(view, dtype=dtype, offset=start).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))


def _read_file(f: io.BufferedReader, where: str) -> np.ndarray[Any, Any]:
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        _fail(where, "not a file", "expected a regular file")
    dtype, dims, _ = _parse_header(f.read(4), st.st_size, where, f.read)
    arr = np.empty(dims, dtype)
    flat = arr.reshape(-1).view(np.uint8)
    if flat.nbytes and f.readinto(flat.data) != flat.nbytes:
        _fail(where, "truncated payload", "the file ended inside the data (did it change while reading?)")
    if not arr.dtype.isnative:  # swap in place: no second copy of a large file
        arr = arr.byteswap(inplace=True).view(dtype.newbyteorder("="))
    return arr


def read_idx_array(path: str | os.PathLike[str]) -> np.ndarray[Any, Any]:
    """Read an IDX file into a NumPy array in native byte order (the NumPy layer of read_idx)."""
    where = f"IDX file {os.fspath(path)!r}"
    with open(path, "rb") as f:
        return _read_file(f, where)


def _tensor(arr: np.ndarray[Any, Any]) -> Tensor:
    from kael._tensor import from_numpy

    return from_numpy(arr)


def read_idx(path: str | os.PathLike[str]) -> Tensor:
    """Read any IDX file into a CPU tensor of its element type and dimensions."""
    return _tensor(read_idx_array(path))


def _checked_images(path: str | os.PathLike[str]) -> np.ndarray[Any, Any]:
    arr = read_idx_array(path)
    where = f"IDX file {os.fspath(path)!r}"
    if arr.dtype != np.uint8:
        _fail(where, "wrong type for images", f"expected unsigned bytes (type 0x08), got {arr.dtype.name}")
    if arr.ndim < 2:
        _fail(where, "wrong dimensions for images", f"expected [count, ...] with at least 2 dimensions, got {arr.ndim}")
    if 0 in arr.shape[1:]:
        _fail(where, "empty images", f"dimensions {list(arr.shape)}: every image dimension must be positive")
    return arr


def _checked_labels(path: str | os.PathLike[str]) -> np.ndarray[Any, Any]:
    arr = read_idx_array(path)
    where = f"IDX file {os.fspath(path)!r}"
    if arr.dtype != np.uint8:
        _fail(where, "wrong type for labels", f"expected unsigned bytes (type 0x08), got {arr.dtype.name}")
    if arr.ndim != 1:
        _fail(where, "wrong dimensions for labels", f"expected 1 dimension, got {arr.ndim}")
    return arr


def read_idx_images(path: str | os.PathLike[str]) -> Tensor:
    """Read an IDX image file: a uint8 tensor `[count, rows, cols]` (or the file's dims, at least 2)."""
    return _tensor(_checked_images(path))


def read_idx_labels(path: str | os.PathLike[str]) -> Tensor:
    """Read an IDX label file: a uint8 tensor `[count]`."""
    return _tensor(_checked_labels(path))


def read_idx_dataset(images: str | os.PathLike[str], labels: str | os.PathLike[str]) -> tuple[Tensor, Tensor]:
    """Read an image file and its label file, checking that they hold the same number of samples."""
    x, y = _checked_images(images), _checked_labels(labels)
    if x.shape[0] != y.shape[0]:
        raise FormatError(
            f"IDX files {os.fspath(images)!r} and {os.fspath(labels)!r}: label count mismatch: "
            f"{x.shape[0]} images but {y.shape[0]} labels"
        )
    return _tensor(x), _tensor(y)


def _as_array(array: Any, where: str) -> np.ndarray[Any, Any]:
    if isinstance(array, np.ndarray):
        return array
    from kael._tensor import Tensor, numpy_bits

    if not isinstance(array, Tensor):
        _fail(where, "unsupported value", f"expected a NumPy array or a kael Tensor, got {type(array).__name__}")
    if array.dtype.name == "bfloat16":
        _fail(where, "unsupported type", "bfloat16 has no IDX type code")
    arr: np.ndarray[Any, Any] = numpy_bits(array)
    return arr


def write_idx(path: str | os.PathLike[str], array: Any) -> None:
    """Write a NumPy array or kael tensor (uint8, int8, int16, int32, float32 or float64) as IDX.

    The file is written atomically (a temporary file renamed over `path`).
    """
    where = f"write_idx to {os.fspath(path)!r}"
    arr = _as_array(array, where)
    code = _CODE_OF.get(arr.dtype.newbyteorder("=").name) if arr.dtype.kind in "uif" else None
    if code is None:
        _fail(
            where,
            "unsupported type",
            f"{arr.dtype.name} has no IDX type code; expected one of " + ", ".join(sorted(_CODE_OF)),
        )
    if not 1 <= arr.ndim <= _MAX_NDIM:
        _fail(where, "wrong dimensions", f"IDX needs 1 to {_MAX_NDIM} dimensions, got {arr.ndim}")
    if any(d >= 2**32 for d in arr.shape):
        _fail(where, "dimension too large", f"dimensions {list(arr.shape)} do not fit uint32")
    data = np.ascontiguousarray(arr, dtype=TYPE_CODES[code])
    with atomic_write(path) as f:
        f.write(bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape))
        if data.nbytes:
            f.write(data.reshape(-1).view(np.uint8).data)
