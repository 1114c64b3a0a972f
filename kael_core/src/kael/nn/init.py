"""Parameter initialisation, in place and without recording gradients (PyTorch's ``nn.init``).

Every random initialiser takes an optional ``generator`` (a ``kael.Generator``);
without one it draws from the default generator, so ``kael.manual_seed`` makes
model initialisation reproducible.
"""

from __future__ import annotations

import math
from typing import Any

from .. import ops
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd._grad_mode import no_grad

__all__ = [
    "calculate_gain",
    "uniform_",
    "normal_",
    "constant_",
    "zeros_",
    "ones_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "trunc_normal_",
]


def _check(t: Any, op: str) -> None:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point tensor, got {t.dtype!r}")


def _fill_from(t: Tensor, values: Tensor) -> Tensor:
    with no_grad():
        t.copy_(values)
    return t


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for an activation (PyTorch's table)."""
    if nonlinearity in (
        "linear",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "sigmoid",
        "identity",
    ):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise DTypeError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fans(t: Tensor, op: str) -> tuple[int, int]:
    if t.ndim < 2:
        raise ShapeError(f"{op}: fan in and fan out need a tensor with at least 2 dims, got {list(t.shape)}")
    receptive = 1
    for n in t.shape[2:]:
        receptive *= n
    return t.shape[1] * receptive, t.shape[0] * receptive


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill t in place with values drawn uniformly from [a, b); returns t."""
    _check(t, "uniform_")
    u = ops.rand(t.shape, dtype=t.dtype, device=t.device, generator=generator)
    return _fill_from(t, ops.add(ops.mul(u, b - a), a))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill t in place with values drawn from N(mean, std**2); returns t."""
    _check(t, "normal_")
    n = ops.randn(t.shape, dtype=t.dtype, device=t.device, generator=generator)
    return _fill_from(t, ops.add(ops.mul(n, std), mean))


def constant_(t: Tensor, value: float) -> Tensor:
    """Fill t in place with ``value``; returns t."""
    with no_grad():
        t.fill_(value)
    return t


def zeros_(t: Tensor) -> Tensor:
    """Fill t in place with zeros; returns t."""
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    """Fill t in place with ones; returns t."""
    return constant_(t, 1.0)


def xavier_uniform_(t: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)), in place; returns t."""
    fan_in, fan_out = _fans(t, "xavier_uniform_")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
    return uniform_(t, -bound, bound, generator)


def xavier_normal_(t: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot normal: N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out)), in place; returns t."""
    fan_in, fan_out = _fans(t, "xavier_normal_")
    std = gain * math.sqrt(2.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
    return normal_(t, 0.0, std, generator)


def _kaiming_std(t: Tensor, a: float, mode: str, nonlinearity: str, op: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise DTypeError(f"{op}: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(t, op)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0


def kaiming_uniform_(
    t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator: Any = None
) -> Tensor:
    """U(-b, b) with b = gain * sqrt(3 / fan); a=sqrt(5) gives Linear's default U(-1/sqrt(in), 1/sqrt(in))."""
    bound = math.sqrt(3.0) * _kaiming_std(t, a, mode, nonlinearity, "kaiming_uniform_")
    return uniform_(t, -bound, bound, generator)


def kaiming_normal_(
    t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator: Any = None
) -> Tensor:
    """He normal: N(0, std**2) with std = gain(nonlinearity, a) / sqrt(fan), fan by ``mode``, in place; returns t."""
    return normal_(t, 0.0, _kaiming_std(t, a, mode, nonlinearity, "kaiming_normal_"), generator)


def trunc_normal_(
    t: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, generator: Any = None
) -> Tensor:
    """N(mean, std) restricted to [a, b]: out-of-range draws are redrawn until none is left."""
    _check(t, "trunc_normal_")
    if not a < b or std <= 0:
        raise DTypeError(f"trunc_normal_: expected a < b and std > 0, got a={a!r}, b={b!r}, std={std!r}")
    lo, hi = (a - mean) / std, (b - mean) / std
    if hi < -8 or lo > 8:
        raise DTypeError(f"trunc_normal_: [{a}, {b}] is too far from the mean {mean} to sample by redrawing")
    z = ops.randn(t.shape, dtype=t.dtype, device=t.device, generator=generator)
    while True:
        bad = ops.logical_or(ops.lt(z, lo), ops.gt(z, hi))
        if not bool(ops.any(bad).item()):
            break
        z = ops.where(bad, ops.randn(t.shape, dtype=t.dtype, device=t.device, generator=generator), z)
    return _fill_from(t, ops.add(ops.mul(z, std), mean))
