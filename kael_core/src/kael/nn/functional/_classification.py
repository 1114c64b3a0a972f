"""The class-index losses of kael.nn.functional: cross_entropy and nll_loss, with PyTorch's arguments.

They take PyTorch's layouts ([C], [N, C] or [N, C, d1, ...]) and check every target on
the host (an out-of-range class is an ``IndexError_``), like PyTorch's CPU kernels;
``cross_entropy`` also takes class-probability targets. Without class weights it is the
fused ``cross_entropy`` op; otherwise it is written with differentiable ops.
"""

from __future__ import annotations

import numpy as np

from ... import _dtype as dt
from ... import ops
from ..._errors import DTypeError, IndexError_, ShapeError
from ..._tensor import Tensor
from ._loss import _float_input, _reduction, _tensors

__all__ = ["cross_entropy", "nll_loss"]


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
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood of log-probabilities [N, C] (or [C], [N, C, d...]) against class indices.

    Each loss is -weight[t] * input[n, t]; "mean" divides by the summed weights of the targets not ignored.
    """
    reduction = _reduction("nll_loss", size_average, reduce, reduction)
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
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy of logits [N, C] (or [C], [N, C, d...]) against class indices or probabilities.

    Class-index targets equal to ignore_index contribute nothing and are not counted by the mean;
    with ``weight`` the mean divides by the summed weights of the targets. A floating target of
    input's shape is a distribution over the classes (the mean then divides by the batch size).
    label_smoothing mixes the target with the uniform distribution, as PyTorch does.
    """
    reduction = _reduction("cross_entropy", size_average, reduce, reduction)
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
