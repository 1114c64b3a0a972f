"""kael.ops._pool_fused: max_pool2d as a fused catalogue op (NOTE [max_pool2d fused op]).

Values, indices and gradients against torch.nn.functional.max_pool2d / max_pool1d on
hypothesis-drawn shapes and windows (ceil_mode, padding, dilation, ties), through the
active CPU backend's kernels and through a backend without them (the decompositions);
NaN propagation; a window entirely in the padding (-inf, index -1); which ops run; argument errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
import torch
from decomposition_backend import modes
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kael.nn import functional as F


@pytest.fixture(params=["fused_kernel", "decomposition"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The current CPU backend, then a reference backend without fused kernels (so: the decompositions)."""
    yield from modes(request.param, "pool_decomposition")


@st.composite
def pool_cases(draw: Any) -> dict[str, Any]:
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    h = draw(st.integers(max(1, d[0] * (k[0] - 1) + 1 - 2 * p[0]), 9))
    w = draw(st.integers(max(1, d[1] * (k[1] - 1) + 1 - 2 * p[1]), 9))
    return {
        "x": (draw(st.integers(1, 3)), draw(st.integers(1, 3)), h, w),
        "args": (k, s, p, d, draw(st.booleans())),
        "seed": draw(st.integers(0, 2**16)),
    }


def _grad(t: Any) -> np.ndarray:
    assert t.grad is not None
    return np.asarray(t.grad.numpy())


@given(case=pool_cases())
@settings(max_examples=40, deadline=None)
def test_max_pool2d_matches_torch(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(case["seed"])
    x = np.round(rng.standard_normal(case["x"]) * 2) / 2  # steps of 0.5: ties, so the first maximum matters
    k, s, p, d, cm = case["args"]
    tx = torch.tensor(x, requires_grad=True)
    ty, ti = torch.nn.functional.max_pool2d(tx, k, s, p, d, cm, return_indices=True)
    # a dilated window can miss the input entirely (all padding): -inf, and torch's index is not in the plane
    assume(bool(torch.isfinite(ty).all()))
    g = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(g))
    kx = kael.tensor(x, requires_grad=True)
    y, i = F.max_pool2d(kx, k, s, p, d, cm, return_indices=True)
    y.backward(kael.tensor(g))
    np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    np.testing.assert_allclose(_grad(kx), _grad(tx), rtol=1e-12, atol=1e-12)


def _record(seen: list[str], op: str, k: Any) -> Any:
    seen.append(op)
    return k


def test_max_pool_runs_the_fused_ops_and_matches_torch_in_1d_and_unbatched(mode: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 7))
    fused = "max_pool2d" in kael.backends.current("cpu").supported_ops()
    assert not (mode == "decomposition" and fused)
    seen: list[str] = []
    kx = kael.tensor(x, requires_grad=True)
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: _record(seen, op, k))
    try:
        F.max_pool2d(kx, 2).sum().backward()
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert ("max_pool2d" in seen and "max_pool2d_backward" in seen) == fused, seen
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(tx, 2).sum().backward()
    np.testing.assert_array_equal(_grad(kx), _grad(tx))
    x1 = rng.standard_normal((3, 10))  # unbatched [C, L]
    k1, t1 = kael.tensor(x1, requires_grad=True), torch.tensor(x1, requires_grad=True)
    ky, ki = F.max_pool1d(k1, 3, 2, 1, ceil_mode=True, return_indices=True)
    ty, ti = torch.nn.functional.max_pool1d(t1, 3, 2, 1, ceil_mode=True, return_indices=True)
    np.testing.assert_array_equal(ky.detach().numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(ki.numpy(), ti.numpy())
    ky.sum().backward()
    ty.sum().backward()
    np.testing.assert_array_equal(_grad(k1), _grad(t1))


def test_a_window_entirely_in_the_padding_gives_minus_inf_and_index_minus_one(mode: str) -> None:
    x = kael.tensor(np.array([[[[1.5], [2.0]]]]), requires_grad=True)  # W = 1; positions -1 and 1 are padding
    y, i = F.max_pool2d(x, (1, 2), 1, (0, 1), (1, 2), return_indices=True)
    np.testing.assert_array_equal(y.detach().numpy(), np.full((1, 1, 2, 1), -np.inf))
    np.testing.assert_array_equal(i.numpy(), np.full((1, 1, 2, 1), -1))
    y.sum().backward()
    np.testing.assert_array_equal(_grad(x), np.zeros((1, 1, 2, 1)))


def test_nan_in_a_window_gives_nan(mode: str) -> None:
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    x[0, 0, 1, 0] = np.nan
    got = F.max_pool2d(kael.tensor(x), 2).numpy()
    want = torch.nn.functional.max_pool2d(torch.tensor(x), 2).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[0, 0, 0, 0]) and not np.isnan(got[0, 0, 0, 1])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_narrow_dtypes_keep_values_exactly(mode: str, dtype: str) -> None:
    x = np.round(np.random.default_rng(4).standard_normal((2, 2, 6, 6)) * 4) / 4
    kd = getattr(kael, dtype)
    got = F.max_pool2d(kael.tensor(x).to(dtype=kd), 3, 2, 1)
    assert got.dtype is kd
    want = torch.nn.functional.max_pool2d(torch.tensor(x), 3, 2, 1).numpy()
    np.testing.assert_array_equal(got.to(dtype=kael.float64).numpy(), want)


