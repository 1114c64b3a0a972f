"""Tensor creation: tensor, zeros/ones/full/empty, arange/linspace/eye, *_like, random."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _dispatch
from .. import _dtype as dt
from .._device import CPU, Device, as_device
from .._errors import DTypeError, KaelError, ShapeError
from .._tensor import Tensor, from_numpy
from ._core import check_shape, empty, int_in_range
from ._random import Generator, default_generator

__all__ = [
    "tensor",
    "zeros",
    "ones",
    "full",
    "empty_",
    "arange",
    "linspace",
    "eye",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "rand",
    "randn",
    "randint",
    "randperm",
    "rand_like",
    "randn_like",
    "to_device",
]


def _shape_args(size: tuple[Any, ...], op: str) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return check_shape(size, op)


def _infer_np(data: Any, op: str) -> np.ndarray:
    try:
        arr = np.array(data)
    except ValueError as exc:
        raise ShapeError(
            f"{op}: data {type(data).__name__} is ragged or malformed: expected a rectangular "
            f"nested sequence of numbers ({exc})"
        ) from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise DTypeError(f"{op}: expected numbers (bool, int, float), got elements of type {arr.dtype}")
    return arr


def to_device(host: np.ndarray, dtype: dt.DType, device: Device) -> Tensor:
    """A new tensor on device holding host's values (host dtype == dtype.np)."""
    out = empty(tuple(host.shape), dtype, device)
    _dispatch.backend_for(device.type).from_host(out, np.ascontiguousarray(host))
    return out


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor copying data (nested lists, numbers, NumPy arrays or tensors)."""
    dev = as_device(device)
    if isinstance(data, Tensor):
        from ._inplace import to

        t = to(data.detach(), device=dev, dtype=dtype, copy=True)
    else:
        arr = _infer_np(data, "tensor")
        if dtype is not None:
            d = dt.as_dtype(dtype)
        elif arr.dtype == np.float64 and not isinstance(data, (np.ndarray, np.generic)):
            d = dt.get_default_dtype()
        elif arr.dtype.kind == "i" and not isinstance(data, (np.ndarray, np.generic)):
            d = dt.int64
        else:
            d = dt.as_dtype(arr.dtype)
        if d is dt.bfloat16:
            host = dt.f32_to_bf16_bits(arr.astype(np.float32))
        else:
            with np.errstate(all="ignore"):
                host = arr.astype(d.np)
        t = to_device(host, d, dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _filled(shape: tuple[int, ...], value: Any, dtype: Any, device: Any, requires_grad: bool = False) -> Tensor:
    d = (
        dt.as_dtype(dtype)
        if dtype is not None
        else (
            dt.get_default_dtype()
            if isinstance(value, float)
            else dt.scalar_dtype(value)
            if isinstance(value, (bool, int))
            else dt.get_default_dtype()
        )
    )
    dev = as_device(device)
    if value is not None:
        value = int_in_range(value, d, "full", wrap=False)
    out = empty(shape, d, dev)
    if value is not None:
        _dispatch.kernel(dev.type, "fill")(out, value)
    if requires_grad:
        out.requires_grad_(True)
    return out


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros of the given size (ints, or one tuple); the default float dtype unless ``dtype``."""
    return _filled(_shape_args(size, "zeros"), 0, dtype or dt.get_default_dtype(), device, requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones of the given size (ints, or one tuple); the default float dtype unless ``dtype``."""
    return _filled(_shape_args(size, "ones"), 1, dtype or dt.get_default_dtype(), device, requires_grad)


def empty_(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor of the given size (ints, or one tuple): its values are whatever the memory held."""
    return _filled(_shape_args(size, "empty"), None, dtype or dt.get_default_dtype(), device, requires_grad)


def full(size: Any, fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value`` (a Python number, whose type picks the dtype unless given)."""
    if not isinstance(fill_value, (bool, int, float)):
        raise DTypeError(f"full: fill_value must be a Python number, got {type(fill_value).__name__}")
    return _filled(check_shape(size, "full"), fill_value, dtype, device, requires_grad)


def _like(t: Tensor, value: Any, dtype: Any, device: Any, requires_grad: bool = False) -> Tensor:
    return _filled(t.shape, value, dtype or t.dtype, device or t.device, requires_grad)


def zeros_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Zeros with t's shape, and t's dtype and device unless given."""
    return _like(t, 0, dtype, device, requires_grad)


def ones_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Ones with t's shape, and t's dtype and device unless given."""
    return _like(t, 1, dtype, device, requires_grad)


def full_like(t: Tensor, fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` everywhere, with t's shape, and t's dtype and device unless given."""
    return _like(t, fill_value, dtype, device, requires_grad)


def empty_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor with t's shape, and t's dtype and device unless given."""
    return _like(t, None, dtype, device, requires_grad)


def arange(
    start: Any, end: Any = None, step: Any = 1, dtype: Any = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """start, start + step, ... up to but excluding end (``arange(n)`` is 0..n-1).

    int64 for integer arguments, the default float dtype when any is a float, unless ``dtype``.
    """
    if end is None:
        start, end = 0, start
    for v in (start, end, step):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DTypeError(f"arange: start, end and step must be numbers, got {start!r}, {end!r}, {step!r}")
    if step == 0 or not all(math.isfinite(v) for v in (start, end, step)):
        raise KaelError(f"arange: step must be non-zero and bounds finite, got {start!r}, {end!r}, {step!r}")
    n = max(0, math.ceil((end - start) / step))
    is_float = any(isinstance(v, float) for v in (start, end, step))
    d = dt.as_dtype(dtype) if dtype is not None else (dt.get_default_dtype() if is_float else dt.int64)
    dev = as_device(device)
    out = empty(check_shape((n,), "arange"), d, dev)
    _dispatch.kernel(dev.type, "arange")(out, start, step)
    if requires_grad:
        out.requires_grad_(True)
    return out


def linspace(start: float, end: float, steps: int, dtype: Any = None, device: Any = None) -> Tensor:
    """``steps`` evenly spaced values from start to end, both included."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ShapeError(f"linspace: steps must be a non-negative int, got {steps!r}")
    d = dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()
    host = np.linspace(start, end, steps, dtype=np.float64)
    return tensor(host, dtype=d, device=device)


def eye(n: int, m: int | None = None, dtype: Any = None, device: Any = None) -> Tensor:
    """The n x m identity matrix (m = n by default)."""
    m = n if m is None else m
    check_shape((n, m), "eye")
    return tensor(np.eye(n, m), dtype=dtype or dt.get_default_dtype(), device=device)


def _gen(generator: Generator | None) -> Generator:
    if generator is None:
        return default_generator
    if not isinstance(generator, Generator):
        raise DTypeError(f"generator must be a kael.Generator, got {type(generator).__name__}")
    return generator


def _random(
    op: str, shape: tuple[int, ...], a: Any, b: Any, dtype: Any, device: Any, generator: Any, requires_grad: bool
) -> Tensor:
    d = dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()
    if op != "randint" and not d.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point dtype, got {d!r}")
    dev = as_device(device)
    out = empty(shape, d, dev)
    _dispatch.kernel(dev.type, op)(out, a, b, _gen(generator))
    if requires_grad:
        out.requires_grad_(True)
    return out


def rand(
    *size: Any, dtype: Any = None, device: Any = None, generator: Any = None, requires_grad: bool = False
) -> Tensor:
    """Values drawn uniformly from [0, 1) (from ``generator``, or the default generator kael.manual_seed seeds)."""
    return _random("uniform", _shape_args(size, "rand"), 0.0, 1.0, dtype, device, generator, requires_grad)


def randn(
    *size: Any, dtype: Any = None, device: Any = None, generator: Any = None, requires_grad: bool = False
) -> Tensor:
    """Values drawn from the standard normal N(0, 1) (from ``generator``, or the default generator)."""
    return _random("normal", _shape_args(size, "randn"), 0.0, 1.0, dtype, device, generator, requires_grad)


def randint(
    low: int, high: int | None = None, size: Any = (), dtype: Any = None, device: Any = None, generator: Any = None
) -> Tensor:
    """Integers drawn uniformly from [low, high) (``randint(high, size)`` draws from [0, high)); int64 by default."""
    if high is None:
        low, high = 0, low
    if not isinstance(low, int) or not isinstance(high, int) or high <= low:
        raise KaelError(f"randint: expected ints low < high, got low={low!r}, high={high!r}")
    return _random("randint", check_shape(size, "randint"), low, high, dtype or dt.int64, device, generator, False)


def randperm(n: int, dtype: Any = None, device: Any = None, generator: Any = None) -> Tensor:
    """A random permutation of 0..n-1 (int64 by default)."""
    check_shape((n,), "randperm")
    host = _gen(generator).numpy_rng().permutation(n)
    return tensor(host, dtype=dtype or dt.int64, device=device)


def rand_like(t: Tensor, dtype: Any = None, generator: Any = None) -> Tensor:
    """``rand`` with t's shape and device, and t's dtype unless given."""
    return rand(t.shape, dtype=dtype or t.dtype, device=t.device, generator=generator)


def randn_like(t: Tensor, dtype: Any = None, generator: Any = None) -> Tensor:
    """``randn`` with t's shape and device, and t's dtype unless given."""
    return randn(t.shape, dtype=dtype or t.dtype, device=t.device, generator=generator)


_ = (CPU, from_numpy)
