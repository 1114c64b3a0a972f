"""Reductions over dims (int, tuple or None) with keepdim, and their gradients."""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor, contiguous_strides
from ..autograd._function import Function
from ._core import cast, empty, expand_to, wrap_dims
from ._pointwise import binary, unary
from ._views import reshape_nograd

__all__ = ["reduce_sum", "reduce_op"]


def _kept_shape(shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


def _final_shape(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return _kept_shape(shape, dims)
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def reduce_op(op: str, a: Tensor, dims: tuple[int, ...], keepdim: bool, out_dtype: dt.DType) -> Tensor:
    """Run reduction kernel `op` over wrapped dims (no autograd)."""
    if op in ("amax", "amin", "argmax", "argmin"):
        for d in dims:
            if a.shape[d] == 0:
                raise ShapeError(f"{op}: cannot reduce over dimension {d} of size 0 (shape {list(a.shape)})")
    kept = _kept_shape(a.shape, dims)
    if keepdim:
        res = out = empty(kept, out_dtype, a.device)
    else:  # the result owns its memory (not a view), so e.g. AccumulateGrad can keep it without a copy
        res = empty(_final_shape(a.shape, dims, False), out_dtype, a.device)
        out = Tensor._make(res._storage, kept, contiguous_strides(kept), 0, out_dtype, res)
    if dims:
        _dispatch.kernel(a.device.type, op)(out, a, dims)
    else:
        _dispatch.kernel(a.device.type, "copy")(out, a)
    return res


def _sum_dtype(a: Tensor, dtype: Any) -> dt.DType:
    if dtype is not None:
        return dt.as_dtype(dtype)
    return dt.int64 if a.dtype.category < 2 else a.dtype


def reduce_sum(a: Tensor, dims: tuple[int, ...], keepdim: bool = False, dtype: Any = None) -> Tensor:
    return reduce_op("sum", a, dims, keepdim, _sum_dtype(a, dtype))


class Sum(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        _check(a, "sum")
        dims = wrap_dims(dim, a.ndim, "sum")
        ctx.shape, ctx.dims, ctx.keepdim, ctx.dtype = a.shape, dims, keepdim, a.dtype
        return reduce_sum(a, dims, keepdim, dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        if not ctx.keepdim:
            g = reshape_nograd(g, _kept_shape(ctx.shape, ctx.dims))
        return cast(expand_to(g, ctx.shape), ctx.dtype)


class Prod(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        _check(a, "prod")
        dims = wrap_dims(dim, a.ndim, "prod")
        out = reduce_op("prod", a, dims, True, _sum_dtype(a, None))
        ctx.save_for_backward(a, out)
        ctx.dims, ctx.keepdim, ctx.shape = dims, keepdim, a.shape
        return out if keepdim else reshape_nograd(out, _final_shape(a.shape, dims, False))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        a, out = ctx.saved_tensors
        if not ctx.keepdim:
            g = reshape_nograd(g, _kept_shape(ctx.shape, ctx.dims))
        # d prod / d a_i = prod of the others; computed without dividing by zero.
        zero = binary("eq", a, 0.0)
        safe = Where_nograd(zero, 1.0, a)
        prod_nz = reduce_op("prod", safe, ctx.dims, True, a.dtype)
        nzeros = reduce_op("sum", zero, ctx.dims, True, dt.int64)
        others = Where_nograd(
            zero,
            Where_nograd(binary("eq", nzeros, 1), prod_nz, 0.0),
            Where_nograd(binary("eq", nzeros, 0), binary("div", out, safe), 0.0),
        )
        return binary("mul", expand_to(g, ctx.shape), others)


def Where_nograd(cond: Tensor, a: Any, b: Any) -> Tensor:
    from ._pointwise import Where

    return Where.forward(_NoSave(), cond, a, b)


class _NoSave:
    def save_for_backward(self, *a: Any) -> None:
        pass


class AmaxAmin(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, op: str, dim: Any = None, keepdim: bool = False) -> Tensor:
        _check(a, op)
        dims = wrap_dims(dim, a.ndim, op)
        out = reduce_op(op, a, dims, True, a.dtype)
        ctx.save_for_backward(a, out)
        ctx.dims, ctx.keepdim, ctx.shape = dims, keepdim, a.shape
        return out if keepdim else reshape_nograd(out, _final_shape(a.shape, dims, False))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        a, out = ctx.saved_tensors
        if not ctx.keepdim:
            g = reshape_nograd(g, _kept_shape(ctx.shape, ctx.dims))
        hit = binary("eq", a, expand_to(out, ctx.shape))
        count = reduce_op("sum", hit, ctx.dims, True, a.dtype)
        return binary("div", binary("mul", expand_to(g, ctx.shape), hit), count), None


class Amax(AmaxAmin):
    pass


class Amin(AmaxAmin):
    pass


def _check(a: Any, op: str) -> None:
    if not isinstance(a, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(a).__name__}")


def argreduce(op: str, a: Tensor, dim: Any, keepdim: bool) -> Tensor:
    _check(a, op)
    if dim is None:
        from ._views import reshape

        flat = reshape(a, (-1,))
        if flat.shape[0] == 0:
            raise ShapeError(f"{op}: cannot reduce an empty tensor")
        r = reduce_op(op, flat.contiguous() if not flat.is_contiguous() else flat, (0,), False, dt.int64)
        return reshape_nograd(r, (1,) * a.ndim) if keepdim else r
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise DTypeError(f"{op}: dim must be an int or None, got {dim!r}")
    (d,) = wrap_dims(dim, a.ndim, op) or (0,)
    if a.ndim == 0:
        return reduce_op("fill", a, (), keepdim, dt.int64) if False else _zero_index(a)
    return reduce_op(op, a, (d,), keepdim, dt.int64)


def _zero_index(a: Tensor) -> Tensor:
    out = empty((), dt.int64, a.device)
    _dispatch.kernel(a.device.type, "fill")(out, 0)
    return out


def logical_reduce(op: str, a: Tensor, dim: Any, keepdim: bool) -> Tensor:
    _check(a, op)
    dims = wrap_dims(dim, a.ndim, op)
    src = a if a.dtype is dt.bool_ else binary("ne", a, 0)
    return reduce_op(op, src, dims, keepdim, dt.bool_)


def mean(a: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """The mean over ``dim`` (an int, a tuple, or None for all elements) of a floating-point tensor."""
    _check(a, "mean")
    if dtype is None and not a.dtype.is_floating_point:
        raise DTypeError(f"mean: expected a floating-point tensor, got {a.dtype!r}; pass dtype= or cast first")
    dims = wrap_dims(dim, a.ndim, "mean")
    n = 1
    for d in dims:
        n *= a.shape[d]
    s = Sum.apply(a, dim, keepdim, dtype)
    from ._pointwise import Div

    return Div.apply(s, float(n) if n else float("nan"))  # type: ignore[no-any-return]


def var(a: Tensor, dim: Any = None, correction: int = 1, keepdim: bool = False) -> Tensor:
    """The variance over ``dim``: sum((x - mean)**2) / (N - correction) (Bessel's correction by default)."""
    _check(a, "var")
    if not a.dtype.is_floating_point:
        raise DTypeError(f"var: expected a floating-point tensor, got {a.dtype!r}")
    dims = wrap_dims(dim, a.ndim, "var")
    n = 1
    for d in dims:
        n *= a.shape[d]
    from ._pointwise import Div, Mul, Sub

    mu = mean(a, dim, True)
    dev = Sub.apply(a, mu)
    ss = Sum.apply(Mul.apply(dev, dev), dim, keepdim)
    denom = max(n - correction, 0)
    return Div.apply(ss, float(denom) if denom else float("nan"))  # type: ignore[no-any-return]


def std(a: Tensor, dim: Any = None, correction: int = 1, keepdim: bool = False) -> Tensor:
    """The standard deviation over ``dim``: sqrt(var(a, dim, correction))."""
    from ._pointwise import Sqrt

    return Sqrt.apply(var(a, dim, correction, keepdim))  # type: ignore[no-any-return]


def max_with_indices(a: Tensor, dim: int, keepdim: bool, op: str) -> tuple[Tensor, Tensor]:
    """(values, indices) of max/min along dim, values differentiable through gather."""
    idx = argreduce("argmax" if op == "max" else "argmin", a, dim, True)
    from ._indexing import gather

    d = wrap_dims(dim, a.ndim, op)
    values = gather(a, d[0] if d else 0, idx) if a.ndim else a
    if not keepdim and a.ndim:
        from ._views import squeeze

        values = squeeze(values, d[0])
        idx = reshape_nograd(idx, tuple(n for i, n in enumerate(idx.shape) if i != d[0]))
    return values, idx


_ = unary
