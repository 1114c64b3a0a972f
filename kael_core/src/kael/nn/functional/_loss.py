"""The loss functions of kael.nn.functional, with PyTorch's names, arguments, defaults and reductions.

``reduction`` is "mean" (default), "sum" or "none" everywhere ("batchmean" too for
``kl_div``); the class-index losses (``cross_entropy``, ``nll_loss``) are in
``_classification``. The deprecated ``size_average``/``reduce`` pair is honoured with a warning,
as PyTorch does, and arguments are in PyTorch's positional order. Everything is written
with differentiable ops, so gradients come from autograd on every backend.
"""

from __future__ import annotations

import warnings
from typing import Any

from ... import ops
from ..._errors import DTypeError, ShapeError
from ..._tensor import Tensor

__all__ = [
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "cosine_embedding_loss",
]


def _check_reduction(op: str, reduction: Any, extra: tuple[str, ...] = ()) -> None:
    allowed = ("mean", "sum", "none", *extra)
    if reduction not in allowed:
        raise DTypeError(f"{op}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")


def _legacy(op: str, size_average: Any, reduce: Any, reduction: str, stacklevel: int = 3) -> str:
    """PyTorch's deprecated size_average/reduce pair as a reduction (reduction itself when both are None)."""
    if size_average is None and reduce is None:
        return reduction
    sa = True if size_average is None else bool(size_average)
    rd = True if reduce is None else bool(reduce)
    legacy = "none" if not rd else ("mean" if sa else "sum")
    warnings.warn(
        f"{op}: size_average and reduce are deprecated, use reduction={legacy!r} instead",
        UserWarning,
        stacklevel=stacklevel,
    )
    return legacy


def _reduction(op: str, size_average: Any, reduce: Any, reduction: str, extra: tuple[str, ...] = ()) -> str:
    """A loss function's reduction: the legacy size_average/reduce pair resolved, then checked."""
    reduction = _legacy(op, size_average, reduce, reduction, stacklevel=4)  # the warning names the user's call
    _check_reduction(op, reduction, extra)
    return reduction


def _same_shape_floats(op: str, input: Any, target: Any) -> None:
    """input and target are tensors of one shape, input a floating-point one (the binary losses)."""
    _tensors(op, input=input, target=target)
    _float_input(op, input)
    if target.shape != input.shape:
        raise ShapeError(f"{op}: target shape {list(target.shape)} must equal input shape {list(input.shape)}")


def _reduce(losses: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return losses
    return ops.sum(losses) if reduction == "sum" else ops.mean(losses)


def _tensors(op: str, **ts: Any) -> None:
    for name, t in ts.items():
        if not isinstance(t, Tensor):
            raise DTypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")


def _float_input(op: str, x: Tensor) -> None:
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: input must be a floating-point tensor, got {x.dtype!r}")


def _pair(op: str, input: Any, target: Any) -> tuple[Tensor, Tensor]:
    _tensors(op, input=input, target=target)
    return input, target


def _weighted_reduce(op: str, losses: Tensor, weight: Tensor | None, reduction: str, by_weights: bool = True) -> Tensor:
    """losses reduced; with a weight of the losses' shape, weight * losses, whose "mean" divides by the
    weights' sum (by_weights; PyTorch's mse_loss and l1_loss) or by the element count (huber_loss)."""
    if weight is None:
        return _reduce(losses, reduction)
    _tensors(op, weight=weight)
    if weight.shape != losses.shape:
        raise ShapeError(f"{op}: weight must have the input's shape {list(losses.shape)}, got {list(weight.shape)}")
    weighted = ops.mul(losses, weight)
    if reduction == "none":
        return weighted  # type: ignore[no-any-return]
    total = ops.sum(weighted)
    if reduction == "sum":
        return total
    return ops.div(total, ops.sum(weight)) if by_weights else ops.mean(weighted)


def mse_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    weight: Tensor | None = None,
) -> Tensor:
    """(input - target)**2, reduced: its mean (default), its sum, or each element (reduction='none');
    with ``weight`` (input's shape) each term is weighted and the mean divides by the weights' sum."""
    reduction = _reduction("mse_loss", size_average, reduce, reduction)
    x, y = _pair("mse_loss", input, target)
    d = ops.sub(x, y)
    return _weighted_reduce("mse_loss", ops.mul(d, d), weight, reduction)


def l1_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    weight: Tensor | None = None,
) -> Tensor:
    """|input - target|, reduced (weighted as mse_loss with ``weight``)."""
    reduction = _reduction("l1_loss", size_average, reduce, reduction)
    x, y = _pair("l1_loss", input, target)
    return _weighted_reduce("l1_loss", ops.abs(ops.sub(x, y)), weight, reduction)


def _nonneg(op: str, name: str, v: Any, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
        raise DTypeError(f"{op}: {name} must be a {'positive' if positive else 'non-negative'} number, got {v!r}")
    return float(v)


def smooth_l1_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    beta: float = 1.0,
) -> Tensor:
    """0.5 * d**2 / beta where |d| < beta, else |d| - 0.5 * beta (d = input - target); beta=0 is l1_loss."""
    reduction = _reduction("smooth_l1_loss", size_average, reduce, reduction)
    b = _nonneg("smooth_l1_loss", "beta", beta)
    x, y = _pair("smooth_l1_loss", input, target)
    if b == 0.0:
        return l1_loss(x, y, reduction=reduction)
    d = ops.abs(ops.sub(x, y))
    losses = ops.where(ops.lt(d, b), ops.div(ops.mul(ops.mul(d, d), 0.5), b), ops.sub(d, 0.5 * b))
    return _reduce(losses, reduction)


