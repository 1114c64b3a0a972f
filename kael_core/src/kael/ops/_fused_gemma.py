"""The Gemma family's fused ops: gelu_tanh_mul (GeGLU) and softcap (logit soft-capping).

As in ``_fused_llama``: each op runs the backend's fused kernel when it has one and its
decomposition into primitives otherwise (registered in ``_fused.decompositions``, which the
conformance kit checks backend kernels against), and has a backward written with frontend
ops, so every backend gets gradients. The semantics are the catalogue's
(``kael.backends.catalogue``):

* ``gelu_tanh_mul(gate, up) = gelu_tanh(gate) * up``, Gemma's MLP
  ``down(gelu_pytorch_tanh(gate(x)) * up(x))``, with
  ``gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))``;
* ``softcap(x, cap) = cap * tanh(x / cap)``, Gemma 2's soft-capping of the attention scores
  and of the final logits (values squashed smoothly into (-cap, cap)).

NOTE [16-bit rounding of the Gemma ops]: float16 and bfloat16 round where PyTorch's eager
ops do in the Hugging Face models, so a 16-bit model gives its twin's bits: gelu_tanh_mul
rounds gelu(gate) to the dtype before the product (``act_fn(gate) * up``); softcap rounds
after each of its three ops (``(x / cap).tanh() * cap``: each computed in float32 with cap
as a float32, PyTorch's opmath value of the scalar, and rounded to the dtype). The
decompositions below make those roundings explicit (casts to float32 and back), so they hold
whatever a backend's 16-bit primitives compute in.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError, KaelError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast
from ._fused import decompositions, gelu_backward_decomp, gelu_decomp, run_fused
from ._fused_llama import _gated_operands, _need_float
from ._gelu_ggml import ggml_gelu, ggml_gelu_tanh_mul
from ._pointwise import binary, unary

__all__ = ["gelu_tanh_mul", "softcap", "GeluTanhMul", "Softcap"]


def _half(d: dt.DType) -> bool:
    return d.itemsize == 2


# -- decompositions (no autograd; primitives only) ------------------------------------------


def gelu_tanh_mul_decomp(gate: Tensor, up: Tensor) -> Tensor:
    """gelu_tanh(gate) * up; 16-bit gates get gelu computed in float32 and rounded to their dtype."""
    if _half(gate.dtype):
        act = cast(gelu_decomp(cast(gate, dt.float32), "tanh"), gate.dtype)
    else:
        act = gelu_decomp(gate, "tanh")
    return binary("mul", act, up)


def softcap_decomp(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap); 16-bit x rounds after each of the three ops (NOTE [16-bit rounding of the Gemma ops])."""
    if not _half(x.dtype):
        return binary("mul", unary("tanh", binary("div", x, cap)), cap)
    f32 = dt.float32
    q = cast(binary("div", cast(x, f32), cap), x.dtype)
    t = cast(unary("tanh", cast(q, f32)), x.dtype)
    return cast(binary("mul", cast(t, f32), cap), x.dtype)


decompositions["gelu_tanh_mul"] = gelu_tanh_mul_decomp
decompositions["softcap"] = softcap_decomp


# -- gelu_tanh_mul --------------------------------------------------------------------------


def _gelu_tanh(x: Tensor) -> Tensor:
    """gelu_tanh(x) without autograd: the backend's gelu kernel, else its decomposition."""
    return run_fused("gelu", gelu_decomp, x, x, "tanh")


def _gelu_tanh_grad(g: Tensor, x: Tensor) -> Tensor:
    """g * gelu_tanh'(x) without autograd: the backend's gelu_backward kernel, else its decomposition."""
    return run_fused("gelu_backward", gelu_backward_decomp, x, g, x, "tanh")


class GeluTanhMul(Function):
    """out = gelu_tanh(gate) * up; d gate = g * up * gelu_tanh'(gate), d up = g * gelu_tanh(gate).

    gelu_tanh'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2) with
    t = tanh(sqrt(2/pi) (x + 0.044715 x^3)) (the fused ``gelu_backward``).
    """

    @staticmethod
    def forward(ctx: Any, gate: Tensor, up: Tensor) -> Tensor:
        if ggml_gelu(gate):  # KAEL_GELU=ggml: NOTE [ggml GELU table]
            out = ggml_gelu_tanh_mul(gate, up)
        else:
            out = run_fused("gelu_tanh_mul", gelu_tanh_mul_decomp, gate, gate, up)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        gate, up = ctx.saved_tensors
        need = ctx.needs_input_grad
        dgate = dup = None
        if need[0]:
            dgate = _gelu_tanh_grad(binary("mul", g, up), gate)
        if need[1]:
            dup = binary("mul", g, _gelu_tanh(gate))
        return dgate, dup


def gelu_tanh_mul(gate: Tensor, up: Tensor) -> Tensor:
    """GeGLU's product gelu_tanh(gate) * up (Gemma's MLP: ``down(gelu_tanh_mul(gate(x), up(x)))``).

    gelu_tanh is GELU's tanh approximation (PyTorch's ``gelu(approximate="tanh")``, Hugging
    Face's ``gelu_pytorch_tanh``). gate and up share a floating-point dtype; their shapes
    broadcast (as stride-0 views). 16-bit floats round gelu_tanh(gate) to their dtype before
    the product, as ``act_fn(gate) * up`` does.
    """
    return GeluTanhMul.apply(*_gated_operands("gelu_tanh_mul", gate, up))  # type: ignore[no-any-return]


# -- softcap --------------------------------------------------------------------------------


class Softcap(Function):
    """out = cap * tanh(x / cap); d x = g * (1 - tanh(x / cap)^2) (cap is a constant)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cap: float) -> Tensor:
        out = run_fused("softcap", softcap_decomp, x, x, cap)
        ctx.save_for_backward(x)
        ctx.cap = cap
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (x,) = ctx.saved_tensors
        t = unary("tanh", binary("div", x, ctx.cap))
        return binary("mul", g, binary("sub", 1.0, binary("mul", t, t))), None


def softcap(x: Tensor, cap: float) -> Tensor:
    """Soft-capping ``cap * tanh(x / cap)``: x squashed smoothly into (-cap, cap), near x where |x| << cap.

    Gemma 2 caps its attention scores (``attn_logit_softcapping``) and final logits
    (``final_logit_softcapping``) this way. x is a floating-point tensor, cap a positive
    finite number (a ``DTypeError`` if it is not a number, a ``KaelError`` if it is not
    positive and finite). 16-bit floats round as ``(x / cap).tanh() * cap`` does in PyTorch:
    after the division, the tanh and the product.
    """
    _need_float(x, "softcap", "x")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)):
        raise DTypeError(f"softcap: cap must be a number, got {type(cap).__name__}")
    try:
        c = float(cap)
    except OverflowError:  # an int beyond float range
        c = math.inf
    if not (math.isfinite(c) and c > 0):
        raise KaelError(f"softcap: cap must be a positive finite number, got {cap!r}")
    return Softcap.apply(x, c)  # type: ignore[no-any-return]
