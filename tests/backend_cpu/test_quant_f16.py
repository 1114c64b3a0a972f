"""The CPU backend's float16 path of quantized_linear for f16 weights (NOTE [float16 activations] in
csrc/quant.cpp, NOTE [float16 dot order] in csrc/vec_f16_dot.h): activation rows rounded to float16 as llama.cpp
does for F16 weights, exact float16 products summed in 16 float32 lanes.

Oracle: a NumPy model (NumPy's float32 -> float16 conversion: nearest, ties to even; the products in float64,
exact, then float32 additions in the stated order). The kernel must equal it bit for bit, and it is the same
kernel on every vector table: the module runs again under every other table this CPU can run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")

from _quant_helpers import F32, SETTINGS, assert_bits, check_requested_isa, not_in_isa_rerun, run  # noqa: E402
from cpu_helpers import other_isas, rerun_under_isa  # noqa: E402

LANES = 16


@pytest.fixture(autouse=True)
def _f16_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test here asks for llama.cpp's rounding of activations (q8) unless it says otherwise."""
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "q8")
    yield


def model(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The float16 path's float32 result [m, n] by NOTE [float16 dot order] (w: float16 [n, k])."""
    m, k = x.shape
    n = w.shape[0]
    kp = -(-k // 32) * 32
    with np.errstate(over="ignore"):
        xr = np.zeros((m, kp), np.float64)
        xr[:, :k] = x.astype(np.float16)
    wp = np.zeros((n, kp), np.float64)
    wp[:, :k] = w
    a = np.zeros((2, m, n, LANES), F32)
    with np.errstate(all="ignore"):
        for c in range(kp // 32):
            for half in range(2):
                lo = 32 * c + LANES * half
                p = (xr[:, None, lo : lo + LANES] * wp[None, :, lo : lo + LANES]).astype(F32)  # exact
                a[half] = (a[half] + p).astype(F32)
        s = (a[0] + a[1]).astype(F32)
        for h in (8, 4, 2, 1):
            s = (s[..., :h] + s[..., h : 2 * h]).astype(F32)
        s = s[..., 0]
        if bias is not None:
            s = (s + bias.astype(F32)[None, :]).astype(F32)
    return s.astype(F32)


def weights(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return rng.standard_normal((n, k)).astype(np.float16)


@SETTINGS
@given(
    m=st.integers(1, 20),
    k=st.integers(1, 300),
    n=st.integers(1, 24),
    seed=st.integers(0, 2**32 - 1),
    with_bias=st.booleans(),
)
def test_equals_the_model(cpu: Any, m: int, k: int, n: int, seed: int, with_bias: bool) -> None:
    """Any shape (k not a multiple of 32 included; more than 16 rows: q8's waves), activations over many
    magnitudes, float16's subnormal range included."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.choice([1e-6, 1e-3, 1.0, 1e3], (m, k))).astype(F32)
    w = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_bits(run(cpu, x, w, bias, "f16"), model(x, w, bias))


def test_rows_alone_and_overflow(cpu: Any) -> None:
    """A row's result is the same bits alone and in a batch; an activation beyond float16's range becomes
    +-inf (as llama.cpp's conversion), a nan stays nan."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 100)).astype(F32)
    x[4, 3] = 7e4
    x[5, 9] = np.nan
    w = weights(rng, 7, 100)
    want = model(x, w, None)
    got = run(cpu, x, w, None, "f16")
    assert_bits(got, want)
    for i in range(6):
        assert_bits(run(cpu, x[i : i + 1], w, None, "f16"), want[i : i + 1])
    assert np.all(np.isinf(got[4]) | np.isnan(got[4])) and np.all(np.isnan(got[5]))


def test_close_to_the_float_path(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The activation rounding is the only approximation: within 2^-11 |x| per value of the exact product."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 768)).astype(F32)
    w = weights(rng, 50, 768)
    got = run(cpu, x, w, None, "f16")
    wf = w.astype(np.float64)
    exact = x.astype(np.float64) @ wf.T
    bound = 2.0**-11 * (np.abs(x).astype(np.float64) @ np.abs(wf).T) * 1.01 + 1e-5
    assert np.all(np.abs(got - exact) <= bound)
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
    assert not np.array_equal(got, run(cpu, x, w, None, "f16"))  # the rounding is there


@pytest.mark.parametrize("mode", [None, "auto"])
def test_default_selection(cpu: Any, monkeypatch: pytest.MonkeyPatch, mode: str | None) -> None:
    """Unset (or auto): the float16 path up to 16 rows on the AVX2 and AVX-512 tables, the float32-activation
    path (as f32) above 16 rows and on the baseline table."""
    from kael_backend_cpu._native import C

    rng = np.random.default_rng(7)
    x = rng.standard_normal((17, 96)).astype(F32)
    w = weights(rng, 9, 96)
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
    f32 = [run(cpu, x[:rows], w, None, "f16") for rows in (1, 16, 17)]
    if mode is None:
        monkeypatch.delenv("KAEL_QUANT_ACTIVATIONS", raising=False)
    else:
        monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", mode)
    simd = C.isa() not in ("baseline", "base")
    for rows, want in zip((1, 16), f32[:2], strict=True):
        assert_bits(run(cpu, x[:rows], w, None, "f16"), model(x[:rows], w, None) if simd else want)
    assert_bits(run(cpu, x, w, None, "f16"), f32[2])


def test_runs_on_the_requested_table() -> None:
    check_requested_isa()


@not_in_isa_rerun
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)
