"""Saving safetensors files, atomically.

Tensors are written in the dict's order with ascending offsets. The header is built and
validated (names, metadata, dtypes) before the file is created; the data is then
streamed one tensor at a time (a CUDA tensor is copied to the host only while it is
written) into a temporary file that is renamed over the target once complete, so a
failed save leaves neither a half-written file nor a temporary one.

Only the data section's start is aligned (to 8 bytes); a tensor that follows one whose
size is not a multiple of its own itemsize starts misaligned, and a mapped load copies
it. Put wider dtypes first (as the reference writer does) to keep every tensor mappable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._atomic import atomic_write
from ._safetensors_format import build_header, fail

if TYPE_CHECKING:
    from kael._tensor import Tensor

__all__ = ["save_arrays", "save_entries", "save_safetensors"]

Getter = Callable[[], np.ndarray[Any, Any]]


def save_entries(
    entries: Sequence[tuple[str, str, tuple[int, ...], Getter]],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None,
    where: str,
) -> None:
    """Write `(name, kael dtype name, shape, get_array)` entries; arrays are fetched one at a time."""
    header, sizes = build_header([(n, d, s) for n, d, s, _ in entries], metadata, where)
    with atomic_write(path) as f:
        f.write(header)
        for (name, _, _, get), nbytes in zip(entries, sizes, strict=True):
            arr = np.ascontiguousarray(get())
            if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            if arr.nbytes != nbytes:
                fail(where, "data size", f"the array holds {arr.nbytes} bytes, the header says {nbytes}", name)
            if nbytes:
                f.write(arr.reshape(-1).view(np.uint8).data)


def save_arrays(
    arrays: Mapping[str, tuple[np.ndarray[Any, Any], str]],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Save `{name: (array, kael dtype name)}` (bfloat16 as uint16 bits): the NumPy layer of save."""
    where = f"save_safetensors to {os.fspath(path)!r}"
    entries = []
    for name, value in arrays.items():
        if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], np.ndarray)):
            fail(where, "value", f"expected (NumPy array, dtype name), got {type(value).__name__}", str(name))
        arr, dtype = value
        entries.append((name, dtype, tuple(arr.shape), lambda a=arr: a))
    save_entries(entries, path, metadata, where)


def save_safetensors(
    tensors: Mapping[str, Tensor], path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None
) -> None:
    """Save `{name: Tensor}` to a safetensors file, with optional `{str: str}` metadata.

    Any tensor layout and device is accepted (non-contiguous and CUDA tensors are copied
    to contiguous host memory while written). Invalid names, metadata or values raise
    `kael.FormatError` before the file is created; on any failure no file is left behind.
    """
    from kael._tensor import Tensor, numpy_bits

    where = f"save_safetensors to {os.fspath(path)!r}"
    if not isinstance(tensors, Mapping):
        fail(where, "value", f"expected a dict of tensors, got {type(tensors).__name__}")
    entries = []
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            fail(where, "value", f"expected a kael Tensor, got {type(t).__name__}", str(name))
        entries.append((name, t.dtype.name, tuple(t.shape), lambda t=t: numpy_bits(t)))
    save_entries(entries, path, metadata, where)
