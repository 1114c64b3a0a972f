"""Elementwise ops (unary, binary, comparison, where) with their gradients.

Each differentiable op is a Function registered for its catalogue name with
``@differentiable(op)`` (``FUNCTIONS``): ``forward`` promotes dtypes (PyTorch rules,
Python scalars included), broadcasts with stride-0 views, allocates the output and calls
the backend kernel; ``backward`` is written with frontend ops, so every backend gets
gradients for free. The public functions and Tensor methods are made from the catalogue
(``kael.ops.__init__``, ``_methods``): an op without a registered Function runs without
autograd (comparisons, logical ops, floor_divide).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError
from .._ops import CATALOGUE, POINTWISE_OPS
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import as_tensor_like, broadcast_shapes, check_device, empty, expand_to, scalar_tensor

__all__ = ["binary", "unary", "sum_to", "grad_for", "FUNCTIONS", "differentiable", "float_only"]


def _spec_has(flag: Callable[[Any], bool]) -> frozenset[str]:
    return frozenset(op for op in POINTWISE_OPS if flag(CATALOGUE[op].pointwise))


#: ops computed in the default float dtype when given integer or bool operands (exp, div, silu, ...)
float_only = _spec_has(lambda p: p.dtypes == "float")
_FLOAT_UNARY = frozenset(op for op in float_only if CATALOGUE[op].arity[1] == 1)
_COMPARE = frozenset(op for op in _spec_has(lambda p: p.bool_out) if CATALOGUE[op].arity[1] == 2)
_LOGICAL = _spec_has(lambda p: p.dtypes == "bool")

#: op name -> the autograd Function that computes it (``@differentiable(op)``)
FUNCTIONS: dict[str, type[Function]] = {}
F = TypeVar("F", bound=type[Function])


def differentiable(op: str, saves_input: bool = False) -> Callable[[F], F]:
    """Register a Function as the differentiable implementation of catalogue op `op`.

    saves_input: backward reads the op's (first) input itself, so the in-place method
    (``Tensor.<op>_``) must compute from a copy while a graph is recorded.
    """

    def register(fn: F) -> F:
        if op not in CATALOGUE:
            raise KeyError(f"differentiable: {op!r} is not in the op catalogue")
        fn.saves_input = saves_input  # type: ignore[attr-defined]
        FUNCTIONS[op] = fn
        return fn

    return register


def binary(op: str, a: Any, b: Any) -> Tensor:
    """Compute op(a, b) into a new tensor (no autograd)."""
    if (
        type(a) is Tensor
        and type(b) is Tensor
        and a.dtype is b.dtype
        and a.shape == b.shape
        and a.device is b.device
        and (op not in float_only or a.dtype.is_floating_point)
        and (op != "sub" or a.dtype is not dt.bool_)
    ):
        out = empty(a.shape, dt.bool_ if op in _COMPARE else a.dtype, a.device)
        _dispatch.kernel(a.device.type, op)(out, a, b)
        return out
    # fast path: a tensor and a Python scalar that does not change its dtype (the hot case x * 0.5)
    ta, tb = type(a), type(b)
    t, s = (
        (a, b)
        if ta is Tensor and (tb is float or tb is int)
        else ((b, a) if tb is Tensor and (ta is float or ta is int) else (None, None))
    )
    if t is not None and op not in _LOGICAL:
        d = t.dtype
        if d.is_floating_point or (type(s) is int and d.category == 1 and op not in float_only):
            sc = scalar_tensor(s, d, t.device)
            sv = Tensor._make(sc._storage, t.shape, (0,) * len(t.shape), sc._offset, d, sc)
            out = empty(t.shape, dt.bool_ if op in _COMPARE else d, t.device)
            _dispatch.kernel(t.device.type, op)(out, *((t, sv) if t is a else (sv, t)))
            return out
    device = check_device(op, a, b)
    if op in _LOGICAL:
        ctype = dt.bool_
    else:
        try:
            ctype = dt.result_type(a, b)
        except DTypeError as exc:
            raise DTypeError(f"{op}: {exc}") from None
    if op in float_only and not ctype.is_floating_point:
        ctype = dt.get_default_dtype()
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise DTypeError(f"{op}: expected at least one tensor operand, got {type(a).__name__} and {type(b).__name__}")
    sa = a.shape if isinstance(a, Tensor) else ()
    sb = b.shape if isinstance(b, Tensor) else ()
    shape = broadcast_shapes(sa, sb, op)
    xa = expand_to(as_tensor_like(a, ctype, device, op), shape)
    xb = expand_to(as_tensor_like(b, ctype, device, op), shape)
    if op in ("sub",) and ctype is dt.bool_:
        raise DTypeError("sub: subtraction of two bool tensors is not supported; use logical_xor or ~")
    out = empty(shape, dt.bool_ if op in _COMPARE else ctype, device)
    _dispatch.kernel(device.type, op)(out, xa, xb)
    return out


def unary(op: str, a: Tensor) -> Tensor:
    if not isinstance(a, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(a).__name__}")
    if op == "logical_not":
        out = empty(a.shape, dt.bool_, a.device)
        _dispatch.kernel(a.device.type, op)(out, a)
        return out
    if op in _FLOAT_UNARY and not a.dtype.is_floating_point:
        from ._core import cast

        a = cast(a, dt.get_default_dtype())
    elif op == "neg" and a.dtype is dt.bool_:
        raise DTypeError("neg: negation of a bool tensor is not supported; use logical_not")
    out = empty(a.shape, a.dtype, a.device)
    _dispatch.kernel(a.device.type, op)(out, a)
    return out


def sum_to(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast gradient back down to `shape`."""
    if g.shape == shape:
        return g
    from ._reduce import reduce_sum

    lead = len(g.shape) - len(shape)
    dims = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1 and g.shape[i + lead] != 1)
    r = reduce_sum(g, dims, keepdim=True)
    from ._views import reshape_nograd

    return reshape_nograd(r, shape)


