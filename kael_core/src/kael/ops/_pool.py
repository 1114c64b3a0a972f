"""Pooling (max, average, adaptive average) and resampling (nearest, bilinear), with kael's differentiable ops.

As the convolutions (NOTE [convolution by gather and matmul] in ``_conv``), windows are
gathered as stacked strided views after padding. Max pooling sums each window times a
mask of its first maximum, so the gradient goes to one element, as in PyTorch (``amax``
would share it between ties, e.g. the zeros after a ReLU). Average
pooling divides window sums by a host-computed divisor table (PyTorch's rules for
``ceil_mode``, ``count_include_pad`` and ``divisor_override``). Adaptive average pooling
and bilinear resampling are separable linear maps: ``A_h @ x @ A_w^T`` with small
host-built matrices, so their gradients are matmuls too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd._grad_mode import no_grad
from ._conv import _pad_dim, index_tensor, ntuple, windows

__all__ = ["max_pool_nd", "max_pool_composed", "avg_pool_nd", "adaptive_avg_pool_nd", "interpolate"]


def _ops() -> Any:
    from .. import ops

    return ops


def _pool_input(op: str, x: Any, nd: int) -> tuple[Tensor, bool]:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: input must be a tensor, got {type(x).__name__}")
    if x.ndim not in (nd + 1, nd + 2):
        raise ShapeError(f"{op}: input must be {nd + 1}-d or {nd + 2}-d (batched), got {list(x.shape)}")
    unbatched = x.ndim == nd + 1
    return (_ops().unsqueeze(x, 0) if unbatched else x), unbatched


def _out_size(op: str, n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = d * (k - 1) + 1
    num = n + 2 * p - span
    if num < 0:
        raise ShapeError(f"{op}: kernel_size {k} (dilated extent {span}) is larger than the padded input {n + 2 * p}")
    o = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (o - 1) * s >= n + p:  # the last window must start inside the input or left padding
        o -= 1
    return o


def _windows(
    op: str,
    x: Tensor,
    k: tuple[int, ...],
    s: tuple[int, ...],
    p: tuple[int, ...],
    d: tuple[int, ...],
    ceil_mode: bool,
    fill: float,
) -> tuple[Tensor, list[int]]:
    """x [N, C, *S] padded with fill and gathered into [N, C, K, *outs] (K = prod(k))."""
    nd = len(k)
    outs = []
    for i in range(nd):
        if p[i] * 2 > k[i]:
            raise ShapeError(f"{op}: padding {p} must be at most half of kernel_size {k}")
        outs.append(_out_size(op, x.shape[2 + i], k[i], s[i], p[i], d[i], ceil_mode))
    for i in range(nd):
        need = (outs[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1
        right = max(0, need - x.shape[2 + i] - p[i])
        x = _pad_dim(x, 2 + i, p[i], right, "constant", fill, op)
    return windows(x, k, s, d, outs), outs


def _args(op: str, nd: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any) -> tuple[tuple[int, ...], ...]:
    k = ntuple(op, "kernel_size", kernel_size, nd, 1)
    s = (
        k
        if stride is None or (isinstance(stride, (list, tuple)) and not stride)
        else ntuple(op, "stride", stride, nd, 1)
    )
    return k, s, ntuple(op, "padding", padding, nd, 0), ntuple(op, "dilation", dilation, nd, 1)


def max_pool_nd(
    op: str,
    nd: int,
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """Max pooling over the last nd dims (PyTorch's max_pool1d/2d), run as the max_pool2d fused op (1-d as
    H = 1); with return_indices also the flat index of each maximum within its input plane (int64)."""
    from ._pool_fused import max_pool2d_fused

    ops = _ops()
    x, unbatched = _pool_input(op, input, nd)
    k, s, p, d = _args(op, nd, kernel_size, stride, padding, dilation)
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: input must be a floating-point tensor, got {x.dtype!r}")
    for i in range(nd):
        if p[i] * 2 > k[i]:
            raise ShapeError(f"{op}: padding {p} must be at most half of kernel_size {k}")
        _out_size(op, x.shape[2 + i], k[i], s[i], p[i], d[i], ceil_mode)  # checks the window fits
    if nd == 1:
        x2 = ops.unsqueeze(x, 2)
        out, idx = max_pool2d_fused(x2, (1, k[0]), (1, s[0]), (0, p[0]), (1, d[0]), bool(ceil_mode))
        out, idx = ops.squeeze(out, 2), ops.squeeze(idx, 2)
    else:
        out, idx = max_pool2d_fused(x, (k[0], k[1]), (s[0], s[1]), (p[0], p[1]), (d[0], d[1]), bool(ceil_mode))
    if unbatched:
        out, idx = ops.squeeze(out, 0), ops.squeeze(idx, 0)
    return (out, idx) if return_indices else out


def max_pool_composed(
    x: Tensor, k: tuple[int, ...], s: tuple[int, ...], p: tuple[int, ...], d: tuple[int, ...], ceil_mode: bool
) -> tuple[Tensor, Tensor]:
    """Max pooling of checked x [N, C, *S] composed of primitives: (values, flat indices within each plane).

    The decomposition of the max_pool2d fused op (``_pool_fused``); differentiable in x as well.
    """
    ops = _ops()
    nd = len(k)
    w, outs = _windows("max_pool2d", x, k, s, p, d, ceil_mode, -math.inf)
    n, c = x.shape[:2]
    kk = int(np.prod(k))
    first = _first_max(w)  # [N, C, K, *outs], True at each window's first maximum
    out = ops.sum(ops.where(first, w, 0.0), 2)  # the gradient goes to that element only
    with no_grad():
        m = ops.amax(w, 2)
    out = ops.where(ops.ne(m, m), m, out)  # a NaN in a window gives NaN, as in PyTorch
    # the flat input position of window offset j at output position (o1, o2, ...)
    sizes = x.shape[2:]
    pos = np.zeros(tuple(outs) + (kk,), np.int64)
    grids = np.meshgrid(*[np.arange(o) for o in outs], indexing="ij")
    kgrids = np.meshgrid(*[np.arange(kv) for kv in k], indexing="ij")
    inside = np.ones(pos.shape, bool)
    for i in range(nd):
        coord = grids[i][..., None] * s[i] - p[i] + kgrids[i].reshape(-1) * d[i]
        pos = pos * sizes[i] + coord
        inside &= (coord >= 0) & (coord < sizes[i])
    pos = np.where(inside, pos, -1)  # a window entirely in the padding gives index -1, as the kernels do
    table = index_tensor(np.moveaxis(pos, -1, 0), x.device)  # [K, *outs]
    with no_grad():
        arg = ops.argmax(w, 2, keepdim=True)
        flat = ops.reshape(ops.gather(ops.expand(table, (n, c, kk, *outs)), 2, arg), (n, c, *outs))
    return out, flat


def _first_max(w: Tensor) -> Tensor:
    """A bool mask of w [N, C, K, ...]: True at the first maximum along dim 2 (no gradient).

    Elementwise ops only (one comparison with the maximum, then K slices marking the first hit),
    which is faster on CPU backends than an argmax and a gather/scatter over a middle dim.
    """
    ops = _ops()
    with no_grad():
        wd = w.detach()
        hit = ops.eq(wd, ops.amax(wd, 2, keepdim=True))
        k = w.shape[2]
        if k == 1:
            return ops.ones(w.shape, dtype=dt.bool_, device=w.device)  # type: ignore[no-any-return]
        marks, taken = [], None
        for j in range(k):
            h = ops.select(hit, 2, j)
            marks.append(h if taken is None else ops.logical_and(h, ops.logical_not(taken)))
            taken = h if taken is None else ops.logical_or(taken, h)
        return ops.stack(marks, 2)  # type: ignore[no-any-return]


def _avg_divisors(n: int, k: int, s: int, p: int, o: int, count_include_pad: bool) -> np.ndarray:
    start = np.arange(o) * s - p
    end = np.minimum(start + k, n + p)
    size = end - start
    if count_include_pad:
        return size.astype(np.float64)
    return (np.minimum(end, n) - np.maximum(start, 0)).astype(np.float64)


def avg_pool_nd(
    op: str,
    nd: int,
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """Average pooling over the last nd dims (PyTorch's avg_pool1d/2d rules for the divisor)."""
    ops = _ops()
    x, unbatched = _pool_input(op, input, nd)
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: input must be a floating-point tensor, got {x.dtype!r}")
    k, s, p, d = _args(op, nd, kernel_size, stride, padding, 1)
    if divisor_override is not None and (
        isinstance(divisor_override, bool) or not isinstance(divisor_override, int) or divisor_override <= 0
    ):
        raise ShapeError(f"{op}: divisor_override must be a positive int or None, got {divisor_override!r}")
    from ._avg_pool_fused import avg_pool2d_fused  # NOTE [avg_pool2d fused op]; 1-d as H = 1

    outs = []
    for i in range(nd):
        if p[i] * 2 > k[i]:
            raise ShapeError(f"{op}: padding {p} must be at most half of kernel_size {k}")
        outs.append(_out_size(op, x.shape[2 + i], k[i], s[i], p[i], d[i], ceil_mode))
    if divisor_override is not None:
        div = np.full(tuple(outs), float(divisor_override))
    else:
        div = np.ones((), np.float64)
        for i in range(nd):
            div = np.multiply.outer(div, _avg_divisors(x.shape[2 + i], k[i], s[i], p[i], outs[i], count_include_pad))
    table = ops.tensor(
        np.ascontiguousarray(div.reshape((1,) * (2 - nd) + tuple(outs))), dtype=dt.float64, device=x.device
    )
    if nd == 1:
        out = ops.squeeze(avg_pool2d_fused(ops.unsqueeze(x, 2), table, (1, k[0]), (1, s[0]), (0, p[0])), 2)
    else:
        out = avg_pool2d_fused(x, table, (k[0], k[1]), (s[0], s[1]), (p[0], p[1]))
    return ops.squeeze(out, 0) if unbatched else out  # type: ignore[no-any-return]


def _adaptive_matrix(n: int, o: int) -> np.ndarray:
    m = np.zeros((o, n), np.float64)
    for i in range(o):
        a, b = (i * n) // o, -(-((i + 1) * n) // o)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _apply_separable(x: Tensor, mats: list[np.ndarray]) -> Tensor:
    """x [N, C, *S] with each spatial dim i mapped by mats[i] [o_i, S_i] (a matmul per dim)."""
    ops = _ops()
    nd = len(mats)
    for i, m in enumerate(mats):
        dim = 2 + i
        mt = ops.tensor(np.ascontiguousarray(m.T), dtype=x.dtype, device=x.device)  # [S_i, o_i]
        moved = ops.transpose(x, dim, x.ndim - 1) if dim != x.ndim - 1 else x
        y = ops.matmul(moved, mt)
        x = ops.transpose(y, dim, x.ndim - 1) if dim != x.ndim - 1 else y
    del nd
    return x


def adaptive_avg_pool_nd(op: str, nd: int, input: Tensor, output_size: Any) -> Tensor:
    """Adaptive average pooling to output_size over the last nd dims (None keeps a dim), PyTorch's windows
    [floor(i*n/o), ceil((i+1)*n/o))."""
    x, unbatched = _pool_input(op, input, nd)
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: input must be a floating-point tensor, got {x.dtype!r}")
    sizes = (output_size,) * nd if isinstance(output_size, int) or output_size is None else tuple(output_size)
    if len(sizes) != nd:
        raise ShapeError(f"{op}: output_size must be an int or a sequence of {nd}, got {output_size!r}")
    outs = [x.shape[2 + i] if v is None else v for i, v in enumerate(sizes)]
    for v in outs:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ShapeError(f"{op}: output_size must hold positive ints (or None), got {output_size!r}")
    for i in range(nd):
        if x.shape[2 + i] == 0:
            raise ShapeError(f"{op}: input {list(x.shape)} has an empty spatial dim")
    out = _apply_separable(x, [_adaptive_matrix(x.shape[2 + i], outs[i]) for i in range(nd)])
    return _ops().squeeze(out, 0) if unbatched else out


def _linear_matrix(n: int, o: int, scale: float, align_corners: bool) -> np.ndarray:
    m = np.zeros((o, n), np.float64)
    for i in range(o):
        if align_corners:
            src = i * (n - 1) / (o - 1) if o > 1 else 0.0
        else:
            src = max((i + 0.5) * scale - 0.5, 0.0)
        i0 = min(math.floor(src), n - 1)
        i1 = min(i0 + 1, n - 1)
        f = src - i0
        m[i, i0] += 1.0 - f
        m[i, i1] += f
    return m


def interpolate(
    input: Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """Resample the spatial dims of input [N, C, *S] (1-d or 2-d) to ``size`` or by ``scale_factor``:
    mode 'nearest' (PyTorch's floor(dst * in/out)), 'linear' (1-d) or 'bilinear' (2-d), with
    PyTorch's align_corners (None is False) and recompute_scale_factor. Differentiable."""
    op = "interpolate"
    if not isinstance(input, Tensor) or not input.dtype.is_floating_point:
        raise DTypeError(f"{op}: input must be a floating-point tensor, got {getattr(input, 'dtype', type(input))!r}")
    nd = input.ndim - 2
    if nd not in (1, 2):
        raise ShapeError(f"{op}: input must be 3-d [N, C, L] or 4-d [N, C, H, W], got {list(input.shape)}")
    if mode not in ("nearest", "linear", "bilinear"):
        raise DTypeError(f"{op}: mode must be 'nearest', 'linear' or 'bilinear', got {mode!r}")
    if (mode == "linear" and nd != 1) or (mode == "bilinear" and nd != 2):
        raise ShapeError(f"{op}: mode {mode!r} needs a {3 if mode == 'linear' else 4}-d input, got {list(input.shape)}")
    if antialias:
        raise DTypeError(f"{op}: antialias=True is not supported (anti-aliased downsampling); use antialias=False")
    if mode == "nearest" and align_corners is not None:
        raise DTypeError(f"{op}: align_corners only applies to linear modes, got mode 'nearest'")
    if (size is None) == (scale_factor is None):
        raise ShapeError(
            f"{op}: give exactly one of size and scale_factor, got size={size!r}, scale_factor={scale_factor!r}"
        )
    spatial = input.shape[2:]
    if size is not None:
        outs = list(ntuple(op, "size", size, nd, 1))
        scales = [n / o for n, o in zip(spatial, outs)]
    else:
        sf = (scale_factor,) * nd if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
        if len(sf) != nd or any(not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0 for v in sf):
            raise ShapeError(f"{op}: scale_factor must be a positive number or {nd} of them, got {scale_factor!r}")
        outs = [math.floor(n * f) for n, f in zip(spatial, sf)]
        if any(o < 1 for o in outs):
            raise ShapeError(f"{op}: scale_factor {scale_factor!r} gives an empty output for input {list(input.shape)}")
        # recompute_scale_factor=True: the scale from the rounded output size, as if size had been given
        scales = [n / o for n, o in zip(spatial, outs)] if recompute_scale_factor else [1.0 / f for f in sf]
    ops = _ops()
    if mode == "nearest":
        x = input
        for i in range(nd):
            src = np.minimum(np.floor(np.arange(outs[i]) * np.float32(scales[i])).astype(np.int64), spatial[i] - 1)
            x = ops.index_select(x, 2 + i, index_tensor(src, x.device))
        return x
    mats = [_linear_matrix(spatial[i], outs[i], scales[i], bool(align_corners)) for i in range(nd)]
    return _apply_separable(input, mats)
