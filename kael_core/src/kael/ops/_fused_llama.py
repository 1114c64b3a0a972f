"""The Llama family's fused ops: rms_norm, rope (rotary embeddings) and silu_mul (SwiGLU).

As in ``_fused``: each op runs the backend's fused kernel when it has one and its
decomposition into primitives otherwise (registered in ``_fused.decompositions``, the
table the conformance kit checks backend kernels against), and has a backward written
with frontend ops, so every backend gets gradients. The semantics are the catalogue's
(``kael.backends.catalogue``): rms_norm is Hugging Face's ``LlamaRMSNorm`` (float32
statistics, the normalised value rounded to x's dtype before the weight), rope the
rotate-half convention over [P, D/2] cos/sin tables indexed by per-token positions.
"""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import broadcast_shapes, cast, check_device, empty, expand_to
from ._fused import decompositions, run_fused
from ._pointwise import binary, unary
from ._reduce import reduce_op
from ._views import _slice_fn, contiguous_nograd, expand, reshape_nograd

__all__ = ["rms_norm", "rope", "silu_mul", "RmsNorm", "Rope", "SiluMul"]


def _stat(d: dt.DType) -> dt.DType:
    """The dtype rms_norm's statistics (and arithmetic) use for inputs of dtype d."""
    return dt.float64 if d is dt.float64 else dt.float32


