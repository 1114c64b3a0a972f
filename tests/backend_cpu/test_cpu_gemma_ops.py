"""The CPU backend's Gemma-family fused kernels (csrc/geglu_softcap.cpp): gelu_tanh_mul and
softcap against float64 NumPy oracles written here, over shapes, strides and dtypes (the
16-bit rounding sequences included); in place; their errors; the GIL released while they run."""

from __future__ import annotations

import math
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")

from cpu_helpers import (  # noqa: E402
    GATED_CASES,
    LAYOUTS,
    check_gated,
    check_gated_halves,
    close,
    cpu_empty,
    place,
    round_to,
    runs_while,
    vals,
)
from kael import _dtype as dt  # noqa: E402
from kael._tensor import from_numpy_bits  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = ["float16", "bfloat16", "float32", "float64"]
K = math.sqrt(2.0 / math.pi)


@pytest.fixture(autouse=True)
def _needs_the_kernels(cpu: Any) -> None:
    missing = {"gelu_tanh_mul", "softcap"} - set(cpu.supported_ops())
    if missing:
        pytest.skip(f"this build of kael_backend_cpu has no {sorted(missing)} kernels (an older extension)")


def gelu64(g: np.ndarray) -> np.ndarray:
    # (1 + tanh(z)) / 2 = 1 / (1 + exp(-2z)): no cancellation for g << 0 (the kernels use this form)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-2.0 * K * (g + 0.044715 * g**3)))


def gelu_tanh_mul64(g: np.ndarray, u: np.ndarray, d: dt.DType) -> np.ndarray:
    return (round_to(gelu64(g), d) if d.itemsize == 2 else gelu64(g)) * u  # 16-bit: gelu rounded first


def softcap64(x: np.ndarray, cap: float, d: dt.DType) -> np.ndarray:
    if d.itemsize != 2:
        return cap * np.tanh(x / cap)
    c = np.float32(cap)  # (x / cap).tanh() * cap: each op in float32, rounded to the dtype
    q = round_to(x.astype(np.float32) / c, d)
    return round_to(round_to(np.tanh(q), d).astype(np.float32) * c, d)


# -- gelu_tanh_mul -----------------------------------------------------------------------


@SETTINGS
@GATED_CASES
def test_gelu_tanh_mul(cpu: Any, shape: tuple, dtype: str, layout: str, scale: float, seed: int) -> None:
    check_gated(cpu, "gelu_tanh_mul", gelu_tanh_mul64, shape, dtype, layout, scale, seed)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("inter", [1, 7, 300, 1536])
def test_gelu_tanh_mul_on_the_halves_of_one_projection(cpu: Any, dtype: str, inter: int) -> None:
    check_gated_halves(cpu, "gelu_tanh_mul", gelu_tanh_mul64, dtype, inter)


def test_gelu_tanh_mul_in_place_and_errors(cpu: Any) -> None:
    rng = np.random.default_rng(7)
    gv, uv = rng.standard_normal(1000) * 5, rng.standard_normal(1000)
    for alias in ("gate", "up"):
        g = from_numpy_bits(gv.astype(np.float32), dt.float32)
        u = from_numpy_bits(uv.astype(np.float32), dt.float32)
        want = gelu_tanh_mul64(vals(g), vals(u), dt.float32)
        cpu.kernel("gelu_tanh_mul")(g if alias == "gate" else u, g, u)
        close(vals(g if alias == "gate" else u), want, dt.float32, 2.0, msg=alias)
    k = cpu.kernel("gelu_tanh_mul")
    u = from_numpy_bits(uv.astype(np.float32), dt.float32)
    with pytest.raises(kael.ShapeError, match="gelu_tanh_mul: gate, up and out must share a shape"):
        k(cpu_empty(cpu, (1000,), dt.float32), u, place(np.ones(99), dt.float32, "contiguous"))
    with pytest.raises(kael.DTypeError, match="gelu_tanh_mul: gate, up and out must share a dtype, got float64"):
        k(cpu_empty(cpu, (1000,), dt.float32), place(gv, dt.float64, "contiguous"), u)
    with pytest.raises(kael.DTypeError, match="gelu_tanh_mul: expected floating-point tensors, got int64"):
        ints = place(np.ones(3), dt.int64, "contiguous")
        k(cpu_empty(cpu, (3,), dt.int64), ints, ints)


