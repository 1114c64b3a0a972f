"""QuantizedLinear: a linear layer whose weight is stored in a weight format (NOTE [weight formats])."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..nn._module import Module
from ..ops import zeros
from ..ops._quant import check_scheme, quantized_linear
from ._formats import BLOCK_BYTES, BLOCK_VALUES, quantize_array, storage_shape, to_device_weight

__all__ = ["QuantizedLinear"]

_DTYPES = {"bf16": dt.bfloat16, "f16": dt.float16}


def _size(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ShapeError(f"QuantizedLinear: {name} must be a non-negative int, got {v!r}")
    return int(v)


class QuantizedLinear(Module):
    """``y = x @ dequantize(weight).T + bias`` in float32, the weight held in `scheme`.

    Buffers (state_dict keys as ``nn.Linear``'s): ``weight``, uint8 [out, in/32*B] of GGML
    blocks for q8_0/q4_0, bfloat16/float16 [out, in] for bf16/f16; ``bias`` float32 [out]
    or None. Built empty (zeros: load a state dict into it), around stored bytes (``weight=``: a
    loader's, no zeros made first) or with ``from_float``. x must
    be float32; gradients flow to x (and a bias that requires grad), never to the weight.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        scheme: str,
        bias: bool = True,
        device: Any = None,
        *,
        weight: Tensor | None = None,
    ) -> None:
        super().__init__()
        check_scheme("QuantizedLinear", scheme)
        self.in_features = _size("in_features", in_features)
        self.out_features = _size("out_features", out_features)
        if scheme in BLOCK_BYTES and self.in_features % BLOCK_VALUES[scheme]:
            raise ShapeError(
                f"QuantizedLinear: a {scheme} layer needs in_features to be a multiple of {BLOCK_VALUES[scheme]}, "
                f"got {in_features}"
            )
        self.scheme = scheme
        shape = storage_shape(scheme, self.out_features, self.in_features)
        dtype = _DTYPES.get(scheme, dt.uint8)
        if weight is None:
            weight = zeros(shape, dtype=dtype, device=device)
        elif not isinstance(weight, Tensor) or weight.dtype is not dtype:
            raise DTypeError(
                f"QuantizedLinear: a {scheme} weight is a {dtype} tensor of its stored bytes, got "
                f"{getattr(weight, 'dtype', type(weight).__name__)}"
            )
        elif tuple(weight.shape) != tuple(shape):
            raise ShapeError(
                f"QuantizedLinear: a {scheme} weight of {self.out_features} x {self.in_features} is stored as "
                f"{list(shape)}, got {list(weight.shape)}"
            )
        else:
            device = weight.device  # the layer lives with its weight
        self.register_buffer("weight", weight)
        self.register_buffer("bias", zeros(self.out_features, dtype=dt.float32, device=device) if bias else None)

    @classmethod
    def from_float(cls, weight_out_in: Tensor, bias: Tensor | None, scheme: str) -> QuantizedLinear:
        """A QuantizedLinear holding `weight_out_in` [out, in] quantized to `scheme`, and `bias` as float32.

        The weight may be any floating dtype (on any device: it is quantized on the host); the
        layer lives on the weight's device.
        """
        check_scheme("QuantizedLinear.from_float", scheme)
        if not isinstance(weight_out_in, Tensor) or not weight_out_in.dtype.is_floating_point:
            raise DTypeError(
                "QuantizedLinear.from_float: weight must be a floating-point tensor, got "
                f"{getattr(weight_out_in, 'dtype', type(weight_out_in).__name__)!r}"
            )
        if weight_out_in.ndim != 2:
            raise ShapeError(f"QuantizedLinear.from_float: weight must be [out, in], got {list(weight_out_in.shape)}")
        out_f, in_f = weight_out_in.shape
        if bias is not None:
            if not isinstance(bias, Tensor) or not bias.dtype.is_floating_point:
                raise DTypeError("QuantizedLinear.from_float: bias must be a floating-point tensor or None")
            if bias.shape != (out_f,):
                raise ShapeError(f"QuantizedLinear.from_float: bias has shape {list(bias.shape)}, expected [{out_f}]")
        device = weight_out_in.device
        q = cls(in_f, out_f, scheme, bias=bias is not None, device=device)
        values = np.asarray(weight_out_in.detach()._host(), dtype=np.float32)
        q.weight = to_device_weight(quantize_array(values, scheme), scheme, device)
        if bias is not None:
            q.bias = bias.detach().to(dtype=dt.float32, device=device, copy=True)
        return q

    def forward(self, x: Tensor) -> Tensor:
        return quantized_linear(x, self.weight, self.bias, self.scheme)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"scheme={self.scheme!r}"
        )
