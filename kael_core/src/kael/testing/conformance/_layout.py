"""Operands of a kernel call and how they are placed in memory.

An ``Operand`` is a tensor input: logical values plus a memory layout. The same
operand is materialised twice: on the device under test (through the backend's
``allocate``/``from_host``) and on the host for the reference kernels (wrapping NumPy
memory directly, so the oracle never depends on the backend under test). Layouts:

* ``contiguous``: row-major.
* ``transposed``: stored with the dims reversed, viewed back (non-contiguous strides).
* ``strided``: every other element of a larger buffer along the last dim, from
  storage offset 1 (0-d: offset 1), so both a step and an offset are exercised.
* ``broadcast``: ``values`` is a smaller array expanded to ``shape`` (stride 0).
* ``permute:i,j,...``: stored with the dims in that order, viewed back (e.g. attention
  heads ``permute:0,2,1,3``, the [B, T, H, D] -> [B, H, T, D] transpose of GPT-2).

An ``Out`` is an output the frontend would preallocate: contiguous, or ``strided``
inside a sentinel-filled buffer (so a kernel writing outside its view is caught), or
initialised with values (in-place kernels like ``index_add``). ``Alias(i)`` passes
the very tensor of argument i again (in-place ``kernel(t, t, b)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import kael
from kael import Tensor
from kael.backends import dtypes as dt
from kael.backends import host, memory

__all__ = ["Operand", "Out", "Alias", "host_bits", "place", "SENTINEL"]

LAYOUTS = ("contiguous", "transposed", "strided", "broadcast")
SENTINEL = 77


@dataclass(frozen=True)
class Operand:
    values: np.ndarray
    dtype: dt.DType
    layout: str = "contiguous"
    shape: tuple[int, ...] | None = None  # broadcast target shape

    @property
    def logical_shape(self) -> tuple[int, ...]:
        return tuple(self.shape) if self.shape is not None else tuple(self.values.shape)

    def describe(self) -> str:
        return f"{self.dtype.name}{list(self.logical_shape)} {self.layout}"


@dataclass(frozen=True)
class Out:
    shape: tuple[int, ...]
    dtype: dt.DType
    layout: str = "contiguous"  # contiguous | strided
    init: np.ndarray | None = None


@dataclass(frozen=True)
class Alias:
    index: int  # position of the argument whose tensor is passed again (and is an output)


def host_bits(values: np.ndarray, dtype: dt.DType) -> np.ndarray:
    """Values in dtype's storage representation (bfloat16: rounded uint16 bits)."""
    if dtype is dt.bfloat16:
        return host.f32_to_bf16_bits(np.asarray(values, dtype=np.float32))
    with np.errstate(all="ignore"):
        return np.asarray(values).astype(dtype.np)


def _strided_buffer(values: np.ndarray, fill: Any) -> tuple[np.ndarray, Callable[[Tensor], Tensor]]:
    """A larger buffer holding values at [..., 1::2] (0-d: at [1]), and the view that selects them."""
    if values.ndim == 0:
        big = np.full((2,), fill, dtype=values.dtype)
        big[1] = values
        return big, lambda t: t[1]
    n = values.shape[-1]
    big = np.full(values.shape[:-1] + (2 * n + 1,), fill, dtype=values.dtype)
    big[..., 1::2] = values
    return big, lambda t: t[..., 1::2]


def place(
    values: np.ndarray,
    dtype: dt.DType,
    layout: str,
    make: Callable[[np.ndarray], Tensor],
    shape: tuple[int, ...] | None = None,
    fill: Any = 0,
) -> Tensor:
    """values (storage representation of dtype) laid out as `layout` in memory made by make(host)."""
    if layout == "contiguous":
        return make(np.asarray(values, order="C"))
    if layout == "transposed":
        if values.ndim < 2:
            return make(np.asarray(values, order="C"))
        order = tuple(reversed(range(values.ndim)))
        return make(np.asarray(values.transpose(order), order="C")).permute(order)  # type: ignore[no-any-return]
    if layout.startswith("permute:"):
        order = tuple(int(i) for i in layout.split(":")[1].split(","))
        inverse = tuple(int(i) for i in np.argsort(order))
        return make(np.asarray(values.transpose(order), order="C")).permute(inverse)  # type: ignore[no-any-return]
    if layout == "strided":
        big, select = _strided_buffer(values, fill)
        return select(make(big))
    if layout == "broadcast":
        if shape is None:
            raise ValueError("a broadcast operand needs its target shape")
        return make(np.asarray(values, order="C")).expand(shape)  # type: ignore[no-any-return]
    raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


def host_tensor(values: np.ndarray, dtype: dt.DType) -> Tensor:
    """A contiguous CPU tensor over a private copy of values (storage representation; no backend involved)."""
    a = np.array(values, dtype=dtype.np, order="C", copy=True)
    flat = a.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)
    shape = tuple(int(n) for n in a.shape)
    return memory.wrap_buffer(flat, flat.nbytes, kael.device("cpu"), shape, memory.contiguous_strides(shape), dtype)
