"""Gradients of every differentiable op and fused op, against finite differences and PyTorch.

Each case is a function ``fn(m, *tensors)`` written once against the API that kael
and PyTorch share (``m`` is the ``kael`` or ``torch`` module), plus a generator of
float64 inputs chosen away from the op's kinks (|x| > 0.1 for abs/relu, no ties for
max/min, positive bases for pow...). Every case runs ``kael.testing.gradcheck``
(central differences in float64, always) and, when PyTorch is installed, compares
outputs and gradients with PyTorch's autograd on the same inputs and the same
random output weights. Fused ops run twice: through the backend's fused kernel and
through the frontend decomposition (a backend without fused kernels).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kael
import numpy as np
import pytest
from decomposition_backend import modes
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.testing import gradcheck

Arrays = list[Any]


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    make: Callable[[np.random.Generator], Arrays]
    fused: bool = False  # run through the fused kernel and through the decomposition
    torch: bool = True  # compare with PyTorch (False where the two APIs differ)


def nrm(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda r: r.standard_normal(shape)


def pos(*shape: int, lo: float = 0.5, hi: float = 2.0) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda r: r.uniform(lo, hi, shape)


def away0(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Magnitudes in [0.2, 2] with random signs: away from the kink at 0."""
    return lambda r: r.uniform(0.2, 2.0, shape) * r.choice([-1.0, 1.0], shape)


