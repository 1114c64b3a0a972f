"""kael.ops._batch_norm_fused: training-mode batch norm as a fused catalogue op (NOTE [batch_norm fused op]).

nn.BatchNorm1d/2d against torch (outputs, input/weight/bias gradients, running statistics
over several steps, then eval) on hypothesis-drawn shapes, momentum and eps, through the
active CPU backend's kernels and through a backend without them (the decompositions);
the decompositions against float64 NumPy; which ops run; float64 gradcheck; errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
import torch
from decomposition_backend import modes
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import nn
from kael.nn import functional as F
from kael.ops._batch_norm_fused import batch_norm_backward_decomp, batch_norm_decomp
from kael.testing import gradcheck


@pytest.fixture(params=["fused_kernel", "decomposition"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The current CPU backend, then a reference backend without fused kernels (so: the decompositions)."""
    yield from modes(request.param, "bn_decomposition")


def _grad(t: Any) -> np.ndarray:
    assert t.grad is not None
    return np.asarray(t.grad.detach().numpy())


def _pair(c: int, nd: int, momentum: float, eps: float, affine: bool) -> tuple[Any, Any]:
    tm = (torch.nn.BatchNorm1d if nd <= 3 else torch.nn.BatchNorm2d)(c, eps, momentum, affine).double()
    km = (nn.BatchNorm1d if nd <= 3 else nn.BatchNorm2d)(c, eps, momentum, affine).to(dtype=kael.float64)
    if affine:
        with torch.no_grad():
            tm.weight.uniform_(0.5, 1.5)
            tm.bias.uniform_(-1, 1)
    km.load_state_dict({k: kael.tensor(v.detach().numpy().copy()) for k, v in tm.state_dict().items()})
    return km, tm


@given(
    shape=st.sampled_from([(4, 3), (2, 3, 5), (3, 2, 4, 5), (1, 4, 3, 3), (5, 1, 2, 2)]),
    momentum=st.sampled_from([0.1, 0.5]),
    eps=st.sampled_from([1e-5, 1e-2]),
    affine=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=20, deadline=None)
