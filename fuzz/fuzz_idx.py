"""Fuzz target: the IDX (MNIST) readers on arbitrary file contents.

Every input goes through `read_idx` (any IDX file), `read_idx_images`, `read_idx_labels`
(through a temporary file named with the process id) and `parse_idx` (bytes in memory).
Expected outcomes: success or `kael.FormatError`. A finding is anything else: another
exception, the file and memory parsers disagreeing, an image or label reader accepting
what its rules forbid, a result that differs from an independent NumPy decoding of the
same bytes, a crash, or an allocation over the runner's limit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import struct
from typing import Any

import _harness
import numpy as np

with _harness.instrumented(__name__ == "__main__", ["kael"]):
    import kael.ops  # noqa: F401
    from kael import FormatError
    from kael.backends import host
    from kael.data.idx import parse_idx, read_idx, read_idx_images, read_idx_labels


def _bits(t: Any) -> Any:
    """A C-contiguous host array of CPU tensor t's raw elements (uint16 bits for bfloat16)."""
    return np.asarray(host.view(t), order="C")  # asarray(order="C"), not ascontiguousarray: 0-d stays 0-d


PATH = _harness.scratch_path("idx", ".idx")


@atexit.register
def _remove_scratch_file() -> None:
    with contextlib.suppress(OSError):
        os.remove(PATH)


_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _oracle(data: bytes) -> np.ndarray[Any, Any] | None:
    """The array the bytes hold, by the format's definition, or None when they break it."""
    if len(data) < 4 or data[0] or data[1] or data[2] not in _DTYPES or not data[3]:
        return None
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        return None
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    dtype = np.dtype(_DTYPES[data[2]])
    if len(data) - 4 - 4 * ndim != dtype.itemsize * int(np.prod(dims, dtype=object)):
        return None
    try:
        arr = np.frombuffer(data, dtype, offset=4 + 4 * ndim).reshape(dims)
    except ValueError:  # dims NumPy cannot represent (over 64, or sizes that overflow)
        return None
    return arr.astype(dtype.newbyteorder("="))


def _same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _read(reader: Any) -> np.ndarray[Any, Any] | None:
    try:
        return _bits(reader(PATH))
    except FormatError:
        return None


def TestOneInput(data: bytes) -> None:
    _harness.write_scratch(PATH, data)
    try:
        parsed: np.ndarray[Any, Any] | None = parse_idx(data)
    except FormatError:
        parsed = None
    expected = _oracle(data)
    if (parsed is None) != (expected is None) or (parsed is not None and not _same(parsed, expected)):  # type: ignore[arg-type]
        raise AssertionError(f"parse_idx gave {parsed!r}, the format says {expected!r}")

    anything = _read(read_idx)
    if (anything is None) != (parsed is None) or (anything is not None and not _same(anything, parsed)):  # type: ignore[arg-type]
        raise AssertionError(f"read_idx gave {anything!r}, parse_idx {parsed!r}")

    images = _read(read_idx_images)
    images_ok = parsed is not None and parsed.dtype == np.uint8 and parsed.ndim >= 2 and 0 not in parsed.shape[1:]
    if (images is not None) != images_ok or (images is not None and not _same(images, parsed)):  # type: ignore[arg-type]
        raise AssertionError(f"read_idx_images gave {images!r} for {parsed!r}")

    labels = _read(read_idx_labels)
    labels_ok = parsed is not None and parsed.dtype == np.uint8 and parsed.ndim == 1
    if (labels is not None) != labels_ok or (labels is not None and not _same(labels, parsed)):  # type: ignore[arg-type]
        raise AssertionError(f"read_idx_labels gave {labels!r} for {parsed!r}")


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