def off_int(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Values k + [0.2, 0.4]: away from integers and from .5 (floor, ceil, round)."""
    return lambda r: r.integers(-3, 3, shape) + r.uniform(0.2, 0.4, shape)


def distinct(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """A random permutation of well-separated values (no ties for max/min/sort)."""
    n = int(np.prod(shape))
    return lambda r: (r.permutation(n) * 0.37 - n * 0.15).reshape(shape)


def ints(hi: int, *shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda r: r.integers(0, hi, shape).astype(np.int64)


def args(*makers: Callable[[np.random.Generator], Any]) -> Callable[[np.random.Generator], Arrays]:
    return lambda r: [mk(r) for mk in makers]


def F(m: Any) -> Any:
    return m.nn.functional


# -- the case table -------------------------------------------------------------------------------

UNARY = [
    Case("neg", lambda m, x: m.neg(x), args(nrm(3, 4))),
    Case("exp", lambda m, x: m.exp(x), args(nrm(3, 4))),
    Case("log", lambda m, x: m.log(x), args(pos(3, 4))),
    Case("sqrt", lambda m, x: m.sqrt(x), args(pos(3, 4))),
    Case("rsqrt", lambda m, x: m.rsqrt(x), args(pos(3, 4))),
    Case("tanh", lambda m, x: m.tanh(x), args(nrm(3, 4))),
    Case("abs", lambda m, x: m.abs(x), args(away0(3, 4))),
    Case("sin", lambda m, x: m.sin(x), args(nrm(3, 4))),
    Case("cos", lambda m, x: m.cos(x), args(nrm(3, 4))),
    Case("sigmoid", lambda m, x: m.sigmoid(x), args(nrm(3, 4))),
    Case("erf", lambda m, x: m.erf(x), args(nrm(3, 4))),
    Case("log1p", lambda m, x: m.log1p(x), args(pos(3, 4, lo=-0.5, hi=2.0))),
    Case("expm1", lambda m, x: m.expm1(x), args(nrm(3, 4))),
    Case("floor", lambda m, x: m.floor(x) * x, args(off_int(3, 4))),
    Case("ceil", lambda m, x: m.ceil(x) * x, args(off_int(3, 4))),
    Case("round", lambda m, x: m.round(x) * x, args(off_int(3, 4))),
    Case("sign", lambda m, x: m.sign(x) * x, args(away0(3, 4))),
    Case("relu", lambda m, x: m.relu(x), args(away0(3, 4))),
    Case("relu_method", lambda m, x: x.relu(), args(away0(3, 4))),
    Case("clamp", lambda m, x: m.clamp(x, -0.5, 0.7), args(away0(3, 4))),
    Case("clamp_min", lambda m, x: m.clamp(x, min=0.1), args(away0(3, 4))),
    Case("pow_int_exponent", lambda m, x: x**3, args(nrm(3, 4))),
    Case("pow_float_exponent", lambda m, x: x**2.5, args(pos(3, 4))),
    Case("pow_zero_exponent", lambda m, x: x**0 + x, args(nrm(3, 4))),
    Case("rpow", lambda m, x: 2.0**x, args(nrm(3, 4))),
    Case("neg_operator", lambda m, x: -x, args(nrm(5))),
    Case("zero_dim", lambda m, x: m.exp(x) * x, args(lambda r: np.array(0.7))),
]

BINARY = [
    Case("add", lambda m, a, b: m.add(a, b), args(nrm(3, 4), nrm(3, 4))),
    Case("add_broadcast", lambda m, a, b: a + b, args(nrm(3, 1), nrm(1, 4))),
    Case("add_broadcast_rank", lambda m, a, b: a + b, args(nrm(2, 3, 4), nrm(4))),
    Case("sub", lambda m, a, b: m.sub(a, b), args(nrm(3, 4), nrm(4))),
    Case("mul", lambda m, a, b: m.mul(a, b), args(nrm(3, 4), nrm(3, 1))),
    Case("div", lambda m, a, b: m.div(a, b), args(nrm(3, 4), away0(4))),
    Case("pow", lambda m, a, b: m.pow(a, b), args(pos(3, 4), nrm(3, 4))),
    Case("maximum", lambda m, a, b: m.maximum(a, b), args(distinct(3, 4), distinct(3, 4))),
    Case("minimum", lambda m, a, b: m.minimum(a, b), args(distinct(3, 4), distinct(1, 4))),
    Case(
        "remainder", lambda m, a, b: m.remainder(a, b), args(off_int(3, 4), lambda r: np.array([1.5, -2.5, 3.5, 4.5]))
    ),
    Case("remainder_scalar", lambda m, a: a % 1.5, args(off_int(3, 4))),
    Case("scalar_right", lambda m, a: (a + 2) * 3 - 1.5, args(nrm(3, 4))),
    Case("scalar_left", lambda m, a: 2 - 3 / a, args(away0(3, 4))),
    Case("scalar_div", lambda m, a: a / 4, args(nrm(3, 4))),
    Case("zero_dim_operand", lambda m, a, b: a * b, args(nrm(3, 4), lambda r: np.array(1.3))),
    Case("same_input_twice", lambda m, a: a * a + a, args(nrm(3, 4))),
    Case("where", lambda m, a, b, c: m.where(c > 0, a, b), args(nrm(3, 4), nrm(4), nrm(3, 4))),
    Case("where_scalar", lambda m, a, c: m.where(c > 0, a, 0.0), args(nrm(3, 4), nrm(3, 4))),
]

REDUCE = [
    Case("sum_all", lambda m, x: x.sum(), args(nrm(3, 4))),
    Case("sum_dim", lambda m, x: x.sum(1), args(nrm(3, 4))),
    Case("sum_dims_keepdim", lambda m, x: x.sum((0, 2), keepdim=True), args(nrm(2, 3, 2))),
    Case("sum_negative_dim", lambda m, x: m.sum(x, -1), args(nrm(2, 3, 2))),
    Case("mean", lambda m, x: x.mean(1), args(nrm(3, 4))),
    Case("mean_all", lambda m, x: m.mean(x), args(nrm(3, 4))),
    Case("prod", lambda m, x: x.prod(1), args(pos(3, 4))),
    Case("prod_all", lambda m, x: m.prod(x), args(nrm(2, 3))),
    Case("prod_one_zero", lambda m, x: x.prod(1), args(lambda r: np.array([[1.5, 0.0, -2.0], [0.5, 1.2, 0.8]]))),
    Case("prod_two_zeros", lambda m, x: x.prod(1), args(lambda r: np.array([[0.0, 0.0, -2.0], [0.5, 1.2, 0.8]]))),
    Case("amax", lambda m, x: m.amax(x, 1), args(distinct(3, 4))),
    Case("amin_keepdim", lambda m, x: m.amin(x, 0, keepdim=True), args(distinct(3, 4))),
    Case("amax_all", lambda m, x: m.amax(x), args(distinct(3, 4))),
    Case("max_dim", lambda m, x: m.max(x, 1)[0], args(distinct(3, 4))),
    Case("min_dim_keepdim", lambda m, x: x.min(0, keepdim=True)[0], args(distinct(3, 4))),
    Case("max_all", lambda m, x: x.max(), args(distinct(3, 4))),
    Case("var", lambda m, x: x.var(1), args(nrm(3, 4))),
    Case("var_population", lambda m, x: m.var(x, 0, correction=0), args(nrm(3, 4))),
    Case("std", lambda m, x: x.std(1, keepdim=True), args(nrm(3, 4))),
]

MATMUL = [
    Case("matmul_2d", lambda m, a, b: a @ b, args(nrm(3, 4), nrm(4, 2))),
    Case("matmul_vec_vec", lambda m, a, b: m.matmul(a, b), args(nrm(4), nrm(4))),
    Case("matmul_vec_mat", lambda m, a, b: m.matmul(a, b), args(nrm(4), nrm(4, 3))),
    Case("matmul_mat_vec", lambda m, a, b: m.matmul(a, b), args(nrm(3, 4), nrm(4))),
    Case("matmul_batched", lambda m, a, b: a @ b, args(nrm(2, 3, 4), nrm(2, 4, 2))),
    Case("matmul_broadcast", lambda m, a, b: a @ b, args(nrm(2, 3, 4), nrm(4, 2))),
    Case("matmul_broadcast_batch", lambda m, a, b: a @ b, args(nrm(2, 1, 2, 3), nrm(3, 3, 2))),
    Case("matmul_transposed", lambda m, a, b: a.T @ b, args(nrm(4, 3), nrm(4, 2))),
]

VIEWS = [
    Case("reshape", lambda m, x: x.reshape(2, 6) * 2, args(nrm(3, 4))),
    Case("view", lambda m, x: x.view(4, 3).exp(), args(nrm(3, 4))),
    Case("reshape_noncontiguous", lambda m, x: x.T.reshape(12), args(nrm(3, 4))),
    Case("permute", lambda m, x: x.permute(2, 0, 1) * m.arange(4.0), args(nrm(3, 4, 2))),
    Case("transpose", lambda m, x: m.transpose(x, 0, 2).exp(), args(nrm(3, 4, 2))),
    Case("T", lambda m, x: x.T.exp(), args(nrm(3, 4))),
    Case("mT", lambda m, x: x.mT @ x, args(nrm(2, 3, 4))),
    Case("expand", lambda m, x: x.expand(3, 4) * m.arange(12.0).reshape(3, 4), args(nrm(3, 1))),
    Case("expand_new_dims", lambda m, x: x.expand(2, 3, 4).sin(), args(nrm(4))),
    Case("squeeze", lambda m, x: x.squeeze(1).exp(), args(nrm(3, 1, 4))),
    Case("unsqueeze", lambda m, x: x.unsqueeze(0) * x.unsqueeze(1), args(nrm(4))),
    Case("flatten", lambda m, x: x.flatten(1) ** 2, args(nrm(2, 3, 2))),
    Case("narrow", lambda m, x: m.narrow(x, 1, 1, 2) ** 2, args(nrm(3, 4))),
    Case("select", lambda m, x: m.select(x, 1, 2).exp(), args(nrm(3, 4))),
    Case("getitem_int", lambda m, x: x[1] ** 2, args(nrm(3, 4))),
    Case("getitem_slice_step", lambda m, x: x[::2, 1::2].exp(), args(nrm(5, 6))),
    Case("getitem_none_ellipsis", lambda m, x: x[None, ..., 1] * 3, args(nrm(2, 3, 4))),
    Case("getitem_negative", lambda m, x: x[-1, -2:], args(nrm(3, 4))),
    Case("getitem_tensor", lambda m, x, i: x[i] * 2, args(nrm(5, 3), lambda r: np.array([4, 0, 4, 2]))),
    Case("getitem_list", lambda m, x: x[:, [2, 0, 2]].exp(), args(nrm(3, 4))),
    Case("getitem_bool_mask", lambda m, x: x[x > 0] * 2, args(away0(3, 4))),
    Case("getitem_two_tensors", lambda m, x: x[m.tensor([0, 2, 2]), m.tensor([1, 0, 1])] ** 2, args(nrm(3, 4))),
    Case("split", lambda m, x: tuple(p.exp() for p in x.split(2, 1)), args(nrm(2, 5))),
    Case("chunk", lambda m, x: x.chunk(3, 0)[1] * 2, args(nrm(6, 2))),
    Case("cat", lambda m, a, b: m.cat([a, b, a], 1), args(nrm(2, 3), nrm(2, 1))),
    Case("stack", lambda m, a, b: m.stack([a, b], 1), args(nrm(2, 3), nrm(2, 3))),
    Case("gather", lambda m, x, i: m.gather(x, 1, i), args(nrm(3, 4), ints(4, 3, 5))),
    Case("index_select", lambda m, x, i: m.index_select(x, 0, i), args(nrm(3, 4), lambda r: np.array([2, 0, 2]))),
    Case("contiguous", lambda m, x: x.T.contiguous() * 2, args(nrm(3, 4))),
    Case("clone", lambda m, x: x.clone() * x, args(nrm(3, 4))),
]

INPLACE = [
    Case("inplace_mul", lambda m, x, z: x.clone().mul_(z), args(nrm(3, 4), nrm(4))),
    Case("inplace_chain", lambda m, x: (x * 1).mul_(2).add_(1.0).exp_(), args(nrm(3, 4))),
    Case(
        "inplace_unary_saving_input",
        lambda m, x: (x * 1).log_().abs_().clamp_(0.5, 0.9),
        args(pos(3, 4, lo=1.5, hi=3.0)),
    ),
    Case("setitem_slice", lambda m, x, z: _setitem(x * 1, (slice(1, 3),), z) ** 2, args(nrm(4, 3), nrm(2, 3))),
    Case("setitem_scalar", lambda m, x: _setitem(x * 2, (0, 1), 5.0) * x, args(nrm(3, 4))),
    Case("inplace_on_select", lambda m, x: _row_mul(x.clone(), 1, 3.0) * x, args(nrm(3, 4))),
    Case("inplace_on_view_two_outputs", lambda m, x, z: _view_add(x.clone(), z), args(nrm(3, 4), nrm(2, 4))),
    Case("inplace_on_transposed_view", lambda m, x, z: _t_add(x * 1, z), args(nrm(3, 4), nrm(3))),
]


def _setitem(y: Any, key: Any, value: Any) -> Any:
    y[key] = value
    return y


def _row_mul(y: Any, i: int, v: float) -> Any:
    y[i].mul_(v)
    return y


def _view_add(y: Any, z: Any) -> Any:
    v = y[1:]
    v.add_(z)
    return y, v


def _t_add(y: Any, z: Any) -> Any:
    y.T[1] += z
    return y.exp()


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


_ROPE_FREQ = np.arange(5)[:, None] * 10000.0 ** (-np.arange(0, 4, 2) / 4)  # [P=5, D/2=2] angles


def _rope(m: Any, x: Any, pos: Any) -> Any:
    """Rotary embedding of x [B, H, T, 4] at positions pos [B, T]: kael's op, torch's rotate-half formula."""
    cos, sin = np.cos(_ROPE_FREQ), np.sin(_ROPE_FREQ)
    if m is kael:
        return kael.rope(x, kael.tensor(cos), kael.tensor(sin), pos)
    c = m.tensor(np.concatenate([cos, cos], -1))[pos][:, None]
    s = m.tensor(np.concatenate([sin, sin], -1))[pos][:, None]
    return x * c + m.cat([-x[..., 2:], x[..., :2]], -1) * s


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
    Case(
        "nll_loss",
        lambda m, x, t: F(m).nll_loss(F(m).log_softmax(x, 1), t, ignore_index=1),
        args(nrm(4, 3), lambda r: np.array([0, 1, 2, 2])),
        fused=True,
    ),
    Case("mse_loss", lambda m, a, b: F(m).mse_loss(a, b), args(nrm(3, 4), nrm(3, 4))),
]

CASES = UNARY + BINARY + REDUCE + MATMUL + VIEWS + INPLACE + FUSED


# -- machinery ------------------------------------------------------------------------------------


@pytest.fixture(params=["fused_kernel", "decomposition"])
def fused_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run under the current CPU backend, then under a reference backend without fused kernels."""
    yield from modes(request.param, "decomposition")


def _inputs(case: Case) -> Arrays:
    return case.make(np.random.default_rng(zlib.crc32(case.name.encode())))


def _kael_args(arrays: Arrays) -> list[Any]:
    out = []
    for a in arrays:
        t = kael.tensor(a)
        if a.dtype == np.float64:
            t.requires_grad_(True)
        out.append(t)
    return out


def _outputs(r: Any) -> list[Any]:
    return list(r) if isinstance(r, (tuple, list)) else [r]


def _check_case(case: Case) -> None:
    arrays = _inputs(case)
    kargs = _kael_args(arrays)
    # 1. finite differences (always)
    gradcheck(lambda *a: case.fn(kael, *a), kargs, name=case.name)
    # 2. PyTorch autograd on the same inputs (when installed)
    if not case.torch:
        return
    torch = pytest.importorskip("torch")
    targs = [torch.tensor(a, requires_grad=a.dtype == np.float64) for a in arrays]
    kargs = _kael_args(arrays)
    k_out, t_out = _outputs(case.fn(kael, *kargs)), _outputs(case.fn(torch, *targs))
    assert len(k_out) == len(t_out)
    rng = np.random.default_rng(7)
    k_loss: Any = 0.0
    t_loss: Any = 0.0
    for ko, to in zip(k_out, t_out):
        assert tuple(ko.shape) == tuple(to.shape), f"{case.name}: output shape {ko.shape} vs torch {tuple(to.shape)}"
        np.testing.assert_allclose(
            ko.detach().numpy(),
            to.detach().numpy(),
            rtol=1e-7,
            atol=1e-9,
            err_msg=f"{case.name}: forward differs from torch",
        )
        w = rng.standard_normal(tuple(ko.shape))
        k_loss = k_loss + (ko * kael.tensor(w)).sum()
        t_loss = t_loss + (to * torch.tensor(w)).sum()
    k_loss.backward()
    t_loss.backward()
    for i, (kt, tt) in enumerate(zip(kargs, targs)):
        if not tt.requires_grad:
            continue
        assert (kt.grad is None) == (tt.grad is None), f"{case.name}: input {i} grad presence differs from torch"
        if tt.grad is not None:
            np.testing.assert_allclose(
                kt.grad.numpy(),
                tt.grad.numpy(),
                rtol=1e-7,
                atol=1e-9,
                err_msg=f"{case.name}: gradient of input {i} differs from torch",
            )


@pytest.mark.parametrize("case", [c for c in CASES if not c.fused], ids=lambda c: c.name)
def test_gradient(case: Case) -> None:
    _check_case(case)


@pytest.mark.parametrize("case", [c for c in CASES if c.fused], ids=lambda c: c.name)
def test_fused_gradient(case: Case, fused_mode: str) -> None:
    _check_case(case)


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
        "topk",
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


def test_every_differentiable_primitive_has_a_gradient_case() -> None:
    from kael._ops import BINARY_OPS, UNARY_OPS

    names = {c.name.split("_")[0] for c in CASES}
    non_diff = {"logical_not", "floor_divide"}  # floor_divide has no derivative (as in PyTorch)
    missing = [op for op in (*UNARY_OPS, *BINARY_OPS) if op not in non_diff and op not in names]
    assert not missing, f"no gradient case for {missing}"


def test_decomposition_backend_really_lacks_fused_kernels(fused_mode: str) -> None:
    from kael import _dispatch

    if fused_mode == "decomposition":
        assert _dispatch.fused_kernel("cpu", "softmax") is None
        assert kael.backends.current("cpu").name == "reference_decomposition"


# -- property tests: broadcasting and views ------------------------------------------------------


def _sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    while g.ndim > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdims=True)
    return g


@st.composite
def broadcast_pair(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    out = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    a = [n if draw(st.booleans()) else 1 for n in out]
    b = [n if draw(st.booleans()) else 1 for n in out]
    return tuple(a[draw(st.integers(0, len(a))) :]), tuple(b[draw(st.integers(0, len(b))) :])


@settings(max_examples=40, deadline=None)
@given(shapes=broadcast_pair(), op=st.sampled_from(["add", "sub", "mul", "div"]), seed=st.integers(0, 2**16))
def test_broadcast_binary_gradients_property(
    shapes: tuple[tuple[int, ...], tuple[int, ...]], op: str, seed: int
) -> None:
    r = np.random.default_rng(seed)
    a, b = r.standard_normal(shapes[0]), r.uniform(0.5, 2.0, shapes[1])
    ka, kb = kael.tensor(a, requires_grad=True), kael.tensor(b, requires_grad=True)
    out = getattr(kael, op)(ka, kb)
    w = r.standard_normal(out.shape)
    (out * kael.tensor(w)).sum().backward()
    bb = np.broadcast_to(b, out.shape)
    aa = np.broadcast_to(a, out.shape)
    da, db = {"add": (w, w), "sub": (w, -w), "mul": (w * bb, w * aa), "div": (w / bb, -w * aa / bb**2)}[op]
    np.testing.assert_allclose(ka.grad.numpy(), _sum_to(da, a.shape), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kb.grad.numpy(), _sum_to(db, b.shape), rtol=1e-12, atol=1e-12)


@st.composite
def view_key(draw: Any) -> tuple[tuple[int, ...], tuple[Any, ...], tuple[int, ...]]:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    perm = tuple(draw(st.permutations(range(len(shape)))))
    key: list[Any] = []
    for n in (shape[i] for i in perm):
        kind = draw(st.sampled_from(["int", "slice", "full"]))
        if kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.integers(-n, n))
            stop = draw(st.integers(-n, n))
            key.append(slice(start, stop, draw(st.integers(1, 3))))
        else:
            key.append(slice(None))
    return shape, tuple(key[: draw(st.integers(1, len(key)))]), perm


