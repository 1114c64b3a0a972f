"""Matmul (cuBLAS through CuPy) and the indexing family: gather, index_select, index_add,
scatter_add, cat, nonzero, sort.

Scatter-adds use ``xp.add.at`` (CuPy: atomicAdd). CUDA has no atomicAdd for signed
64-bit or 8/16-bit integers, so those accumulate in uint64 (two's complement makes the
sum identical) or int32, and 16-bit floats in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from kael.backends import dtypes as dt

from ._io import distinct, f32_to_bf16_bits, rd, view, wr
from ._xp import X, argsort, dense_view, quiet

__all__ = ["KERNELS"]


def matmul(out: Any, a: Any, b: Any) -> None:
    xp = X.xp
    av, bv = rd(a), rd(b)
    if (
        out.dtype.is_floating_point
        and out.dtype is not dt.bfloat16
        and out.dtype is a.dtype is b.dtype
        and out.is_contiguous()
        and distinct(out, a, b)
    ):
        xp.matmul(av, bv, out=dense_view(out, out.shape))
    else:
        wr(out, xp.matmul(av, bv))


def _scatter_add(out: Any, index: tuple[Any, ...], vals: Any) -> None:
    """out[index] += vals with repeated indices accumulating (xp.add.at), in an atomicAdd-able dtype."""
    xp = X.xp
    d = out.dtype
    if d.is_floating_point:
        acc = xp.array(rd(out), dtype=np.float64 if d is dt.float64 else np.float32)
        v = vals.astype(acc.dtype, copy=False)
    elif d.itemsize == 8:  # int64: add the uint64 bits, which wrap exactly like int64
        acc = xp.array(view(out), dtype=np.int64).view(np.uint64)
        v = vals.astype(np.int64).view(np.uint64)
    else:
        acc = xp.array(view(out), dtype=np.int32)
        v = vals.astype(np.int32)
    xp.add.at(acc, index, v)
    wr(out, acc.view(np.int64) if acc.dtype == np.uint64 else acc)


def index_add(out: Any, index: Any, src: Any, dim: int) -> None:
    _scatter_add(out, (slice(None),) * dim + (rd(index),), rd(src))


def _grid(shape: tuple[int, ...], dim: int, index: Any) -> tuple[Any, ...]:
    """Broadcastable index arrays addressing every position of `shape`, with `index` along dim."""
    xp = X.xp
    n = len(shape)
    return tuple(
        index if d == dim else xp.arange(size).reshape(tuple(-1 if e == d else 1 for e in range(n)))
        for d, size in enumerate(shape)
    )


def scatter_add(out: Any, index: Any, src: Any, dim: int) -> None:
    if index.numel() == 0:
        return
    idx = rd(index)
    vals = rd(src)[tuple(slice(0, n) for n in idx.shape)]
    _scatter_add(out, _grid(idx.shape, dim, idx), vals)


def gather(out: Any, a: Any, index: Any, dim: int) -> None:
    xp = X.xp
    idx = view(index)
    src = view(a)[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(idx.shape))]
    if a.ndim == 0:
        xp.copyto(view(out), src)
        return
    xp.copyto(view(out), xp.take_along_axis(src, idx, axis=dim))


def index_select(out: Any, a: Any, index: Any, dim: int) -> None:
    xp = X.xp
    if a.ndim == 0:
        xp.copyto(view(out), view(a))
        return
    xp.copyto(view(out), xp.take(view(a), view(index), axis=dim))


def cat(out: Any, tensors: list[Any], dim: int) -> None:
    xp = X.xp
    ov = view(out)
    pos = 0
    for t in tensors:
        n = t.shape[dim]
        dst = ov[(slice(None),) * dim + (slice(pos, pos + n),)]
        if t.dtype is out.dtype:
            xp.copyto(dst, view(t))
        else:
            vals = rd(t)
            if out.dtype is dt.bfloat16:
                vals = f32_to_bf16_bits(xp.broadcast_to(vals.astype(np.float32), dst.shape))
            xp.copyto(dst, vals, casting="unsafe")
        pos += n


def nonzero(out: Any, mask: Any) -> None:
    wr(out, X.xp.argwhere(rd(mask)))


def sort(values: Any, indices: Any, a: Any, dim: int, descending: bool) -> None:
    xp = X.xp
    x = rd(a)
    if x.ndim == 0:
        wr(indices, 0)
        wr(values, x)
        return
    if descending:  # stable descending: ties keep their original order, like the reference
        n = x.shape[dim]
        idx = n - 1 - xp.flip(argsort(xp.flip(x, dim), dim), dim)
    else:
        idx = argsort(x, dim)
    wr(indices, idx)
    wr(values, xp.take_along_axis(x, idx, axis=dim))


_PLAIN: dict[str, Callable[..., None]] = {
    "matmul": matmul,
    "gather": gather,
    "index_select": index_select,
    "index_add": index_add,
    "scatter_add": scatter_add,
    "cat": cat,
    "nonzero": nonzero,
    "sort": sort,
}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
