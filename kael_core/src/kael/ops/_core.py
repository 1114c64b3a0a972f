"""Shared frontend plumbing: allocation, scalars, broadcasting, casts, device checks."""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._device import CPU, Device
from .._errors import DeviceError, DTypeError, ShapeError
from .._storage import Storage
from .._strides import numel_of as numel
from .._tensor import Tensor, contiguous_strides

__all__ = ["empty", "broadcast_shapes", "expand_to", "cast", "as_tensor_like", "check_device", "numel", "Tensor"]


def empty(shape: tuple[int, ...], dtype: dt.DType, device: Device = CPU) -> Tensor:
    """A new contiguous tensor, uninitialised (the one place outputs are allocated)."""
    n = dtype.itemsize
    for s in shape:
        n *= s
    data = _dispatch.backend_for(device.type).allocate(n, device)
    return Tensor._make(Storage(data, n, device), shape, contiguous_strides(shape), 0, dtype)


def check_shape(shape: Any, op: str) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        out = tuple(shape)
    except TypeError:
        raise ShapeError(f"{op}: expected a shape (sequence of ints), got {shape!r}") from None
    for s in out:
        if isinstance(s, bool) or not isinstance(s, int):
            if isinstance(s, Tensor) and s.numel() == 1 and s.dtype.category == 1:
                continue
            raise ShapeError(f"{op}: shape entries must be ints, got {shape!r}")
    out = tuple(int(s) for s in out)
    if any(s < 0 for s in out):
        raise ShapeError(f"{op}: negative dimension in shape {list(out)}")
    if numel(out) * 8 > 1 << 46:
        raise ShapeError(f"{op}: shape {list(out)} is too large to allocate")
    return out


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    if a == b:
        return a
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + a
    pb = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(
                f"{op}: shapes {list(a)} and {list(b)} cannot be broadcast together (dimension sizes {x} and {y})"
            )
    return tuple(out)


def expand_to(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A stride-0 view of t broadcast to shape (no autograd; kernels only)."""
    if t.shape == shape:
        return t
    n = len(shape) - len(t.shape)
    strides = [0] * n
    for i, (size, st) in enumerate(zip(t.shape, t._strides)):
        strides.append(0 if size == 1 and shape[n + i] != 1 else st)
    base = t._base if t._base is not None else t
    return Tensor._make(t._storage, shape, tuple(strides), t._offset, t.dtype, base)


def cast(t: Tensor, dtype: dt.DType) -> Tensor:
    """t converted to dtype (a new tensor; no autograd — callers handle it)."""
    if t.dtype is dtype:
        return t
    out = empty(t.shape, dtype, t.device)
    _dispatch.kernel(t.device.type, "copy")(out, t)
    return out


def int_in_range(v: Any, dtype: dt.DType, op: str, wrap: bool) -> Any:
    """A Python int made to fit an integer dtype: wrapped (binary-op operands, like PyTorch) or rejected (fills)."""
    if dtype.category != 1 or isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    bits = dtype.itemsize * 8
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.is_signed else (0, (1 << bits) - 1)
    if isinstance(v, float):  # a float into an integer tensor (fills only): truncated, and it must fit
        if v == v and abs(v) != float("inf") and lo <= int(v) <= hi:
            return v
        raise DTypeError(f"{op}: value {v!r} cannot be converted to {dtype!r} without overflow")
    if lo <= v <= hi:
        return v
    if not wrap or not -(1 << 63) <= v < (1 << 64):
        raise DTypeError(f"{op}: value {v!r} cannot be converted to {dtype!r} without overflow (expected {lo}..{hi})")
    v &= (1 << bits) - 1
    return v - (1 << bits) if dtype.is_signed and v > hi else v


_scalars: dict[tuple[Any, ...], Tensor] = {}
_dispatch._derived.append(_scalars)  # forgotten whenever the backends change


def scalar_tensor(v: Any, dtype: dt.DType, device: Device) -> Tensor:
    """A 0-d tensor holding v, cached: it is only ever a kernel input (NOTE [kernel contract]), never returned."""
    key = (type(v), str(v) if v == 0 else v, dtype, id(device))  # str keeps -0.0 apart from 0.0; devices are interned
    out = _scalars.get(key)
    if out is None:
        if len(_scalars) >= 1024:
            _scalars.clear()
        out = empty((), dtype, device)
        _dispatch.kernel(device.type, "fill")(out, int_in_range(v, dtype, "scalar operand", wrap=True))
        _scalars[key] = out
    return out


def as_tensor_like(v: Any, dtype: dt.DType, device: Device, op: str) -> Tensor:
    if isinstance(v, Tensor):
        if v.device is not device:
            raise DeviceError(f"{op}: expected all tensors on {device}, got one on {v.device}")
        return cast(v, dtype)
    if isinstance(v, (bool, int, float)):
        return scalar_tensor(int_in_range(v, dtype, op, wrap=True), dtype, device)
    raise DTypeError(f"{op}: expected a tensor or a Python number, got {type(v).__name__}")


def check_device(op: str, *ts: Any) -> Device:
    dev = None
    for t in ts:
        if isinstance(t, Tensor):
            if dev is None:
                dev = t.device
            elif t.device is not dev:
                raise DeviceError(f"{op}: expected all tensors on the same device, got {dev} and {t.device}")
    return dev or CPU


def wrap_dims(dims: Any, ndim: int, op: str) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = (dims,)
    elif not isinstance(dims, (tuple, list)):
        raise DTypeError(f"{op}: dim must be an int or a tuple of ints, got {dims!r}")
    out = []
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise DTypeError(f"{op}: dim must be an int or a tuple of ints, got {dims!r}")
        if d < lo or d > hi:
            from .._errors import IndexError_

            raise IndexError_(f"{op}: dim {d} is out of range for a {ndim}-d tensor (expected {lo}..{hi})")
        d = d + ndim if d < 0 else d
        if ndim == 0:
            continue
        if d in out:
            raise ShapeError(f"{op}: dim {d} appears more than once in {dims!r}")
        out.append(d)
    return tuple(out)
