"""The loss functions of kael.nn.functional, with PyTorch's names, arguments, defaults and reductions.

``reduction`` is "mean" (default), "sum" or "none" everywhere ("batchmean" too for
``kl_div``). Class-index losses take PyTorch's layouts ([C], [N, C] or [N, C, d1, ...])
and check every target on the host (an out-of-range class is an ``IndexError_``), like
PyTorch's CPU kernels. Everything is written with differentiable ops, so gradients come
from autograd on every backend (``cross_entropy`` without class weights is the fused op).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _dtype as dt
from ... import ops
from ..._errors import DTypeError, IndexError_, ShapeError
from ..._tensor import Tensor

__all__ = [
    "cross_entropy",
    "nll_loss",
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


def _classes_last(input: Tensor, target: Tensor, op: str) -> tuple[Tensor, Tensor]:
    """PyTorch's layouts [C] / [N, C] / [N, C, d1, ...] -> scores [M, C] and target [M]."""
    _tensors(op, input=input, target=target)
    if input.ndim == 0:
        raise ShapeError(f"{op}: input must have a class dimension, got a 0-d tensor")
    if input.ndim == 1:
        if target.ndim != 0:
            raise ShapeError(f"{op}: unbatched input [C] needs a 0-d target, got {list(target.shape)}")
        return ops.unsqueeze(input, 0), ops.reshape(target, (1,))
    want = (input.shape[0],) + input.shape[2:]
    if target.shape != want:
        raise ShapeError(
            f"{op}: input {list(input.shape)} needs target {list(want)} (logits [N, C] and target [N], or "
            f"[N, C, d...] and [N, d...]), got {list(target.shape)}"
        )
    if input.ndim > 2:
        c = input.shape[1]
        moved = ops.permute(input, (0, *range(2, input.ndim), 1))
        return ops.reshape(moved, (-1, c)), ops.reshape(target, (-1,))
    return input, target


def _check_targets(op: str, target: Tensor, classes: int, ignore_index: int) -> np.ndarray:
    """The targets on the host, checked: integers in [0, classes) or ignore_index."""
    if target.dtype.category != 1:
        raise DTypeError(f"{op}: target must be an integer tensor of class indices, got {target.dtype!r}")
    ids = np.asarray(target.to(dtype=dt.int64)._host())
    kept = ids != ignore_index
    bad = kept & ((ids < 0) | (ids >= classes))
    if bad.any():
        raise IndexError_(f"{op}: target {int(ids[bad][0])} is out of range for {classes} classes")
    return kept  # type: ignore[no-any-return]


def _check_weight(op: str, weight: Tensor | None, classes: int) -> None:
    if weight is not None:
        _tensors(op, weight=weight)
        if weight.shape != (classes,):
            raise ShapeError(f"{op}: weight must have shape [{classes}] (one per class), got {list(weight.shape)}")


def _weighted_nll(
    logp: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, op: str
) -> tuple[Tensor, Tensor]:
    """(per-row losses [M] with ignored rows 0, per-row weights [M] with ignored rows 0)."""
    m = logp.shape[0]
    keep = ops.ne(target, ignore_index)
    safe = ops.where(keep, target.to(dtype=dt.int64), 0)
    picked = ops.reshape(ops.gather(logp, 1, ops.unsqueeze(safe, 1)), (m,))
    w = ops.index_select(weight, 0, safe) if weight is not None else ops.ones((m,), dtype=logp.dtype)
    w = ops.where(keep, w, 0.0).to(dtype=logp.dtype)
    return ops.mul(ops.neg(picked), w), w


