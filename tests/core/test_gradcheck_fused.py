"""Gradients of every differentiable fused op, against finite differences and PyTorch.

Norms, SwiGLU's silu_mul, GeGLU's gelu_tanh_mul, softcap, convolution and pooling, batch norm, rope, softmax and
log_softmax, gelu and silu, linear, embedding, the losses, attention (causal, lengths, KV
cache, GQA/MQA) and topk, each a ``Case`` of gradcheck_cases.py run twice: through the
backend's fused kernel and through the frontend decomposition (a reference backend
without fused kernels, decomposition_backend.py). Also checks that every differentiable
fused op of the catalogue has a case.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
from decomposition_backend import modes
from gradcheck_cases import Case, F, args, check_case, distinct, ints, nrm


def _sdpa_lengths(m: Any, q: Any, k: Any, v: Any) -> Any:
    if m is kael:
        return kael.attention(q, k, v, lengths=kael.tensor([3, 2]))
    mask = m.arange(3)[None, :] < m.tensor([3, 2])[:, None]
    return F(m).scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])


def _sdpa_cache(m: Any, q: Any, k: Any, v: Any) -> Any:
    """Causal attention of 2 new queries over 4 keys: query i sees keys 0..i+2 (kael aligns to the end)."""
    if m is kael:
        return F(m).scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = m.arange(4)[None, :] <= m.arange(2)[:, None] + 2
    return F(m).scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _silu_mul(m: Any, gate: Any, up: Any) -> Any:
    """SwiGLU's product: kael's fused op, torch's silu(gate) * up."""
    return m.silu_mul(gate, up) if m is kael else F(m).silu(gate) * up


def _gelu_tanh_mul(m: Any, gate: Any, up: Any) -> Any:
    """GeGLU's product: kael's fused op, torch's gelu(gate, approximate="tanh") * up."""
    return m.gelu_tanh_mul(gate, up) if m is kael else F(m).gelu(gate, approximate="tanh") * up


def _softcap(cap: float) -> Any:
    """Soft-capping: kael's fused op, torch's (x / cap).tanh() * cap (Gemma 2's formula)."""
    return lambda m, x: m.softcap(x, cap) if m is kael else (x / cap).tanh() * cap


_ROPE_FREQ = np.arange(5)[:, None] * 10000.0 ** (-np.arange(0, 4, 2) / 4)  # [P=5, D/2=2] angles


def _rope(m: Any, x: Any, pos: Any) -> Any:
    """Rotary embedding of x [B, H, T, 4] at positions pos [B, T]: kael's op, torch's rotate-half formula."""
    cos, sin = np.cos(_ROPE_FREQ), np.sin(_ROPE_FREQ)
    if m is kael:
        return kael.rope(x, kael.tensor(cos), kael.tensor(sin), pos)
    c = m.tensor(np.concatenate([cos, cos], -1))[pos][:, None]
    s = m.tensor(np.concatenate([sin, sin], -1))[pos][:, None]
    return x * c + m.cat([-x[..., 2:], x[..., :2]], -1) * s


def _moe_route(m: Any, x: Any) -> Any:
    """Top-2 routing weights, renormalised: kael's fused op, torch's softmax + topk + division."""
    if m is kael:
        return kael.moe_route(x, 2, True)[0]
    v = m.topk(m.softmax(x, -1), 2)[0]
    return v / v.sum(-1, keepdim=True)


_EXPERTS = np.array([[0, 2], [1, 2], [2, 2], [0, 1]])  # [T=4, K=2] over E=3 experts


def _expert_linear(m: Any, x: Any, w: Any, e: Any) -> Any:
    """Each token through its two experts: kael's fused op, torch's gathered weights and einsum."""
    if m is kael:
        return kael.expert_linear(x, w, e)
    return m.einsum("tknc,tkc->tkn" if x.ndim == 3 else "tknc,tc->tkn", w[e], x)


