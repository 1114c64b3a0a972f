"""kael.ops._conv_fused: conv2d as a fused catalogue op (NOTE [conv2d fused op]).

Values and gradients against torch.nn.functional.conv2d (float64) on hypothesis-drawn
shapes, strides, paddings, dilations and groups, through the active CPU backend's fused
kernels and through a backend without them (the decompositions); the decompositions
called directly; float64 finite-difference gradchecks; which ops run (conv2d and
conv2d_backward, conv1d through conv2d); and argument errors.
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
from kael.nn import functional as F
from kael.ops._conv_fused import conv2d_backward_decomp, conv2d_decomp
from kael.testing import gradcheck


@pytest.fixture(params=["fused_kernel", "decomposition"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The current CPU backend, then a reference backend without fused kernels (so: the decompositions)."""
    yield from modes(request.param, "conv_decomposition")


@st.composite
def conv_cases(draw: Any) -> dict[str, Any]:
    g = draw(st.sampled_from([1, 1, 2, 3]))
    c, o = g * draw(st.integers(1, 3)), g * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    p = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h = draw(st.integers(max(1, d[0] * (kh - 1) + 1 - 2 * p[0]), 8))
    w = draw(st.integers(max(1, d[1] * (kw - 1) + 1 - 2 * p[1]), 8))
    n = draw(st.integers(1, 3))
    return {
        "x": (n, c, h, w),
        "w": (o, c // g, kh, kw),
        "stride": s,
        "padding": p,
        "dilation": d,
        "groups": g,
        "bias": draw(st.booleans()),
        "channels_last": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _torch_conv(case: dict[str, Any], x: np.ndarray, w: np.ndarray, b: np.ndarray | None, g: np.ndarray) -> list[Any]:
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True) if b is not None else None
    y = torch.nn.functional.conv2d(tx, tw, tb, case["stride"], case["padding"], case["dilation"], case["groups"])
    y.backward(torch.tensor(g))
    return [y.detach().numpy(), _grad(tx), _grad(tw), None if tb is None else _grad(tb)]


def _arrays(case: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    rng = np.random.default_rng(case["seed"])
    x, w = rng.standard_normal(case["x"]), rng.standard_normal(case["w"])
    b = rng.standard_normal(case["w"][0]) if case["bias"] else None
    s, p, d = case["stride"], case["padding"], case["dilation"]
    oh = (case["x"][2] + 2 * p[0] - d[0] * (case["w"][2] - 1) - 1) // s[0] + 1
    ow = (case["x"][3] + 2 * p[1] - d[1] * (case["w"][3] - 1) - 1) // s[1] + 1
    return x, w, b, rng.standard_normal((case["x"][0], case["w"][0], oh, ow))


def _leaf(v: np.ndarray, channels_last: bool = False) -> kael.Tensor:
    if channels_last:  # the same values stored [N, H, W, C], viewed back as [N, C, H, W]
        t = kael.tensor(np.ascontiguousarray(v.transpose(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return t.detach().requires_grad_(True)
    return kael.tensor(v, requires_grad=True)


@given(case=conv_cases())
@settings(max_examples=40, deadline=None)
def test_conv2d_matches_torch_values_and_gradients(case: dict[str, Any]) -> None:
    x, w, b, g = _arrays(case)
    want = _torch_conv(case, x, w, b, g)
    kx, kw = _leaf(x, case["channels_last"]), _leaf(w)
    kb = _leaf(b) if b is not None else None
    y = F.conv2d(kx, kw, kb, case["stride"], case["padding"], case["dilation"], case["groups"])
    y.backward(kael.tensor(g))
    got = [y.detach().numpy(), _grad(kx), _grad(kw), None if kb is None else _grad(kb)]
    for name, a, e in zip(("out", "dx", "dweight", "dbias"), got, want):
        if e is not None:
            np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-10, err_msg=name)


@given(case=conv_cases())
@settings(max_examples=25, deadline=None)
def test_decompositions_match_torch(case: dict[str, Any]) -> None:
    x, w, b, g = _arrays(case)
    want = _torch_conv(case, x, w, b, g)
    attrs = (case["stride"], case["padding"], case["dilation"], case["groups"])
    out = conv2d_decomp(kael.tensor(x), kael.tensor(w), None if b is None else kael.tensor(b), *attrs)
    dx, dw, db = conv2d_backward_decomp(kael.tensor(g), kael.tensor(x), kael.tensor(w), *attrs)
    np.testing.assert_allclose(out.numpy(), want[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx.numpy(), want[1], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dw.numpy(), want[2], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(db.numpy(), g.sum(axis=(0, 2, 3)), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "kw",
    [
        {"stride": 2, "padding": 1, "groups": 2},
        {"padding": "same", "dilation": (1, 2)},
        {"stride": (1, 2), "padding": (2, 0), "dilation": 2},
    ],
)
def test_conv2d_float64_gradcheck(mode: str, kw: dict[str, Any]) -> None:
    rng = np.random.default_rng(3)
    x = kael.tensor(rng.standard_normal((2, 4, 5, 6)), requires_grad=True)
    w = kael.tensor(rng.standard_normal((4, 4 // kw.get("groups", 1), 2, 3)), requires_grad=True)
    b = kael.tensor(rng.standard_normal(4), requires_grad=True)
    assert gradcheck(lambda x, w, b: F.conv2d(x, w, b, **kw), [x, w, b], name="conv2d")


def _grad(t: Any) -> np.ndarray:
    assert t.grad is not None
    return t.grad.numpy()


def _record(seen: list[str], op: str, k: Any) -> Any:
    seen.append(op)
    return k


def _ops_seen(fn: Any) -> list[str]:
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: _record(seen, op, k))
    try:
        fn()
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    return seen


def test_conv2d_and_conv1d_run_the_fused_ops_when_the_backend_has_them(mode: str) -> None:
    rng = np.random.default_rng(0)
    x = kael.tensor(rng.standard_normal((2, 3, 6, 7)), requires_grad=True)
    w = kael.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    x1 = kael.tensor(rng.standard_normal((2, 3, 9)), requires_grad=True)
    w1 = kael.tensor(rng.standard_normal((5, 3, 2)), requires_grad=True)
    fused = "conv2d" in kael.backends.current("cpu").supported_ops()
    assert not (mode == "decomposition" and fused)
    for run in (
        lambda: F.conv2d(x, w, padding=1).sum().backward(),
        lambda: F.conv1d(x1, w1, stride=2).sum().backward(),
    ):
        seen = _ops_seen(run)
        assert ("conv2d" in seen and "conv2d_backward" in seen) == fused, seen
        assert ("matmul" in seen) == (not fused), seen
    tx1, tw1 = (
        torch.tensor(x1.detach().numpy(), requires_grad=True),
        torch.tensor(w1.detach().numpy(), requires_grad=True),
    )
    torch.nn.functional.conv1d(tx1, tw1, stride=2).sum().backward()
    np.testing.assert_allclose(_grad(x1), _grad(tx1), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(_grad(w1), _grad(tw1), rtol=1e-10, atol=1e-10)


def test_only_the_wanted_gradients_are_computed(mode: str) -> None:
    rng = np.random.default_rng(1)
    x = kael.tensor(rng.standard_normal((2, 2, 5, 5)))
    w = kael.tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)
    b = kael.tensor(rng.standard_normal(3))
    F.conv2d(x, w, b, padding=1).sum().backward()
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    torch.nn.functional.conv2d(torch.tensor(x.numpy()), tw, torch.tensor(b.numpy()), padding=1).sum().backward()
    np.testing.assert_allclose(_grad(w), _grad(tw), rtol=1e-10, atol=1e-10)
    assert x.grad is None and b.grad is None


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_narrow_dtypes_match_torch_float32(mode: str, dtype: str) -> None:
    rng = np.random.default_rng(2)
    x, w = rng.uniform(-1, 1, (2, 3, 7, 6)), rng.uniform(-1, 1, (4, 3, 3, 3))
    want = torch.nn.functional.conv2d(
        torch.tensor(x, dtype=torch.float32), torch.tensor(w, dtype=torch.float32), None, 2, 1
    )
    kd = getattr(kael, dtype)
    got = F.conv2d(kael.tensor(x).to(dtype=kd), kael.tensor(w).to(dtype=kd), None, 2, 1)
    assert got.dtype is kd
    tol = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 1e-1}[dtype]
    np.testing.assert_allclose(got.to(dtype=kael.float32).numpy(), want.numpy(), rtol=tol, atol=tol)


def test_empty_batch_gives_empty_output_and_zero_weight_gradient(mode: str) -> None:
    x = kael.zeros(0, 3, 5, 5, dtype=kael.float64, requires_grad=True)
    w = kael.tensor(np.ones((2, 3, 3, 3)), requires_grad=True)
    b = kael.tensor(np.ones(2), requires_grad=True)
    y = F.conv2d(x, w, b)
    assert y.shape == (0, 2, 3, 3)
    y.sum().backward()
    np.testing.assert_array_equal(_grad(w), np.zeros((2, 3, 3, 3)))
    np.testing.assert_array_equal(_grad(b), np.zeros(2))


def test_bad_arguments_raise_kael_errors_naming_them() -> None:
    x, w = kael.zeros(1, 4, 5, 5), kael.zeros(2, 4, 3, 3)
    with pytest.raises(kael.ShapeError, match=r"conv2d: kernel_size \(8, 8\).*larger than the padded input \[7, 7\]"):
        F.conv2d(x, kael.zeros(2, 4, 8, 8), padding=1)
    with pytest.raises(kael.ShapeError, match="groups=3 must divide in_channels 4"):
        F.conv2d(x, kael.zeros(3, 4, 3, 3), groups=3)
    with pytest.raises(kael.ShapeError, match="stride must be an int >= 1"):
        F.conv2d(x, w, stride=-1)
    with pytest.raises(kael.ShapeError, match="padding must be an int >= 0"):
        F.conv2d(x, w, padding=(1, -1))
    with pytest.raises(kael.DTypeError, match="must share a dtype"):
        F.conv2d(x, w.to(dtype=kael.float64))
