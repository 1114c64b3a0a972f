"""Parameter utilities: clip_grad_norm_, clip_grad_value_, parameters_to_vector and vector_to_parameters."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .. import _dtype as dt
from .. import ops
from .._errors import DTypeError, KaelError
from .._tensor import Tensor
from ..autograd._grad_mode import no_grad

__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "vector_to_parameters"]


def _grads(parameters: Any) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p.grad for p in params if p.grad is not None]


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> Tensor:
    """Scale the gradients in place so that their joint norm is at most max_norm.

    The total norm (over all gradients, as if concatenated) is computed in float64
    and returned as a 0-d float64 tensor, the norm *before* clipping (``float(norm)``
    gives the number). Gradients are multiplied by ``max_norm / (norm + 1e-6)`` when
    that is below 1.
    """
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)):
        raise DTypeError(f"clip_grad_norm_: max_norm must be a number, got {max_norm!r}")
    p = float(norm_type)
    if not (p > 0 or p == math.inf):
        raise DTypeError(f"clip_grad_norm_: norm_type must be positive or inf, got {norm_type!r}")
    grads = _grads(parameters)
    if not grads:
        return ops.zeros((), dtype=dt.float64)
    device = grads[0].device
    with no_grad():
        parts = []
        for g in grads:
            if g.device is not device:
                raise KaelError(f"clip_grad_norm_: gradients live on {device} and {g.device}; expected one device")
            a = ops.abs(g.to(dtype=dt.float64))
            if p == math.inf:
                parts.append(ops.amax(a) if g.numel() else ops.zeros((), dtype=dt.float64, device=device))
            elif p == 2.0:
                parts.append(ops.sum(ops.mul(a, a)))
            else:
                parts.append(ops.sum(ops.pow(a, p)))
        stacked = ops.stack(parts)
        if p == math.inf:
            total = ops.amax(stacked)
        elif p == 2.0:
            total = ops.sqrt(ops.sum(stacked))
        else:
            total = ops.pow(ops.sum(stacked), 1.0 / p)
        norm = float(total.item())
        if error_if_nonfinite and not math.isfinite(norm):
            raise KaelError(
                f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is {norm}; "
                "pass error_if_nonfinite=False to clip anyway"
            )
        coef = float(max_norm) / (norm + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every gradient element into [-clip_value, clip_value], in place."""
    v = float(clip_value)
    with no_grad():
        for g in _grads(parameters):
            g.copy_(ops.clamp(g, -v, v))


def _param_list(parameters: Any, op: str) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise DTypeError(f"{op}: parameter {i} is a {type(p).__name__}, not a Tensor")
    if params and any(p.device != params[0].device for p in params):
        raise KaelError(f"{op}: parameters are on different devices; expected one device")
    return params


def parameters_to_vector(parameters: Tensor | Iterable[Tensor]) -> Tensor:
    """The parameters flattened and concatenated into one 1-d tensor (differentiable, a copy)."""
    params = _param_list(parameters, "parameters_to_vector")
    if not params:
        raise KaelError("parameters_to_vector: got no parameters")
    return ops.cat([ops.reshape(p, (-1,)) for p in params], 0)


def vector_to_parameters(vec: Tensor, parameters: Tensor | Iterable[Tensor]) -> None:
    """Copy consecutive slices of the 1-d ``vec`` into the parameters, in order (in place, no autograd)."""
    if not isinstance(vec, Tensor):
        raise DTypeError(f"vector_to_parameters: vec must be a Tensor, got {type(vec).__name__}")
    if vec.ndim != 1:
        raise KaelError(f"vector_to_parameters: vec must be 1-d, got shape {list(vec.shape)}")
    params = _param_list(parameters, "vector_to_parameters")
    total = sum(p.numel() for p in params)
    if total != vec.numel():
        raise KaelError(f"vector_to_parameters: vec has {vec.numel()} elements, the parameters hold {total}")
    offset = 0
    with no_grad():
        for p in params:
            n = p.numel()
            p.copy_(ops.reshape(vec[offset : offset + n], p.shape))
            offset += n