def huber_loss(
    input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0, weight: Tensor | None = None
) -> Tensor:
    """0.5 * d**2 where |d| < delta, else delta * (|d| - 0.5 * delta) (d = input - target); with ``weight``
    each term is weighted and "mean" averages the weighted terms (PyTorch's huber_loss)."""
    _check_reduction("huber_loss", reduction)
    k = _nonneg("huber_loss", "delta", delta, positive=True)
    x, y = _pair("huber_loss", input, target)
    d = ops.abs(ops.sub(x, y))
    losses = ops.where(ops.lt(d, k), ops.mul(ops.mul(d, d), 0.5), ops.mul(ops.sub(d, 0.5 * k), k))
    return _weighted_reduce("huber_loss", losses, weight, reduction, by_weights=False)


def binary_cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """-(target * log(input) + (1 - target) * log(1 - input)) * weight, each log clamped at -100 (PyTorch's).

    input holds probabilities (values in [0, 1], checked) and target has its shape.
    """
    reduction = _reduction("binary_cross_entropy", size_average, reduce, reduction)
    _same_shape_floats("binary_cross_entropy", input, target)
    if input.numel():
        lo, hi = float(ops.amin(input).item()), float(ops.amax(input).item())
        if not (lo >= 0.0 and hi <= 1.0):
            raise DTypeError(
                f"binary_cross_entropy: input values must be probabilities in [0, 1], got values in [{lo}, {hi}]"
            )
    log_p = ops.maximum(ops.log(input), -100.0)
    log_q = ops.maximum(ops.log(ops.sub(1.0, input)), -100.0)
    losses = ops.neg(ops.add(ops.mul(target, log_p), ops.mul(ops.sub(1.0, target), log_q)))
    if weight is not None:
        losses = ops.mul(losses, weight)
    return _reduce(losses, reduction)


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    """binary_cross_entropy(sigmoid(input), target) computed stably from the logits.

    (1 - t) * x + (1 + (pos_weight - 1) * t) * (log1p(exp(-|x|)) + max(-x, 0)), times weight;
    pos_weight (broadcast along the last dim, one per class) weighs the positive term.
    """
    reduction = _reduction("binary_cross_entropy_with_logits", size_average, reduce, reduction)
    _same_shape_floats("binary_cross_entropy_with_logits", input, target)
    x, t = input, target
    softplus_neg = ops.add(ops.log1p(ops.exp(ops.neg(ops.abs(x)))), ops.maximum(ops.neg(x), 0.0))
    if pos_weight is not None:
        _tensors("binary_cross_entropy_with_logits", pos_weight=pos_weight)
        log_weight = ops.add(ops.mul(ops.sub(pos_weight, 1.0), t), 1.0)
        losses = ops.add(ops.mul(ops.sub(1.0, t), x), ops.mul(log_weight, softplus_neg))
    else:
        losses = ops.add(ops.mul(ops.sub(1.0, t), x), softplus_neg)
    if weight is not None:
        losses = ops.mul(losses, weight)
    return _reduce(losses, reduction)


def kl_div(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    log_target: bool = False,
) -> Tensor:
    """Kullback-Leibler divergence with input holding log-probabilities: target * (log(target) - input).

    With log_target, target holds log-probabilities too: exp(target) * (target - input). Terms with
    target == 0 are 0. reduction "batchmean" divides the sum by the batch size (input.shape[0]), the
    mathematically correct KL; "mean" (PyTorch's default) averages over every element.
    """
    reduction = _reduction("kl_div", size_average, reduce, reduction, ("batchmean",))
    _tensors("kl_div", input=input, target=target)
    if log_target:
        losses = ops.mul(ops.exp(target), ops.sub(target, input))
    else:
        zero = ops.eq(target, 0)
        safe = ops.where(zero, 1.0, target).to(dtype=input.dtype)
        xlogx = ops.where(zero, 0.0, ops.mul(target, ops.log(safe)))  # xlogy(t, t): 0 where t == 0
        losses = ops.sub(xlogx, ops.mul(target, input))
    if reduction == "batchmean":
        total = ops.sum(losses)
        return ops.div(total, float(input.shape[0])) if input.ndim else total
    return _reduce(losses, reduction)


def cosine_embedding_loss(
    input1: Tensor,
    input2: Tensor,
    target: Tensor,
    margin: float = 0.0,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """1 - cos(x1, x2) where target == 1, max(0, cos(x1, x2) - margin) where target == -1.

    input1, input2 [N, D] (or [D] with a 0-d target); cos over the last dim, with PyTorch's 1e-12
    added to each squared norm.
    """
    reduction = _reduction("cosine_embedding_loss", size_average, reduce, reduction)
    _tensors("cosine_embedding_loss", input1=input1, input2=input2, target=target)
    if input1.shape != input2.shape or input1.ndim not in (1, 2):
        raise ShapeError(
            f"cosine_embedding_loss: input1 {list(input1.shape)} and input2 {list(input2.shape)} must be equal "
            "1-d or 2-d shapes"
        )
    if target.shape != input1.shape[:-1]:
        raise ShapeError(
            f"cosine_embedding_loss: target must have shape {list(input1.shape[:-1])}, got {list(target.shape)}"
        )
    m = float(margin)
    d = input1.ndim - 1
    prod = ops.sum(ops.mul(input1, input2), d)
    mag1 = ops.add(ops.sum(ops.mul(input1, input1), d), 1e-12)
    mag2 = ops.add(ops.sum(ops.mul(input2, input2), d), 1e-12)
    cos = ops.div(prod, ops.sqrt(ops.mul(mag1, mag2)))
    pos = ops.where(ops.eq(target, 1), ops.sub(1.0, cos), 0.0)
    neg = ops.where(ops.eq(target, -1), ops.maximum(ops.sub(cos, m), 0.0), 0.0)
    return _reduce(ops.add(pos, neg), reduction)
