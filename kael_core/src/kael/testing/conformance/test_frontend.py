"""Frontend ops end to end on the backend's device, against NumPy: the backend as users see it."""

from __future__ import annotations

from typing import Any

import numpy as np

import kael
from kael.testing import assert_close

A = np.arange(12, dtype=np.float32).reshape(3, 4) / 4 - 1


def _t(x: Any, device: Any, **kw: Any) -> Any:
    return kael.tensor(x, device=device, **kw)


def test_promotion_and_broadcast(kael_device: Any) -> None:
    i = _t([1, 2, 3], kael_device, dtype=kael.int32)
    r = i + 2.5
    assert r.dtype is kael.float32 and r.device == kael_device
    assert_close(r, np.array([3.5, 4.5, 5.5], np.float32))
    f = _t(A, kael_device)
    assert (f * 2.0).dtype is kael.float32 and (f * _t(2.0, kael_device, dtype=kael.float64)).dtype is kael.float32
    assert_close(f - _t([[1.0], [2.0], [3.0]], kael_device), A - np.array([[1.0], [2.0], [3.0]], np.float32))
    assert_close(i / 2, np.array([0.5, 1.0, 1.5], np.float32))


def test_reductions(kael_device: Any) -> None:
    f = _t(A, kael_device)
    assert_close(f.sum(), A.sum())
    assert_close(f.mean(1, keepdim=True), A.mean(1, keepdims=True))
    v, i = kael.max(f, 0)
    assert_close(v, A.max(0))
    assert i.tolist() == A.argmax(0).tolist()
    assert_close(f.var(1), A.var(1, ddof=1), rtol=1e-5)
    assert kael.any(f > 1.5).item() is True and kael.all(f > -2).item() is True
    assert_close(_t(np.zeros((0, 3), np.float32), kael_device).sum(0), np.zeros(3, np.float32))


def test_matmul_broadcast(kael_device: Any) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    assert_close(_t(a, kael_device) @ _t(b, kael_device), a @ b, rtol=1e-5, atol=1e-5)
    assert_close(_t(a, kael_device).mT @ _t(a, kael_device), a.transpose(0, 2, 1) @ a, rtol=1e-5, atol=1e-5)


def test_indexing_and_setitem(kael_device: Any) -> None:
    f = _t(A, kael_device)
    assert_close(f[1:, ::2], A[1:, ::2])
    assert_close(f[_t([2, 0], kael_device)], A[[2, 0]])
    assert_close(f[f > 0.5], A[A > 0.5])
    g = f.clone()
    v0 = g._version()
    g[0, 1] = 7.0
    g[_t([True, False, True], kael_device)] = 0.0
    want = A.copy()
    want[0, 1] = 7.0
    want[[0, 2]] = 0.0
    assert_close(g, want)
    assert g._version() > v0


def test_views_share_storage_and_inplace(kael_device: Any) -> None:
    f = _t(A, kael_device).clone()
    v = f.T[1:3]
    assert v.data_ptr() != 0 and v.untyped_storage() is f.untyped_storage()
    v.add_(10.0)
    want = A.copy()
    want.T[1:3] += 10
    assert_close(f, want)
    f.zero_()
    assert_close(f, np.zeros_like(A))


def test_cat_stack_split_where_clamp(kael_device: Any) -> None:
    f = _t(A, kael_device)
    assert_close(kael.cat([f, f[:1]], 0), np.concatenate([A, A[:1]], 0))
    assert_close(kael.stack([f, f], 1), np.stack([A, A], 1))
    assert [p.shape for p in f.split(3, 1)] == [(3, 3), (3, 1)]
    assert_close(kael.where(f > 0, f, 0.0), np.where(A > 0, A, 0).astype(np.float32))
    assert_close(kael.clamp(f, -0.5, 0.5), np.clip(A, -0.5, 0.5))


