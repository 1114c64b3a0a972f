"""Fuzz target: kael's safetensors loaders on arbitrary file contents.

Every input is loaded three ways: copied from a file, memory-mapped from the same
file (a temporary file named with the process id), and decoded from bytes in memory.
Each loaded tensor has its first and last byte read straight from its storage, so a
view that runs past a short mapping faults here rather than in a user's program.

Expected outcomes: success, or `kael.FormatError`. A finding is anything else: another
exception, the three modes disagreeing (one accepts what another refuses, or they load
different bytes), an accepted file that the reference `safetensors` package refuses or
reads differently, a crash, a sanitizer report, or an allocation over the runner's limit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from typing import Any

import _harness
import numpy as np

with _harness.instrumented(__name__ == "__main__", ["kael"]):
    import kael.ops  # noqa: F401  (the loader imports it lazily; imported here to be instrumented)
    from kael import FormatError, Tensor
    from kael.backends import host
    from kael.io import load_safetensors_with_metadata

    # internal: the in-memory decoder and dtype tables have no public name (the differential check needs them)
    from kael.io._safetensors_format import DTYPES, KAEL_TO_ST, decode_buffer


def _bits(t: Any) -> Any:
    """A C-contiguous host array of CPU tensor t's raw elements (uint16 bits for bfloat16)."""
    return np.asarray(host.view(t), order="C")  # asarray(order="C"), not ascontiguousarray: 0-d stays 0-d


try:  # the reference implementation, as an independent oracle when installed
    import safetensors as _reference
except ImportError:  # pragma: no cover
    _reference = None  # type: ignore[assignment]

PATH = _harness.scratch_path("safetensors", ".safetensors")


@atexit.register
def _remove_scratch_file() -> None:
    with contextlib.suppress(OSError):
        os.remove(PATH)


# {name: (safetensors dtype, shape, raw little-endian bytes)} and the metadata
Loaded = tuple[dict[str, tuple[str, tuple[int, ...], bytes]], "dict[str, str] | None"]


def _touch(t: Tensor) -> None:
    """Read the first and last byte of t's data from its storage (a 1-D uint8 array on CPU)."""
    n = t.nbytes
    if n == 0:
        return
    if not t.is_contiguous():
        raise AssertionError(f"loaded tensor is not contiguous: shape {t.shape}, strides {t._strides}")
    start = t._offset * t.dtype.itemsize
    buf = t._storage.data
    if not (0 <= start and start + n <= t._storage.nbytes <= len(buf)):
        raise AssertionError(f"tensor bytes [{start}, {start + n}) outside a {t._storage.nbytes}-byte storage")
    _ = int(buf[start]) + int(buf[start + n - 1])


def _load_file(mmap: bool) -> Loaded | None:
    try:
        tensors, metadata = load_safetensors_with_metadata(PATH, mmap=mmap)
    except FormatError:
        return None
    out = {}
    for name, t in tensors.items():
        _touch(t)
        out[name] = (KAEL_TO_ST[t.dtype.name], t.shape, _bits(t).tobytes())
    return out, metadata


def _load_bytes(data: bytes) -> Loaded | None:
    try:
        arrays, metadata = decode_buffer(data, copy=False)
    except FormatError:
        return None
    out = {}
    for name, (arr, kael_dtype) in arrays.items():
        st = KAEL_TO_ST[kael_dtype]
        out[name] = (st, tuple(arr.shape), arr.astype(DTYPES[st].np, copy=False).tobytes())
    return out, metadata


def _check_reference(data: bytes, loaded: Loaded) -> None:
    """What kael accepts, the reference implementation accepts and reads the same."""
    if _reference is None:
        return
    try:
        ref = {name: (v["dtype"], tuple(v["shape"]), bytes(v["data"])) for name, v in _reference.deserialize(data)}
    except Exception as e:  # the reference raises its own SafetensorError (and others) on bad files
        raise AssertionError(f"kael loaded a file the reference refuses: {e!r}") from None
    if ref != loaded[0]:
        raise AssertionError(f"kael and the reference read different tensors: {ref!r} != {loaded[0]!r}")


def TestOneInput(data: bytes) -> None:
    _harness.write_scratch(PATH, data)
    results: dict[str, Any] = {
        "copy": _load_file(mmap=False),
        "mmap": _load_file(mmap=True),
        "bytes": _load_bytes(data),
    }
    first = results["copy"]
    for mode, result in results.items():
        if (result is None) != (first is None):
            raise AssertionError(f"load modes disagree: copy {'refused' if first is None else 'accepted'}, {mode} not")
        if result != first:
            raise AssertionError(f"load modes disagree: {mode} loaded {result!r}, copy {first!r}")
    if first is not None:
        _check_reference(data, first)
    with contextlib.suppress(OSError):
        os.remove(PATH)


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
