"""``kael.backends.memory``: a tensor's memory as a backend sees it, and wrapping a buffer as a tensor.

Every tensor is a strided view over a ``Storage``: ``data`` is the object the backend's
``allocate`` returned (for CPU backends a 1-D NumPy uint8 array; for CUDA a CuPy one),
``nbytes``, ``device``, and ``version`` (bumped by in-place ops; autograd checks it).
Strides and offsets are in elements (``t.stride()``, ``t.storage_offset()``).

* ``Storage``: the class (``Storage(data, nbytes, device)``).
* ``buffer(t)``: t's ``Storage.data``; ``storage(t)``: the Storage itself.
* ``same_storage(a, b)``: whether a and b are views of one Storage (so a kernel must not
  write into a while reading b elementwise out of order).
* ``contiguous_strides(shape)``: row-major strides in elements.
* ``wrap_buffer(data, nbytes, device, shape, strides, dtype, offset=0)``: a new Tensor over
  memory the backend did not allocate through ``allocate`` (a DLPack import): the
  public way to hand a device buffer back to the frontend.
* ``cached_view(t, make)``: a per-tensor cache for a backend's array view of t's
  elements (``make(t)`` runs once per tensor object; tensor metadata never changes after
  creation, so the cache never goes stale). CPU tensors use this slot for their NumPy
  view (``kael.backends.host.view``); other device types may use it for theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._device import Device
from .._dtype import DType
from .._errors import ShapeError
from .._storage import Storage
from .._tensor import Tensor, contiguous_strides

__all__ = ["Storage", "buffer", "storage", "same_storage", "contiguous_strides", "wrap_buffer", "cached_view"]


def storage(t: Tensor) -> Storage:
    """The Storage t views."""
    return t._storage


def buffer(t: Tensor) -> Any:
    """The backend's memory object t views (``Storage.data``: what ``allocate`` returned)."""
    return t._storage.data


def same_storage(a: Tensor, b: Tensor) -> bool:
    """True when a and b view the same Storage."""
    return a._storage is b._storage


def wrap_buffer(
    data: Any,
    nbytes: int,
    device: Device,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: DType,
    offset: int = 0,
) -> Tensor:
    """A tensor of `shape`/`strides` (elements) from `offset` over a backend buffer of nbytes bytes on device."""
    shape = tuple(int(n) for n in shape)
    strides = tuple(int(s) for s in strides)
    if len(shape) != len(strides) or any(n < 0 for n in shape) or any(s < 0 for s in strides) or offset < 0:
        raise ShapeError(
            f"wrap_buffer: shape {list(shape)}, strides {list(strides)} and offset {offset} must be "
            "non-negative and of one length"
        )
    if all(shape):
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
        if (last + 1) * dtype.itemsize > nbytes:
            raise ShapeError(
                f"wrap_buffer: a {dtype.name} view of shape {list(shape)}, strides {list(strides)}, offset {offset} "
                f"reaches byte {(last + 1) * dtype.itemsize}, past the buffer's {nbytes} bytes"
            )
    return Tensor._make(Storage(data, nbytes, device), shape, strides, offset, dtype)


def cached_view(t: Tensor, make: Callable[[Tensor], Any]) -> Any:
    """t's cached backend view, made with make(t) on first use."""
    v = t._npv
    if v is None:
        v = t._npv = make(t)
    return v
