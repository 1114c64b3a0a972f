"""Loss modules with PyTorch's names, arguments and defaults (``CrossEntropyLoss`` ... ``CosineEmbeddingLoss``).

Each forwards to its ``kael.nn.functional`` form; arguments are in PyTorch's positional order,
the deprecated ``size_average``/``reduce`` included (honoured with a warning). Class weights and ``pos_weight`` are
registered as buffers, as PyTorch does (``weight``/``pos_weight`` in the state_dict).
"""

from __future__ import annotations

from .._errors import DTypeError
from .._tensor import Tensor
from . import functional as F
from ._module import Module
from .functional._loss import _legacy

__all__ = [
    "CrossEntropyLoss",
    "NLLLoss",
    "MSELoss",
    "L1Loss",
    "SmoothL1Loss",
    "HuberLoss",
    "BCELoss",
    "BCEWithLogitsLoss",
    "KLDivLoss",
    "CosineEmbeddingLoss",
]


class _Loss(Module):
    _reductions: tuple[str, ...] = ("mean", "sum", "none")

    def __init__(self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean") -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = _legacy(type(self).__name__, size_average, reduce, reduction)
        if reduction not in self._reductions:
            raise DTypeError(
                f"{type(self).__name__}: reduction must be one of {', '.join(map(repr, self._reductions))}, "
                f"got {reduction!r}"
            )
        self.reduction = reduction


class _WeightedLoss(_Loss):
    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        if weight is not None and not isinstance(weight, Tensor):
            raise DTypeError(f"{type(self).__name__}: weight must be a tensor or None, got {type(weight).__name__}")
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """Softmax cross-entropy of logits against class indices or class probabilities (see F.cross_entropy)."""

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The loss of logits ``input`` against ``target``."""
        return F.cross_entropy(
            input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of log-probabilities against class indices (see F.nll_loss)."""

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The loss of log-probabilities ``input`` against class indices ``target``."""
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(_Loss):
    """Mean squared error (reduction as PyTorch)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """(input - target)**2, reduced."""
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """Mean absolute error (reduction as PyTorch)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """|input - target|, reduced."""
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Squared below ``beta``, absolute above (see F.smooth_l1_loss)."""

    def __init__(
        self,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
        beta: float = 1.0,
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The smooth L1 loss, reduced."""
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Squared below ``delta``, delta-scaled absolute above (see F.huber_loss)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The Huber loss, reduced."""
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class BCELoss(_WeightedLoss):
    """Binary cross-entropy of probabilities (see F.binary_cross_entropy)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The loss of probabilities ``input`` against ``target``."""
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
    """Binary cross-entropy of logits, computed stably (see F.binary_cross_entropy_with_logits)."""

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
        pos_weight: Tensor | None = None,
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if pos_weight is not None and not isinstance(pos_weight, Tensor):
            raise DTypeError(f"BCEWithLogitsLoss: pos_weight must be a tensor or None, got {type(pos_weight).__name__}")
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The loss of logits ``input`` against ``target``."""
        return F.binary_cross_entropy_with_logits(
            input, target, self.weight, reduction=self.reduction, pos_weight=self.pos_weight
        )


class KLDivLoss(_Loss):
    """KL divergence of log-probabilities ``input`` from ``target`` (see F.kl_div); reduction may be 'batchmean'."""

    _reductions = ("mean", "sum", "none", "batchmean")

    def __init__(
        self,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
        log_target: bool = False,
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = bool(log_target)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The divergence, reduced."""
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class CosineEmbeddingLoss(_Loss):
    """1 - cos for similar pairs (target 1), max(0, cos - margin) for dissimilar ones (target -1)."""

    def __init__(
        self,
        margin: float = 0.0,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        """The loss of the pairs (input1[i], input2[i]) labelled target[i]."""
        return F.cosine_embedding_loss(input1, input2, target, self.margin, reduction=self.reduction)
