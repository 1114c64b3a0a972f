"""The Llama family's ops rms_norm and silu_mul against independent oracles.

Property tests (hypothesis) over shapes and layouts check each op against its float64 formula
written here in NumPy, forward and backward (the backward against the formula's own derivative,
written out by hand); PyTorch is an oracle for ``torch.nn.functional.rms_norm``, ``nn.RMSNorm``
and silu-then-multiply in half precision, and Hugging Face's ``LlamaRMSNorm`` for the
half-precision rounding. Every op runs on the default CPU backend, on the reference backend's
fused kernels and as the decompositions on a backend without fused kernels (``mode``); bad input
raises a ``kael.KaelError`` subclass naming the op and the offending value. rope is in
test_llama_ops_rope.py, grouped-query attention in test_llama_ops_gqa.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_ops_common import MODES, backend_mode
from llama_ops_common import float64_of as _np
from llama_ops_common import tensor_of as _t


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The CPU backend as installed, the reference backend (fused host kernels), and one without fused kernels."""
    with backend_mode(request.param) as name:
        yield name


# -- float64 formulas, written independently of kael ------------------------------------------------


def rms_ref(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * (1.0 if w is None else w)


def rms_grad_ref(x: np.ndarray, w: np.ndarray | None, eps: float, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d/dx and d/dw of sum(g * rms_norm(x, w)), by the chain rule on y_i = w_i x_i r, r = (mean(x^2)+eps)^-1/2."""
    c = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    gw = g * (1.0 if w is None else w)
    # dy_i/dx_j = w_i (r delta_ij - x_i r^3 x_j / C)
    dx = gw * r - x * r**3 * np.sum(gw * x, axis=-1, keepdims=True) / c
    dw = np.sum((g * x * r).reshape(-1, c), axis=0)
    return dx, dw


def silu_mul_ref(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return g / (1.0 + np.exp(-g)) * u


# -- rms_norm -------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    c=st.integers(1, 9),
    weight=st.booleans(),
    transposed=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_forward_and_backward_property(
    lead: list[int], c: int, weight: bool, transposed: bool, eps: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    shape = (*lead, c)
    x = rng.standard_normal(shape)
    w = rng.standard_normal(c) if weight else None
    g = rng.standard_normal(shape)
    kx = _t(x, True)
    src = kx
    if transposed and x.ndim >= 2:  # a non-contiguous operand: the same values through a transposed view
        src = _t(np.ascontiguousarray(np.swapaxes(x, -1, -2)), True)
        kx = src.transpose(-1, -2)
    kw = _t(w, True) if w is not None else None
    y = kael.rms_norm(kx, kw, eps)
    np.testing.assert_allclose(_np(y), rms_ref(x, w, eps), rtol=1e-12, atol=1e-13)
    (y * _t(g)).sum().backward()
    dx, dw = rms_grad_ref(x, w, eps, g)
    got_dx = _np(src.grad) if src is kx else np.swapaxes(_np(src.grad), -1, -2)
    np.testing.assert_allclose(got_dx, dx, rtol=1e-10, atol=1e-12)
    if kw is not None:
        np.testing.assert_allclose(_np(kw.grad), dw, rtol=1e-10, atol=1e-12)


def test_rms_norm_on_every_backend_matches_torch(mode: str) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 8)), rng.standard_normal(8)
    kx, kw = _t(x, True), _t(w, True)
    y = kael.nn.functional.rms_norm(kx, (8,), kw, 1e-5)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.rms_norm(tx, (8,), tw, 1e-5)
    np.testing.assert_allclose(_np(y), ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    gr = rng.standard_normal(x.shape)
    (y * _t(gr)).sum().backward()
    (ty * torch.tensor(gr)).sum().backward()
    np.testing.assert_allclose(_np(kx.grad), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(kw.grad), tw.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_nn_rmsnorm_default_eps_and_multi_dim_shape_match_torch(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 5)) * 3
    m = kael.nn.RMSNorm((2, 5), dtype=getattr(kael, dtype))
    tm = torch.nn.RMSNorm((2, 5), dtype=getattr(torch, dtype))
    assert m.eps is None and tm.eps is None
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()] == ["weight"]
    wv = rng.standard_normal((2, 5))
    with kael.no_grad():
        m.weight.copy_(kael.tensor(wv, dtype=getattr(kael, dtype)))
    with torch.no_grad():
        tm.weight.copy_(torch.tensor(wv))
    y = m(kael.tensor(x, dtype=getattr(kael, dtype)))
    ty = tm(torch.tensor(x, dtype=getattr(torch, dtype)))
    assert y.dtype is getattr(kael, dtype) and y.shape == (3, 2, 5)
    # PyTorch rounds once after the weight, Hugging Face (and kael) also before it: one half ulp apart
    tol = {"float32": 1e-6, "float64": 1e-13, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    np.testing.assert_allclose(_np(y), ty.detach().double().numpy(), rtol=tol, atol=tol)
    no_affine = kael.nn.RMSNorm(5, eps=1e-3, elementwise_affine=False)
    assert no_affine.weight is None and "eps=0.001" in repr(no_affine)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rms_norm_half_matches_hugging_face_llama_rmsnorm(dtype: str, mode: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 16)) * 4
    w = rng.standard_normal(16)
    hf = LlamaRMSNorm(16, eps=1e-6).to(getattr(torch, dtype))
    with torch.no_grad():
        hf.weight.copy_(torch.tensor(w))
    want = hf(torch.tensor(x, dtype=getattr(torch, dtype))).detach().double().numpy()
    kd = getattr(kael, dtype)
    got = kael.rms_norm(kael.tensor(x, dtype=kd), kael.tensor(w, dtype=kd), 1e-6)
    assert got.dtype is kd
    # the same two roundings as Hugging Face: equal but where float32 sums round differently (rarely one ulp)
    ulp = {"bfloat16": 2.0**-7, "float16": 2.0**-10}[dtype]
    np.testing.assert_allclose(_np(got), want, rtol=ulp, atol=ulp * 1e-2)
    assert np.mean(_np(got) == want) > 0.9


def test_rms_norm_bad_input_names_op_and_value() -> None:
    x = kael.randn(2, 4)
    with pytest.raises(kael.ShapeError, match=r"rms_norm: weight has shape \[3\], expected \[4\]"):
        kael.rms_norm(x, kael.ones(3))
    with pytest.raises(kael.DTypeError, match="rms_norm: x must be a floating-point tensor"):
        kael.rms_norm(kael.ones(2, 4, dtype=kael.int64))
    with pytest.raises(kael.DTypeError, match="weight is kael.float64 but x is kael.float32"):
        kael.rms_norm(x, kael.ones(4, dtype=kael.float64))
    with pytest.raises(kael.DTypeError, match="eps must be a non-negative number, got -1"):
        kael.rms_norm(x, eps=-1)
    with pytest.raises(kael.ShapeError, match="0-d"):
        kael.rms_norm(kael.tensor(1.0))
    with pytest.raises(kael.ShapeError, match=r"does not end with normalized_shape \[5\]"):
        kael.nn.functional.rms_norm(x, 5)
    with pytest.raises(kael.ShapeError, match="RMSNorm: normalized_shape must be a non-negative int, got -2"):
        kael.nn.RMSNorm(-2)


# -- silu_mul -------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    broadcast_up=st.booleans(),
    scale=st.sampled_from([1.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_silu_mul_forward_and_backward_property(shape: list[int], broadcast_up: bool, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sg = tuple(shape)
    su = sg[-1:] if broadcast_up and sg else sg
    g, u = rng.standard_normal(sg) * scale, rng.standard_normal(su)
    kg, ku = _t(g, True), _t(u, True)
    y = kael.silu_mul(kg, ku)
    np.testing.assert_allclose(_np(y), silu_mul_ref(g, u), rtol=1e-12, atol=1e-300)
    go = rng.standard_normal(y.shape)
    (y * _t(go)).sum().backward()
    s = 1.0 / (1.0 + np.exp(-g))
    dg = go * u * (s + g * s * (1 - s))
    du = go * g * s
    if su != sg:  # up was broadcast over the leading dims: its gradient sums over them
        du = du.sum(axis=tuple(range(du.ndim - len(su))))
    np.testing.assert_allclose(_np(kg.grad), dg, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(_np(ku.grad), du, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_silu_mul_on_every_backend_and_dtype(dtype: str, mode: str) -> None:
    rng = np.random.default_rng(5)
    g, u = rng.standard_normal((3, 7)) * 4, rng.standard_normal((3, 7))
    kd = getattr(kael, dtype)
    kg, ku = kael.tensor(g, dtype=kd), kael.tensor(u, dtype=kd)
    y = kael.nn.functional.silu_mul(kg, ku)
    assert y.dtype is kd
    tol = {"float32": 1e-6, "bfloat16": 1.6e-2, "float16": 3e-3}[dtype]
    np.testing.assert_allclose(_np(y), silu_mul_ref(_np(kg), _np(ku)), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_silu_mul_half_rounds_like_hugging_face_act_fn_then_mul(dtype: str, mode: str) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    g, u = rng.standard_normal((4, 64)) * 3, rng.standard_normal((4, 64))
    td = getattr(torch, dtype)
    want = (torch.nn.functional.silu(torch.tensor(g, dtype=td)) * torch.tensor(u, dtype=td)).double().numpy()
    kd = getattr(kael, dtype)
    got = _np(kael.silu_mul(kael.tensor(g, dtype=kd), kael.tensor(u, dtype=kd)))
    if mode == "reference":  # the reference kernel: silu rounded to the dtype, then the product rounded
        np.testing.assert_array_equal(got, want)
    else:  # a backend kernel or the decomposition (sigmoid, then two products): within an ulp or two
        ulp = {"bfloat16": 2.0**-7, "float16": 2.0**-10}[dtype]
        np.testing.assert_allclose(got, want, rtol=2 * ulp, atol=ulp * 1e-2)


def test_silu_mul_bad_input() -> None:
    with pytest.raises(kael.DTypeError, match="silu_mul: gate is kael.float32 but up is kael.float64"):
        kael.silu_mul(kael.ones(2), kael.ones(2, dtype=kael.float64))
    with pytest.raises(kael.ShapeError, match="silu_mul: shapes"):
        kael.silu_mul(kael.ones(2, 3), kael.ones(4))
    with pytest.raises(kael.DTypeError, match="up must be a floating-point tensor"):
        kael.silu_mul(kael.ones(2), kael.ones(2, dtype=kael.int64))