def test_bad_arguments_raise_kael_errors_naming_them() -> None:
    x = kael.zeros(1, 2, 5, 5)
    with pytest.raises(kael.ShapeError, match="max_pool2d: padding .* must be at most half of kernel_size"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(kael.ShapeError, match="max_pool2d: kernel_size 7 .* larger than the padded input 5"):
        F.max_pool2d(x, 7)
    with pytest.raises(kael.ShapeError, match="max_pool2d: stride must be an int >= 1"):
        F.max_pool2d(x, 2, stride=-1)
    with pytest.raises(kael.DTypeError, match="max_pool2d: input must be a floating-point tensor"):
        F.max_pool2d(kael.zeros(1, 2, 5, 5, dtype=kael.int64), 2)


@st.composite
def avg_cases(draw: Any) -> dict[str, Any]:
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    h, w = draw(st.integers(max(1, k[0] - 2 * p[0]), 8)), draw(st.integers(max(1, k[1] - 2 * p[1]), 8))
    override = draw(st.sampled_from([None, None, 3]))
    return {
        "x": (draw(st.integers(1, 3)), draw(st.integers(1, 3)), h, w),
        "args": (k, s, p, draw(st.booleans()), draw(st.booleans()), override),
        "seed": draw(st.integers(0, 2**16)),
    }


@given(case=avg_cases())
@settings(max_examples=40, deadline=None)
def test_avg_pool2d_matches_torch(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["x"])
    tx, kx = torch.tensor(x, requires_grad=True), kael.tensor(x, requires_grad=True)
    ty = torch.nn.functional.avg_pool2d(tx, *case["args"])
    y = F.avg_pool2d(kx, *case["args"])
    g = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(g))
    y.backward(kael.tensor(g))
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_grad(kx), _grad(tx), rtol=1e-12, atol=1e-12)


def test_avg_pool_runs_the_fused_ops_in_2d_and_1d(mode: str) -> None:
    rng = np.random.default_rng(3)
    fused = "avg_pool2d" in kael.backends.current("cpu").supported_ops()
    assert not (mode == "decomposition" and fused)
    for kx, run, ref in (
        (
            kael.tensor(rng.standard_normal((2, 3, 7, 6)), requires_grad=True),
            lambda t: F.avg_pool2d(t, 3, 2, 1, True, False),
            lambda t: torch.nn.functional.avg_pool2d(t, 3, 2, 1, True, False),
        ),
        (
            kael.tensor(rng.standard_normal((2, 3, 9)), requires_grad=True),
            lambda t: F.avg_pool1d(t, 3, 2, 1),
            lambda t: torch.nn.functional.avg_pool1d(t, 3, 2, 1),
        ),
    ):
        seen: list[str] = []
        kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: _record(seen, op, k))
        try:
            y = run(kx)
            y.sum().backward()
        finally:
            kael.backends.dispatch.set_kernel_wrapper(None)
        assert ("avg_pool2d" in seen and "avg_pool2d_backward" in seen) == fused, seen
        tx = torch.tensor(kx.detach().numpy(), requires_grad=True)
        ty = ref(tx)
        ty.sum().backward()
        np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(_grad(kx), _grad(tx), rtol=1e-12, atol=1e-12)