FUSED = [
    Case("rms_norm", lambda m, x, w: F(m).rms_norm(x, (4,), w, eps=1e-6), args(nrm(2, 3, 4), nrm(4)), fused=True),
    Case("rms_norm_no_weight", lambda m, x: F(m).rms_norm(x, (5,), eps=1e-3), args(nrm(3, 5)), fused=True),
    Case("rms_norm_2d_shape", lambda m, x, w: F(m).rms_norm(x, (2, 3), w), args(nrm(2, 2, 3), nrm(2, 3)), fused=True),
    Case("silu_mul", _silu_mul, args(nrm(3, 4), nrm(3, 4)), fused=True),
    Case(
        "conv2d",
        lambda m, x, w, b: F(m).conv2d(x, w, b, stride=2, padding=1, groups=2),
        args(nrm(2, 4, 5, 4), nrm(4, 2, 3, 2), nrm(4)),
        fused=True,
    ),
    Case(
        "max_pool2d",
        lambda m, x: F(m).max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
        args(nrm(2, 2, 7, 6)),
        fused=True,
    ),
    Case(
        "batch_norm_train",
        lambda m, x, w, b: F(m).batch_norm(x, None, None, w, b, training=True, eps=1e-3),
        args(nrm(3, 2, 4), nrm(2), nrm(2)),
        fused=True,
    ),
    Case(
        "conv1d_dilated",
        lambda m, x, w: F(m).conv1d(x, w, padding=2, dilation=2),
        args(nrm(2, 3, 7), nrm(2, 3, 3)),
        fused=True,
    ),
    Case("silu_mul_broadcast", _silu_mul, args(nrm(3, 4), nrm(4)), fused=True),
    Case("gelu_tanh_mul", _gelu_tanh_mul, args(nrm(3, 4), nrm(3, 4)), fused=True),
    Case("gelu_tanh_mul_broadcast", _gelu_tanh_mul, args(nrm(4), nrm(2, 3, 4)), fused=True),
    Case(
        "gelu_tanh_mul_wide_range",
        lambda m, g, u: _gelu_tanh_mul(m, g * 6.0, u),
        args(nrm(5, 3), nrm(5, 3)),
        fused=True,
    ),
    Case("softcap", _softcap(1.5), args(nrm(3, 4)), fused=True),
    Case("softcap_saturated", lambda m, x: _softcap(0.5)(m, x * 4.0).sum(0), args(nrm(5, 3)), fused=True),
    Case("rope", _rope, args(nrm(2, 2, 3, 4), ints(5, 2, 3)), fused=True),
    Case("softmax", lambda m, x: F(m).softmax(x, dim=1), args(nrm(3, 4)), fused=True),
    Case("softmax_dim0", lambda m, x: m.softmax(x, 0), args(nrm(3, 4)), fused=True),
    Case("log_softmax", lambda m, x: F(m).log_softmax(x, dim=-1), args(nrm(3, 4)), fused=True),
    Case("log_softmax_3d", lambda m, x: m.log_softmax(x, 1), args(nrm(2, 3, 2)), fused=True),
    Case("gelu", lambda m, x: F(m).gelu(x), args(nrm(3, 4)), fused=True),
    Case("gelu_tanh", lambda m, x: F(m).gelu(x, approximate="tanh"), args(nrm(3, 4)), fused=True),
    Case("silu", lambda m, x: F(m).silu(x), args(nrm(3, 4)), fused=True),
    Case("silu_wide_range", lambda m, x: F(m).silu(x * 8.0).sum(0), args(nrm(5, 3)), fused=True),
    Case(
        "layer_norm", lambda m, x, w, b: F(m).layer_norm(x, (4,), w, b), args(nrm(2, 3, 4), nrm(4), nrm(4)), fused=True
    ),
    Case("layer_norm_no_affine", lambda m, x: F(m).layer_norm(x, (5,), eps=1e-3), args(nrm(3, 5)), fused=True),
    Case("layer_norm_weight_only", lambda m, x, w: F(m).layer_norm(x, (4,), w), args(nrm(3, 4), nrm(4)), fused=True),
    Case("linear", lambda m, x, w, b: F(m).linear(x, w, b), args(nrm(3, 4), nrm(2, 4), nrm(2)), fused=True),
    Case("linear_no_bias_3d", lambda m, x, w: F(m).linear(x, w), args(nrm(2, 3, 4), nrm(5, 4)), fused=True),
    Case(
        "embedding",
        lambda m, ids, w: F(m).embedding(ids, w) * 2,
        args(lambda r: np.array([[1, 3, 1], [0, 1, 3]]), nrm(4, 3)),
        fused=True,
    ),
    Case("cross_entropy", lambda m, x, t: F(m).cross_entropy(x, t), args(nrm(4, 5), ints(5, 4)), fused=True),
    Case(
        "cross_entropy_sum",
        lambda m, x, t: F(m).cross_entropy(x, t, reduction="sum"),
        args(nrm(4, 5), ints(5, 4)),
        fused=True,
    ),
    Case(
        "cross_entropy_none",
        lambda m, x, t: F(m).cross_entropy(x, t, reduction="none"),
        args(nrm(4, 5), ints(5, 4)),
        fused=True,
    ),
    Case(
        "cross_entropy_ignore_index",
        lambda m, x, t: F(m).cross_entropy(x, t, ignore_index=2),
        args(nrm(5, 3), lambda r: np.array([2, 0, 2, 1, 0])),
        fused=True,
    ),
    Case(
        "cross_entropy_ignore_none",
        lambda m, x, t: F(m).cross_entropy(x, t, ignore_index=-1, reduction="none"),
        args(nrm(4, 3), lambda r: np.array([2, -1, 0, -1])),
        fused=True,
    ),
    Case(
        "cross_entropy_label_smoothing",
        lambda m, x, t: F(m).cross_entropy(x, t, label_smoothing=0.2),
        args(nrm(4, 5), ints(5, 4)),
        fused=True,
    ),
    Case(
        "cross_entropy_smoothing_ignore",
        lambda m, x, t: F(m).cross_entropy(x, t, ignore_index=0, label_smoothing=0.1),
        args(nrm(4, 3), lambda r: np.array([0, 1, 2, 0])),
        fused=True,
    ),
    Case("cross_entropy_3d", lambda m, x, t: F(m).cross_entropy(x, t), args(nrm(2, 3, 2), ints(3, 2, 2)), fused=True),
    Case("cross_entropy_unbatched", lambda m, x: F(m).cross_entropy(x, m.tensor(2)), args(nrm(4)), fused=True),
    Case(
        "attention",
        lambda m, q, k, v: F(m).scaled_dot_product_attention(q, k, v),
        args(nrm(1, 2, 3, 2), nrm(1, 2, 4, 2), nrm(1, 2, 4, 3)),
        fused=True,
    ),
    Case(
        "attention_causal",
        lambda m, q, k, v: F(m).scaled_dot_product_attention(q, k, v, is_causal=True),
        args(nrm(2, 1, 3, 2), nrm(2, 1, 3, 2), nrm(2, 1, 3, 2)),
        fused=True,
    ),
    Case(
        "attention_scale_3d",
        lambda m, q, k, v: F(m).scaled_dot_product_attention(q, k, v, scale=0.3),
        args(nrm(2, 3, 2), nrm(2, 3, 2), nrm(2, 3, 2)),
        fused=True,
    ),
    Case("attention_lengths", _sdpa_lengths, args(nrm(2, 1, 2, 2), nrm(2, 1, 3, 2), nrm(2, 1, 3, 2)), fused=True),
    Case("attention_causal_kv_cache", _sdpa_cache, args(nrm(1, 1, 2, 2), nrm(1, 1, 4, 2), nrm(1, 1, 4, 2)), fused=True),
    Case(
        "attention_gqa",
        lambda m, q, k, v: F(m).scaled_dot_product_attention(q, k, v, enable_gqa=True),
        args(nrm(1, 4, 3, 2), nrm(1, 2, 4, 2), nrm(1, 2, 4, 3)),
        fused=True,
    ),
    Case(
        "attention_mqa_causal",
        lambda m, q, k, v: F(m).scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        args(nrm(2, 3, 3, 2), nrm(2, 1, 3, 2), nrm(2, 1, 3, 2)),
        fused=True,
    ),
    Case("topk", lambda m, x: m.topk(x, 2)[0] * 2, args(distinct(3, 5)), fused=True),
    Case("moe_route", _moe_route, args(distinct(3, 5)), fused=True),
    Case("expert_linear", _expert_linear, args(nrm(4, 3), nrm(3, 2, 3), lambda r: _EXPERTS), fused=True),
    Case("expert_linear_per_slot", _expert_linear, args(nrm(4, 2, 3), nrm(3, 2, 3), lambda r: _EXPERTS), fused=True),
    Case(
        "nll_loss",
        lambda m, x, t: F(m).nll_loss(F(m).log_softmax(x, 1), t, ignore_index=1),
        args(nrm(4, 3), lambda r: np.array([0, 1, 2, 2])),
        fused=True,
    ),
]


