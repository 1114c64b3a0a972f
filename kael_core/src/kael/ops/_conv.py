"""Convolutions (1-d and 2-d, transposed 2-d) and padding: argument checks, then the conv2d fused op.

NOTE [convolution by gather and matmul]
---------------------------------------
A convolution is an im2col gather plus one matmul per group: for each kernel offset the
(padded, batch and channel dims swapped) input is viewed with strides at positions
``o*stride + k*dilation``, and the views are copied into columns
[C, k1*k2, N, o1, o2] = [g, C/g*k1*k2, N*o1*o2], multiplied by the weight [g, O/g, C/g*k1*k2]:
the result [O, N, o1, o2] is returned as the view [N, O, o1, o2]. That is the decomposition
of the ``conv2d`` fused op (and of its backward, ``conv2d_backward``) in ``_conv_fused``
(NOTE [conv2d fused op]); backends with kernels for them (C++, CUDA) run those instead.
``conv1d`` is conv2d with H = 1. ``windows`` (the same gather as a differentiable op) serves
the pooling layers. A transposed convolution is the
convolution of the stride-dilated input (zeros inserted by ``cat`` and ``reshape``) with
the flipped, transposed weight. Padding modes other than zeros gather the padded input
from index tables (reflect, replicate, circular), as ``torch.nn.functional.pad`` does.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ..autograd._grad_mode import no_grad

__all__ = [
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "pad",
    "windows",
    "ntuple",
    "index_tensor",
    "channel_sum",
    "add_channel_bias",
]

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _ops() -> Any:
    from .. import ops

    return ops


def ntuple(op: str, name: str, v: Any, n: int, minimum: int = 0) -> tuple[int, ...]:
    """v (an int or a sequence of n ints, each >= minimum) as an n-tuple; a ShapeError naming it otherwise."""
    vals = (v,) * n if isinstance(v, int) and not isinstance(v, bool) else v
    if (
        not isinstance(vals, (tuple, list))
        or len(vals) != n
        or any(isinstance(x, bool) or not isinstance(x, int) or x < minimum for x in vals)
    ):
        raise ShapeError(f"{op}: {name} must be an int >= {minimum} or a sequence of {n} of them, got {v!r}")
    return tuple(vals)


def index_tensor(idx: np.ndarray, device: Any) -> Tensor:
    """An int64 kael tensor of the host index table idx on device."""
    return _ops().tensor(np.ascontiguousarray(idx, dtype=np.int64), dtype=dt.int64, device=device)  # type: ignore[no-any-return]


def _window_keys(
    kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...], outs: list[int]
) -> list[tuple[slice, ...]]:
    keys = []
    for offs in itertools.product(*(range(k) for k in kernel)):
        key = [slice(None), slice(None)]
        for i, o in enumerate(offs):
            start = o * dilation[i]
            key.append(slice(start, start + (outs[i] - 1) * stride[i] + 1, stride[i]))
        keys.append(tuple(key))
    return keys


class _Windows(Function):
    """x [N, C, *S] -> [N, C, K, *outs]: one strided view per kernel offset, stacked (one copy).

    The backward adds each slice of the gradient back into its view of a zero tensor, in place
    (K strided adds; no K full-size temporaries as the stack's and slices' own backwards would make).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, keys: list[tuple[slice, ...]], dim: int) -> Tensor:
        ops = _ops()
        ctx.keys, ctx.shape, ctx.dim = keys, x.shape, dim
        return ops.stack([x[key] for key in keys], dim)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        ops = _ops()
        with no_grad():
            dx = ops.zeros(*ctx.shape, dtype=g.dtype, device=g.device)
            for j, key in enumerate(ctx.keys):
                dx[key].add_(ops.select(g, ctx.dim, j))
        return dx, None, None


def windows(
    x: Tensor,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    outs: list[int],
    dim: int = 2,
) -> Tensor:
    """x [A, B, *S] -> the K = prod(kernel) windows stacked at ``dim`` (2: [A, B, K, *outs]; 1: [A, K, B, *outs]);
    window j at output position o is x at o*stride + k_j*dilation."""
    return _Windows.apply(x, _window_keys(kernel, stride, dilation, outs), dim)  # type: ignore[no-any-return]


