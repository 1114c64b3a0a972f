"""The C++ max_pool2d / max_pool2d_backward kernels (csrc/pool.cpp) against the NumPy host kernels and torch.

Random windows, ties, NaNs, strided operands and outputs, every float dtype and both
thread counts; indices out of a plane and bad shapes raise KaelErrors naming the op.
Skipped when the installed extension has no max_pool2d.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from kael.backends import host  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(C, "max_pool2d"), reason="this build of kael_backend_cpu._C has no max_pool2d (built before it)"
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _out_len(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = n + 2 * p - d * (k - 1) - 1
    o = (-(-num // s) if ceil_mode else num // s) + 1
    return o - 1 if ceil_mode and (o - 1) * s >= n + p else o


@st.composite
def windows(draw: Any) -> dict[str, Any]:
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    h = draw(st.integers(max(1, d[0] * (k[0] - 1) + 1 - 2 * p[0]), 11))
    w = draw(st.integers(max(1, d[1] * (k[1] - 1) + 1 - 2 * p[1]), 11))
    cm = draw(st.booleans())
    x = (draw(st.integers(0, 3)), draw(st.integers(1, 4)), h, w)
    out = (x[0], x[1], _out_len(h, k[0], s[0], p[0], d[0], cm), _out_len(w, k[1], s[1], p[1], d[1], cm))
    return {"x": x, "out": out, "args": (k, s, p, d, cm)}


def _t(v: np.ndarray, kd: Any, channels_last: bool) -> kael.Tensor:
    if channels_last:
        return kael.tensor(np.ascontiguousarray(v.transpose(0, 2, 3, 1))).to(dtype=kd).permute(0, 3, 1, 2)
    return kael.tensor(v).to(dtype=kd)


@given(geo=windows(), dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]), seed=st.integers(0, 99))
@SETTINGS
def test_forward_and_backward_match_the_host_kernels(geo: dict[str, Any], dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    kd = getattr(kael, dtype)
    x = np.round(rng.standard_normal(geo["x"]) * 2) / 2
    if x.size and seed % 5 == 0:
        x.flat[seed % x.size] = np.nan
    xt = _t(x, kd, seed % 2 == 1)
    outs = [kael.empty(*geo["out"], dtype=kd), kael.empty(*geo["out"], dtype=kael.int64)]
    wants = [kael.empty(*geo["out"], dtype=kd), kael.empty(*geo["out"], dtype=kael.int64)]
    C.max_pool2d(*outs, xt, *geo["args"])
    host.kernel("max_pool2d")(*wants, xt, *geo["args"])
    np.testing.assert_array_equal(outs[0].to(dtype=kael.float64).numpy(), wants[0].to(dtype=kael.float64).numpy())
    np.testing.assert_array_equal(outs[1].numpy(), wants[1].numpy())
    g = _t(np.round(rng.standard_normal(geo["out"]) * 4) / 4, kd, seed % 3 == 0)
    size = geo["x"][2:]
    k, s, p, d, _ = geo["args"]
    dx, want = kael.empty(*geo["x"], dtype=kd), kael.empty(*geo["x"], dtype=kd)
    C.max_pool2d_backward(dx, g, outs[1], size, k, s, p, d)
    host.kernel("max_pool2d_backward")(want, g, outs[1], size, k, s, p, d)
    tol = 1e-2 if dtype in ("float16", "bfloat16") else 1e-12
    np.testing.assert_allclose(
        dx.to(dtype=kael.float64).numpy(), want.to(dtype=kael.float64).numpy(), rtol=tol, atol=tol
    )


def test_against_torch_at_one_and_two_threads() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8, 24, 24)).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    ty, ti = torch.nn.functional.max_pool2d(tx, 3, 2, 1, return_indices=True)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.tensor(g))
    before = kael.get_num_threads()
    try:
        for threads in (1, 2):
            kael.set_num_threads(threads)
            out, idx = kael.empty(*ty.shape), kael.empty(*ty.shape, dtype=kael.int64)
            C.max_pool2d(out, idx, kael.tensor(x), (3, 3), (2, 2), (1, 1), (1, 1), False)
            np.testing.assert_array_equal(out.numpy(), ty.detach().numpy())
            np.testing.assert_array_equal(idx.numpy(), ti.numpy())
            dx = kael.empty(*x.shape)
            C.max_pool2d_backward(dx, kael.tensor(g), idx, (24, 24), (3, 3), (2, 2), (1, 1), (1, 1))
            assert tx.grad is not None
            np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)
    finally:
        kael.set_num_threads(before)


@given(
    k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    p=st.tuples(st.integers(0, 1), st.integers(0, 1)),
    seed=st.integers(0, 999),
)
@SETTINGS
def test_windows_inside_and_across_the_border_with_many_nans_and_infinities(
    k: tuple[int, int], s: tuple[int, int], p: tuple[int, int], seed: int
) -> None:
    """Interior windows take pool.cpp's unchecked path, border ones the checked path; both keep the first
    maximum or the first NaN as the host kernel does, and torch's values where there is no NaN."""
    p = (min(p[0], k[0] // 2), min(p[1], k[1] // 2))
    rng = np.random.default_rng(seed)
    x = rng.choice(
        [-np.inf, -1.0, 0.0, 0.5, 2.0, np.inf, np.nan], size=(2, 3, 9, 8), p=[0.1, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1]
    )
    x = x.astype(np.float32)
    shape = (2, 3, _out_len(9, k[0], s[0], p[0], 1, False), _out_len(8, k[1], s[1], p[1], 1, False))
    args = (k, s, p, (1, 1), False)
    got = [kael.empty(*shape), kael.empty(*shape, dtype=kael.int64)]
    want = [kael.empty(*shape), kael.empty(*shape, dtype=kael.int64)]
    C.max_pool2d(*got, kael.tensor(x), *args)
    host.kernel("max_pool2d")(*want, kael.tensor(x), *args)
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
    clean = np.nan_to_num(x, nan=-7.0)
    tv = torch.nn.functional.max_pool2d(torch.tensor(clean), k, s, p)
    cv = [kael.empty(*shape), kael.empty(*shape, dtype=kael.int64)]
    C.max_pool2d(*cv, kael.tensor(clean), *args)
    np.testing.assert_array_equal(cv[0].numpy(), tv.numpy())


def test_bad_input_raises_kael_errors_naming_the_op() -> None:
    x = kael.zeros(1, 2, 4, 4)
    with pytest.raises(kael.DTypeError, match="max_pool2d: x and out must share a float dtype and indices be int64"):
        C.max_pool2d(kael.empty(1, 2, 2, 2), kael.empty(1, 2, 2, 2), x, (2, 2), (2, 2), (0, 0), (1, 1), False)
    with pytest.raises(kael.ShapeError, match=r"max_pool2d: kernel \(0, 2\)"):
        C.max_pool2d(
            kael.empty(1, 2, 2, 2), kael.empty(1, 2, 2, 2, dtype=kael.int64), x, (0, 2), (2, 2), (0, 0), (1, 1), False
        )
    idx = kael.tensor(np.full((1, 2, 2, 2), 16, dtype=np.int64))
    with pytest.raises(kael.IndexError_, match="max_pool2d_backward: index 16 is outside a plane of 16 elements"):
        C.max_pool2d_backward(x, kael.zeros(1, 2, 2, 2), idx, (4, 4), (2, 2), (2, 2), (0, 0), (1, 1))


@given(geo=windows(), dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]), seed=st.integers(0, 99))
@SETTINGS
def test_avg_pool_matches_the_host_kernels(geo: dict[str, Any], dtype: str, seed: int) -> None:
    k, s, p, _, _ = geo["args"]
    x_shape = geo["x"]
    out = (
        x_shape[0],
        x_shape[1],
        _out_len(x_shape[2], k[0], s[0], p[0], 1, False),
        _out_len(x_shape[3], k[1], s[1], p[1], 1, False),
    )
    if min(out) <= 0 and out[0] != 0:
        return
    rng = np.random.default_rng(seed)
    kd = getattr(kael, dtype)
    xt = _t(rng.uniform(-2, 2, x_shape), kd, seed % 2 == 1)
    div = kael.tensor(rng.integers(1, 9, out[2:]).astype(np.float64))
    got, want = kael.empty(*out, dtype=kd), kael.empty(*out, dtype=kd)
    C.avg_pool2d(got, xt, div, k, s, p)
    host.kernel("avg_pool2d")(want, xt, div, k, s, p)
    tol = 1e-2 if dtype in ("float16", "bfloat16") else 1e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(
        got.to(dtype=kael.float64).numpy(), want.to(dtype=kael.float64).numpy(), rtol=tol, atol=tol
    )
    g = _t(rng.uniform(-1, 1, out), kd, seed % 3 == 0)
    dx, dwant = kael.empty(*x_shape, dtype=kd), kael.empty(*x_shape, dtype=kd)
    C.avg_pool2d_backward(dx, g, div, x_shape[2:], k, s, p)
    host.kernel("avg_pool2d_backward")(dwant, g, div, x_shape[2:], k, s, p)
    np.testing.assert_allclose(
        dx.to(dtype=kael.float64).numpy(), dwant.to(dtype=kael.float64).numpy(), rtol=tol, atol=tol
    )
