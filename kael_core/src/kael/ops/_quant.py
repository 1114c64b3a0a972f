"""Weight-format ops: dequantize and quantized_linear (NOTE [weight formats] in ``kael/quant/_formats.py``).

Each runs the backend's fused kernel when it has one and its decomposition into
primitives otherwise (registered in ``_fused.decompositions``, which the conformance kit
checks kernels against). The block decode is written over the bytes: the weight is a
uint8 [N, K/32*B] tensor viewed as [N, K/32, B] blocks; the first two bytes of a block
are viewed as its float16 scale and the rest as int8 values (q8_0) or split into nibbles
with floor division (q4_0), so every backend runs every format on its primitives alone.

quantized_linear is differentiable in x (dx = grad @ dequantize(weight)) and in the bias,
never in the weight: a quantized weight is data (a buffer), as in llama.cpp's fine-tuning
of adapters over a frozen quantized base.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, check_device, empty, numel
from ._fused import decompositions
from ._linalg import _mm, _t
from ._pointwise import binary
from ._reduce import reduce_op
from ._views import _slice_fn, contiguous_nograd, reshape_nograd, view_dtype

__all__ = [
    "dequantize",
    "quantized_linear",
    "dequantize_decomp",
    "quantized_linear_decomp",
    "check_weight",
    "QuantizedLinearFunction",
]

#: The storage dtype of each non-block scheme's weight tensor.
_FLOAT_DTYPES: dict[str, dt.DType] = {"bf16": dt.bfloat16, "f16": dt.float16}


def _formats() -> Any:
    """kael.quant's registry (imported on first use: kael.quant imports kael.ops)."""
    from ..quant import formats

    return formats.FORMATS


def _block(scheme: str) -> tuple[int, int]:
    """(values, bytes) per block of a block scheme."""
    fmt = _formats()[scheme]
    return fmt.block_values, fmt.block_bytes


def check_scheme(op: str, scheme: Any) -> str:
    """scheme itself when it names a weight format, else a DTypeError naming op and the formats."""
    schemes = [name for name in _formats() if name != "f32"]
    if not isinstance(scheme, str) or scheme not in schemes:
        raise DTypeError(f"{op}: unknown weight scheme {scheme!r}; expected one of {', '.join(schemes)}")
    return scheme


def check_weight(op: str, weight: Any, scheme: Any) -> tuple[int, int]:
    """(N, K), the logical shape of `weight` stored in `scheme`, after checking its dtype and shape."""
    check_scheme(op, scheme)
    if not isinstance(weight, Tensor):
        raise DTypeError(f"{op}: weight must be a tensor, got {type(weight).__name__}")
    want = _FLOAT_DTYPES.get(scheme, dt.uint8)
    if weight.dtype is not want:
        raise DTypeError(f"{op}: a {scheme} weight must be a {want.name} tensor, got {weight.dtype!r}")
    if weight.ndim != 2:
        layout = "[N, K]" if scheme in _FLOAT_DTYPES else "[N, K/{}*{}]".format(*_block(scheme))
        raise ShapeError(f"{op}: a {scheme} weight must be 2-D {layout}, got shape {list(weight.shape)}")
    n, cols = weight.shape
    if scheme in _FLOAT_DTYPES:
        return n, cols
    bv, b = _block(scheme)
    if cols % b:
        raise ShapeError(
            f"{op}: a {scheme} weight row holds {cols} bytes, not a whole number of {b}-byte blocks "
            f"(expected [N, K/{bv}*{b}])"
        )
    return n, cols // b * bv