@settings(max_examples=40, deadline=None)
@given(case=view_key(), seed=st.integers(0, 2**16))
def test_view_gradients_property(case: tuple[tuple[int, ...], tuple[Any, ...], tuple[int, ...]], seed: int) -> None:
    """d sum(w * x.permute(p)[key]) / dx scatters w back through the same view (NumPy as the oracle)."""
    shape, key, perm = case
    r = np.random.default_rng(seed)
    x = kael.tensor(r.standard_normal(shape), requires_grad=True)
    v = x.permute(perm)[key]
    w = r.standard_normal(v.shape)
    (v * kael.tensor(w)).sum().backward()
    expected = np.zeros(shape)
    view = np.transpose(expected, perm)[key]
    if view.ndim == 0:
        np.transpose(expected, perm)[key] = w
    else:
        view += w
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=0, atol=0)


def test_scalar_operands_keep_sign_value_and_dtype() -> None:
    """Python scalars become cached 0-d operands: -0.0 stays apart from 0.0, ints from floats and bools."""
    x = kael.tensor([1.0, -2.0])
    assert (x / -0.0).tolist() == [-np.inf, np.inf] and (x / 0.0).tolist() == [np.inf, -np.inf]
    assert (kael.tensor([3]) * 2).dtype is kael.int64 and (kael.tensor([3]) * 2.5).tolist() == [7.5]
    assert (kael.tensor([3]) + True).tolist() == [4] and (kael.tensor([3]) + 1).tolist() == [4]
    assert (x * 2).tolist() == [2.0, -4.0] and (2 - x).tolist() == [1.0, 4.0]
    h = kael.tensor([1.0], dtype=kael.float16) * 1e-4
    assert h.dtype is kael.float16 and abs(h.item() - 1e-4) < 1e-6