# -- softcap -----------------------------------------------------------------------------


@SETTINGS
@given(
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from(FLOATS),
    layout=st.sampled_from(LAYOUTS),
    cap=st.sampled_from([0.3, 1.0, 30.0, 50.0]),
    seed=st.integers(0, 2**16),
)
def test_softcap(cpu: Any, shape: tuple, dtype: str, layout: str, cap: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    x = place(rng.standard_normal(shape) * 40, d, layout)
    out = cpu_empty(cpu, shape, d)
    cpu.kernel("softcap")(out, x, cap)
    close(vals(out), softcap64(vals(x), cap, d), d, 2.0, msg=f"softcap {dtype} {layout} {cap}")
    assert np.all(np.abs(vals(out)) <= round_to(np.float32(cap), d))  # (cap itself rounds in 16 bits)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_softcap_half_rounds_three_times(cpu: Any, dtype: str) -> None:
    """Nearly every element equals the three-rounding sequence exactly (the float32 tanh may move a rare one)."""
    d = dt.BY_NAME[dtype]
    x = place(np.random.default_rng(3).standard_normal((64, 257)) * 60, d, "contiguous")
    out = cpu_empty(cpu, x.shape, d)
    cpu.kernel("softcap")(out, x, 50.0)
    assert np.mean(vals(out) == softcap64(vals(x), 50.0, d)) > 0.995


def test_softcap_in_place_and_errors(cpu: Any) -> None:
    xv = np.random.default_rng(8).standard_normal(1000) * 80
    x = from_numpy_bits(xv.copy(), dt.float64)  # (over the copy's memory: xv stays the input)
    cpu.kernel("softcap")(x, x, 30.0)
    np.testing.assert_allclose(vals(x), 30.0 * np.tanh(xv / 30.0), rtol=1e-14, atol=0)
    k = cpu.kernel("softcap")
    for cap in (0.0, -2.0, math.inf, math.nan):
        with pytest.raises(kael.KaelError, match="softcap: cap must be a positive finite number"):
            k(cpu_empty(cpu, (1000,), dt.float64), x, cap)
    with pytest.raises(kael.ShapeError, match="softcap: x and out must share a shape"):
        k(cpu_empty(cpu, (999,), dt.float64), x, 1.0)
    with pytest.raises(kael.DTypeError, match="softcap: x and out must share a dtype, got float64 and float32"):
        k(cpu_empty(cpu, (1000,), dt.float32), x, 1.0)


def test_frontend_runs_the_kernels(cpu: Any) -> None:
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: (seen.append(op), k)[1])
    try:
        kael.gelu_tanh_mul(kael.ones(3, 4), kael.ones(4))
        kael.softcap(kael.ones(3, 4), 30.0)
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    if kael.backends.current("cpu").name == cpu.name:
        assert {"gelu_tanh_mul", "softcap"} <= set(seen) and "tanh" not in seen, seen


# -- the GIL -----------------------------------------------------------------------------


def test_kernels_release_the_gil(cpu: Any) -> None:
    before = kbc.get_num_threads()
    kbc.set_num_threads(1)
    try:
        x = from_numpy_bits(np.random.default_rng(9).standard_normal((4096, 1024)), dt.float64)
        out = cpu_empty(cpu, x.shape, dt.float64)
        calls = {
            "gelu_tanh_mul": lambda: cpu.kernel("gelu_tanh_mul")(out, x, x),
            "softcap": lambda: cpu.kernel("softcap")(out, x, 30.0),
        }
        for name, call in calls.items():
            assert any(runs_while(call) for _ in range(5)), f"{name} held the GIL"
    finally:
        kbc.set_num_threads(before)
