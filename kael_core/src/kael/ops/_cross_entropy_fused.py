"""The cross-entropy loss as a fused op: the backend's kernel when it has one, else the decomposition
(a log-softmax, a gather of each row's target, the label smoothing mixed in)."""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, check_device, empty, expand_to, scalar_tensor
from ._fused import Softmax, _float, _Nop, decompositions, log_softmax_decomp
from ._indexing import scatter_add_nograd
from ._pointwise import Div, binary, unary
from ._reduce import Sum, Where_nograd, reduce_op
from ._views import reshape_nograd

__all__ = ["CrossEntropy", "cross_entropy", "cross_entropy_decomp"]


def cross_entropy_decomp(logits: Tensor, target: Tensor, ignore_index: int, smoothing: float) -> Tensor:
    from ._indexing import Gather
    from ._reduce import Where_nograd

    logp = log_softmax_decomp(logits, 1)
    keep = binary("ne", target, ignore_index)
    safe = Where_nograd(keep, target, 0)
    nll = unary(
        "neg",
        reshape_nograd(Gather.forward(_Nop(), logp, 1, reshape_nograd(safe, (target.shape[0], 1))), (target.shape[0],)),
    )
    if smoothing:
        mean_logp = binary("div", reduce_op("sum", logp, (1,), False, logp.dtype), float(logits.shape[1]))
        nll = binary("sub", binary("mul", nll, 1 - smoothing), binary("mul", mean_logp, smoothing))
    return Where_nograd(keep, nll, 0.0)


class CrossEntropy(Function):
    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, ignore_index: int, smoothing: float, all_kept: bool = False
    ) -> Tensor:
        k = _dispatch.fused_kernel(logits.device.type, "cross_entropy")
        if k is not None:
            losses = empty((logits.shape[0],), logits.dtype, logits.device)
            k(losses, logits, target, ignore_index, smoothing)
        else:
            losses = cross_entropy_decomp(logits, target, ignore_index, smoothing)
        ctx.save_for_backward(logits, target)
        ctx.ignore_index, ctx.smoothing, ctx.all_kept = ignore_index, smoothing, all_kept
        return losses

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        # d loss_i / d logits_i = softmax_i - ((1 - s) * onehot(target_i) + s / C), rows of ignored targets 0
        logits, target = ctx.saved_tensors
        n, c = logits.shape
        s = ctx.smoothing
        d = Softmax.forward(_Nop(), logits, 1)
        if s:
            d = binary("sub", d, s / c)
        keep = None
        if not ctx.all_kept:
            keep = reshape_nograd(binary("ne", target, ctx.ignore_index), (n, 1))
            target = Where_nograd(keep, reshape_nograd(target, (n, 1)), 0)
        src = expand_to(scalar_tensor(s - 1.0, d.dtype, d.device), (n, 1))
        scatter_add_nograd(d, 1, reshape_nograd(target, (n, 1)), src)
        if keep is not None:
            d = Where_nograd(keep, d, 0.0)
        return binary("mul", d, reshape_nograd(g, (n, 1))), None, None, None, None


def cross_entropy(
    logits: Tensor, target: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"
) -> Tensor:
    """The cross-entropy loss of ``logits`` [N, C] against integer class ids ``target`` [N], as
    ``torch.nn.functional.cross_entropy``: ``-log_softmax(logits)[n, target[n]]`` per row, mixed with
    the mean over the classes by ``label_smoothing``; rows whose target is ``ignore_index`` count 0 and
    are left out of the mean. ``reduction`` "mean" (over the rows not ignored), "sum" or "none" ([N]).
    Differentiable in ``logits``.
    """
    _float(logits, "cross_entropy")
    if reduction not in ("mean", "sum", "none"):
        raise DTypeError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not isinstance(target, Tensor) or target.dtype.category != 1:
        raise DTypeError(
            f"cross_entropy: target must be an integer tensor of class ids, got "
            f"{getattr(target, 'dtype', type(target))!r}"
        )
    if logits.ndim != 2 or target.shape != (logits.shape[0],):
        raise ShapeError(
            f"cross_entropy: expected logits [N, C] and target [N], got {list(logits.shape)} and "
            f"{list(getattr(target, 'shape', ()))}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise DTypeError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    check_device("cross_entropy", logits, target)
    target = cast(target, dt.int64)
    # The targets are checked on the host: they are small ([N] ids), and on CPU this is a view, not a copy.
    ids = target._host()
    kept = ids != ignore_index
    bad = kept & ((ids < 0) | (ids >= logits.shape[1]))
    if bad.any():
        raise IndexError_(f"cross_entropy: target {int(ids[bad][0])} is out of range for {logits.shape[1]} classes")
    count = int(kept.sum())
    losses = CrossEntropy.apply(logits, target, int(ignore_index), float(label_smoothing), count == len(ids))
    if reduction == "none":
        return losses  # type: ignore[no-any-return]
    total = Sum.apply(losses)
    if reduction == "sum":
        return total  # type: ignore[no-any-return]
    return Div.apply(total, float(count) if count else float("nan"))  # type: ignore[no-any-return]


decompositions["cross_entropy"] = cross_entropy_decomp
