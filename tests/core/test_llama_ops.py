"""The Llama family's ops (rms_norm, rope, silu_mul, grouped-query attention) against independent oracles.

* Property tests (hypothesis) over shapes and layouts: each op against its float64 formula
  written here in NumPy, forward and backward (the backward against the formula's own
  derivative, written out by hand).
* PyTorch as an oracle: ``torch.nn.functional.rms_norm`` and ``nn.RMSNorm``,
  ``scaled_dot_product_attention(..., enable_gqa=True)`` with its gradients.
* Hugging Face as an oracle for the half-precision rounding: ``LlamaRMSNorm`` and
  ``apply_rotary_pos_emb`` in bfloat16 / float16.
* Every op on the default CPU backend and on the reference backend's fused kernels, and
  the decompositions on a backend without fused kernels (``fused_mode``).
* Bad input: a ``kael.KaelError`` subclass naming the op and the offending value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.backends.reference import ReferenceBackend

MODES = ["default", "reference", "decomposition"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The CPU backend as installed, the reference backend (fused host kernels), and one without fused kernels."""
    if request.param == "default":
        yield request.param
        return
    backend = ReferenceBackend(fused=request.param == "reference")
    backend.name = f"llama_ops_{request.param}"
    backend.priority = -1

    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [backend]

    kael.backends.register(Plugin(), f"test_llama_ops_{request.param}")
    kael.backends.use("cpu", backend.name)
    try:
        yield request.param
    finally:
        kael.backends.use("cpu", None)
        kael.backends.unregister(f"test_llama_ops_{request.param}")


def _t(a: np.ndarray, grad: bool = False, dtype: Any = None) -> kael.Tensor:
    t = kael.tensor(a, dtype=dtype)
    return t.requires_grad_(True) if grad else t


def _np(t: kael.Tensor) -> np.ndarray:
    return np.asarray(t.detach().to(dtype=kael.float64) if t.dtype.itemsize == 2 else t.detach(), dtype=np.float64)