def test_softmax_topk_nonzero(kael_device: Any) -> None:
    f = _t(A, kael_device)
    e = np.exp(A - A.max(1, keepdims=True))
    assert_close(kael.softmax(f, 1), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    vals, idx = kael.topk(f, 2)
    assert_close(vals, np.sort(A, 1)[:, ::-1][:, :2])
    assert idx.tolist() == [[3, 2]] * 3
    assert kael.nonzero(f > 1).tolist() == np.argwhere(A > 1).tolist()


def test_dtype_casts_and_host_transfer(kael_device: Any) -> None:
    f = _t(A, kael_device)
    for d in (kael.float16, kael.bfloat16, kael.float64, kael.int32, kael.bool):
        c = f.to(d)
        assert c.dtype is d and c.device == kael_device
        want = A if d is kael.bfloat16 else A.astype(d.np).astype(np.float32)  # A's values are exact in bfloat16
        assert_close(c.to(kael.float32), want, rtol=0, atol=0)
    assert f.to("cpu").tolist() == A.tolist()
    assert f[1, 2].item() == float(A[1, 2])


def test_zero_dim_and_empty(kael_device: Any) -> None:
    s = _t(3.0, kael_device)
    assert s.shape == () and (s * 2).item() == 6.0 and (s + _t([1.0], kael_device)).shape == (1,)
    e = kael.zeros(0, 4, device=kael_device)
    assert (e + 1).shape == (0, 4) and (e @ kael.ones(4, 2, device=kael_device)).shape == (0, 2)
    assert kael.ones(3, 0, device=kael_device).sum(1).tolist() == [0.0, 0.0, 0.0]


def test_random_creation(kael_device: Any) -> None:
    kael.manual_seed(0)
    a = kael.randn(100, device=kael_device)
    kael.manual_seed(0)
    b = kael.randn(100, device=kael_device)
    assert a.device == kael_device and a.tolist() == b.tolist()
    u = kael.rand(1000, device=kael_device)
    assert 0 <= kael.amin(u).item() and kael.amax(u).item() < 1


def test_llama_ops(kael_device: Any) -> None:
    """rms_norm, rope, silu_mul, gelu_tanh_mul, softcap and grouped-query attention through the frontend, against
    NumPy formulas."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    want = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * w
    assert_close(kael.rms_norm(_t(x, kael_device), _t(w, kael_device)), want, rtol=1e-5, atol=1e-6)
    h = rng.standard_normal((2, 4, 3, 6)).astype(np.float32)  # [B, H, T, D]
    ang = np.arange(5)[:, None] * 10000.0 ** (-np.arange(3) / 3)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = np.array([[0, 1, 2], [2, 3, 4]])
    c, s = cos[pos][:, None], sin[pos][:, None]
    rot = np.concatenate([h[..., :3] * c - h[..., 3:] * s, h[..., 3:] * c + h[..., :3] * s], -1)
    got = kael.rope(_t(h, kael_device), _t(cos, kael_device), _t(sin, kael_device), _t(pos, kael_device))
    assert_close(got, rot, rtol=1e-5, atol=1e-6)
    g, u = x * 3, x[::-1].copy()
    assert_close(kael.silu_mul(_t(g, kael_device), _t(u, kael_device)), g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)
    geglu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
    assert_close(kael.gelu_tanh_mul(_t(g, kael_device), _t(u, kael_device)), geglu, rtol=1e-5, atol=1e-5)
    assert_close(kael.softcap(_t(g * 20, kael_device), 30.0), 30.0 * np.tanh(g * 20 / 30.0), rtol=1e-5, atol=1e-5)
    k, v = rng.standard_normal((2, 2, 5, 6)).astype(np.float32), rng.standard_normal((2, 2, 5, 6)).astype(np.float32)
    sc = h @ np.repeat(k, 2, axis=1).swapaxes(-1, -2) / np.sqrt(6)  # query head i reads kv head i // 2
    sc = np.where(np.arange(5)[None, :] > np.arange(3)[:, None] + 2, -np.inf, sc)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ np.repeat(v, 2, axis=1)
    got = kael.attention(_t(h, kael_device), _t(k, kael_device), _t(v, kael_device), causal=True)
    assert_close(got, want, rtol=1e-5, atol=1e-5)