def _float32(op: str, name: str, t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype is not dt.float32:
        raise DTypeError(f"{op}: {name} must be float32, got {t.dtype!r}")
    return t


# -- decompositions (no autograd; primitives only) ------------------------------------------


def _even_offset(t: Tensor) -> Tensor:
    """t contiguous with an even byte offset, so its two-byte scales can be viewed as float16."""
    t = contiguous_nograd(t)
    if t._offset % 2:
        out = empty(t.shape, t.dtype, t.device)
        _dispatch.kernel(t.device.type, "copy")(out, t)
        return out
    return t


def dequantize_decomp(weight: Tensor, scheme: str) -> Tensor:
    """float32 [N, K] values of weight (checked by the caller): block scale times value, exactly as ggml."""
    if scheme in _FLOAT_DTYPES:
        return cast(weight, dt.float32) if weight.numel() else empty(weight.shape, dt.float32, weight.device)
    bv, b = _block(scheme)
    n, nb = weight.shape[0], weight.shape[1] // b
    k = nb * bv
    if n * nb == 0:
        return empty((n, k), dt.float32, weight.device)
    if scheme not in ("q8_0", "q4_0"):
        return _host_decoded(weight, scheme, k)
    blocks = reshape_nograd(_even_offset(weight), (n, nb, b))  # [N, nb, B]
    d = cast(view_dtype(_slice_fn(2, 0, 2, 1)(blocks), dt.float16), dt.float32)  # [N, nb, 1] block scales
    data = _slice_fn(2, 2, b, 1)(blocks)  # [N, nb, B - 2]
    if scheme == "q8_0":
        values = binary("mul", cast(view_dtype(data, dt.int8), dt.float32), d)  # [N, nb, 32]
        return reshape_nograd(values, (n, k))
    packed = cast(data, dt.float32)  # [N, nb, 16]: bytes 0..255, exact in float32
    high = binary("floor_divide", packed, 16.0)
    low = binary("sub", packed, binary("mul", high, 16.0))
    half = bv // 2
    out = empty((n, nb, bv), dt.float32, weight.device)
    copy = _dispatch.kernel(weight.device.type, "copy")
    copy(_slice_fn(2, 0, half, 1)(out), binary("mul", binary("sub", low, 8.0), d))  # value i = d*((q[i] & 15) - 8)
    copy(_slice_fn(2, half, bv, 1)(out), binary("mul", binary("sub", high, 8.0), d))  # i + 16: d*((q >> 4) - 8)
    return reshape_nograd(out, (n, k))


def _host_decoded(weight: Tensor, scheme: str, k: int) -> Tensor:
    """The other block formats' decomposition: the blocks' bytes on the host, decoded by the registry's
    reference dequantizer (bit-exact with gguf.quants), the float32 values put back on the weight's device.
    Their bit fields (6-bit scales, split high bits, non-linear tables) have no short form in the
    primitives; every backend in kael has a kernel for them, so this runs only for a backend without one."""
    from .._tensor import from_numpy_bits, numpy_bits
    from ..backends.host._quant import decode

    data = np.ascontiguousarray(numpy_bits(weight), dtype=np.uint8)
    values = from_numpy_bits(decode(data, scheme, k), dt.float32)
    return values if weight.device.type == "cpu" else values.to(weight.device)


def quantized_linear_decomp(x: Tensor, weight: Tensor, bias: Tensor | None, scheme: str) -> Tensor:
    """x [.., K] @ dequantize(weight).T + bias, on the backend's matmul (float32)."""
    return _linear_on(x, dequantize_decomp(weight, scheme), bias)


def _linear_on(x: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    """x [.., K] @ w [N, K].T + bias [N] with the matmul primitive."""
    n, k = w.shape
    rows = numel(x.shape[:-1])
    if rows == 0:
        return empty(x.shape[:-1] + (n,), dt.float32, x.device)
    y = _mm(reshape_nograd(x, (rows, k)), _t(w))  # [rows, N]
    if bias is not None:
        y = binary("add", y, bias)
    return reshape_nograd(y, x.shape[:-1] + (n,))


def _dequantize_apply(weight: Tensor, scheme: str) -> Tensor:
    kern = _dispatch.fused_kernel(weight.device.type, "dequantize")
    if kern is None or weight.numel() == 0:
        return dequantize_decomp(weight, scheme)
    n = weight.shape[0]
    if scheme in _FLOAT_DTYPES:
        k = weight.shape[1]
    else:
        bv, b = _block(scheme)
        k = weight.shape[1] // b * bv
    out = empty((n, k), dt.float32, weight.device)
    kern(out, weight, scheme)
    return out


def _quantized_linear_apply(x: Tensor, weight: Tensor, bias: Tensor | None, scheme: str) -> Tensor:
    kern = _dispatch.fused_kernel(x.device.type, "quantized_linear")
    if kern is None or x.numel() == 0:  # the backend's dequantize kernel (if any), then its matmul
        return _linear_on(x, _dequantize_apply(weight, scheme), bias)
    out = empty(x.shape[:-1] + (weight.shape[0],), dt.float32, x.device)
    kern(out, x, weight, bias, scheme)
    return out


# -- the ops --------------------------------------------------------------------------------


class QuantizedLinearFunction(Function):
    """out = x @ W.T + b with W = dequantize(weight); dx = g @ W, db = sum of g over the rows, no dweight."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, scheme: str) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.scheme = scheme
        ctx.x_shape = x.shape
        ctx.has_b = bias is not None
        return _quantized_linear_apply(x, weight, bias, scheme)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (weight,) = ctx.saved_tensors
        need = ctx.needs_input_grad
        n = weight.shape[0]
        rows = numel(ctx.x_shape[:-1])
        g2 = reshape_nograd(contiguous_nograd(g), (rows, n))
        dx = db = None
        if need[0]:
            w = _dequantize_apply(weight, ctx.scheme)  # [N, K]
            if rows == 0 or n == 0:
                dx = empty(ctx.x_shape, dt.float32, g.device)
                _dispatch.kernel(g.device.type, "fill")(dx, 0.0)
            else:
                dx = reshape_nograd(_mm(g2, w), ctx.x_shape)
        if ctx.has_b and need[2]:
            db = reduce_op("sum", g2, (0,), False, dt.float32)
        return dx, None, db, None


def dequantize(weight: Tensor, scheme: str) -> Tensor:
    """The float32 [N, K] values of a weight matrix stored in a weight format (no autograd).

    ``scheme``: a block format of ``kael.quant.formats`` (weight uint8 [N, K/V*B] of GGML blocks of
    V values in B bytes: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl with V = 32; q2_k..q6_k, iq4_xs with
    V = 256), or ``"bf16"`` / ``"f16"`` (weight bfloat16 / float16 [N, K]); see NOTE [weight formats].
    """
    check_weight("dequantize", weight, scheme)
    return _dequantize_apply(weight, scheme)


def quantized_linear(x: Tensor, weight: Tensor, bias: Tensor | None, scheme: str) -> Tensor:
    """x [.., K] @ dequantize(weight, scheme).T + bias [N] in float32, differentiable in x and bias.

    x and bias are float32; weight as for :func:`dequantize`. For a block scheme K must be a
    multiple of the format's block (32 or 256 values). A row's result never depends on how many rows x has (on every backend
    whose kernels keep the catalogue's contract).
    """
    n, k = check_weight("quantized_linear", weight, scheme)
    _float32("quantized_linear", "x", x)
    if x.ndim == 0:
        raise ShapeError("quantized_linear: x must have at least one dimension [.., K], got a 0-d tensor")
    if scheme not in _FLOAT_DTYPES and x.shape[-1] % _block(scheme)[0]:
        raise ShapeError(
            f"quantized_linear: a {scheme} weight needs K (the last dim of x {list(x.shape)}) to be a multiple "
            f"of {_block(scheme)[0]}, got {x.shape[-1]}"
        )
    if x.shape[-1] != k:
        raise ShapeError(
            f"quantized_linear: x {list(x.shape)} does not match the {scheme} weight of logical shape [{n}, {k}] "
            f"(expected x [.., {k}])"
        )
    if bias is not None:
        _float32("quantized_linear", "bias", bias)
        if bias.shape != (n,):
            raise ShapeError(f"quantized_linear: bias has shape {list(bias.shape)}, expected [{n}]")
    check_device("quantized_linear", x, weight, bias)
    return QuantizedLinearFunction.apply(x, weight, bias, scheme)  # type: ignore[no-any-return]


decompositions["dequantize"] = dequantize_decomp
decompositions["quantized_linear"] = quantized_linear_decomp
