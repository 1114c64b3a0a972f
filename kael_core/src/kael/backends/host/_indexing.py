"""Matmul and the indexing family: gather, index_select, index_add, scatter_add, cat, nonzero, sort."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import rd, view, wr

__all__ = ["KERNELS"]


def _blas_ready(x: np.ndarray) -> np.ndarray:
    """x itself when NumPy can hand it to BLAS (unit stride in one of the last two dims, no
    broadcast batch dims); else a contiguous copy. NumPy's own (non-BLAS) matmul loop is far slower."""
    isz = x.itemsize
    if x.ndim >= 2 and (x.strides[-1] == isz or x.strides[-2] == isz) and all(st > 0 for st in x.strides[:-2]):
        return x
    return np.ascontiguousarray(x)


def matmul(out: Any, a: Any, b: Any) -> None:
    av, bv = rd(a), rd(b)
    if av.ndim > 2 and all(st == 0 for st in bv.strides[:-2]):
        # the right operand is shared by every batch (x @ W): one GEMM over all rows
        k = av.shape[-1]
        rows = np.ascontiguousarray(av).reshape(-1, k)
        wr(out, (rows @ _blas_ready(bv[(0,) * (bv.ndim - 2)])).reshape(out.shape))
        return
    wr(out, np.matmul(_blas_ready(av), _blas_ready(bv)))


def _full_index(index: np.ndarray, dim: int) -> tuple[np.ndarray, ...]:
    grids: list[np.ndarray] = list(np.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


def gather(out: Any, a: Any, index: Any, dim: int) -> None:
    wr(out, rd(a)[_full_index(rd(index), dim)])


def index_select(out: Any, a: Any, index: Any, dim: int) -> None:
    wr(out, np.take(rd(a), rd(index), axis=dim))


def index_add(out: Any, index: Any, src: Any, dim: int) -> None:
    acc = np.array(rd(out), dtype=np.float64 if out.dtype.is_floating_point else out.dtype.np)
    np.add.at(np.moveaxis(acc, dim, 0), rd(index), np.moveaxis(rd(src), dim, 0))
    wr(out, acc)


def scatter_add(out: Any, index: Any, src: Any, dim: int) -> None:
    acc = np.array(rd(out), dtype=np.float64 if out.dtype.is_floating_point else out.dtype.np)
    idx = rd(index)
    s = rd(src)[tuple(slice(0, n) for n in idx.shape)]
    np.add.at(acc, _full_index(idx, dim), s)
    wr(out, acc)


def cat(out: Any, tensors: list[Any], dim: int) -> None:
    wr(out, np.concatenate([rd(t) for t in tensors], axis=dim))


def nonzero(out: Any, mask: Any) -> None:
    wr(out, np.argwhere(rd(mask)))


def sort(values: Any, indices: Any, a: Any, dim: int, descending: bool) -> None:
    x = rd(a)
    if descending:
        n = x.shape[dim]
        idx = np.flip(np.argsort(np.flip(x, dim), axis=dim, kind="stable"), dim)
        idx = n - 1 - idx
    else:
        idx = np.argsort(x, axis=dim, kind="stable")
    wr(indices, idx)
    wr(values, np.take_along_axis(x, idx, axis=dim))


KERNELS: dict[str, Callable[..., None]] = {
    "matmul": matmul,
    "gather": gather,
    "index_select": index_select,
    "index_add": index_add,
    "scatter_add": scatter_add,
    "cat": cat,
    "nonzero": nonzero,
    "sort": sort,
}
_ = view
