"""max_pool2d / max_pool2d_backward on emulated cuda (kael_backend_cuda/_pool.py): the backend's own kernels run,
with torch's values, indices and gradients. The CUDA sources are compiled by tests/scripts/test_cuda_compile.py.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from kael.nn import functional as F


def _record(seen: list[str], op: str, k: Any) -> Any:
    seen.append(op)
    return k


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("args", [(2, 2, 0, 1, False), (3, 2, 1, 1, True), ((3, 2), (1, 2), (1, 0), (2, 1), False)])
def test_max_pool2d_kernels(emulate: Any, dtype: str, args: tuple[Any, ...]) -> None:
    assert {"max_pool2d", "max_pool2d_backward"} <= set(emulate.supported_ops())
    rng = np.random.default_rng(0)
    x = np.round(rng.standard_normal((2, 3, 9, 8)) * 2) / 2  # ties
    kd = getattr(kael, dtype)
    xt = kael.tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), dtype=kd, device="cuda").permute(0, 3, 1, 2)
    xt.requires_grad_(True)
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: _record(seen, op, k))
    try:
        k, s, p, d, cm = args
        y, i = F.max_pool2d(xt, k, s, p, d, cm, return_indices=True)
        g = np.round(rng.standard_normal(y.shape) * 4) / 4
        y.backward(kael.tensor(g, dtype=kd, device="cuda"))
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert "max_pool2d" in seen and "max_pool2d_backward" in seen and "scatter_add" not in seen, seen
    tx = torch.tensor(x, requires_grad=True)
    ty, ti = torch.nn.functional.max_pool2d(tx, *args, return_indices=True)
    ty.backward(torch.tensor(g))
    assert y.device.type == "cuda" and y.dtype is kd and xt.grad is not None and tx.grad is not None
    np.testing.assert_array_equal(y.detach().to(dtype=kael.float64).cpu().numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(i.cpu().numpy(), ti.numpy())
    np.testing.assert_allclose(xt.grad.to(dtype=kael.float64).cpu().numpy(), tx.grad.numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize(
    "args", [(2, 2, 0, False, True, None), (3, 2, 1, True, False, None), ((3, 2), (2, 1), (1, 0), True, True, 5)]
)
def test_avg_pool2d_kernels(emulate: Any, dtype: str, args: tuple[Any, ...]) -> None:
    assert {"avg_pool2d", "avg_pool2d_backward"} <= set(emulate.supported_ops())
    rng = np.random.default_rng(1)
    kd = getattr(kael, dtype)
    x = kael.tensor(rng.uniform(-1, 1, (2, 3, 7, 6)), dtype=kd).to(dtype=kael.float64).numpy()  # values of kd
    xt = kael.tensor(x, dtype=kd, device="cuda", requires_grad=True)
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: _record(seen, op, k))
    try:
        y = F.avg_pool2d(xt, *args)
        y.sum().backward()
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert "avg_pool2d" in seen and "avg_pool2d_backward" in seen, seen
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.avg_pool2d(tx, *args)
    ty.sum().backward()
    assert xt.grad is not None and tx.grad is not None
    tol = 2e-3 if dtype == "float16" else 1e-6
    np.testing.assert_allclose(y.detach().to(dtype=kael.float64).cpu().numpy(), ty.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(xt.grad.to(dtype=kael.float64).cpu().numpy(), tx.grad.numpy(), rtol=tol, atol=tol)
