"""Dtype casts as a differentiable op."""

from __future__ import annotations

from typing import Any

from .. import _dtype as dt
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast

__all__ = ["Cast"]


class Cast(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, dtype: dt.DType) -> Tensor:
        ctx.dtype = a.dtype
        out = cast(a, dtype)
        return out if out is not a else a._alias()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        return (cast(g, ctx.dtype) if ctx.dtype.is_floating_point else None), None
