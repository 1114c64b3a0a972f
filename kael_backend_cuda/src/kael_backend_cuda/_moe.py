"""The mixture-of-experts fused ops on CUDA: ``moe_route`` and ``expert_linear`` (kael/ops/_moe_fused.py).

``moe_route`` is one raw row kernel, a thread block per token: the softmax of the router logits
(float32, float64 for float64 logits), each expert's place in the routing order counted (larger
first, equal ones in index order, NOTE [routing ties]), the k first written, renormalised when
asked. ``expert_linear`` groups the T*K assignments by expert on the device (CuPy's stable sort,
then the tile tables by binary search and a cumulative sum: no host round trip) and runs one grouped
kernel over every expert hit (NOTE [expert grouping]): 64-row tiles of one expert's rows against
64 output columns of its weight, which is read in place in its storage dtype (16-bit weights are
widened as they are loaded, never copied) and with any strides (the backward's transposed view).
x is float32 (float64 for float64 operands; 16-bit x is widened first) and read in place with
its strides, so the frontend's stride-0 broadcast over K is never materialised.

Numerics: each output is a sum over the C products in index order, accumulated in float32
(float64 for float64), so a row's values do not depend on which other rows share the call
(batched = alone, bit for bit, on the GPU). Under emulation (NOTE [host emulation] in ``_xp``)
both launchers run NumPy twins: ``moe_route_rows`` the same arithmetic, ``expert_linear_tiles``
the same tile tables and block-to-tile mapping, each tile one NumPy product.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from kael.backends import dtypes as dt

from ._fused import _dst, _finish
from ._io import compute_dtype, rd, view
from ._moe_source import MOE_KERNEL_NAMES, MOE_KERNELS_SOURCE, TILE_COLS, TILE_ROWS, TILE_THREADS
from ._raw_kernels import _block
from ._xp import X, argsort, quiet, state

__all__ = ["KERNELS", "moe_route_rows", "expert_linear_tiles", "tile_tables"]

_MAX_GRID_Y = 65535
_WEIGHT_TYPES = {dt.float32: "float", dt.float64: "double", dt.float16: "kael_half", dt.bfloat16: "kael_bf16"}

_module: Any = None


def _kernel(name: str) -> Any:
    global _module
    if _module is None:
        _module = state().cupy.RawModule(
            code=MOE_KERNELS_SOURCE, options=("--std=c++14",), name_expressions=MOE_KERNEL_NAMES
        )
    return _module.get_function(name)


def _scalar_type(dtype: Any) -> str:
    return "double" if dtype == np.float64 else "float"


# -- launchers (GPU) and NumPy twins (emulation) ---------------------------------------------------
def moe_route_rows(x: Any, weights: Any, experts: Any, k: int, normalize: bool) -> None:
    """weights [rows, k], experts int64 [rows, k] = the top k of softmax(x [rows, e]); all C-contiguous."""
    rows, e = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            z = np.exp(x - np.max(x, axis=-1, keepdims=True))
            p = z / np.sum(z, axis=-1, keepdims=True)
            idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]  # NaN last, ties in index order
            w = np.take_along_axis(p, idx, axis=-1)
            if normalize:
                total = w[:, 0].copy()
                for i in range(1, k):  # in routing order, as the kernel sums
                    total += w[:, i]
                w = w / total[:, None]
        weights[...] = w
        experts[...] = idx
        return
    p = X.xp.empty_like(x)
    args = (x, weights, experts, p, np.int32(e), np.int32(k), np.int32(normalize))
    _kernel(f"moe_route_rows<{_scalar_type(x.dtype)}>")((rows,), (_block(e),), args)


def tile_tables(ids: Any, e: int) -> tuple[Any, Any]:
    """(row_start, tile_end) int64 [e] for the expert ids of the assignments in sorted order: where each expert's
    rows begin, and the cumulative number of TILE_ROWS-row tiles of experts 0..e (xp ops: no host round trip)."""
    xp = X.xp
    every = xp.arange(e, dtype=np.int64)
    row_start = xp.searchsorted(ids, every, side="left")
    counts = xp.searchsorted(ids, every, side="right") - row_start
    return row_start.astype(np.int64), xp.cumsum((counts + (TILE_ROWS - 1)) // TILE_ROWS).astype(np.int64)


def _elements(a: Any) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def _widen(w: Any, wtype: str) -> Any:
    """Weights w in their storage (bfloat16 as uint16 bits) as float32/float64 (the twin's loads)."""
    if wtype == "kael_bf16":
        return (w.astype(np.uint32) << 16).view(np.float32)
    return w.astype(np.float32) if wtype == "kael_half" else w


def expert_linear_tiles(x: Any, w: Any, wtype: str, order: Any, row_start: Any, tile_end: Any, out: Any) -> None:
    """out [T*K, N] = w[e] @ x[t, j] for each assignment p = t*K + j of expert e (the kernel's comment).

    x [T, K, C] float32/float64 (any non-negative strides), w [E, N, C] of storage ``wtype`` (any
    strides), order int64 [T*K] the assignments sorted by expert (stable), row_start and tile_end
    int64 [E] their ``tile_tables``, out C-contiguous in x's dtype.
    """
    t, kk, c = x.shape
    e, n = w.shape[:2]
    total = t * kk
    if X.emulated:
        for b in range(int(tile_end[-1])):
            ex = int(np.searchsorted(tile_end, b, side="right"))
            first = int(row_start[ex]) + (b - (int(tile_end[ex - 1]) if ex else 0)) * TILE_ROWS
            stop = int(row_start[ex + 1]) if ex + 1 < e else total
            p = order[first : min(stop, first + TILE_ROWS)]
            out[p] = x[p // kk, p % kk] @ _widen(w[ex], wtype).T
        return
    if any(s < 0 or s % x.itemsize for s in x.strides):
        x = X.xp.ascontiguousarray(x)
    tiles_y = min(_MAX_GRID_Y, -(-n // TILE_COLS))
    grid = (-(-total // TILE_ROWS) + min(e, total), tiles_y)  # at least as many tiles as the experts make
    args = (
        x,
        w,
        order,
        row_start,
        tile_end,
        out,
        np.int32(e),
        np.int32(kk),
        np.int32(n),
        np.int32(c),
        np.int64(total),
        *(np.int64(s) for s in _elements(x) + _elements(w)),
    )
    _kernel(f"expert_linear_tiles<{wtype}>")(grid, (TILE_THREADS,), args)


# -- the ops -----------------------------------------------------------------------------------------
def moe_route(weights: Any, experts: Any, logits: Any, k: int, normalize: bool) -> None:
    if weights.numel() == 0:
        return
    cd = compute_dtype(logits)
    z = X.xp.ascontiguousarray(rd(logits), dtype=cd)
    shape = (z.shape[0], k)
    w, w_direct = _dst(weights, cd, shape, logits, experts)
    i, i_direct = _dst(experts, np.int64, shape, logits, weights)
    moe_route_rows(z, w, i, k, bool(normalize))
    _finish(weights, w, w_direct)
    _finish(experts, i, i_direct)


def expert_linear(out: Any, x: Any, weight: Any, experts: Any) -> None:
    if out.numel() == 0:
        return
    xp = X.xp
    t, kk, _ = x.shape
    e, n = weight.shape[:2]
    cd = compute_dtype(x, weight)
    flat = xp.ascontiguousarray(view(experts), dtype=np.int64).reshape(-1)
    order = argsort(flat, 0)  # stable: each expert's assignments in token order
    row_start, tile_end = tile_tables(flat[order], e)
    y, direct = _dst(out, cd, (t * kk, n), x, weight, experts)
    wtype = _WEIGHT_TYPES[weight.dtype]
    expert_linear_tiles(rd(x).astype(cd, copy=False), view(weight), wtype, order, row_start, tile_end, y)
    _finish(out, y, direct)


_PLAIN: dict[str, Callable[..., None]] = {"moe_route": moe_route, "expert_linear": expert_linear}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
