"""Pooling and resampling layers: MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d, Upsample, PixelShuffle/Unshuffle.

Arguments, defaults and reprs are PyTorch's; each forwards to ``kael.nn.functional``.
"""

from __future__ import annotations

from typing import Any

from .._tensor import Tensor
from . import functional as F
from ._module import Module

__all__ = [
    "MaxPool1d",
    "MaxPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "Upsample",
    "PixelShuffle",
    "PixelUnshuffle",
]


def _one(v: Any) -> Any:
    return (v,) if isinstance(v, int) and not isinstance(v, bool) else v


class _MaxPoolNd(Module):
    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = bool(return_indices), bool(ceil_mode)

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool1d(_MaxPoolNd):
    """The maximum of each window of [N, C, L] (see F.max_pool1d)."""

    def forward(self, x: Tensor) -> Any:
        """Pooled x (and the indices with return_indices=True)."""
        return F.max_pool1d(
            x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices
        )


class MaxPool2d(_MaxPoolNd):
    """The maximum of each window of [N, C, H, W] (see F.max_pool2d)."""

    def forward(self, x: Tensor) -> Any:
        """Pooled x (and the indices with return_indices=True)."""
        return F.max_pool2d(
            x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices
        )


class AvgPool1d(Module):
    """The mean of each window of [N, C, L] (see F.avg_pool1d)."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> None:
        super().__init__()
        self.kernel_size = _one(kernel_size)  # 1-tuples, as PyTorch's AvgPool1d keeps them
        self.stride = _one(stride if stride is not None else kernel_size)
        self.padding, self.ceil_mode, self.count_include_pad = _one(padding), bool(ceil_mode), bool(count_include_pad)

    def forward(self, x: Tensor) -> Tensor:
        """Pooled x."""
        return F.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    """The mean of each window of [N, C, H, W] (see F.avg_pool2d)."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode, self.count_include_pad = padding, bool(ceil_mode), bool(count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, x: Tensor) -> Tensor:
        """Pooled x."""
        return F.avg_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool1d(Module):
    """Average pooling of [N, C, L] into output_size windows."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        """Pooled x."""
        return F.adaptive_avg_pool1d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool2d(Module):
    """Average pooling of [N, C, H, W] into an output_size grid (None keeps a dim)."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        """Pooled x."""
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class Upsample(Module):
    """Resample to ``size`` or by ``scale_factor``: mode 'nearest', 'linear' or 'bilinear' (see F.interpolate)."""

    def __init__(
        self,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ) -> None:
        super().__init__()
        self.size, self.mode, self.align_corners = size, mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor
        self.scale_factor = float(scale_factor) if isinstance(scale_factor, (int, float)) else scale_factor

    def forward(self, x: Tensor) -> Tensor:
        """Resampled x."""
        return F.interpolate(
            x, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor
        )

    def extra_repr(self) -> str:
        what = f"scale_factor={self.scale_factor}" if self.scale_factor is not None else f"size={self.size}"
        return f"{what}, mode={self.mode!r}"


class PixelShuffle(Module):
    """[*, C*r*r, H, W] -> [*, C, H*r, W*r]."""

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x: Tensor) -> Tensor:
        """Shuffled x."""
        return F.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """[*, C, H*r, W*r] -> [*, C*r*r, H, W]."""

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x: Tensor) -> Tensor:
        """Unshuffled x."""
        return F.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"