def channel_sum(t: Tensor) -> Tensor:
    """t [N, C, *S] summed to [C]: over the trailing dims first, then the batch (two contiguous-friendly
    reductions; one reduction over (0, 2, ...) at once is several times slower on CPU backends)."""
    ops = _ops()
    if t.ndim > 2:
        t = ops.sum(t, tuple(range(2, t.ndim)))
    return ops.sum(t, 0)  # type: ignore[no-any-return]


class _AddChannelBias(Function):
    """x [N, C, *S] + b [C] broadcast over the batch and spatial dims; b's gradient is channel_sum(g)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, b: Tensor) -> Tensor:
        return _ops().add(x, _ops().reshape(b, (b.shape[0],) + (1,) * (x.ndim - 2)))  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        need = ctx.needs_input_grad
        return (g if need[0] else None), (channel_sum(g) if need[1] else None)


def add_channel_bias(x: Tensor, b: Tensor) -> Tensor:
    """x [N, C, *S] plus a per-channel bias b [C] (differentiable in both)."""
    return _AddChannelBias.apply(x, b)  # type: ignore[no-any-return]


def _pad_index(n: int, before: int, after: int, mode: str, op: str) -> np.ndarray:
    i = np.arange(-before, n + after)
    if mode == "reflect":
        if before >= n or after >= n:
            raise ShapeError(f"{op}: reflect padding ({before}, {after}) must be smaller than the dimension {n}")
        i = np.abs(i)
        return np.where(i >= n, 2 * (n - 1) - i, i)
    if mode == "circular":
        if before > n or after > n:
            raise ShapeError(f"{op}: circular padding ({before}, {after}) must not exceed the dimension {n}")
        return np.mod(i, n)
    if n == 0:
        raise ShapeError(f"{op}: {mode} padding of an empty dimension")
    return np.clip(i, 0, n - 1)


def _pad_dim(x: Tensor, dim: int, before: int, after: int, mode: str, value: float, op: str) -> Tensor:
    ops = _ops()
    if before == 0 and after == 0:
        return x
    if before < 0 or after < 0:  # negative padding crops, as in PyTorch
        x = ops.narrow(x, dim, max(0, -before), x.shape[dim] - max(0, -before) - max(0, -after))
        return _pad_dim(x, dim, max(0, before), max(0, after), mode, value, op)
    if mode == "constant":
        parts = []
        for n in (before, None, after):
            if n is None:
                parts.append(x)
            elif n:
                shape = x.shape[:dim] + (n,) + x.shape[dim + 1 :]
                parts.append(ops.full(shape, value, dtype=x.dtype, device=x.device))
        return ops.cat(parts, dim)  # type: ignore[no-any-return]
    return ops.index_select(x, dim, index_tensor(_pad_index(x.shape[dim], before, after, mode, op), x.device))  # type: ignore[no-any-return]


def pad(input: Tensor, pad: Any, mode: str = "constant", value: float | None = None) -> Tensor:
    """``torch.nn.functional.pad``: pad = (last_before, last_after, 2nd_last_before, ...); modes
    constant (value, default 0), reflect, replicate, circular. Differentiable."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"pad: input must be a tensor, got {type(input).__name__}")
    if mode not in PAD_MODES:
        raise DTypeError(f"pad: mode must be one of {', '.join(map(repr, PAD_MODES))}, got {mode!r}")
    if (
        not isinstance(pad, (tuple, list))
        or len(pad) % 2
        or any(isinstance(p, bool) or not isinstance(p, int) for p in pad)
    ):
        raise ShapeError(f"pad: pad must be a sequence of an even number of ints, got {pad!r}")
    if len(pad) // 2 > input.ndim:
        raise ShapeError(f"pad: {len(pad) // 2} padded dims for a {input.ndim}-d input")
    if mode != "constant" and value:
        raise DTypeError(f"pad: value is only meaningful for mode 'constant', got {value!r} with {mode!r}")
    x = input
    for i in range(len(pad) // 2):
        x = _pad_dim(x, input.ndim - 1 - i, pad[2 * i], pad[2 * i + 1], mode, float(value or 0.0), "pad")
    return x


def _check_conv(op: str, x: Tensor, w: Tensor, b: Tensor | None, nd: int, groups: int) -> bool:
    """Check operands; True when x is unbatched (no N dim)."""
    for name, t in (("input", x), ("weight", w)):
        if not isinstance(t, Tensor) or not t.dtype.is_floating_point:
            raise DTypeError(f"{op}: {name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t))!r}")
    if w.ndim != nd + 2:
        raise ShapeError(f"{op}: weight must be {nd + 2}-d [out, in/groups, *kernel], got {list(w.shape)}")
    if x.ndim not in (nd + 1, nd + 2):
        raise ShapeError(f"{op}: input must be {nd + 1}-d or {nd + 2}-d (batched), got {list(x.shape)}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}")
    if b is not None and (not isinstance(b, Tensor) or b.shape != (w.shape[0],)):
        raise ShapeError(f"{op}: bias must have shape [{w.shape[0]}], got {list(getattr(b, 'shape', ()))}")
    return x.ndim == nd + 1


def conv_nd(
    op: str, x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any, dilation: Any, groups: int
) -> Tensor:
    """The n-d convolution (n = w.ndim - 2, 1 or 2) of x [N, C, *S] with w [O, C/groups, *K] (cross-correlation),
    checked here and run as the conv2d fused op."""
    ops = _ops()
    nd = w.ndim - 2
    unbatched = _check_conv(op, x, w, b, nd, groups)
    if unbatched:
        x = ops.unsqueeze(x, 0)
    s = ntuple(op, "stride", stride, nd, 1)
    d = ntuple(op, "dilation", dilation, nd, 1)
    c = x.shape[1]
    o, cg = w.shape[0], w.shape[1]
    if c % groups or o % groups:
        raise ShapeError(
            f"{op}: groups={groups} must divide in_channels {c} and out_channels {o} (input {list(x.shape)})"
        )
    if cg * groups != c:
        raise ShapeError(
            f"{op}: weight {list(w.shape)} expects {cg * groups} input channels (groups={groups}), "
            f"input {list(x.shape)} has {c}"
        )
    k = w.shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":
            if any(v != 1 for v in s):
                raise ShapeError(f"{op}: padding='same' needs stride 1, got stride {s}")
            pads = [(t // 2, t - t // 2) for t in (di * (ki - 1) for di, ki in zip(d, k))]
        else:
            raise DTypeError(f"{op}: padding must be 'same', 'valid', an int or a tuple of ints, got {padding!r}")
    else:
        pads = [(p, p) for p in ntuple(op, "padding", padding, nd, 0)]
    for i, (lo, hi) in enumerate(pads):  # the fused op pads symmetrically: pad any extra on the high side here
        x = _pad_dim(x, 2 + i, 0, hi - lo, "constant", 0.0, op)
    sym = tuple(lo for lo, _ in pads)
    for i in range(nd):
        span = d[i] * (k[i] - 1) + 1
        if x.shape[2 + i] + 2 * sym[i] < span:
            raise ShapeError(
                f"{op}: kernel_size {tuple(k)} (dilated extent {span}) is larger than the padded input "
                f"{[v + 2 * p for v, p in zip(x.shape[2:], sym)]} in spatial dim {i}"
            )
    if (b is not None and b.dtype is not x.dtype) or w.dtype is not x.dtype:
        raise DTypeError(f"{op}: input {x.dtype!r}, weight {w.dtype!r} and bias must share a dtype")
    from ._conv_fused import conv2d_fused  # the conv2d fused op (NOTE [conv2d fused op]); 1-d as H = 1

    if nd == 1:
        x1, w1 = ops.unsqueeze(x, 2), ops.unsqueeze(w, 2)
        out = ops.squeeze(conv2d_fused(x1, w1, b, (1, s[0]), (0, sym[0]), (1, d[0]), groups), 2)
    else:
        out = conv2d_fused(x, w, b, (s[0], s[1]), (sym[0], sym[1]), (d[0], d[1]), groups)
    return ops.squeeze(out, 0) if unbatched else out  # type: ignore[no-any-return]


def conv1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """1-d convolution of input [N, C, L] (or [C, L]) with weight [O, C/groups, K], as torch.nn.functional.conv1d."""
    return conv_nd("conv1d", input, weight, bias, stride, padding, dilation, groups)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """2-d convolution of input [N, C, H, W] (or [C, H, W]) with weight [O, C/groups, kH, kW]; padding an int,
    a pair, 'same' or 'valid', as torch.nn.functional.conv2d. Differentiable in all three tensors."""
    return conv_nd("conv2d", input, weight, bias, stride, padding, dilation, groups)


def _dilate(x: Tensor, dim: int, s: int) -> Tensor:
    """Insert s-1 zeros between consecutive elements of x along dim."""
    ops = _ops()
    if s == 1 or x.shape[dim] == 0:
        return x
    n = x.shape[dim]
    u = ops.unsqueeze(x, dim + 1)
    z = ops.zeros(*(u.shape[: dim + 1] + (s - 1,) + u.shape[dim + 2 :]), dtype=x.dtype, device=x.device)
    y = ops.reshape(ops.cat([u, z], dim + 1), x.shape[:dim] + (n * s,) + x.shape[dim + 1 :])
    return ops.narrow(y, dim, 0, (n - 1) * s + 1)  # type: ignore[no-any-return]


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """Transposed 2-d convolution (the gradient of conv2d in its input) of input [N, C, H, W] with weight
    [C, O/groups, kH, kW], as torch.nn.functional.conv_transpose2d; output size
    (H-1)*stride - 2*padding + dilation*(kH-1) + output_padding + 1."""
    ops = _ops()
    op = "conv_transpose2d"
    for name, t in (("input", input), ("weight", weight)):
        if not isinstance(t, Tensor) or not t.dtype.is_floating_point:
            raise DTypeError(f"{op}: {name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t))!r}")
    if weight.ndim != 4:
        raise ShapeError(f"{op}: weight must be 4-d [in, out/groups, kH, kW], got {list(weight.shape)}")
    if input.ndim not in (3, 4):
        raise ShapeError(f"{op}: input must be 3-d or 4-d (batched), got {list(input.shape)}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}")
    unbatched = input.ndim == 3
    x = ops.unsqueeze(input, 0) if unbatched else input
    s = ntuple(op, "stride", stride, 2, 1)
    p = ntuple(op, "padding", padding, 2, 0)
    op_ = ntuple(op, "output_padding", output_padding, 2, 0)
    d = ntuple(op, "dilation", dilation, 2, 1)
    for i in range(2):
        if op_[i] >= max(s[i], d[i]):
            raise ShapeError(f"{op}: output_padding {op_} must be smaller than stride {s} or dilation {d}")
    c, og = weight.shape[0], weight.shape[1]
    if x.shape[1] != c or c % groups:
        raise ShapeError(
            f"{op}: input {list(x.shape)} must have weight's {c} input channels, divisible by groups={groups}"
        )
    k = weight.shape[2:]
    # weight [C, O/g, kh, kw] -> [O, C/g, kh, kw], flipped spatially
    w = ops.reshape(weight, (groups, c // groups, og) + k)
    w = ops.reshape(ops.transpose(w, 1, 2), (groups * og, c // groups) + k)
    w = ops.index_select(w, 2, index_tensor(np.arange(k[0])[::-1], w.device))
    w = ops.index_select(w, 3, index_tensor(np.arange(k[1])[::-1], w.device))
    for i in range(2):
        x = _dilate(x, 2 + i, s[i])
        lo = d[i] * (k[i] - 1) - p[i]
        x = _pad_dim(x, 2 + i, lo, lo + op_[i], "constant", 0.0, op)
    out = conv_nd(op, x, w, bias, 1, 0, d, groups)
    return ops.squeeze(out, 0) if unbatched else out