def _tables(p: int, half: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    ang = np.arange(p)[:, None] * base ** (-np.arange(half) / half)
    return np.cos(ang), np.sin(ang)


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


def rope_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Pair (x[..., i], x[..., i + D/2]) rotated by the angle of (cos, sin)[pos, i], one element at a time."""
    b, h, t, d = x.shape
    out = np.empty_like(x)
    for bi, hi, ti, i in np.ndindex(b, h, t, d // 2):
        c, s = cos[pos[bi, ti], i], sin[pos[bi, ti], i]
        a, z = x[bi, hi, ti, i], x[bi, hi, ti, i + d // 2]
        out[bi, hi, ti, i] = a * c - z * s
        out[bi, hi, ti, i + d // 2] = z * c + a * s
    return out


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


# -- rope -----------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    t=st.integers(1, 4),
    half=st.integers(1, 4),
    shared=st.booleans(),
    heads_last=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rope_forward_and_backward_property(
    b: int, h: int, t: int, half: int, shared: bool, heads_last: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    d, p = 2 * half, 7
    x = rng.standard_normal((b, h, t, d))
    cos, sin = _tables(p, half)
    pos = rng.integers(0, p, (t,) if shared else (b, t))
    pos_bt = np.broadcast_to(pos, (b, t))
    if heads_last:  # x viewed [B, H, T, D] from [B, T, H, D] storage, as a model splits heads
        src = _t(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), True)
        kx = src.permute(0, 2, 1, 3)
    else:
        src = kx = _t(x, True)
    y = kael.rope(kx, _t(cos), _t(sin), kael.tensor(pos))
    assert y.shape == x.shape and y.dtype is kael.float64
    np.testing.assert_allclose(_np(y), rope_ref(x, cos, sin, pos_bt), rtol=1e-12, atol=1e-13)
    g = rng.standard_normal(x.shape)
    (y * _t(g)).sum().backward()
    # a rotation's transpose is the rotation by the opposite angle
    want = rope_ref(g, cos, -sin, pos_bt)
    got = _np(src.grad).transpose(0, 2, 1, 3) if heads_last else _np(src.grad)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_rope_matches_hugging_face_apply_rotary_pos_emb(dtype: str, mode: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rng = np.random.default_rng(3)
    b, h, t, d, p = 2, 3, 5, 8, 12
    x = rng.standard_normal((b, h, t, d))
    pos = np.stack([np.arange(t), np.arange(4, 4 + t)])  # the second row continues a 4-token cache
    cos, sin = _tables(p, d // 2)
    c2 = torch.tensor(np.concatenate([cos, cos], -1)[pos], dtype=torch.float32)  # HF: [B, T, D]
    s2 = torch.tensor(np.concatenate([sin, sin], -1)[pos], dtype=torch.float32)
    tx = torch.tensor(x, dtype=torch.float32)
    want, _ = apply_rotary_pos_emb(tx, tx, c2, s2)
    kd = getattr(kael, dtype)
    got = kael.rope(
        kael.tensor(x, dtype=kd),
        kael.tensor(cos, dtype=kael.float32),
        kael.tensor(sin, dtype=kael.float32),
        kael.tensor(pos),
    )
    assert got.dtype is kd
    # computed in float32 from x rounded to dtype, rounded once at the end
    tol = {"float32": 1e-6, "bfloat16": 2 * 2.0**-8, "float16": 2 * 2.0**-11}[dtype]
    xr = _np(kael.tensor(x, dtype=kd))
    np.testing.assert_allclose(_np(got), rope_ref(xr, cos, sin, pos), rtol=tol, atol=tol)
    np.testing.assert_allclose(
        _np(
            kael.rope(
                kael.tensor(x, dtype=kael.float32),
                kael.tensor(cos, dtype=kael.float32),
                kael.tensor(sin, dtype=kael.float32),
                kael.tensor(pos),
            )
        ),
        want.numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_rope_positions_broadcast_without_copy_and_on_every_backend(mode: str) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 2, 4, 6))
    cos, sin = _tables(10, 3)
    shared = kael.rope(_t(x), _t(cos), _t(sin), kael.arange(4))
    rows = kael.rope(_t(x), _t(cos), _t(sin), kael.tensor(np.tile(np.arange(4), (3, 1))))
    np.testing.assert_array_equal(_np(shared), _np(rows))
    np.testing.assert_allclose(
        _np(shared), rope_ref(x, cos, sin, np.tile(np.arange(4), (3, 1))), rtol=1e-12, atol=1e-13
    )
    assert kael.nn.functional.rope(_t(x), _t(cos), _t(sin), kael.arange(4)).shape == x.shape


def test_rope_bad_input_names_op_and_value() -> None:
    x = kael.randn(1, 2, 3, 4)
    cos, sin = kael.ones(8, 2), kael.zeros(8, 2)
    with pytest.raises(kael.IndexError_, match=r"rope: position 8 is out of range for tables of 8 positions"):
        kael.rope(x, cos, sin, kael.tensor([0, 1, 8]))
    with pytest.raises(kael.IndexError_, match="position -1"):
        kael.rope(x, cos, sin, kael.tensor([[0, -1, 2]]))
    with pytest.raises(kael.ShapeError, match=r"rope: x must be \[B, H, T, D\], got shape \[2, 3, 4\]"):
        kael.rope(kael.randn(2, 3, 4), cos, sin, kael.arange(3))
    with pytest.raises(kael.ShapeError, match="must be even, got 5"):
        kael.rope(kael.randn(1, 1, 3, 5), cos, sin, kael.arange(3))
    with pytest.raises(kael.ShapeError, match=r"cos must be \[P, D/2\] = \[P, 2\].*got \[8, 3\]"):
        kael.rope(x, kael.ones(8, 3), kael.ones(8, 3), kael.arange(3))
    with pytest.raises(kael.ShapeError, match=r"positions must be \[B, T\] = \[1, 3\] or \[T\] = \[3\], got \[4\]"):
        kael.rope(x, cos, sin, kael.arange(4))
    with pytest.raises(kael.DTypeError, match="positions must be an integer tensor"):
        kael.rope(x, cos, sin, kael.zeros(3))
    with pytest.raises(kael.DTypeError, match="cos must be a float32 or float64 table, got kael.float16"):
        kael.rope(x, cos.to(dtype=kael.float16), sin.to(dtype=kael.float16), kael.arange(3))
    with pytest.raises(kael.ShapeError, match="must have the same shape and dtype"):
        kael.rope(x, cos, kael.zeros(9, 2), kael.arange(3))


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


# -- grouped-query attention ----------------------------------------------------------------------


def _torch_mask(torch: Any, b: int, tq: int, tk: int, causal: bool, lengths: list[int] | None) -> Any:
    m = torch.ones(b, 1, tq, tk, dtype=torch.bool)
    if causal:  # kael aligns the last query with the last key
        m &= torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
    if lengths is not None:
        m &= (torch.arange(tk)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
    return m


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tq", "tk", "causal", "lengths"),
    [
        (4, 2, 3, 5, False, None),
        (4, 1, 3, 5, True, None),
        (6, 3, 1, 6, True, [6, 4]),
        (4, 4, 2, 5, True, [5, 3]),
        (8, 2, 4, 4, True, None),
    ],
)
def test_gqa_attention_matches_torch_enable_gqa(
    heads: int, kv_heads: int, tq: int, tk: int, causal: bool, lengths: list[int] | None, mode: str
) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(heads * 100 + kv_heads * 10 + tq)
    q = rng.standard_normal((2, heads, tq, 4))
    k, v = rng.standard_normal((2, kv_heads, tk, 4)), rng.standard_normal((2, kv_heads, tk, 3))
    kq, kk, kv = _t(q, True), _t(k, True), _t(v, True)
    ln = kael.tensor(lengths) if lengths is not None else None
    y = kael.attention(kq, kk, kv, causal=causal, lengths=ln)
    tq_, tk_, tv_ = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ty = torch.nn.functional.scaled_dot_product_attention(
        tq_, tk_, tv_, attn_mask=_torch_mask(torch, 2, tq, tk, causal, lengths), enable_gqa=True
    )
    np.testing.assert_allclose(_np(y), ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    g = rng.standard_normal(y.shape)
    (y * _t(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    for a, b in ((kq, tq_), (kk, tk_), (kv, tv_)):
        np.testing.assert_allclose(_np(a.grad), b.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_gqa_equals_attention_over_repeated_kv(mode: str) -> None:
    """Query head h reads kv head h // (H // Hkv): Hugging Face's repeat_kv, done by hand, gives the same."""
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((1, 6, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4))
    grouped = kael.attention(_t(q), _t(k), _t(v), causal=True)
    rep = kael.attention(_t(q), _t(np.repeat(k, 3, axis=1)), _t(np.repeat(v, 3, axis=1)), causal=True)
    np.testing.assert_allclose(_np(grouped), _np(rep), rtol=1e-13, atol=1e-14)


def test_sdpa_enable_gqa_flag_as_pytorch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((4, 3, 2)), rng.standard_normal((2, 5, 2)), rng.standard_normal((2, 5, 2))
    y = kael.nn.functional.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=False, enable_gqa=True)
    ty = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), enable_gqa=True
    )
    np.testing.assert_allclose(_np(y), ty.numpy(), rtol=1e-12, atol=1e-13)
    with pytest.raises(kael.ShapeError, match="pass enable_gqa=True"):
        kael.nn.functional.scaled_dot_product_attention(_t(q), _t(k), _t(v))


def test_gqa_bad_head_counts_name_both() -> None:
    q, k = kael.randn(1, 6, 2, 4), kael.randn(1, 4, 3, 4)
    with pytest.raises(kael.ShapeError, match=r"the 6 query heads of q \[1, 6, 2, 4\] are not a multiple of the 4"):
        kael.attention(q, k, k)
    with pytest.raises(kael.ShapeError, match="do not fit"):
        kael.attention(q, kael.randn(1, 2, 3, 4), kael.randn(1, 3, 3, 4))
