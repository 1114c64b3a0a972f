"""The mixture-of-experts fused ops ``kael.moe_route`` and ``kael.expert_linear`` (kael/ops/_moe_fused.py)
against NumPy formulas on hypothesis-drawn shapes, on the reference backend (its host kernels) and the C++ CPU
backend (its kernels, csrc/moe.cpp; tests/backend_cpu/test_cpu_moe_ops.py checks them against the
decompositions), through tests/core/conftest.py's ``backend`` fixture; their gradients against NumPy; torch's
router on tie-free logits; and the refusals.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael import _dispatch

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _route(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's routing: softmax in float64, the k largest (equal ones in index order), renormalised if asked."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, idx, -1)
    return (w / w.sum(-1, keepdims=True) if normalize else w), idx


@given(
    t=st.integers(0, 7),
    e=st.integers(1, 9),
    data=st.data(),
    normalize=st.booleans(),
    dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_moe_route_matches_numpy(
    backend: str, t: int, e: int, data: Any, normalize: bool, dtype: str, seed: int
) -> None:
    """Small-integer logits: equal ones tie exactly (kept in index order), distinct ones are far apart."""
    k = data.draw(st.integers(1, e))
    logits = np.random.default_rng(seed).integers(-3, 4, size=(t, e)).astype(np.float32)
    w, ex = kael.moe_route(kael.tensor(logits, dtype=getattr(kael, dtype)), k, normalize)
    want_w, want_ex = _route(logits, k, normalize)
    assert w.shape == ex.shape == (t, k) and ex.dtype is kael.int64
    assert w.dtype is (kael.float64 if dtype == "float64" else kael.float32)
    np.testing.assert_array_equal(ex.numpy(), want_ex)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-6, atol=1e-7)


def test_moe_route_matches_torch_router_on_distinct_logits(backend: str) -> None:
    import torch

    logits = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32)
    for normalize in (False, True):
        p = torch.softmax(torch.tensor(logits), -1, dtype=torch.float32)
        v, i = torch.topk(p, 3, -1)
        if normalize:
            v = v / v.sum(-1, keepdim=True)
        w, ex = kael.moe_route(kael.tensor(logits), 3, normalize)
        np.testing.assert_array_equal(ex.numpy(), i.numpy())
        np.testing.assert_allclose(w.numpy(), v.numpy(), rtol=1e-6, atol=1e-7)


@given(
    t=st.integers(0, 6),
    kk=st.integers(1, 3),
    e=st.integers(1, 5),
    n=st.integers(1, 5),
    c=st.integers(1, 6),
    per_slot=st.booleans(),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_expert_linear_matches_numpy(
    backend: str, t: int, kk: int, e: int, n: int, c: int, per_slot: bool, dtype: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(t, kk, c) if per_slot else (t, c)).astype(dtype)
    w = rng.normal(size=(e, n, c)).astype(dtype)
    ex = rng.integers(0, e, size=(t, kk))
    got = kael.expert_linear(kael.tensor(x), kael.tensor(w), kael.tensor(ex))
    want = np.einsum("tknc,tkc->tkn" if per_slot else "tknc,tc->tkn", w[ex], x)
    assert got.shape == (t, kk, n) and got.dtype is getattr(kael, dtype)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@given(per_slot=st.booleans(), seed=st.integers(0, 2**16))
@SETTINGS
def test_expert_linear_gradients_match_numpy(backend: str, per_slot: bool, seed: int) -> None:
    """d/dx and d/dW of sum(expert_linear(x, W, e) * G): W[e].T @ G rows (summed over the slots for x [T, C]),
    and each expert's sum of G x^T over the rows routed to it (experts never hit get 0)."""
    rng = np.random.default_rng(seed)
    t, kk, e, n, c = 5, 2, 4, 3, 6
    x = rng.normal(size=(t, kk, c) if per_slot else (t, c))
    w = rng.normal(size=(e, n, c))
    ex = rng.integers(0, e, size=(t, kk))
    g = rng.normal(size=(t, kk, n))
    kx, kw = kael.tensor(x, requires_grad=True), kael.tensor(w, requires_grad=True)
    kael.sum(kael.expert_linear(kx, kw, kael.tensor(ex)) * kael.tensor(g)).backward()
    dx = np.einsum("tknc,tkn->tkc", w[ex], g)
    dw = np.zeros_like(w)
    xs = x if per_slot else np.broadcast_to(x[:, None], (t, kk, c))
    np.add.at(dw, ex.reshape(-1), np.einsum("rn,rc->rnc", g.reshape(-1, n), xs.reshape(-1, c)))
    assert kx.grad is not None and kw.grad is not None
    np.testing.assert_allclose(kx.grad.numpy(), dx if per_slot else dx.sum(1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kw.grad.numpy(), dw, rtol=1e-10, atol=1e-12)


def test_moe_route_weights_are_differentiable_in_the_logits(backend: str) -> None:
    import torch

    logits = np.random.default_rng(1).normal(size=(4, 5))
    kl = kael.tensor(logits, requires_grad=True)
    w, _ = kael.moe_route(kl, 2, True)
    kael.sum(w * kael.tensor([[1.0, -2.0]])).backward()
    tl = torch.tensor(logits, requires_grad=True)
    v = torch.topk(torch.softmax(tl, -1), 2)[0]
    ((v / v.sum(-1, keepdim=True)) * torch.tensor([[1.0, -2.0]], dtype=torch.float64)).sum().backward()
    assert kl.grad is not None and tl.grad is not None
    np.testing.assert_allclose(kl.grad.numpy(), tl.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_both_backends_have_kernels() -> None:
    """The reference backend's host kernels and the C++ CPU backend's native ones serve both ops."""
    kbc = pytest.importorskip("kael_backend_cpu")
    if {"moe_route", "expert_linear"} & set(kbc._kernels.missing_fused()):
        pytest.skip("this build of kael_backend_cpu's extension predates its moe_route / expert_linear kernels")
    for name in ("cpu", "reference"):
        kael.backends.use("cpu", name)
        try:
            assert _dispatch.fused_kernel("cpu", "moe_route") is not None
            assert _dispatch.fused_kernel("cpu", "expert_linear") is not None
        finally:
            kael.backends.use("cpu", None)


def test_refusals_name_the_op() -> None:
    x, w = kael.randn(3, 4), kael.randn(5, 2, 4)
    ex = kael.tensor([[0, 1], [4, 2], [3, 3]])
    cases = [
        (lambda: kael.moe_route(kael.randn(3, 4), 5), kael.ShapeError, r"moe_route: k=5"),
        (lambda: kael.moe_route(kael.randn(3, 4), 0), kael.ShapeError, r"moe_route: k=0"),
        (lambda: kael.moe_route(kael.randn(3), 1), kael.ShapeError, r"moe_route: logits must be \[T, E\]"),
        (lambda: kael.moe_route(kael.tensor([[1, 2]]), 1), kael.DTypeError, "moe_route: logits"),
        (lambda: kael.moe_route(kael.randn(3, 4), 2, 1), kael.DTypeError, "normalize"),
        (lambda: kael.expert_linear(x, w, kael.tensor([[0, 5], [0, 0], [0, 0]])), kael.IndexError_, "expert 5"),
        (lambda: kael.expert_linear(x, w, kael.tensor([[0, -1], [0, 0], [0, 0]])), kael.IndexError_, "expert -1"),
        (lambda: kael.expert_linear(kael.randn(3, 3), w, ex), kael.ShapeError, "expert_linear: x"),
        (lambda: kael.expert_linear(x, kael.randn(2, 4), ex), kael.ShapeError, r"weight must be \[E, N, C\]"),
        (lambda: kael.expert_linear(x, w, kael.tensor([0, 1, 2])), kael.ShapeError, r"experts must be \[T, K\]"),
        (lambda: kael.expert_linear(x, w, kael.randn(3, 2)), kael.DTypeError, "experts must be an integer"),
        (lambda: kael.expert_linear(x, w.to(dtype=kael.float64), ex), kael.DTypeError, "same dtype"),
    ]
    for fn, err, match in cases:
        with pytest.raises(err, match=match):
            fn()