@pytest.fixture(params=["fused_kernel", "decomposition"])
def fused_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run under the current CPU backend, then under a reference backend without fused kernels."""
    yield from modes(request.param, "decomposition")


@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.name)
def test_fused_gradient(case: Case, fused_mode: str) -> None:
    check_case(case)


def test_every_catalogue_fused_op_has_a_gradient_case() -> None:
    """Each differentiable fused op of the catalogue appears in the table above."""
    from kael._ops import FUSED as CATALOGUE_FUSED

    covered = {
        "silu",
        "softmax",
        "log_softmax",
        "gelu",
        "gelu_backward",
        "layer_norm",
        "layer_norm_backward",
        "linear",
        "embedding",
        "cross_entropy",
        "attention",
        "rms_norm",
        "rope",
        "silu_mul",
        "gelu_tanh_mul",
        "softcap",
        "topk",
        "moe_route",
        "expert_linear",
        "conv2d",
        "conv2d_backward",  # conv2d's backward: the conv2d cases run it
        "max_pool2d",
        "max_pool2d_backward",
        "avg_pool2d",  # through F.avg_pool1d/2d: tests/core/test_nn_pooling.py gradchecks, test_pool_fused.py
        "avg_pool2d_backward",
        "batch_norm",
        "batch_norm_backward",
        "batch_norm_eval",  # through F.batch_norm(training=False): tests/core/test_batch_norm_fused.py
    }
    not_differentiable = {"adamw_step"}  # an optimizer update (checked against torch in test_optim.py)
    # float32-only weight-format ops: dequantize has no autograd (weights are data); quantized_linear's
    # gradient in x is checked by finite differences and NumPy in test_quant_ops.py
    not_differentiable |= {"dequantize", "quantized_linear"}
    # inference only: attention over a paged KV cache has no autograd (tests/core/test_paged_attention.py)
    not_differentiable |= {"paged_attention"}
    assert set(CATALOGUE_FUSED) == covered | not_differentiable


def test_decomposition_backend_really_lacks_fused_kernels(fused_mode: str) -> None:
    from kael import _dispatch

    if fused_mode == "decomposition":
        assert _dispatch.fused_kernel("cpu", "softmax") is None
        assert kael.backends.current("cpu").name == "reference_decomposition"