def nll_loss(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood of log-probabilities [N, C] (or [C], [N, C, d...]) against class indices.

    Each loss is -weight[t] * input[n, t]; "mean" divides by the summed weights of the targets not ignored.
    """
    _check_reduction("nll_loss", reduction)
    logp, tgt = _classes_last(input, target, "nll_loss")
    _float_input("nll_loss", logp)
    _check_weight("nll_loss", weight, logp.shape[1])
    _check_targets("nll_loss", tgt, logp.shape[1], ignore_index)
    losses, w = _weighted_nll(logp, tgt, weight, ignore_index, "nll_loss")
    if reduction == "none":
        return losses if input.ndim == 2 else ops.reshape(losses, target.shape)
    total = ops.sum(losses)
    return total if reduction == "sum" else ops.div(total, ops.sum(w))


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy of logits [N, C] (or [C], [N, C, d...]) against class indices or probabilities.

    Class-index targets equal to ignore_index contribute nothing and are not counted by the mean;
    with ``weight`` the mean divides by the summed weights of the targets. A floating target of
    input's shape is a distribution over the classes (the mean then divides by the batch size).
    label_smoothing mixes the target with the uniform distribution, as PyTorch does.
    """
    _check_reduction("cross_entropy", reduction)
    _tensors("cross_entropy", input=input, target=target)
    _float_input("cross_entropy", input)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise DTypeError(f"cross_entropy: label_smoothing must be a number, got {label_smoothing!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise DTypeError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    eps = float(label_smoothing)
    if target.dtype.is_floating_point:
        return _cross_entropy_probs(input, target, weight, reduction, eps)
    logits, tgt = _classes_last(input, target, "cross_entropy")
    c = logits.shape[1]
    _check_weight("cross_entropy", weight, c)
    if weight is None:
        if tgt.dtype.category != 1:
            raise DTypeError(f"cross_entropy: target must be class indices or probabilities, got {tgt.dtype!r}")
        out = ops.cross_entropy(logits, tgt, ignore_index, eps, reduction)
        return ops.reshape(out, target.shape) if reduction == "none" and input.ndim != 2 else out
    kept = _check_targets("cross_entropy", tgt, c, ignore_index)
    logp = ops.log_softmax(logits, 1)
    nll, w = _weighted_nll(logp, tgt, weight, ignore_index, "cross_entropy")
    losses = nll
    if eps:
        keep = ops.unsqueeze(ops.ne(tgt, ignore_index), 1)
        smooth = ops.neg(ops.sum(ops.where(keep, ops.mul(logp, weight), 0.0), 1))
        losses = ops.add(ops.mul(nll, 1.0 - eps), ops.mul(smooth, eps / c))
    if reduction == "none":
        return losses if input.ndim == 2 else ops.reshape(losses, target.shape)
    total = ops.sum(losses)
    if reduction == "sum":
        return total
    if not kept.any():
        return ops.div(total, 0.0)  # type: ignore[no-any-return]
    return ops.div(total, ops.sum(w))  # type: ignore[no-any-return]


def _cross_entropy_probs(input: Tensor, target: Tensor, weight: Tensor | None, reduction: str, eps: float) -> Tensor:
    if target.shape != input.shape:
        raise DTypeError(
            f"cross_entropy: target must be an integer tensor of class ids (or class probabilities of input's "
            f"shape {list(input.shape)}), got {target.dtype!r} of shape {list(target.shape)}"
        )
    cdim = 0 if input.ndim == 1 else 1
    c = input.shape[cdim]
    _check_weight("cross_entropy", weight, c)
    logp = ops.log_softmax(input, cdim)
    t = ops.add(ops.mul(target, 1.0 - eps), eps / c) if eps else target
    prod = ops.mul(logp, t)
    if weight is not None:
        wshape = (c,) + (1,) * (input.ndim - cdim - 1)
        prod = ops.mul(prod, ops.reshape(weight, wshape))
    losses = ops.neg(ops.sum(prod, cdim))
    if reduction == "none":
        return losses  # type: ignore[no-any-return]
    total = ops.sum(losses)
    if reduction == "sum":
        return total
    return ops.div(total, float(input.numel() // c) if input.numel() else 0.0)  # type: ignore[no-any-return]


def _pair(op: str, input: Any, target: Any) -> tuple[Tensor, Tensor]:
    _tensors(op, input=input, target=target)
    return input, target


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """(input - target)**2, reduced: its mean (default), its sum, or each element (reduction='none')."""
    _check_reduction("mse_loss", reduction)
    x, y = _pair("mse_loss", input, target)
    d = ops.sub(x, y)
    return _reduce(ops.mul(d, d), reduction)


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """|input - target|, reduced."""
    _check_reduction("l1_loss", reduction)
    x, y = _pair("l1_loss", input, target)
    return _reduce(ops.abs(ops.sub(x, y)), reduction)


def _nonneg(op: str, name: str, v: Any, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
        raise DTypeError(f"{op}: {name} must be a {'positive' if positive else 'non-negative'} number, got {v!r}")
    return float(v)


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 * d**2 / beta where |d| < beta, else |d| - 0.5 * beta (d = input - target); beta=0 is l1_loss."""
    _check_reduction("smooth_l1_loss", reduction)
    b = _nonneg("smooth_l1_loss", "beta", beta)
    x, y = _pair("smooth_l1_loss", input, target)
    if b == 0.0:
        return l1_loss(x, y, reduction)
    d = ops.abs(ops.sub(x, y))
    losses = ops.where(ops.lt(d, b), ops.div(ops.mul(ops.mul(d, d), 0.5), b), ops.sub(d, 0.5 * b))
    return _reduce(losses, reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """0.5 * d**2 where |d| < delta, else delta * (|d| - 0.5 * delta) (d = input - target)."""
    _check_reduction("huber_loss", reduction)
    k = _nonneg("huber_loss", "delta", delta, positive=True)
    x, y = _pair("huber_loss", input, target)
    d = ops.abs(ops.sub(x, y))
    losses = ops.where(ops.lt(d, k), ops.mul(ops.mul(d, d), 0.5), ops.mul(ops.sub(d, 0.5 * k), k))
    return _reduce(losses, reduction)


def binary_cross_entropy(
    input: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean"
) -> Tensor:
    """-(target * log(input) + (1 - target) * log(1 - input)) * weight, each log clamped at -100 (PyTorch's).

    input holds probabilities (values in [0, 1], checked) and target has its shape.
    """
    _check_reduction("binary_cross_entropy", reduction)
    _tensors("binary_cross_entropy", input=input, target=target)
    _float_input("binary_cross_entropy", input)
    if target.shape != input.shape:
        raise ShapeError(
            f"binary_cross_entropy: target shape {list(target.shape)} must equal input shape {list(input.shape)}"
        )
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
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    """binary_cross_entropy(sigmoid(input), target) computed stably from the logits.

    (1 - t) * x + (1 + (pos_weight - 1) * t) * (log1p(exp(-|x|)) + max(-x, 0)), times weight;
    pos_weight (broadcast along the last dim, one per class) weighs the positive term.
    """
    _check_reduction("binary_cross_entropy_with_logits", reduction)
    _tensors("binary_cross_entropy_with_logits", input=input, target=target)
    _float_input("binary_cross_entropy_with_logits", input)
    if target.shape != input.shape:
        raise ShapeError(
            f"binary_cross_entropy_with_logits: target shape {list(target.shape)} must equal input shape "
            f"{list(input.shape)}"
        )
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


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """Kullback-Leibler divergence with input holding log-probabilities: target * (log(target) - input).

    With log_target, target holds log-probabilities too: exp(target) * (target - input). Terms with
    target == 0 are 0. reduction "batchmean" divides the sum by the batch size (input.shape[0]), the
    mathematically correct KL; "mean" (PyTorch's default) averages over every element.
    """
    _check_reduction("kl_div", reduction, ("batchmean",))
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
    input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, reduction: str = "mean"
) -> Tensor:
    """1 - cos(x1, x2) where target == 1, max(0, cos(x1, x2) - margin) where target == -1.

    input1, input2 [N, D] (or [D] with a 0-d target); cos over the last dim, with PyTorch's 1e-12
    added to each squared norm.
    """
    _check_reduction("cosine_embedding_loss", reduction)
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
