"""The Llama family's ops on emulated cuda: the backend's own kernels run, with the right values and gradients.

Oracles are float64 NumPy formulas written here (not kael's host kernels): rms_norm,
rotate-half rope over position-indexed tables, silu(gate) * up, and grouped-query
attention computed over K/V repeated by hand (Hugging Face's ``repeat_kv``).
"""

from __future__ import annotations

import kael
import numpy as np
import pytest
from cuda_ops_helpers import TOL, ops_seen, to_cuda, to_host


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_rms_norm_kernel(emulate, dtype):
    assert {"rms_norm", "rope", "silu_mul", "attention"} <= set(emulate.supported_ops())
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4, 16)) * 3, rng.standard_normal(16)
    xt, wt = to_cuda(x, dtype), to_cuda(w, dtype)
    y, seen = ops_seen(lambda: kael.rms_norm(xt.transpose(0, 1), wt, 1e-5))  # a non-contiguous operand
    assert "rms_norm" in seen and "sum" not in seen, seen
    xr, wr = to_host(xt).transpose(1, 0, 2), to_host(wt)
    want = xr / np.sqrt(np.mean(xr * xr, axis=-1, keepdims=True) + 1e-5) * wr
    assert y.dtype is getattr(kael, dtype) and y.device.type == "cuda"
    np.testing.assert_allclose(to_host(y), want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_rope_kernel_and_its_gradient(emulate, dtype):
    rng = np.random.default_rng(1)
    b, t, h, d, p = 2, 3, 4, 8, 10
    x = rng.standard_normal((b, t, h, d))  # [B, T, H, D] storage, viewed [B, H, T, D]
    ang = rng.uniform(-3, 3, (p, d // 2))
    pos = np.array([[0, 1, 2], [7, 8, 9]])
    xt = to_cuda(x, dtype, grad=True)
    cos, sin = to_cuda(np.cos(ang)), to_cuda(np.sin(ang))
    y, seen = ops_seen(lambda: kael.rope(xt.permute(0, 2, 1, 3), cos, sin, kael.tensor(pos, device="cuda")))
    assert "rope" in seen and "index_select" not in seen, seen
    xr = to_host(xt).transpose(0, 2, 1, 3)
    c, s = to_host(cos)[pos][:, None], to_host(sin)[pos][:, None]  # the float32 tables' values
    x1, x2 = xr[..., : d // 2], xr[..., d // 2 :]
    want = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    np.testing.assert_allclose(to_host(y), want, rtol=TOL[dtype], atol=TOL[dtype])
    g = rng.standard_normal(y.shape)
    (y * to_cuda(g, dtype)).sum().backward()
    gr = to_host(to_cuda(g, dtype))
    g1, g2 = gr[..., : d // 2], gr[..., d // 2 :]
    dx = np.concatenate([g1 * c + g2 * s, g2 * c - g1 * s], -1)  # the rotation transposed
    np.testing.assert_allclose(to_host(xt.grad).transpose(0, 2, 1, 3), dx, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_silu_mul_kernel(emulate, dtype):
    rng = np.random.default_rng(2)
    g, u = rng.standard_normal((5, 6)) * 4, rng.standard_normal((6,))
    gt, ut = to_cuda(g, dtype), to_cuda(u, dtype)
    y, seen = ops_seen(lambda: kael.silu_mul(gt.T.contiguous().T, ut))  # strided gate, broadcast up
    assert "silu_mul" in seen and "sigmoid" not in seen, seen
    gr, ur = to_host(gt), to_host(ut)
    np.testing.assert_allclose(to_host(y), gr / (1 + np.exp(-gr)) * ur, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize(("heads", "kv_heads", "tq"), [(4, 2, 3), (6, 1, 1), (6, 3, 1)])
def test_grouped_query_attention(emulate, dtype, heads, kv_heads, tq):
    rng = np.random.default_rng(heads + kv_heads + tq)
    tk = 5
    q = rng.standard_normal((2, heads, tq, 4))
    k, v = rng.standard_normal((2, kv_heads, tk, 4)), rng.standard_normal((2, kv_heads, tk, 3))
    lengths = [5, 4]
    qt, kt, vt = to_cuda(q, dtype), to_cuda(k, dtype), to_cuda(v, dtype)
    y, seen = ops_seen(lambda: kael.attention(qt, kt, vt, causal=True, lengths=kael.tensor(lengths, device="cuda")))
    assert "attention" in seen, seen
    # the oracle: every query head against its kv head's K/V repeated (repeat_kv), masked softmax in float64
    g = heads // kv_heads
    kr, vr = np.repeat(to_host(kt), g, axis=1), np.repeat(to_host(vt), g, axis=1)
    s = to_host(qt) @ kr.swapaxes(-1, -2) / 2.0
    ki, qi = np.arange(tk)[None, :], np.arange(tq)[:, None]
    masked = (ki > qi + tk - tq)[None, None] | (ki >= np.array(lengths)[:, None])[:, None, None, :]
    s = np.where(masked, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vr
    np.testing.assert_allclose(to_host(y), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_grouped_query_attention_gradients(emulate):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((1, 4, 3, 2)), rng.standard_normal((1, 2, 4, 2)), rng.standard_normal((1, 2, 4, 2))
    kq, kk, kv = (to_cuda(a, "float64", grad=True) for a in (q, k, v))
    y = kael.attention(kq, kk, kv, causal=True)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    mask = torch.ones(3, 4, dtype=torch.bool).tril(diagonal=1)
    ty = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, enable_gqa=True)
    np.testing.assert_allclose(to_host(y), ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    w = rng.standard_normal(y.shape)
    (y * to_cuda(w, "float64")).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    for a, b in ((kq, tq), (kk, tk), (kv, tv)):
        np.testing.assert_allclose(to_host(a.grad), b.grad.numpy(), rtol=1e-10, atol=1e-12)
