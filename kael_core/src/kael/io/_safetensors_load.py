"""Loading safetensors files, copied into memory or memory-mapped.

`load_arrays` does the file work on NumPy (tested and fuzzed without tensors);
`load_safetensors` wraps its arrays as kael tensors without copying them again.

NOTE [mapped loads]: the mapped mode maps the file with `mmap.ACCESS_COPY`, a private
copy-on-write mapping: tensors are writable, and writes stay in this process (they
never reach the file). A tensor whose data starts at an offset aligned for its dtype
(every tensor of a file the reference writer made, whose data section starts 8-aligned
and holds wider dtypes first) is a zero-copy view into the mapping, which stays open as
long as any such tensor is alive; a misaligned one is copied. As with every mapped file,
truncating the file while its tensors are alive makes reading them fault (SIGBUS): the
size is checked with fstat at open, but nothing can check it at every access.
"""

from __future__ import annotations

import io
import mmap as _mmap
import os
import stat
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import numpy as np

from kael._device import Device, DeviceLike, as_device

from ._safetensors_format import DTYPES, Entry, Header, decode_tensor, fail, finish_tensor, header_length, parse_header

if TYPE_CHECKING:
    from kael._tensor import Tensor

__all__ = ["load_arrays", "load_safetensors", "load_safetensors_with_metadata"]

Arrays = dict[str, tuple[np.ndarray[Any, Any], str]]


def _read_exactly(f: io.BufferedReader, n: int, where: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        fail(where, "truncated", f"the file ended after {len(data)} of {n} bytes (did it change while loading?)")
    return data


def _open_header(f: io.BufferedReader, where: str) -> tuple[Header, int]:
    """Validate the header of the open file `f`; return it and the file size."""
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        fail(where, "not a file", "expected a regular file")
    size = st.st_size
    n = header_length(_read_exactly(f, min(size, 8), where), size, where)
    return parse_header(_read_exactly(f, n, where), size - 8 - n, where), size


def _read_tensor(f: io.BufferedReader, e: Entry, where: str) -> np.ndarray[Any, Any]:
    """Read one tensor's bytes (the next ones in the file) into a fresh aligned array."""
    st = DTYPES[e.dtype]
    arr = np.empty(e.numel, st.np)
    got = f.readinto(arr.view(np.uint8).data) if arr.size else 0
    if got != arr.nbytes:
        fail(where, "truncated", "the file ended inside the data (did it change while loading?)", e.name)
    return finish_tensor(arr, e, where)


def load_arrays(
    path: str | os.PathLike[str], *, mmap: bool = False, names: Collection[str] | None = None
) -> tuple[Arrays, dict[str, str] | None]:
    """The tensors of a safetensors file as `{name: (array, kael dtype name)}`, plus its metadata.

    bfloat16 tensors come back as their uint16 bits. The order is the order of the data.
    `names`: only these tensors (the others are neither read nor decoded); None: every one.
    """
    where = f"safetensors file {os.fspath(path)!r}"
    with open(path, "rb") as f:
        header, size = _open_header(f, where)
        entries = [e for e in header.entries if names is None or e.name in names]
        if not mmap:
            out: Arrays = {}
            for e in entries:
                if len(entries) != len(header.entries):  # tensors were left out: go to this one's bytes
                    f.seek(header.data_start + e.begin)
                out[e.name] = (_read_tensor(f, e, where), DTYPES[e.dtype].kael)
            return out, header.metadata
        try:
            mapping = _mmap.mmap(f.fileno(), size, access=_mmap.ACCESS_COPY)
        except ValueError as e:  # the file shrank below the size fstat gave
            fail(where, "truncated", f"cannot map {size} bytes: {e}")
    out = {
        e.name: (decode_tensor(mapping, header.data_start + e.begin, e, where, copy=False), DTYPES[e.dtype].kael)
        for e in entries
    }
    return out, header.metadata


def _to_tensor(arr: np.ndarray[Any, Any], dtype_name: str, device: Device) -> Tensor:
    from kael._dtype import BY_NAME
    from kael._tensor import from_numpy_bits
    from kael.ops import to

    t = from_numpy_bits(arr, BY_NAME[dtype_name])
    return t if device.type == "cpu" else to(t, device=device)


def load_safetensors_with_metadata(
    path: str | os.PathLike[str], *, mmap: bool = False, device: DeviceLike = "cpu"
) -> tuple[dict[str, Tensor], dict[str, str] | None]:
    """Load every tensor of a safetensors file, and its `__metadata__` (None when absent).

    With `mmap=True` the file is memory-mapped and aligned tensors are views into the
    mapping (NOTE [mapped loads]); otherwise every tensor is read into its own memory.
    Any violation of the format is a `kael.FormatError` naming the file, tensor and rule,
    raised before the data is read.
    """
    dev = as_device(device)  # a bad device fails before the file is read
    arrays, metadata = load_arrays(path, mmap=mmap)
    return {name: _to_tensor(arr, dtype, dev) for name, (arr, dtype) in arrays.items()}, metadata


def load_safetensors(
    path: str | os.PathLike[str], *, mmap: bool = False, device: DeviceLike = "cpu"
) -> dict[str, Tensor]:
    """Load every tensor of a safetensors file: `{name: Tensor}` (see load_safetensors_with_metadata)."""
    return load_safetensors_with_metadata(path, mmap=mmap, device=device)[0]
