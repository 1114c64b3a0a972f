"""batch_norm / batch_norm_backward on emulated cuda (kael_backend_cuda/_batch_norm.py): the backend's own kernels
run, with torch's outputs, gradients and running statistics."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from kael.nn import functional as F

TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 5e-3, "bfloat16": 3e-2}


def _record(seen: list[str], op: str, k: Any) -> Any:
    seen.append(op)
    return k


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (3, 2, 4, 5)])
def test_batch_norm_kernels(emulate: Any, dtype: str, shape: tuple[int, ...]) -> None:
    assert {"batch_norm", "batch_norm_backward"} <= set(emulate.supported_ops())
    rng = np.random.default_rng(0)
    c = shape[1]
    x, w, b = rng.uniform(-2, 2, shape) + 1, rng.uniform(0.5, 1.5, c), rng.uniform(-1, 1, c)
    g = rng.uniform(-1, 1, shape)
    kd = getattr(kael, dtype)
    # the values torch sees are the ones rounded to dtype
    xr, wr, br = (kael.tensor(v, dtype=kd).to(dtype=kael.float64).numpy() for v in (x, w, b))
    xt, wt, bt = (kael.tensor(v, dtype=kd, device="cuda", requires_grad=True) for v in (x, w, b))
    sd = kael.float64 if dtype == "float64" else kael.float32  # running statistics' dtype
    rm, rv = kael.zeros(c, dtype=sd, device="cuda"), kael.ones(c, dtype=sd, device="cuda")
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, bk, k: _record(seen, op, k))
    try:
        y = F.batch_norm(xt, rm, rv, wt, bt, training=True, momentum=0.3)
        y.backward(kael.tensor(g, dtype=kd, device="cuda"))
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert "batch_norm" in seen and "batch_norm_backward" in seen, seen
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (xr, wr, br))
    trm, trv = torch.zeros(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64)
    ty = torch.nn.functional.batch_norm(tx, trm, trv, tw, tb, training=True, momentum=0.3)
    ty.backward(torch.tensor(kael.tensor(g, dtype=kd).to(dtype=kael.float64).numpy()))
    tol = max(TOL[dtype], 1e-6)
    for got, want in ((y, ty), (xt.grad, tx.grad), (wt.grad, tw.grad), (bt.grad, tb.grad), (rm, trm), (rv, trv)):
        assert got is not None and want is not None
        np.testing.assert_allclose(
            got.detach().to(dtype=kael.float64).cpu().numpy(), want.detach().numpy(), rtol=tol, atol=tol * 10
        )


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_batch_norm_eval_kernel(emulate: Any, dtype: str) -> None:
    assert "batch_norm_eval" in emulate.supported_ops()
    rng = np.random.default_rng(1)
    x, w, b = rng.uniform(-2, 2, (2, 3, 4, 5)), rng.uniform(0.5, 1.5, 3), rng.uniform(-1, 1, 3)
    rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2, 3)
    kd = getattr(kael, dtype)
    sd = kael.float64 if dtype == "float64" else kael.float32
    xt = kael.tensor(x, dtype=kd, device="cuda")
    args = [kael.tensor(v, dtype=kd, device="cuda") for v in (w, b)]
    stats = [kael.tensor(v, dtype=sd, device="cuda") for v in (rm, rv)]
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, bk, k: _record(seen, op, k))
    try:
        y = F.batch_norm(xt, stats[0], stats[1], args[0], args[1], training=False, eps=1e-3)
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert "batch_norm_eval" in seen, seen
    xr = kael.tensor(x, dtype=kd).to(dtype=kael.float64).numpy()
    wr, br = (kael.tensor(v, dtype=kd).to(dtype=kael.float64).numpy() for v in (w, b))
    want = (xr - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-3) * wr[:, None, None] + br[:, None, None]
    tol = max(TOL[dtype], 1e-6)
    np.testing.assert_allclose(y.to(dtype=kael.float64).cpu().numpy(), want, rtol=tol, atol=tol * 10)
