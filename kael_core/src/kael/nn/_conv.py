"""Convolution layers: Conv1d, Conv2d and ConvTranspose2d, with PyTorch's arguments, init and state_dict keys.

``weight`` is [out, in/groups, *kernel] ([in, out/groups, *kernel] for the transposed
layer) and ``bias`` [out], initialised as PyTorch does (kaiming_uniform_ with a=sqrt(5),
bias uniform in +-1/sqrt(fan_in)), so PyTorch checkpoints load and give the same outputs.
Padding modes other than zeros pad with ``F.pad`` first, as PyTorch does.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..ops import empty
from ..ops._conv import ntuple
from . import functional as F
from . import init
from ._module import Module
from ._parameter import Parameter

__all__ = ["Conv1d", "Conv2d", "ConvTranspose2d"]

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    nd = 2
    transposed = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any,
        padding: Any,
        dilation: Any,
        groups: int,
        bias: bool,
        padding_mode: str,
        output_padding: Any = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        op, nd = type(self).__name__, self.nd
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"{op}: {name} must be a positive int, got {v!r}")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}")
        if in_channels % groups or out_channels % groups:
            raise ShapeError(
                f"{op}: groups={groups} must divide in_channels {in_channels} and out_channels {out_channels}"
            )
        if padding_mode not in PADDING_MODES:
            raise DTypeError(
                f"{op}: padding_mode must be one of {', '.join(map(repr, PADDING_MODES))}, got {padding_mode!r}"
            )
        self.kernel_size = ntuple(op, "kernel_size", kernel_size, nd, 1)
        self.stride = ntuple(op, "stride", stride, nd, 1)
        self.dilation = ntuple(op, "dilation", dilation, nd, 1)
        if isinstance(padding, str):
            if padding not in ("same", "valid") or self.transposed:
                raise DTypeError(f"{op}: padding must be 'same', 'valid', an int or a tuple of ints, got {padding!r}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ShapeError(
                    f"{op}: padding='same' is not supported for strided convolutions (stride {self.stride})"
                )
            self.padding: Any = padding
        else:
            self.padding = ntuple(op, "padding", padding, nd, 0)
        self.output_padding = ntuple(op, "output_padding", output_padding, nd, 0)
        if padding_mode != "zeros" and self.transposed:
            raise DTypeError(f"{op}: only padding_mode 'zeros' is supported, got {padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.padding_mode = padding_mode
        d = dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()
        if not d.is_floating_point:
            raise DTypeError(f"{op}: parameters need a floating-point dtype, got {d!r}")
        shape = (
            (in_channels, out_channels // groups) if self.transposed else (out_channels, in_channels // groups)
        ) + self.kernel_size
        self.weight = Parameter(empty(shape, dtype=d, device=device))
        self.register_parameter("bias", Parameter(empty(out_channels, dtype=d, device=device)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise as PyTorch does: kaiming_uniform_(a=sqrt(5)) weight, bias in +-1/sqrt(fan_in)."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * math.prod(self.kernel_size)
            bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound)

    def _pre_pad(self, x: Tensor) -> tuple[Tensor, Any]:
        """x padded by padding_mode (non-zero modes) and the padding left for the convolution."""
        if self.padding_mode == "zeros":
            return x, self.padding
        if self.padding == "valid":
            return x, 0
        if self.padding == "same":
            pairs = [(t // 2, t - t // 2) for t in (d * (k - 1) for d, k in zip(self.dilation, self.kernel_size))]
        else:
            pairs = [(p, p) for p in self.padding]
        flat = [v for lo_hi in reversed(pairs) for v in lo_hi]
        return F.pad(x, flat, mode=self.padding_mode), 0

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self.nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self.nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * self.nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    """1-d convolution over input [N, C_in, L] (or [C_in, L]): weight [C_out, C_in/groups, k]."""

    nd = 1

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device=device,
            dtype=dtype,
        )

    def forward(self, x: Tensor) -> Tensor:
        """The convolution of x: [N, C_out, L_out]."""
        x, padding = self._pre_pad(x)
        return F.conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    """2-d convolution over input [N, C_in, H, W] (or [C_in, H, W]): weight [C_out, C_in/groups, kH, kW].

    padding: an int, a pair, 'same' (stride 1) or 'valid'; padding_mode zeros, reflect, replicate or
    circular; groups == in_channels is a depthwise convolution.
    """

    nd = 2

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device=device,
            dtype=dtype,
        )

    def forward(self, x: Tensor) -> Tensor:
        """The convolution of x: [N, C_out, H_out, W_out]."""
        x, padding = self._pre_pad(x)
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class ConvTranspose2d(_ConvNd):
    """Transposed 2-d convolution (fractionally strided): weight [C_in, C_out/groups, kH, kW]."""

    nd = 2
    transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            output_padding,
            device,
            dtype,
        )

    def forward(self, x: Tensor, output_size: Any = None) -> Tensor:
        """The transposed convolution of x; output_size (the last 2 dims, or more) picks output_padding."""
        out_pad = self.output_padding
        if output_size is not None:
            want = tuple(output_size)[-2:]
            base = [
                (x.shape[-2 + i] - 1) * self.stride[i]
                - 2 * self.padding[i]
                + self.dilation[i] * (self.kernel_size[i] - 1)
                + 1
                for i in range(2)
            ]
            out_pad = tuple(w - b for w, b in zip(want, base))
            if any(not 0 <= v < max(s, d) for v, s, d in zip(out_pad, self.stride, self.dilation)):
                raise ShapeError(
                    f"ConvTranspose2d: output_size {list(want)} is not reachable from input {list(x.shape)} "
                    f"(sizes from {base} to {[b + max(s, d) - 1 for b, s, d in zip(base, self.stride, self.dilation)]})"
                )
        return F.conv_transpose2d(
            x, self.weight, self.bias, self.stride, self.padding, out_pad, self.groups, self.dilation
        )