def _need_float(x: Any, op: str, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: {name} must be a tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: {name} must be a floating-point tensor, got {x.dtype!r}")
    return x


def _gated_operands(op: str, gate: Any, up: Any) -> tuple[Tensor, Tensor]:
    """A gated product's (silu_mul's, gelu_tanh_mul's) gate and up, checked (floating-point tensors of one dtype
    on one device) and broadcast to their common shape as stride-0 views with autograd (whose backward sums the
    gradients back to the operands' shapes)."""
    _need_float(gate, op, "gate")
    _need_float(up, op, "up")
    if gate.dtype is not up.dtype:
        raise DTypeError(f"{op}: gate is {gate.dtype!r} but up is {up.dtype!r}; expected the same dtype")
    check_device(op, gate, up)
    shape = broadcast_shapes(gate.shape, up.shape, op)
    return (gate if gate.shape == shape else expand(gate, shape)), (up if up.shape == shape else expand(up, shape))


# -- decompositions (no autograd; primitives only) ------------------------------------------


def rms_norm_decomp(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """(out, rstd): rstd = 1/sqrt(mean(x*x) + eps) in float32/64, out = (x*rstd).to(x.dtype) * weight."""
    st = _stat(x.dtype)
    xf = cast(x, st)
    last = (x.ndim - 1,)
    ms = binary("div", reduce_op("sum", binary("mul", xf, xf), last, True, st), float(x.shape[-1]))
    r = unary("rsqrt", binary("add", ms, float(eps)))
    y = cast(binary("mul", xf, r), x.dtype)
    if weight is not None:
        y = binary("mul", y, weight)
    return y, reshape_nograd(r, x.shape[:-1])


def _rope_dtype(x: Tensor, cos: Tensor) -> dt.DType:
    return dt.float64 if dt.float64 in (x.dtype, cos.dtype) else dt.float32


def rope_decomp(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
    """Rotate-half rotary embedding of x [B,H,T,D] at positions [B,T] of the [P, D/2] tables."""
    b, _, t, d = x.shape
    half = d // 2
    ct = _rope_dtype(x, cos)
    out = empty(x.shape, x.dtype, x.device)
    if out.numel() == 0:
        return out
    flat = reshape_nograd(contiguous_nograd(positions), (b * t,))

    def rows(table: Tensor) -> Tensor:  # [B, 1, T, D/2]: the table's rows at each position
        picked = empty((b * t, half), table.dtype, table.device)
        _dispatch.kernel(table.device.type, "index_select")(picked, table, flat, 0)
        return reshape_nograd(cast(picked, ct), (b, 1, t, half))

    c, s = rows(cos), rows(sin)
    xf = cast(x, ct)
    x1, x2 = _slice_fn(3, 0, half, 1)(xf), _slice_fn(3, half, d, 1)(xf)
    copy = _dispatch.kernel(x.device.type, "copy")
    copy(_slice_fn(3, 0, half, 1)(out), binary("sub", binary("mul", x1, c), binary("mul", x2, s)))
    copy(_slice_fn(3, half, d, 1)(out), binary("add", binary("mul", x2, c), binary("mul", x1, s)))
    return out


def silu_mul_decomp(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up = gate * sigmoid(gate) * up."""
    return binary("mul", binary("mul", gate, unary("sigmoid", gate)), up)


decompositions["rms_norm"] = rms_norm_decomp
decompositions["rope"] = rope_decomp
decompositions["silu_mul"] = silu_mul_decomp


# -- rms_norm -------------------------------------------------------------------------------


class RmsNorm(Function):
    """y = xhat * w with xhat = x * r, r = (mean(x^2) + eps)^-1/2.

    Backward (in float32/64): dxhat = g * w; dx = r * (dxhat - xhat * mean(dxhat * xhat));
    dw = sum over the leading dims of g * xhat.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor | None, eps: float) -> Tensor:
        k = _dispatch.fused_kernel(x.device.type, "rms_norm")
        if k is not None and x.numel():
            out = empty(x.shape, x.dtype, x.device)
            rstd = empty(x.shape[:-1], _stat(x.dtype), x.device)
            k(out, rstd, x, w, eps)
        else:
            out, rstd = rms_norm_decomp(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, w, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        st = rstd.dtype
        last = (x.ndim - 1,)
        r = reshape_nograd(rstd, x.shape[:-1] + (1,))
        xhat = binary("mul", cast(x, st), r)
        gf = cast(g, st)
        dx = dw = None
        if need[0]:
            gw = binary("mul", gf, cast(w, st)) if w is not None else gf
            m = binary("div", reduce_op("sum", binary("mul", gw, xhat), last, True, st), float(x.shape[-1]))
            dx = cast(binary("mul", r, binary("sub", gw, binary("mul", xhat, m))), x.dtype)
        if w is not None and need[1]:
            lead = tuple(range(x.ndim - 1))
            dw = cast(reduce_op("sum", binary("mul", gf, xhat), lead, False, st), w.dtype)
        return dx, dw, None


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Root-mean-square normalisation over the last dim, as Hugging Face's ``LlamaRMSNorm``.

    The statistics are computed in float32 (float64 for float64 x); the normalised value is
    rounded to x's dtype, then scaled by ``weight`` [x.shape[-1]] (same dtype as x) when given.
    ``eps`` defaults to 1e-6 (Hugging Face's default; ``kael.nn.functional.rms_norm`` keeps
    PyTorch's signature and its default, the dtype's machine epsilon).
    """
    _need_float(x, "rms_norm", "x")
    if x.ndim == 0:
        raise ShapeError("rms_norm: x must have at least one dimension, got a 0-d tensor")
    if weight is not None:
        _need_float(weight, "rms_norm", "weight")
        if weight.shape != (x.shape[-1],):
            raise ShapeError(f"rms_norm: weight has shape {list(weight.shape)}, expected [{x.shape[-1]}]")
        if weight.dtype is not x.dtype:
            raise DTypeError(f"rms_norm: weight is {weight.dtype!r} but x is {x.dtype!r}; expected the same dtype")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise DTypeError(f"rms_norm: eps must be a non-negative number, got {eps!r}")
    check_device("rms_norm", x, weight)
    return RmsNorm.apply(x, weight, float(eps))  # type: ignore[no-any-return]


# -- rope -----------------------------------------------------------------------------------


def _rope_apply(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
    return run_fused("rope", rope_decomp, x, x, cos, sin, positions)


class Rope(Function):
    """out = rotate(x, theta[positions]); the backward rotates by -theta: grad_x = rope(g, cos, -sin)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin, positions)
        return _rope_apply(x, cos, sin, positions)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        cos, sin, positions = ctx.saved_tensors
        return _rope_apply(g, cos, unary("neg", sin), positions), None, None, None


def rope(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
    """Rotary position embedding (rotate-half, Hugging Face Llama's ``apply_rotary_pos_emb``).

    x [B, H, T, D] (D even); cos, sin [P, D/2] float32 or float64 tables (e.g.
    ``cos[p, i] = cos(p * base**(-2i/D))``); positions integer [B, T] or [T] (shared by
    every row), each in [0, P). With c, s the table rows at a token's position and x1, x2
    the halves of its last dim: out = [x1*c - x2*s, x2*c + x1*s], in x's dtype (computed in
    float32, float64 when x or the tables are float64). Differentiable in x only.
    """
    _need_float(x, "rope", "x")
    if x.ndim != 4:
        raise ShapeError(f"rope: x must be [B, H, T, D], got shape {list(x.shape)}")
    b, _, t, d = x.shape
    if d % 2:
        raise ShapeError(f"rope: the head dim D of x {list(x.shape)} must be even, got {d}")
    for name, tab in (("cos", cos), ("sin", sin)):
        _need_float(tab, "rope", name)
        if tab.dtype not in (dt.float32, dt.float64):
            raise DTypeError(f"rope: {name} must be a float32 or float64 table, got {tab.dtype!r}")
        if tab.ndim != 2 or tab.shape[1] != d // 2:
            raise ShapeError(
                f"rope: {name} must be [P, D/2] = [P, {d // 2}] for x {list(x.shape)}, got {list(tab.shape)}"
            )
    if sin.shape != cos.shape or sin.dtype is not cos.dtype:
        raise ShapeError(
            f"rope: cos {cos.dtype!r}{list(cos.shape)} and sin {sin.dtype!r}{list(sin.shape)} must have the same "
            "shape and dtype"
        )
    if not isinstance(positions, Tensor) or positions.dtype.category != 1:
        raise DTypeError(
            f"rope: positions must be an integer tensor, got {getattr(positions, 'dtype', type(positions))!r}"
        )
    if positions.shape == (t,):
        positions = expand_to(reshape_nograd(positions, (1, t)), (b, t))
    elif positions.shape != (b, t):
        raise ShapeError(f"rope: positions must be [B, T] = [{b}, {t}] or [T] = [{t}], got {list(positions.shape)}")
    check_device("rope", x, cos, sin, positions)
    if positions.dtype is not dt.int64:
        positions = cast(positions, dt.int64)
    if positions.numel():
        every = tuple(range(positions.ndim))
        lo = int(reduce_op("amin", positions, every, False, dt.int64).item())
        hi = int(reduce_op("amax", positions, every, False, dt.int64).item())
        if lo < 0 or hi >= cos.shape[0]:
            raise IndexError_(
                f"rope: position {lo if lo < 0 else hi} is out of range for tables of {cos.shape[0]} positions "
                f"(expected 0 <= position < {cos.shape[0]})"
            )
    return Rope.apply(x, cos, sin, positions)  # type: ignore[no-any-return]


# -- silu_mul -------------------------------------------------------------------------------


class SiluMul(Function):
    """out = silu(gate) * up; d gate = g * up * s * (1 + gate * (1 - s)) with s = sigmoid(gate), d up = g * silu(gate)."""

    @staticmethod
    def forward(ctx: Any, gate: Tensor, up: Tensor) -> Tensor:
        out = run_fused("silu_mul", silu_mul_decomp, gate, gate, up)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        gate, up = ctx.saved_tensors
        need = ctx.needs_input_grad
        s = unary("sigmoid", gate)
        dgate = dup = None
        if need[0]:
            ds = binary("mul", s, binary("add", binary("mul", gate, binary("sub", 1.0, s)), 1.0))
            dgate = binary("mul", binary("mul", g, up), ds)
        if need[1]:
            dup = binary("mul", g, binary("mul", gate, s))
        return dgate, dup


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """SwiGLU's product silu(gate) * up (Llama's MLP: ``down(silu_mul(gate(x), up(x)))``).

    gate and up share a floating-point dtype; their shapes broadcast (as stride-0 views).
    """
    return SiluMul.apply(*_gated_operands("silu_mul", gate, up))  # type: ignore[no-any-return]