def grad_for(g: Tensor, x: Any) -> Any:
    """g reduced to x's shape and cast to x's dtype, or None for non-tensors."""
    if not isinstance(x, Tensor):
        return None
    g = sum_to(g, x.shape)
    if g.dtype is not x.dtype:
        from ._core import cast

        g = cast(g, x.dtype)
    return g


@differentiable("add")
class Add(Function):
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Tensor:
        ctx.a, ctx.b = a, b
        return binary("add", a, b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        return grad_for(g, ctx.a), grad_for(g, ctx.b)


@differentiable("sub")
class Sub(Function):
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Tensor:
        ctx.a, ctx.b = a, b
        return binary("sub", a, b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        gb = grad_for(g, ctx.b)
        return grad_for(g, ctx.a), (None if gb is None else unary("neg", gb))


@differentiable("mul", saves_input=True)
class Mul(Function):
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Tensor:
        # save only what backward reads, so t.mul_(2) on a non-leaf t does not trip its own version check
        need = ctx.needs_input_grad
        ctx.save_for_backward(
            a if isinstance(a, Tensor) and need[1:2] == (True,) else None,
            b if isinstance(b, Tensor) and need[:1] == (True,) else None,
        )
        ctx.sa, ctx.sb = a, b
        return binary("mul", a, b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        ta, tb = ctx.saved_tensors
        a = ta if ta is not None else ctx.sa
        b = tb if tb is not None else ctx.sb
        ga = grad_for(binary("mul", g, b), a) if ctx.needs_input_grad[0] else None
        gb = grad_for(binary("mul", g, a), b) if ctx.needs_input_grad[1] else None
        return ga, gb


@differentiable("div", saves_input=True)
class Div(Function):
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Tensor:
        need = ctx.needs_input_grad  # a is read only for b's gradient (see Mul)
        ctx.save_for_backward(
            a if isinstance(a, Tensor) and need[1:2] == (True,) else None, b if isinstance(b, Tensor) else None
        )
        ctx.sa, ctx.sb = a, b
        return binary("div", a, b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        ta, tb = ctx.saved_tensors
        a = ta if ta is not None else ctx.sa
        b = tb if tb is not None else ctx.sb
        ga = grad_for(binary("div", g, b), a) if ctx.needs_input_grad[0] else None
        gb = None
        if ctx.needs_input_grad[1]:
            gb = grad_for(unary("neg", binary("div", binary("mul", g, a), binary("mul", b, b))), b)
        return ga, gb


@differentiable("pow", saves_input=True)
class Pow(Function):
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Tensor:
        out = binary("pow", a, b)
        ctx.save_for_backward(a if isinstance(a, Tensor) else None, b if isinstance(b, Tensor) else None, out)
        ctx.sa, ctx.sb = a, b
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        ta, tb, out = ctx.saved_tensors
        a = ta if ta is not None else ctx.sa
        b = tb if tb is not None else ctx.sb
        ga = gb = None
        if ctx.needs_input_grad[0]:
            if not isinstance(b, Tensor) and b == 0:
                ga = grad_for(binary("mul", g, 0.0), a)
            else:
                bm1 = binary("sub", b, 1) if isinstance(b, Tensor) else b - 1
                ga = grad_for(binary("mul", g, binary("mul", b, binary("pow", a, bm1))), a)
        if len(ctx.needs_input_grad) > 1 and ctx.needs_input_grad[1]:
            loga = unary("log", a) if isinstance(a, Tensor) else math.log(a) if a > 0 else float("nan")
            gb = grad_for(binary("mul", g, binary("mul", out, loga)), b)
        return ga, gb


@differentiable("remainder")
class Remainder(Function):
    """a - floor(a / b) * b: d/da = 1, d/db = -floor(a / b) (as PyTorch)."""

    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Tensor:
        ctx.save_for_backward(a if isinstance(a, Tensor) else None, b if isinstance(b, Tensor) else None)
        ctx.sa, ctx.sb = a, b
        return binary("remainder", a, b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        ta, tb = ctx.saved_tensors
        a = ta if ta is not None else ctx.sa
        b = tb if tb is not None else ctx.sb
        gb = None
        if len(ctx.needs_input_grad) > 1 and ctx.needs_input_grad[1]:
            gb = grad_for(unary("neg", binary("mul", g, binary("floor_divide", a, b))), b)
        return grad_for(g, a), gb


class _MinMax(Function):
    op = "maximum"

    @classmethod
    def forward(cls, ctx: Any, a: Any, b: Any) -> Tensor:
        ctx.save_for_backward(a if isinstance(a, Tensor) else None, b if isinstance(b, Tensor) else None)
        ctx.sa, ctx.sb = a, b
        return binary(cls.op, a, b)

    @classmethod
    def backward(cls, ctx: Any, g: Tensor) -> Any:
        ta, tb = ctx.saved_tensors
        a = ta if ta is not None else ctx.sa
        b = tb if tb is not None else ctx.sb
        wins = binary("gt" if cls.op == "maximum" else "lt", a, b)
        tie = binary("eq", a, b)
        wa = binary("add", binary("mul", wins, 1.0), binary("mul", tie, 0.5))
        wb = binary("sub", 1.0, wa)
        return grad_for(binary("mul", g, wa), a), grad_for(binary("mul", g, wb), b)


@differentiable("maximum", saves_input=True)
class Maximum(_MinMax):
    op = "maximum"


@differentiable("minimum", saves_input=True)
class Minimum(_MinMax):
    op = "minimum"


@differentiable("neg")
class Neg(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor) -> Tensor:
        return unary("neg", a)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        return unary("neg", g)


class Relu(Function):
    """max(x, 0) with gradient 0 at x == 0 (as PyTorch; maximum(x, 0) would give 0.5 there)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor) -> Tensor:
        out = binary("maximum", a, 0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (out,) = ctx.saved_tensors
        return Where.forward(_Dummy(), binary("gt", out, 0), g, 0)


def _unary_fn(name: str, op: str, grad: Any, save: str) -> type[Function]:
    """A Function for a unary op whose gradient is grad(g, x, out)."""

    def forward(ctx: Any, a: Tensor) -> Tensor:
        out = unary(op, a)
        if save == "x":
            ctx.save_for_backward(a)
        elif save == "out":
            ctx.save_for_backward(out)
        ctx.dtype = a.dtype
        return out

    def backward(ctx: Any, g: Tensor) -> Any:
        (s,) = ctx.saved_tensors if save else (None,)
        r = grad(g, s)
        return r

    fn = type(name, (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    return differentiable(op, saves_input=save == "x")(fn)


def _m(a: Any, b: Any) -> Tensor:
    return binary("mul", a, b)


def _d(a: Any, b: Any) -> Tensor:
    return binary("div", a, b)


_u = unary
Exp = _unary_fn("Exp", "exp", lambda g, out: _m(g, out), "out")
Log = _unary_fn("Log", "log", lambda g, x: _d(g, x), "x")
Sqrt = _unary_fn("Sqrt", "sqrt", lambda g, out: _d(g, _m(out, 2.0)), "out")
Rsqrt = _unary_fn("Rsqrt", "rsqrt", lambda g, out: _m(g, _m(_m(out, _m(out, out)), -0.5)), "out")
Tanh = _unary_fn("Tanh", "tanh", lambda g, out: _m(g, binary("sub", 1.0, _m(out, out))), "out")
Abs = _unary_fn("Abs", "abs", lambda g, x: _m(g, _u("sign", x)), "x")
Sin = _unary_fn("Sin", "sin", lambda g, x: _m(g, _u("cos", x)), "x")
Cos = _unary_fn("Cos", "cos", lambda g, x: _m(g, _u("neg", _u("sin", x))), "x")
Sigmoid = _unary_fn("Sigmoid", "sigmoid", lambda g, out: _m(g, _m(out, binary("sub", 1.0, out))), "out")
Erf = _unary_fn("Erf", "erf", lambda g, x: _m(g, _m(_u("exp", _u("neg", _m(x, x))), 2.0 / math.sqrt(math.pi))), "x")
Log1p = _unary_fn("Log1p", "log1p", lambda g, x: _d(g, binary("add", x, 1.0)), "x")
Expm1 = _unary_fn("Expm1", "expm1", lambda g, out: _m(g, binary("add", out, 1.0)), "out")
Floor = _unary_fn("Floor", "floor", lambda g, _: _m(g, 0.0), "")
Ceil = _unary_fn("Ceil", "ceil", lambda g, _: _m(g, 0.0), "")
Round = _unary_fn("Round", "round", lambda g, _: _m(g, 0.0), "")
Sign = _unary_fn("Sign", "sign", lambda g, _: _m(g, 0.0), "")


class Where(Function):
    @staticmethod
    def forward(ctx: Any, cond: Tensor, a: Any, b: Any) -> Tensor:
        if not isinstance(cond, Tensor) or cond.dtype is not dt.bool_:
            raise DTypeError(f"where: condition must be a bool tensor, got {getattr(cond, 'dtype', type(cond))!r}")
        device = check_device("where", cond, a, b)
        ctype = dt.result_type(a, b)
        shape = broadcast_shapes(
            cond.shape,
            broadcast_shapes(
                a.shape if isinstance(a, Tensor) else (), b.shape if isinstance(b, Tensor) else (), "where"
            ),
            "where",
        )
        ctx.save_for_backward(cond)
        ctx.a, ctx.b = a, b
        out = empty(shape, ctype, device)
        _dispatch.kernel(device.type, "where")(
            out,
            expand_to(cond, shape),
            expand_to(as_tensor_like(a, ctype, device, "where"), shape),
            expand_to(as_tensor_like(b, ctype, device, "where"), shape),
        )
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (cond,) = ctx.saved_tensors
        zero = 0.0
        ga = grad_for(Where.forward(_Dummy(), cond, g, zero), ctx.a) if isinstance(ctx.a, Tensor) else None
        gb = grad_for(Where.forward(_Dummy(), cond, zero, g), ctx.b) if isinstance(ctx.b, Tensor) else None
        return None, ga, gb


class _Dummy:
    def save_for_backward(self, *a: Any) -> None:
        pass
