"""The basic layer functions of kael.nn.functional: linear, norms, dropout, embedding, attention.

They are thin wrappers over ``kael.ops`` (fused ops where one exists, so a
backend's kernel runs when it has one), adding PyTorch's argument conventions.
"""

from __future__ import annotations

from typing import Any

from ... import ops
from ..._errors import DTypeError, ShapeError
from ..._tensor import Tensor

__all__ = [
    "linear",
    "layer_norm",
    "rms_norm",
    "rope",
    "silu_mul",
    "gelu_tanh_mul",
    "softcap",
    "dropout",
    "dropout2d",
    "embedding",
    "scaled_dot_product_attention",
]


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """input [.., in] @ weight[out, in].T + bias[out]."""
    return ops.linear(input, weight, bias)


def layer_norm(
    input: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the last ``normalized_shape`` dims, times weight, plus bias (a fused op)."""
    return ops.layer_norm(input, normalized_shape, weight, bias, eps)


#: Machine epsilon of each float dtype (``torch.finfo(dtype).eps``): rms_norm's default eps.
_FINFO_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def rms_norm(input: Tensor, normalized_shape: Any, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """Root-mean-square normalisation over the trailing ``normalized_shape`` dims (PyTorch's signature).

    eps=None is PyTorch's default, the machine epsilon of input's dtype (``torch.finfo(dtype).eps``);
    Hugging Face Llama checkpoints use ``rms_norm_eps`` from config.json (often 1e-6 or 1e-5), which
    is also ``kael.rms_norm``'s default of 1e-6. Values as Hugging Face's ``LlamaRMSNorm``: statistics
    in float32 (float64 for float64 input), the normalised value rounded to input's dtype before the
    weight (PyTorch rounds once, after the weight: half-precision results may differ in the last bit).
    """
    if isinstance(normalized_shape, bool) or not isinstance(normalized_shape, (int, tuple, list)):
        raise DTypeError(f"rms_norm: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not isinstance(input, Tensor):
        raise DTypeError(f"rms_norm: input must be a tensor, got {type(input).__name__}")
    if not ns or input.ndim < len(ns) or input.shape[input.ndim - len(ns) :] != ns:
        raise ShapeError(f"rms_norm: input shape {list(input.shape)} does not end with normalized_shape {list(ns)}")
    if weight is not None and (not isinstance(weight, Tensor) or weight.shape != ns):
        raise ShapeError(
            f"rms_norm: weight has shape {list(getattr(weight, 'shape', ()))!r}, expected normalized_shape {list(ns)}"
        )
    if eps is None:
        eps = _FINFO_EPS.get(input.dtype.name, 2.0**-23)
    if len(ns) == 1:
        return ops.rms_norm(input, weight, eps)
    n = 1
    for s in ns:
        n *= s
    lead = input.shape[: input.ndim - len(ns)]
    w = ops.reshape(weight, (n,)) if weight is not None else None
    return ops.reshape(ops.rms_norm(ops.reshape(input, lead + (n,)), w, eps), input.shape)


def rope(input: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
    """Rotary position embedding of input [B, H, T, D] (rotate-half; see ``kael.rope``)."""
    return ops.rope(input, cos, sin, positions)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, SwiGLU's gated product, as one fused op (see ``kael.silu_mul``)."""
    return ops.silu_mul(gate, up)


def gelu_tanh_mul(gate: Tensor, up: Tensor) -> Tensor:
    """gelu(gate, approximate="tanh") * up, GeGLU's gated product, as one fused op (see ``kael.gelu_tanh_mul``)."""
    return ops.gelu_tanh_mul(gate, up)


def softcap(input: Tensor, cap: float) -> Tensor:
    """cap * tanh(input / cap), soft-capping, as one fused op (see ``kael.softcap``)."""
    return ops.softcap(input, cap)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, generator: Any = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training.

    The mask comes from ``generator`` (a kael.Generator; the default one when None),
    so a seeded generator gives reproducible masks.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise DTypeError(f"dropout: p must be a probability in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return input
    if not input.dtype.is_floating_point:
        raise DTypeError(f"dropout: expected a floating-point tensor, got {input.dtype!r}")
    if p == 1.0:
        return ops.mul(input, 0.0)  # type: ignore[no-any-return]
    u = ops.rand(input.shape, dtype=input.dtype, device=input.device, generator=generator)
    scale = ops.where(ops.ge(u, p), 1.0 / (1.0 - p), 0.0).to(dtype=input.dtype)
    return ops.mul(input, scale)  # type: ignore[no-any-return]


def dropout2d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, generator: Any = None
) -> Tensor:
    """Zero whole channels of input [N, C, H, W] (or [C, H, W]) with probability p, scaling the rest by 1/(1-p)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise DTypeError(f"dropout2d: p must be a probability in [0, 1], got {p!r}")
    if not isinstance(input, Tensor) or input.ndim not in (3, 4):
        raise ShapeError(
            f"dropout2d: input must be 3-d [C, H, W] or 4-d [N, C, H, W], got {getattr(input, 'shape', input)!r}"
        )
    if not training or p == 0.0:
        return input
    mask_shape = input.shape[:-2] + (1, 1)
    u = ops.rand(mask_shape, dtype=input.dtype, device=input.device, generator=generator)
    scale = ops.where(ops.ge(u, p), 1.0 / (1.0 - p) if p < 1.0 else 0.0, 0.0).to(dtype=input.dtype)
    out = ops.mul(input, scale)
    if inplace:
        input.copy_(out)
        return input
    return out  # type: ignore[no-any-return]


def embedding(input: Tensor, weight: Tensor) -> Tensor:
    """Rows of weight [num_embeddings, dim] picked by the integer ids of input: [*input.shape, dim]."""
    return ops.embedding(input, weight)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(q @ k^T * scale) @ v over [..., T, D] operands (scale defaults to 1/sqrt(D)).

    With is_causal, query i sees keys up to i + (Tk - Tq): the last query is aligned with
    the last key, which is what decoding with a KV cache needs (and PyTorch's top-left
    alignment when Tq == Tk). With enable_gqa (PyTorch's flag), key/value may have fewer
    heads (dim -3) than query, a divisor of them: query head h reads key/value head
    h // (H // Hkv) (grouped-query attention; K/V are never repeated).
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.ndim < 2:
            raise ShapeError(
                f"scaled_dot_product_attention: {name} must be a tensor [..., T, D], got "
                f"{getattr(t, 'shape', type(t).__name__)!r}"
            )
    lead = query.shape[:-2]
    grouped = enable_gqa and query.ndim >= 3 and key.ndim == query.ndim and key.shape[-3] != query.shape[-3]
    klead = key.shape[:-3] + query.shape[-3:-2] if grouped else key.shape[:-2]
    vlead = value.shape[:-3] + query.shape[-3:-2] if grouped else value.shape[:-2]
    if klead != lead or vlead != lead or (grouped and value.shape[-3] != key.shape[-3]):
        hint = "" if enable_gqa else " (pass enable_gqa=True for fewer key/value heads than query heads)"
        raise ShapeError(
            f"scaled_dot_product_attention: batch dims of query {list(query.shape)}, key "
            f"{list(key.shape)} and value {list(value.shape)} differ{hint}"
        )

    def as4d(t: Tensor) -> Tensor:
        if t.ndim == 4:
            return t
        if t.ndim == 2:
            return ops.reshape(t, (1, 1) + t.shape)
        if t.ndim == 3:
            return ops.reshape(t, (1,) + t.shape)
        return ops.reshape(t, (-1,) + t.shape[-3:])

    out = ops.attention(as4d(query), as4d(key), as4d(value), causal=is_causal, scale=scale)
    return out if query.ndim == 4 else ops.reshape(out, lead + out.shape[-2:])
