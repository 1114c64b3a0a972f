"""The normalisation functions of kael.nn.functional: batch_norm, instance_norm and group_norm.

batch_norm runs the batch_norm (training) and batch_norm_eval fused ops (NOTE [batch_norm fused op]); the
rest is written with kael's differentiable ops (means over the normalised dims, the biased
variance for normalising, the unbiased one for running statistics, as PyTorch does).
Running statistics are updated in place with gradient recording off.
"""

from __future__ import annotations

from typing import Any

from ... import ops
from ..._errors import DTypeError, ShapeError
from ..._tensor import Tensor
from ...autograd._grad_mode import no_grad
from ...ops._batch_norm_fused import batch_norm_eval, batch_norm_train

__all__ = ["batch_norm", "instance_norm", "group_norm"]


def _float_input(op: str, x: Any, min_ndim: int) -> Tensor:
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: input must be a floating-point tensor, got {getattr(x, 'dtype', type(x))!r}")
    if x.ndim < min_ndim:
        raise ShapeError(f"{op}: input must have at least {min_ndim} dims [N, C, ...], got {list(x.shape)}")
    return x


def _per_channel(t: Tensor | None, c: int, ndim: int, op: str, name: str) -> Tensor | None:
    """t [C] shaped [C, 1, ...] to broadcast over [N, C, *S] (None stays None)."""
    if t is None:
        return None
    if not isinstance(t, Tensor) or t.shape != (c,):
        raise ShapeError(f"{op}: {name} must have shape [{c}], got {list(getattr(t, 'shape', ()))}")
    return ops.reshape(t, (c,) + (1,) * (ndim - 2))


def _normalize(x: Tensor, mean: Tensor, var: Tensor, eps: float, w: Tensor | None, b: Tensor | None) -> Tensor:
    y = ops.mul(ops.sub(x, mean), ops.rsqrt(ops.add(var, eps)))
    if w is not None:
        y = ops.mul(y, w)
    if b is not None:
        y = ops.add(y, b)
    return y  # type: ignore[no-any-return]


def _update(running: Tensor | None, value: Tensor, momentum: float) -> None:
    if running is not None:
        with no_grad():
            running.mul_(1.0 - momentum).add_(value.detach().to(dtype=running.dtype), alpha=momentum)


def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise input [N, C, *S] per channel: batch statistics in training (updating the running ones
    by momentum, the variance unbiased), the running statistics otherwise; then weight and bias."""
    op = "batch_norm"
    x = _float_input(op, input, 2)
    c = x.shape[1]
    rm = _per_channel(running_mean, c, x.ndim, op, "running_mean")
    rv = _per_channel(running_var, c, x.ndim, op, "running_var")
    w = _per_channel(weight, c, x.ndim, op, "weight")
    b = _per_channel(bias, c, x.ndim, op, "bias")
    if training or rm is None or rv is None:
        count = x.numel() // c if c else 0
        if training and count <= 1:
            raise ShapeError(
                f"{op}: expected more than 1 value per channel when training, got input of shape {list(x.shape)}"
            )
        if (w is not None and w.dtype is not x.dtype) or (b is not None and b.dtype is not x.dtype):
            raise DTypeError(f"{op}: weight and bias must have input's dtype {x.dtype!r}")
        out, mean, rstd = batch_norm_train(x, weight, bias, eps)  # NOTE [batch_norm fused op]
        if training:
            with no_grad():
                var = ops.clamp(ops.sub(ops.div(1.0, ops.mul(rstd, rstd)), eps), min=0.0)
            _update(running_mean, mean, momentum)
            _update(running_var, ops.mul(var, count / max(count - 1, 1)), momentum)
        return out
    if (w is not None and w.dtype is not x.dtype) or (b is not None and b.dtype is not x.dtype):
        raise DTypeError(f"{op}: weight and bias must have input's dtype {x.dtype!r}")
    assert running_mean is not None and running_var is not None
    return batch_norm_eval(x, running_mean.detach(), running_var.detach(), weight, bias, eps)


def instance_norm(
    input: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each (sample, channel) plane of input [N, C, *S] over its spatial dims; running statistics
    (the mean over the batch of the per-instance ones) when given and use_input_stats=False."""
    op = "instance_norm"
    x = _float_input(op, input, 3)
    c = x.shape[1]
    w = _per_channel(weight, c, x.ndim, op, "weight")
    b = _per_channel(bias, c, x.ndim, op, "bias")
    if not use_input_stats:
        rm = _per_channel(running_mean, c, x.ndim, op, "running_mean")
        rv = _per_channel(running_var, c, x.ndim, op, "running_var")
        if rm is None or rv is None:
            raise ShapeError(f"{op}: use_input_stats=False needs running_mean and running_var")
        return _normalize(x, rm.to(dtype=x.dtype), rv.to(dtype=x.dtype), eps, w, b)
    dims = tuple(range(2, x.ndim))
    count = 1
    for s in x.shape[2:]:
        count *= s
    if count <= 1:
        raise ShapeError(f"{op}: expected more than 1 spatial element per channel, got input {list(x.shape)}")
    mean = ops.mean(x, dims, keepdim=True)
    d = ops.sub(x, mean)
    var = ops.mean(ops.mul(d, d), dims, keepdim=True)
    if running_mean is not None and running_var is not None:
        _update(running_mean, ops.mean(ops.reshape(mean, x.shape[:2]), 0), momentum)
        unbiased = ops.mul(ops.reshape(var, x.shape[:2]), count / (count - 1))
        _update(running_var, ops.mean(unbiased, 0), momentum)
    return _normalize(x, mean, var, eps, w, b)


def group_norm(
    input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """Normalise input [N, C, *S] over each group of C/num_groups channels (and the spatial dims), then
    scale and shift per channel."""
    op = "group_norm"
    x = _float_input(op, input, 2)
    n, c = x.shape[:2]
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1 or c % num_groups:
        raise ShapeError(f"{op}: num_groups must be a positive divisor of the {c} channels, got {num_groups!r}")
    w = _per_channel(weight, c, x.ndim, op, "weight")
    b = _per_channel(bias, c, x.ndim, op, "bias")
    g = ops.reshape(x, (n, num_groups, -1))
    mean = ops.mean(g, 2, keepdim=True)
    d = ops.sub(g, mean)
    var = ops.mean(ops.mul(d, d), 2, keepdim=True)
    y = ops.reshape(ops.mul(d, ops.rsqrt(ops.add(var, eps))), x.shape)
    if w is not None:
        y = ops.mul(y, w)
    if b is not None:
        y = ops.add(y, b)
    return y
