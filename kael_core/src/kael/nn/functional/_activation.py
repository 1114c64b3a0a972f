"""The activation functions of kael.nn.functional, with PyTorch's names, arguments and defaults.

Each is written with kael's differentiable ops (``exp``, ``log1p``, ``tanh``, ``where``,
the fused ``gelu``/``silu``/``softmax`` ...), so autograd and every backend work with no
kernel of their own. Gradients at the kinks follow PyTorch's choices (e.g. ``leaky_relu``
takes the negative slope at 0, ``hardtanh`` is flat at its bounds). ``inplace=True``
writes the result into the input and returns it, as PyTorch's in-place variants do.
"""

from __future__ import annotations

from typing import Any

from ... import _dtype as dt
from ... import ops
from ..._errors import DTypeError, ShapeError
from ..._tensor import Tensor

__all__ = [
    "relu",
    "relu6",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "softmax",
    "log_softmax",
    "leaky_relu",
    "elu",
    "softplus",
    "mish",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "softsign",
    "logsigmoid",
    "prelu",
]


def _tensor(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: input must be a tensor, got {type(x).__name__}")
    return x


def _number(op: str, name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DTypeError(f"{op}: {name} must be a number, got {v!r}")
    return float(v)


def _floating(x: Any, op: str) -> Tensor:
    x = _tensor(x, op)
    if not x.dtype.is_floating_point:
        x = x.to(dtype=dt.get_default_dtype())
    return x  # type: ignore[no-any-return]


def _out(input: Tensor, result: Tensor, inplace: bool) -> Tensor:
    """result, or input overwritten with it (PyTorch's ``inplace=True``)."""
    if not inplace:
        return result
    input.copy_(result)
    return input


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(input, 0), elementwise."""
    return _out(input, ops.relu(_tensor(input, "relu")), inplace)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(input, 0), 6), elementwise (``hardtanh(input, 0, 6)``)."""
    return hardtanh(input, 0.0, 6.0, inplace)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """Exact GELU (erf), or approximate='tanh' (GPT-2's gelu_new)."""
    return ops.gelu(_tensor(input, "gelu"), approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """SiLU (swish): input * sigmoid(input), a fused op (the backend's kernel, or its decomposition)."""
    if inplace:
        return input.silu_()  # type: ignore[no-any-return]
    return ops.silu(_tensor(input, "silu"))  # type: ignore[no-any-return]


def tanh(input: Tensor) -> Tensor:
    """The hyperbolic tangent, elementwise."""
    return ops.tanh(_tensor(input, "tanh"))  # type: ignore[no-any-return]


def sigmoid(input: Tensor) -> Tensor:
    """1 / (1 + exp(-input)), elementwise."""
    return ops.sigmoid(_tensor(input, "sigmoid"))  # type: ignore[no-any-return]


def _softmax_input(input: Any, dim: Any, dtype: Any, op: str) -> tuple[Tensor, int]:
    x = _tensor(input, op)
    if dtype is not None:
        x = x.to(dtype=dtype)
    if dim is None:  # PyTorch's legacy implicit dim
        dim = 0 if x.ndim in (0, 1, 3) else 1
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise DTypeError(f"{op}: dim must be an int, got {dim!r}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point input (or pass dtype=), got {x.dtype!r}")
    return x, dim


def softmax(input: Tensor, dim: int | None = -1, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim`` (a fused op, computed stably); ``dtype`` casts the input first.

    dim=None picks PyTorch's legacy implicit dim (0 for 0-, 1- and 3-d inputs, else 1); _stacklevel is
    PyTorch's (for its warning) and unused.
    """
    x, d = _softmax_input(input, dim, dtype, "softmax")
    return ops.softmax(x, d)


def log_softmax(input: Tensor, dim: int | None = -1, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """log(softmax(x)) along ``dim``, computed stably (a fused op); ``dtype`` casts the input first."""
    x, d = _softmax_input(input, dim, dtype, "log_softmax")
    return ops.log_softmax(x, d)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """input where input > 0, else negative_slope * input."""
    x = _tensor(input, "leaky_relu")
    s = _number("leaky_relu", "negative_slope", negative_slope)
    return _out(x, ops.where(ops.gt(x, 0), x, ops.mul(x, s)), inplace)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """input where input > 0, else alpha * (exp(input) - 1)."""
    x = _floating(input, "elu")
    a = _number("elu", "alpha", alpha)
    pos = ops.gt(x, 0)
    neg = ops.mul(ops.expm1(ops.where(pos, 0.0, x)), a)  # masked: the unused branch never overflows
    return _out(input, ops.where(pos, x, neg), inplace)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * input)) / beta, and input itself where beta * input > threshold (PyTorch's)."""
    x = _floating(input, "softplus")
    b = _number("softplus", "beta", beta)
    t = _number("softplus", "threshold", threshold)
    bx = ops.mul(x, b)
    linear = ops.gt(bx, t)
    smooth = ops.div(ops.log1p(ops.exp(ops.where(linear, 0.0, bx))), b)  # masked: never overflows
    return ops.where(linear, x, smooth)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """input * tanh(softplus(input))."""
    x = _floating(input, "mish")
    return _out(input, ops.mul(x, ops.tanh(softplus(x))), inplace)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """input clipped to [min_val, max_val]; the gradient is 0 outside (min_val, max_val)."""
    x = _tensor(input, "hardtanh")
    lo = _number("hardtanh", "min_val", min_val)
    hi = _number("hardtanh", "max_val", max_val)
    if lo > hi:
        raise ShapeError(f"hardtanh: min_val {lo} must not be greater than max_val {hi}")
    inside = ops.logical_and(ops.gt(x, lo), ops.lt(x, hi))
    clipped = ops.where(ops.le(x, lo), lo, hi).to(dtype=x.dtype)
    return _out(x, ops.where(inside, x, clipped), inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """relu6(input + 3) / 6."""
    x = _floating(input, "hardsigmoid")
    return _out(input, ops.div(hardtanh(ops.add(x, 3.0), 0.0, 6.0), 6.0), inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """input * relu6(input + 3) / 6."""
    x = _floating(input, "hardswish")
    return _out(input, ops.mul(x, hardsigmoid(x)), inplace)


def softsign(input: Tensor) -> Tensor:
    """input / (1 + |input|)."""
    x = _floating(input, "softsign")
    return ops.div(x, ops.add(ops.abs(x), 1.0))  # type: ignore[no-any-return]


def logsigmoid(input: Tensor) -> Tensor:
    """log(sigmoid(input)), computed stably: min(input, 0) - log1p(exp(-|input|))."""
    x = _floating(input, "logsigmoid")
    return ops.sub(ops.minimum(x, 0.0), ops.log1p(ops.exp(ops.neg(ops.abs(x)))))  # type: ignore[no-any-return]


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """input where input > 0, else weight * input; weight has 1 element or one per channel (dim 1)."""
    x = _tensor(input, "prelu")
    w = _tensor(weight, "prelu (weight)")
    if w.ndim > 1:
        raise ShapeError(f"prelu: weight must be 0-d or 1-d, got shape {list(w.shape)}")
    n = w.numel()
    if n != 1:
        channels = x.shape[1] if x.ndim >= 2 else (x.shape[0] if x.ndim == 1 else 1)
        if n != channels:
            raise ShapeError(
                f"prelu: weight has {n} parameters, expected 1 or the input's {channels} channels "
                f"(input shape {list(x.shape)})"
            )
        if x.ndim >= 2:
            w = ops.reshape(w, (n,) + (1,) * (x.ndim - 2))
    elif w.ndim:
        w = ops.reshape(w, ())
    return ops.where(ops.gt(x, 0), x, ops.mul(w, x))
