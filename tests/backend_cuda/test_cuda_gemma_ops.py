"""The Gemma family's ops on emulated cuda: the backend's own gelu_tanh_mul and softcap kernels run,
with the right values (float64 NumPy formulas written here), 16-bit roundings (PyTorch's
``gelu(gate, approximate="tanh") * up`` and ``(x / cap).tanh() * cap``) and gradients."""

from __future__ import annotations

import math

import kael
import numpy as np
import pytest
from cuda_ops_helpers import TOL, ops_seen, to_cuda, to_host

K = math.sqrt(2 / math.pi)


def _gelu(g: np.ndarray) -> np.ndarray:
    return 0.5 * g * (1 + np.tanh(K * (g + 0.044715 * g**3)))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_gelu_tanh_mul_kernel(emulate, dtype):
    assert {"gelu_tanh_mul", "softcap"} <= set(emulate.supported_ops())
    rng = np.random.default_rng(2)
    g, u = rng.standard_normal((5, 6)) * 4, rng.standard_normal((6,))
    gt, ut = to_cuda(g, dtype), to_cuda(u, dtype)
    y, seen = ops_seen(lambda: kael.gelu_tanh_mul(gt.T.contiguous().T, ut))  # strided gate, broadcast up
    assert "gelu_tanh_mul" in seen and "tanh" not in seen, seen
    assert y.device.type == "cuda" and y.dtype is getattr(kael, dtype)
    gr, ur = to_host(gt), to_host(ut)
    np.testing.assert_allclose(to_host(y), _gelu(gr) * ur, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_rounding_matches_torch(emulate, dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, u = rng.standard_normal((4, 64)) * 40, rng.standard_normal((4, 64))
    td = getattr(torch, dtype)
    want = ((torch.tensor(x, dtype=td) / 50.0).tanh() * 50.0).double().numpy()
    np.testing.assert_array_equal(to_host(kael.softcap(to_cuda(x, dtype), 50.0)), want)
    g = x / 13
    want = (
        torch.nn.functional.gelu(torch.tensor(g, dtype=td), approximate="tanh") * torch.tensor(u, dtype=td)
    ).double()
    got = to_host(kael.gelu_tanh_mul(to_cuda(g, dtype), to_cuda(u, dtype)))
    ulp = {"bfloat16": 2.0**-7, "float16": 2.0**-10}[dtype]
    np.testing.assert_allclose(got, want.numpy(), rtol=ulp, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_softcap_kernel(emulate, dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 8)) * 60
    xt = to_cuda(x, dtype)
    y, seen = ops_seen(lambda: kael.softcap(xt.T, 30.0))  # a transposed view
    assert "softcap" in seen and "tanh" not in seen, seen
    np.testing.assert_allclose(to_host(y), 30.0 * np.tanh(to_host(xt).T / 30.0), rtol=TOL[dtype], atol=TOL[dtype] * 30)


def test_gradients_on_cuda(emulate):
    rng = np.random.default_rng(5)
    g, u, x = rng.standard_normal((3, 4)) * 2, rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) * 3
    gt, ut, xt = to_cuda(g, "float64", True), to_cuda(u, "float64", True), to_cuda(x, "float64", True)
    (kael.gelu_tanh_mul(gt, ut).sum() + kael.softcap(xt, 2.0).sum()).backward()
    t = np.tanh(K * (g + 0.044715 * g**3))
    dgelu = 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * K * (1 + 3 * 0.044715 * g * g)
    np.testing.assert_allclose(to_host(gt.grad), u * dgelu, rtol=1e-12)
    np.testing.assert_allclose(to_host(ut.grad), _gelu(g), rtol=1e-12)
    np.testing.assert_allclose(to_host(xt.grad), 1 - np.tanh(x / 2.0) ** 2, rtol=1e-12)
