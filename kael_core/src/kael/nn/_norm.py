"""Normalisation layers: BatchNorm1d/2d, InstanceNorm1d/2d and GroupNorm, with PyTorch's state_dict keys.

BatchNorm keeps ``running_mean``, ``running_var`` and ``num_batches_tracked`` buffers
(with ``track_running_stats``); ``momentum=None`` makes the running statistics a
cumulative average (factor 1/num_batches_tracked), as in PyTorch. Training mode
normalises with the batch statistics, eval mode with the running ones.
"""

from __future__ import annotations

from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..ops import empty, ones, zeros
from . import functional as F
from . import init
from ._module import Module
from ._parameter import Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "InstanceNorm1d", "InstanceNorm2d", "GroupNorm"]


def _dtype(op: str, dtype: Any) -> dt.DType:
    d = dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()
    if not d.is_floating_point:
        raise DTypeError(f"{op}: parameters need a floating-point dtype, got {d!r}")
    return d


class _NormBase(Module):
    ndims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float,
        momentum: float | None,
        affine: bool,
        track_running_stats: bool,
        device: Any,
        dtype: Any,
        bias: bool = True,
    ) -> None:
        super().__init__()
        op = type(self).__name__
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ShapeError(f"{op}: num_features must be a positive int, got {num_features!r}")
        if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, (int, float))):
            raise DTypeError(f"{op}: momentum must be a number or None, got {momentum!r}")
        d = _dtype(op, dtype)
        self.num_features, self.eps, self.momentum = num_features, float(eps), momentum
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        self.register_parameter("weight", Parameter(empty(num_features, dtype=d, device=device)) if affine else None)
        self.register_parameter(
            "bias", Parameter(empty(num_features, dtype=d, device=device)) if affine and bias else None
        )
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=d, device=device))
            self.register_buffer("running_var", ones(num_features, dtype=d, device=device))
            self.register_buffer("num_batches_tracked", zeros((), dtype=dt.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Running mean 0, variance 1, no batches tracked."""
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset the running statistics, weight to ones and bias to zeros."""
        self.reset_running_stats()
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def _check_input(self, x: Any) -> None:
        if not isinstance(x, Tensor) or x.ndim not in self.ndims:
            raise ShapeError(
                f"{type(self).__name__}: expected a {' or '.join(f'{n}-d' for n in self.ndims)} input, got "
                f"{list(getattr(x, 'shape', ())) if isinstance(x, Tensor) else type(x).__name__}"
            )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )


class _BatchNorm(_NormBase):
    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias)

    def forward(self, x: Tensor) -> Tensor:
        """Normalised x: batch statistics in training (updating the running ones), running ones in eval."""
        self._check_input(x)
        factor = 0.0 if self.momentum is None else float(self.momentum)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.item())
        use_batch = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats
        return F.batch_norm(
            x,
            self.running_mean if keep else None,
            self.running_var if keep else None,
            self.weight,
            self.bias,
            use_batch,
            factor,
            self.eps,
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of [N, C] or [N, C, L] per channel C."""

    ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of [N, C, H, W] per channel C."""

    ndims = (4,)


class _InstanceNorm(_NormBase):
    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias)

    def forward(self, x: Tensor) -> Tensor:
        """x normalised per sample and channel over its spatial dims (running statistics in eval when tracked)."""
        self._check_input(x)
        unbatched = x.ndim == self.ndims[0]
        if unbatched:
            x = x.unsqueeze(0)
        if x.shape[1] != self.num_features and self.affine:
            raise ShapeError(f"{type(self).__name__}: expected {self.num_features} channels, got input {list(x.shape)}")
        out = F.instance_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            0.1 if self.momentum is None else float(self.momentum),
            self.eps,
        )
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation of [N, C, L] (or [C, L])."""

    ndims = (2, 3)


class InstanceNorm2d(_InstanceNorm):
    """Instance normalisation of [N, C, H, W] (or [C, H, W])."""

    ndims = (3, 4)


class GroupNorm(Module):
    """Normalise [N, C, *] over groups of C/num_groups channels, then scale and shift per channel."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        for name, v in (("num_groups", num_groups), ("num_channels", num_channels)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"GroupNorm: {name} must be a positive int, got {v!r}")
        if num_channels % num_groups:
            raise ShapeError(f"GroupNorm: num_groups {num_groups} must divide num_channels {num_channels}")
        d = _dtype("GroupNorm", dtype)
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, float(eps), bool(affine)
        self.register_parameter("weight", Parameter(empty(num_channels, dtype=d, device=device)) if affine else None)
        self.register_parameter(
            "bias", Parameter(empty(num_channels, dtype=d, device=device)) if affine and bias else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to ones and bias to zeros."""
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Group-normalised x."""
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )
