"""conv2d / conv2d_backward on emulated cuda (kael_backend_cuda/_conv.py): the backend's own kernels run,
with torch's values and gradients; the raw kernels' NumPy twins (im2col, col2im) are each other's adjoints.

The CUDA sources themselves are compiled for sm_80/sm_90 by tests/scripts/test_cuda_compile.py.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from kael.nn import functional as F

TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-2, "bfloat16": 1e-1}


def _record(seen: list[str], op: str, k: Any) -> Any:
    seen.append(op)
    return k


def _ops_seen(fn: Any) -> tuple[Any, list[str]]:
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: _record(seen, op, k))
    try:
        return fn(), seen
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)


def _host(t: kael.Tensor | None) -> np.ndarray:
    assert t is not None
    return np.asarray(t.detach().to(dtype=kael.float64).cpu(), dtype=np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "attrs", [((1, 1), (1, 1), (1, 1), 1), ((2, 1), (0, 2), (1, 2), 2), ((1, 2), (1, 0), (2, 1), 4)]
)
def test_conv2d_forward_and_backward_kernels(emulate: Any, dtype: str, attrs: tuple[Any, ...]) -> None:
    assert {"conv2d", "conv2d_backward"} <= set(emulate.supported_ops())
    s, p, d, g = attrs
    rng = np.random.default_rng(0)
    x, w, b = rng.uniform(-1, 1, (2, 4, 7, 6)), rng.uniform(-1, 1, (8, 4 // g, 3, 2)), rng.uniform(-1, 1, 8)
    kd = getattr(kael, dtype)
    xt = kael.tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), dtype=kd, device="cuda").permute(0, 3, 1, 2)
    xt.requires_grad_(True)
    wt, bt = (kael.tensor(v, dtype=kd, device="cuda", requires_grad=True) for v in (w, b))
    y, seen = _ops_seen(lambda: F.conv2d(xt, wt, bt, s, p, d, g))
    assert "conv2d" in seen and "matmul" not in seen, seen
    tx, tw, tb = (torch.tensor(_host(t), requires_grad=True) for t in (xt, wt, bt))
    ty = torch.nn.functional.conv2d(tx, tw, tb, s, p, d, g)
    gr = rng.uniform(-1, 1, tuple(ty.shape))
    ty.backward(torch.tensor(gr))
    _, seen = _ops_seen(lambda: y.backward(kael.tensor(gr, dtype=kd, device="cuda")))
    assert "conv2d_backward" in seen, seen
    assert y.dtype is kd and y.device.type == "cuda"
    for got, want in ((y, ty), (xt.grad, tx.grad), (wt.grad, tw.grad), (bt.grad, tb.grad)):
        assert want is not None
        np.testing.assert_allclose(_host(got), want.detach().numpy(), rtol=TOL[dtype], atol=TOL[dtype])


def test_im2col_and_col2im_twins_are_adjoint(emulate: Any) -> None:
    from kael_backend_cuda import _conv

    rng = np.random.default_rng(1)
    g = (2, 3, 6, 5, 3, 2, 3, 4, 2, 1, 1, 1, 1, 2)  # n c h w kh kw oh ow sh sw ph pw dh dw
    n, c, h, w, kh, kw, oh, ow = g[:8]
    x, y = rng.standard_normal((n, c, h, w)), rng.standard_normal((c * kh * kw, n * oh * ow))
    cols, back = np.empty_like(y), np.empty_like(x)
    _conv.im2col(x, cols, g)
    _conv.col2im(y, back, g)
    np.testing.assert_allclose(np.vdot(cols, y), np.vdot(x, back), rtol=1e-12)  # <Ax, y> == <x, A^T y>


def test_empty_batch(emulate: Any) -> None:
    x = kael.zeros(0, 2, 5, 5, device="cuda", requires_grad=True)
    w = kael.ones(3, 2, 3, 3, device="cuda", requires_grad=True)
    y = F.conv2d(x, w)
    assert y.shape == (0, 3, 3, 3)
    y.sum().backward()
    np.testing.assert_array_equal(_host(w.grad), np.zeros((3, 2, 3, 3)))
