"""The pooling and resampling functions of kael.nn.functional, with PyTorch's signatures and defaults.

max/avg pooling (1-d and 2-d), adaptive average pooling, interpolate (nearest, linear,
bilinear), pixel_shuffle / pixel_unshuffle. The arithmetic is ``kael.ops._pool``'s.
"""

from __future__ import annotations

from typing import Any

from ... import ops
from ..._errors import DTypeError, ShapeError
from ..._tensor import Tensor
from ...ops._pool import adaptive_avg_pool_nd, avg_pool_nd, interpolate, max_pool_nd

__all__ = [
    "max_pool1d",
    "max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "interpolate",
    "pixel_shuffle",
    "pixel_unshuffle",
]


def max_pool1d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """The maximum of each window of input [N, C, L] (or [C, L]); with return_indices also their positions."""
    return max_pool_nd("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """The maximum of each window of input [N, C, H, W] (or [C, H, W]); stride defaults to kernel_size;
    padding (at most half the kernel) counts as -inf; with return_indices also the flat H*W positions."""
    return max_pool_nd("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool1d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """The mean of each window of input [N, C, L] (or [C, L])."""
    return avg_pool_nd("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad)


def avg_pool2d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """The mean of each window of input [N, C, H, W] (or [C, H, W]); zero padding counts in the divisor
    unless count_include_pad=False; divisor_override replaces the divisor."""
    return avg_pool_nd(
        "avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


def adaptive_avg_pool1d(input: Tensor, output_size: Any) -> Tensor:
    """Average pooling of input [N, C, L] into output_size windows."""
    return adaptive_avg_pool_nd("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """Average pooling of input [N, C, H, W] into an output_size grid of windows (None keeps a dim)."""
    return adaptive_avg_pool_nd("adaptive_avg_pool2d", 2, input, output_size)


def _factor(op: str, r: Any) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise DTypeError(f"{op}: the factor must be a positive int, got {r!r}")
    return r


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """[*, C*r*r, H, W] -> [*, C, H*r, W*r] (sub-pixel convolution's rearrangement)."""
    r = _factor("pixel_shuffle", upscale_factor)
    if not isinstance(input, Tensor) or input.ndim < 3 or input.shape[-3] % (r * r):
        raise ShapeError(
            f"pixel_shuffle: input must be [*, C*{r * r}, H, W] (channels divisible by upscale_factor**2), got "
            f"{list(getattr(input, 'shape', ()))}"
        )
    lead, (c, h, w) = input.shape[:-3], input.shape[-3:]
    x = ops.reshape(input, lead + (c // (r * r), r, r, h, w))
    k = len(lead)
    x = ops.permute(x, (*range(k), k, k + 3, k + 1, k + 4, k + 2))
    return ops.reshape(x, lead + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """[*, C, H*r, W*r] -> [*, C*r*r, H, W], the inverse of pixel_shuffle."""
    r = _factor("pixel_unshuffle", downscale_factor)
    if not isinstance(input, Tensor) or input.ndim < 3 or input.shape[-2] % r or input.shape[-1] % r:
        raise ShapeError(
            f"pixel_unshuffle: input must be [*, C, H, W] with H and W divisible by {r}, got "
            f"{list(getattr(input, 'shape', ()))}"
        )
    lead, (c, h, w) = input.shape[:-3], input.shape[-3:]
    x = ops.reshape(input, lead + (c, h // r, r, w // r, r))
    k = len(lead)
    x = ops.permute(x, (*range(k), k, k + 2, k + 4, k + 1, k + 3))
    return ops.reshape(x, lead + (c * r * r, h // r, w // r))