def test_batch_norm_modules_match_torch(
    shape: tuple[int, ...], momentum: float, eps: float, affine: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    km, tm = _pair(shape[1], len(shape), momentum, eps, affine)
    for _step in range(2):
        x = rng.standard_normal(shape) * 3 + 1
        g = rng.standard_normal(shape)
        kx, tx = kael.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y, ty = km(kx), tm(tx)
        y.backward(kael.tensor(g))
        ty.backward(torch.tensor(g))
        np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(_grad(kx), _grad(tx), rtol=1e-9, atol=1e-9)
    if affine:
        np.testing.assert_allclose(_grad(km.weight), _grad(tm.weight), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(_grad(km.bias), _grad(tm.bias), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(km.running_mean.numpy(), tm.running_mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(km.running_var.numpy(), tm.running_var.numpy(), rtol=1e-9, atol=1e-12)
    km.eval()
    tm.eval()
    x = rng.standard_normal(shape)
    np.testing.assert_allclose(
        km(kael.tensor(x)).detach().numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-10, atol=1e-10
    )


def test_decompositions_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x, w, b, g = (
        rng.standard_normal((3, 4, 5)),
        rng.standard_normal(4),
        rng.standard_normal(4),
        rng.standard_normal((3, 4, 5)),
    )
    out, mean, rstd = batch_norm_decomp(kael.tensor(x), kael.tensor(w), kael.tensor(b), 1e-3)
    mu, var = x.mean((0, 2)), x.var((0, 2))
    xhat = (x - mu[:, None]) / np.sqrt(var[:, None] + 1e-3)
    np.testing.assert_allclose(out.numpy(), xhat * w[:, None] + b[:, None], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean.numpy(), mu, rtol=1e-12)
    np.testing.assert_allclose(rstd.numpy(), 1 / np.sqrt(var + 1e-3), rtol=1e-12)
    dx, dw, db = batch_norm_backward_decomp(kael.tensor(g), kael.tensor(x), mean, rstd, kael.tensor(w))
    m = 15
    gw = g * w[:, None]
    want = (gw - gw.sum((0, 2), keepdims=True)[0] / m - xhat * (gw * xhat).sum((0, 2), keepdims=True)[0] / m) / np.sqrt(
        var[:, None] + 1e-3
    )
    np.testing.assert_allclose(dx.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dw.numpy(), (g * xhat).sum((0, 2)), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db.numpy(), g.sum((0, 2)), rtol=1e-12, atol=1e-12)


def _record(seen: list[str], op: str, k: Any) -> Any:
    seen.append(op)
    return k


def test_training_runs_the_fused_ops_and_gradchecks(mode: str) -> None:
    rng = np.random.default_rng(1)
    x = kael.tensor(rng.standard_normal((3, 2, 4, 3)), requires_grad=True)
    w = kael.tensor(rng.uniform(0.5, 1.5, 2), requires_grad=True)
    b = kael.tensor(rng.standard_normal(2), requires_grad=True)
    fused = "batch_norm" in kael.backends.current("cpu").supported_ops()
    assert not (mode == "decomposition" and fused)
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, bk, k: _record(seen, op, k))
    try:
        F.batch_norm(x, None, None, w, b, training=True).sum().backward()
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert ("batch_norm" in seen and "batch_norm_backward" in seen) == fused, seen
    assert gradcheck(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=1e-3), [x, w, b])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_narrow_dtypes(mode: str, dtype: str) -> None:
    x = np.random.default_rng(2).uniform(-2, 2, (4, 3, 5, 5))
    kd = getattr(kael, dtype)
    got = F.batch_norm(kael.tensor(x).to(dtype=kd), None, None, training=True)
    assert got.dtype is kd
    want = torch.nn.functional.batch_norm(torch.tensor(x), None, None, training=True).numpy()
    tol = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 3e-2}[dtype]
    np.testing.assert_allclose(got.to(dtype=kael.float64).numpy(), want, rtol=tol, atol=tol)


def test_bad_arguments_raise_kael_errors() -> None:
    with pytest.raises(kael.ShapeError, match="batch_norm: expected more than 1 value per channel when training"):
        F.batch_norm(kael.zeros(1, 3), None, None, training=True)
    with pytest.raises(kael.ShapeError, match=r"batch_norm: weight must have shape \[3\]"):
        F.batch_norm(kael.zeros(2, 3), None, None, kael.ones(4), training=True)
    with pytest.raises(kael.DTypeError, match="batch_norm: weight and bias must have input's dtype"):
        F.batch_norm(kael.zeros(2, 3), None, None, kael.ones(3, dtype=kael.float64), training=True)


def test_eval_mode_runs_batch_norm_eval_with_torch_gradients(mode: str) -> None:
    rng = np.random.default_rng(5)
    km, tm = _pair(3, 4, 0.1, 1e-3, True)
    with kael.no_grad():
        km.running_mean.copy_(kael.tensor(rng.standard_normal(3)))
        km.running_var.copy_(kael.tensor(rng.uniform(0.5, 2, 3)))
    tm.running_mean.copy_(torch.tensor(km.running_mean.numpy()))
    tm.running_var.copy_(torch.tensor(km.running_var.numpy()))
    km.eval()
    tm.eval()
    x, g = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 3, 4, 4))
    kx, tx = kael.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, bk, k: _record(seen, op, k))
    try:
        y = km(kx)
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    fused = "batch_norm_eval" in kael.backends.current("cpu").supported_ops()
    assert ("batch_norm_eval" in seen) == fused, seen
    ty = tm(tx)
    y.backward(kael.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    for a, b in ((kx, tx), (km.weight, tm.weight), (km.bias, tm.bias)):
        np.testing.assert_allclose(_grad(a), _grad(b), rtol=1e-10, atol=1e-12)
    w = kael.tensor(rng.uniform(0.5, 1.5, 3), requires_grad=True)
    b = kael.tensor(rng.standard_normal(3), requires_grad=True)
    rm, rv = km.running_mean, km.running_var
    assert gradcheck(lambda x, w, b: F.batch_norm(x, rm, rv, w, b, training=False), [kx, w, b])
