"""Gradients in float64 on the backend: autograd's Jacobians against finite differences (kael.testing.gradcheck).

Backward formulas are frontend ops, so this checks that the backend's kernels (and
its fused backward kernels such as gelu_backward and layer_norm_backward, when it has
them) give the right gradients, for every differentiable op family. Every elementwise op
of the catalogue with a float result gets a case of its own (``pointwise_<op>``), its
inputs drawn from the op's sample domain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kael
from kael.backends import catalogue
from kael.testing import gradcheck


def _idx(ref: Any, values: list[Any]) -> Any:
    return kael.tensor(values, device=ref.device)


def _rope_tables(x: Any, p: int) -> tuple[Any, Any]:
    """cos/sin [p, D/2] float64 tables of rotary angles for x [.., D] (constants, on x's device)."""
    half = x.shape[-1] // 2
    freq = np.arange(p)[:, None] * 10000.0 ** (-np.arange(half) / half)
    return kael.tensor(np.cos(freq), device=x.device), kael.tensor(np.sin(freq), device=x.device)


# name: (fn, input specs); a spec is (shape, kind) with kind normal | positive | away0 (|x| >= 0.2)
CASES: dict[str, tuple[Callable[..., Any], list[tuple[tuple[int, ...], str]]]] = {
    "add_bcast": (lambda a, b: a + b, [((2, 3), "normal"), ((3,), "normal")]),
    "sub_scalar": (lambda a, b: 2.0 - a - b, [((2, 3), "normal"), ((2, 1), "normal")]),
    "mul_bcast": (lambda a, b: a * b * 3, [((2, 3), "normal"), ((2, 1), "normal")]),
    "div": (lambda a, b: a / b, [((2, 3), "normal"), ((2, 3), "away0")]),
    "pow": (lambda a, b: a**b, [((4,), "positive"), ((4,), "normal")]),
    "pow_scalar": (lambda a: a**3 + 2.0**a, [((4,), "normal")]),
    "maximum_minimum": (lambda a, b: kael.maximum(a, b) * kael.minimum(a, b), [((5,), "normal"), ((5,), "normal")]),
    "exp_log": (lambda a: kael.exp(a) + kael.log(a), [((4,), "positive")]),
    "sqrt_rsqrt": (lambda a: kael.sqrt(a) * kael.rsqrt(a + 1), [((4,), "positive")]),
    "tanh_sigmoid": (lambda a: kael.tanh(a) + kael.sigmoid(a), [((4,), "normal")]),
    "abs_neg": (lambda a: -kael.abs(a), [((4,), "away0")]),
    "sin_cos": (lambda a: kael.sin(a) * kael.cos(a), [((4,), "normal")]),
    "erf_log1p_expm1": (lambda a: kael.erf(a) + kael.log1p(a) + kael.expm1(a), [((4,), "positive")]),
    "relu_clamp": (lambda a: kael.relu(a) + kael.clamp(a, -0.1, 0.1), [((6,), "away0")]),
    "sum_dims": (lambda a: a.sum((0, 2)), [((2, 3, 4), "normal")]),
    "mean_keepdim": (lambda a: a.mean(1, keepdim=True), [((2, 3), "normal")]),
    "prod": (lambda a: a.prod(1), [((2, 3), "away0")]),
    "amax": (lambda a: kael.amax(a, 0), [((3, 4), "normal")]),
    "max_dim": (lambda a: kael.max(a, 1)[0], [((3, 4), "normal")]),
    "var_std": (lambda a: kael.cat([a.var(1), a.std(0)]), [((3, 4), "normal")]),
    "matmul_batched": (lambda a, b: a @ b, [((2, 3, 4), "normal"), ((4, 2), "normal")]),
    "matmul_vector": (lambda a, b: a @ b, [((3,), "normal"), ((2, 3, 2), "normal")]),
    "views": (lambda a: a.T.reshape(-1)[1:5].unsqueeze(0).expand(2, 4) * 1.0, [((2, 3), "normal")]),
    "permute_slice": (lambda a: a.permute(2, 0, 1)[1:, :, ::2].flatten(), [((2, 3, 4), "normal")]),
    "getitem_advanced": (lambda a: a[_idx(a, [2, 0, 2])], [((3, 2), "normal")]),
    "getitem_mask": (lambda a: a[_idx(a, [[True, False], [False, True], [True, True]])], [((3, 2), "normal")]),
    "cat_stack": (
        lambda a, b: kael.cat([a, b], 0) + kael.stack([a[:1], b[:1]]).sum(0),
        [((2, 3), "normal"), ((1, 3), "normal")],
    ),
    "where": (lambda a, b: kael.where(a > 0, a, b), [((2, 3), "away0"), ((2, 3), "normal")]),
    "gather": (lambda a: kael.gather(a, 1, _idx(a, [[0, 0], [2, 1]])), [((2, 3), "normal")]),
    "index_select": (lambda a: kael.index_select(a, 0, _idx(a, [1, 1, 0])), [((2, 3), "normal")]),
    "softmax": (lambda a: kael.softmax(a, 0), [((3, 4), "normal")]),
    "log_softmax": (lambda a: kael.log_softmax(a, -1), [((3, 4), "normal")]),
    "gelu_tanh": (lambda a: kael.gelu(a, approximate="tanh"), [((5,), "normal")]),
    "gelu_erf": (lambda a: kael.gelu(a), [((5,), "normal")]),
    "layer_norm": (
        lambda x, w, b: kael.layer_norm(x, 4, w, b),
        [((3, 4), "normal"), ((4,), "normal"), ((4,), "normal")],
    ),
    "layer_norm_plain": (lambda x: kael.layer_norm(x, 4), [((2, 4), "normal")]),
    "linear": (lambda x, w, b: kael.linear(x, w, b), [((2, 3), "normal"), ((4, 3), "normal"), ((4,), "normal")]),
    "embedding": (lambda w: kael.embedding(_idx(w, [[1, 4], [1, 0]]), w), [((5, 3), "normal")]),
    "cross_entropy": (lambda z: kael.cross_entropy(z, _idx(z, [1, 0, -100, 4])), [((4, 5), "normal")]),
    "cross_entropy_smoothing": (
        lambda z: kael.cross_entropy(z, _idx(z, [1, 0, 3]), label_smoothing=0.1, reduction="sum"),
        [((3, 5), "normal")],
    ),
    "attention_causal": (
        lambda q, k, v: kael.attention(q, k, v, causal=True),
        [((1, 2, 3, 2), "normal"), ((1, 2, 4, 2), "normal"), ((1, 2, 4, 2), "normal")],
    ),
    "attention_lengths": (
        lambda q, k, v: kael.attention(q, k, v, lengths=_idx(q, [2, 4])),
        [((2, 1, 2, 2), "normal"), ((2, 1, 4, 2), "normal"), ((2, 1, 4, 2), "normal")],
    ),
    "attention_gqa_causal": (
        lambda q, k, v: kael.attention(q, k, v, causal=True),
        [((1, 4, 3, 2), "normal"), ((1, 2, 4, 2), "normal"), ((1, 2, 4, 2), "normal")],
    ),
    "attention_mqa_lengths": (
        lambda q, k, v: kael.attention(q, k, v, lengths=_idx(q, [2, 4])),
        [((2, 3, 2, 2), "normal"), ((2, 1, 4, 2), "normal"), ((2, 1, 4, 2), "normal")],
    ),
    "rms_norm": (lambda x, w: kael.rms_norm(x, w, 1e-6), [((2, 3, 4), "normal"), ((4,), "normal")]),
    "rms_norm_plain": (lambda x: kael.rms_norm(x.T, eps=1e-3), [((4, 3), "normal")]),
    "rope": (lambda x: kael.rope(x, *_rope_tables(x, 6), _idx(x, [[0, 5, 2], [3, 3, 1]])), [((2, 2, 3, 4), "normal")]),
    "silu_mul": (lambda g, u: kael.silu_mul(g, u), [((2, 3), "normal"), ((2, 3), "normal")]),
    "silu_mul_broadcast": (lambda g, u: kael.silu_mul(g.T, u), [((3, 2), "normal"), ((3,), "normal")]),
    "gelu_tanh_mul": (lambda g, u: kael.gelu_tanh_mul(g, u), [((2, 3), "normal"), ((2, 3), "normal")]),
    "gelu_tanh_mul_broadcast": (lambda g, u: kael.gelu_tanh_mul(g.T * 3, u), [((3, 2), "normal"), ((3,), "normal")]),
    "softcap": (lambda x: kael.softcap(x.T * 4, 2.5), [((3, 2), "normal")]),
    "inplace_on_clone": (lambda a: a.clone().mul_(2).add_(a), [((2, 3), "normal")]),
}


# the conformance table's value kinds -> the kinds here (steps such as floor's are not probed at their jumps)
_GRAD_KIND = {"positive": "positive", "small": "positive", "nonzero": "away0", "unit": "unit"}


def _pointwise_cases() -> dict[str, tuple[Callable[..., Any], list[tuple[tuple[int, ...], str]]]]:
    out: dict[str, tuple[Callable[..., Any], list[tuple[tuple[int, ...], str]]]] = {}
    for op in catalogue.POINTWISE_OPS:
        d = catalogue.op(op)
        p = d.pointwise
        assert p is not None
        if p.bool_out or p.dtypes == "bool":
            continue  # no float result to differentiate
        kinds = [_GRAD_KIND.get(k, "normal") for k in (p.domain * 2)[: d.arity[1]]]
        shapes = [(2, 3), (3,)][: d.arity[1]]  # binary ops broadcast their second operand
        out[f"pointwise_{op}"] = (getattr(kael, op), list(zip(shapes, kinds)))
    return out


CASES.update(_pointwise_cases())


def _values(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "positive":
        return rng.uniform(0.3, 2.0, size=shape)
    if kind == "unit":
        return rng.uniform(-0.9, 0.9, size=shape)
    if kind == "away0":
        return rng.uniform(0.2, 1.5, size=shape) * rng.choice([-1.0, 1.0], size=shape)  # type: ignore[no-any-return]
    return rng.standard_normal(shape)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck(name: str, kael_device: Any) -> None:
    fn, specs = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    inputs = [
        kael.tensor(_values(rng, s, k), dtype=kael.float64, device=kael_device, requires_grad=True) for s, k in specs
    ]
    gradcheck(fn, inputs, name=name)
