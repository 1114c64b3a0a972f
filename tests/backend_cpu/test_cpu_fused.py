"""Fused kernels against the reference: gelu (+ backward), silu (also against float64
NumPy), softmax / log_softmax over any dim, layer_norm (+ backward), cross_entropy,
attention over a KV cache with lengths, adamw_step; on strided operands and every float
dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from cpu_helpers import LAYOUTS, cpu_empty, host_empty, logical, place, tol  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael.testing import assert_close  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = ["float16", "bfloat16", "float32", "float64"]
shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)


def _pair(cpu: Any, shape: tuple, d: dt.DType) -> tuple:
    return cpu_empty(cpu, shape, d), host_empty(shape, d)


@SETTINGS
@given(
    shape=shapes,
    dtype=st.sampled_from(FLOATS),
    approx=st.sampled_from(["tanh", "none"]),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_gelu_and_backward(cpu: Any, ref: Any, shape: tuple, dtype: str, approx: str, layout: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    x = place(rng.standard_normal(shape) * 3, d, layout)
    g = place(rng.standard_normal(shape), d, "transposed")
    got, want = _pair(cpu, shape, d)
    cpu.kernel("gelu")(got, x, approx)
    ref.kernel("gelu")(want, x, approx)
    assert_close(logical(got), logical(want), **tol(d, 2.0), msg=f"gelu {approx}")
    got, want = _pair(cpu, shape, d)
    cpu.kernel("gelu_backward")(got, g, x, approx)
    ref.kernel("gelu_backward")(want, g, x, approx)
    assert_close(logical(got), logical(want), **tol(d, 2.0), msg=f"gelu_backward {approx}")


def test_gelu_tanh_float32_long_rows_are_accurate(cpu: Any) -> None:
    x = np.linspace(-12, 12, 100_003).astype(np.float32)
    out = cpu_empty(cpu, x.shape, dt.float32)
    cpu.kernel("gelu")(out, place(x, dt.float32, "contiguous"), "tanh")
    v = x.astype(np.float64)
    exact = 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
    assert_close(logical(out), exact, rtol=1e-6, atol=1e-7)


def _silu64(x: np.ndarray) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return v / (1.0 + np.exp(-v))


def test_silu_is_native_in_this_build(cpu: Any) -> None:
    from kael_backend_cpu._native import C

    assert cpu.kernel("silu") is C.silu


@SETTINGS
@given(
    shape=st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from(FLOATS),
    layout=st.sampled_from(LAYOUTS),
    scale=st.sampled_from([1.0, 10.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_silu(cpu: Any, ref: Any, shape: tuple, dtype: str, layout: str, scale: float, seed: int) -> None:
    d = dt.BY_NAME[dtype]
    x = place(np.random.default_rng(seed).standard_normal(shape) * scale, d, layout)
    got, want = _pair(cpu, shape, d)
    cpu.kernel("silu")(got, x)
    ref.kernel("silu")(want, x)
    assert_close(logical(got), logical(want), **tol(d, 2.0), msg=f"silu {dtype} {layout}")
    assert_close(logical(got), _silu64(logical(x)), **tol(d, 2.0), msg=f"silu {dtype} {layout} vs float64")


@pytest.mark.parametrize("dtype", FLOATS)
def test_silu_special_values(cpu: Any, dtype: str) -> None:
    d = dt.BY_NAME[dtype]
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e4, -1e4, 200.0, -200.0, 20.0, -20.0, 1e-3, -1e-3])
    x = place(vals, d, "contiguous")
    out = cpu_empty(cpu, vals.shape, d)
    cpu.kernel("silu")(out, x)
    got = logical(out).astype(np.float64)
    xv = logical(x).astype(np.float64)
    assert np.isnan(got[3]) and np.isnan(got[4])  # -inf / inf, as PyTorch gives; nan passes
    assert got[2] == np.inf and got[5] == xv[5] and got[7] == xv[7]  # x for large x
    assert got[6] == 0 and np.signbit(got[6])  # -0 where exp(-x) overflows
    finite = np.isfinite(_silu64(xv)) & ~np.isin(np.arange(vals.size), [3, 4])
    assert_close(got[finite], _silu64(xv)[finite], **tol(d, 2.0), msg=f"silu specials {dtype}")
    assert list(np.signbit(got[:2])) == [False, True]


@SETTINGS
@given(
    shape=shapes,
    dtype=st.sampled_from(FLOATS),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_softmax_and_log_softmax_over_any_dim(
    cpu: Any, ref: Any, shape: tuple, dtype: str, layout: str, seed: int, data: Any
) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    dim = data.draw(st.integers(0, len(shape) - 1))
    x = place(rng.standard_normal(shape) * 4, d, layout)
    for op in ("softmax", "log_softmax"):
        got, want = _pair(cpu, shape, d)
        cpu.kernel(op)(got, x, dim)
        ref.kernel(op)(want, x, dim)
        assert_close(logical(got), logical(want), **tol(d, 4.0), msg=f"{op} dim={dim} {layout}")


def test_softmax_special_rows(cpu: Any, ref: Any) -> None:
    inf, nan = np.inf, np.nan
    rows = np.array(
        [
            [0.0, 1.0, 2.0, 3.0],
            [-inf, -inf, -inf, -inf],
            [1.0, nan, 2.0, 0.0],
            [inf, 0.0, 1.0, 2.0],
            [-inf, 0.0, -inf, 5.0],
            [1e30, -1e30, 0.0, 1.0],
        ],
        np.float32,
    )
    x = place(rows, dt.float32, "contiguous")
    for op in ("softmax", "log_softmax"):
        got, want = _pair(cpu, rows.shape, dt.float32)
        cpu.kernel(op)(got, x, 1)
        ref.kernel(op)(want, x, 1)
        assert_close(logical(got), logical(want), rtol=2e-6, atol=1e-6, msg=op)


@SETTINGS
@given(
    shape=shapes,
    dtype=st.sampled_from(FLOATS),
    affine=st.sampled_from(["none", "weight", "both"]),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_and_backward(
    cpu: Any, ref: Any, shape: tuple, dtype: str, affine: str, layout: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    c = shape[-1]
    if layout == "broadcast" and len(shape) == 1:
        layout = "offset"  # a constant row: both sides divide rounding noise by a zero variance
    x = place(rng.standard_normal(shape) * 2 + 1, d, layout)
    w = place(rng.standard_normal(c), d, "stepped") if affine != "none" else None
    b = place(rng.standard_normal(c), d, "contiguous") if affine == "both" else None
    stat = dt.float64 if d is dt.float64 else dt.float32
    got, want = _pair(cpu, shape, d)
    gm, wm = _pair(cpu, shape[:-1], stat)
    gr, wr = _pair(cpu, shape[:-1], stat)
    cpu.kernel("layer_norm")(got, gm, gr, x, w, b, 1e-5)
    ref.kernel("layer_norm")(want, wm, wr, x, w, b, 1e-5)
    assert_close(logical(got), logical(want), **tol(d, 4.0), msg="layer_norm out")
    assert_close(logical(gm), logical(wm), **tol(stat, 4.0), msg="layer_norm mean")
    assert_close(logical(gr), logical(wr), **tol(stat, 4.0), msg="layer_norm rstd")
    g = place(rng.standard_normal(shape), d, "transposed")
    gx, wx = _pair(cpu, shape, d)
    gw, ww = _pair(cpu, (c,), d) if w is not None else (None, None)
    gb, wb = _pair(cpu, (c,), d) if b is not None else (None, None)
    cpu.kernel("layer_norm_backward")(gx, gw, gb, g, x, wm, wr, w)
    if d is dt.float16:
        # The reference computes float16 in float16 NumPy arithmetic, whose rounding swamps
        # the comparison here; the oracle is the same math in float64 on the same values.
        def f64(t: Any) -> Any:
            return None if t is None else place(logical(t), dt.float64, "contiguous")

        wx, ww, wb = (None if t is None else host_empty(t.shape, dt.float64) for t in (wx, ww, wb))
        ref.kernel("layer_norm_backward")(wx, ww, wb, f64(g), f64(x), f64(wm), f64(wr), f64(w))
    else:
        ref.kernel("layer_norm_backward")(wx, ww, wb, g, x, wm, wr, w)
    rows = int(np.prod(shape[:-1]))
    assert_close(logical(gx), logical(wx), **tol(d, 8.0), msg="layer_norm_backward dx")
    if gw is not None:
        assert_close(logical(gw), logical(ww), **tol(d, 4.0 * rows), msg="dweight")
    if gb is not None:
        assert_close(logical(gb), logical(wb), **tol(d, 4.0 * rows), msg="dbias")


@SETTINGS
@given(
    n=st.integers(0, 9),
    c=st.integers(1, 40),
    dtype=st.sampled_from(FLOATS),
    smoothing=st.sampled_from([0.0, 0.1]),
    layout=st.sampled_from(["contiguous", "transposed", "stepped"]),
    seed=st.integers(0, 2**16),
)
def test_cross_entropy(
    cpu: Any, ref: Any, n: int, c: int, dtype: str, smoothing: float, layout: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    logits = place(rng.standard_normal((n, c)) * 3, d, layout)
    t = rng.integers(0, c, n)
    t[rng.random(n) < 0.2] = -100
    target = place(t, dt.int64, "stepped")
    got, want = _pair(cpu, (n,), d)
    cpu.kernel("cross_entropy")(got, logits, target, -100, smoothing)
    ref.kernel("cross_entropy")(want, logits, target, -100, smoothing)
    assert_close(logical(got), logical(want), **tol(d, 4.0))


@SETTINGS
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    tq=st.integers(1, 5),
    extra=st.integers(0, 6),
    dim=st.sampled_from([1, 8, 16]),
    causal=st.booleans(),
    use_lengths=st.booleans(),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_attention_over_a_kv_cache(
    cpu: Any,
    ref: Any,
    b: int,
    h: int,
    tq: int,
    extra: int,
    dim: int,
    causal: bool,
    use_lengths: bool,
    dtype: str,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    tk = tq + extra
    q = place(rng.standard_normal((b, h, tq, dim)), d, "transposed")
    # a cache buffer longer than the keys in use: k and v are slices of it
    cache = rng.standard_normal((2, b, h, tk + 3, dim))
    k = place(cache[0], d, "contiguous")[:, :, :tk]
    v = place(cache[1], d, "stepped")[:, :, :tk]
    lengths = place(rng.integers(0, tk + 1, b), dt.int64, "contiguous") if use_lengths else None
    got, want = _pair(cpu, (b, h, tq, dim), d)
    cpu.kernel("attention")(got, q, k, v, 1 / np.sqrt(dim), causal, lengths)
    ref.kernel("attention")(want, q, k, v, 1 / np.sqrt(dim), causal, lengths)
    assert_close(logical(got), logical(want), **tol(d, 8.0))


@pytest.mark.parametrize("dtype", FLOATS)
def test_adamw_step(cpu: Any, ref: Any, dtype: str) -> None:
    rng = np.random.default_rng(4)
    d = dt.BY_NAME[dtype]
    shape = (7, 13)
    vals = [
        rng.standard_normal(shape),
        rng.standard_normal(shape),
        rng.standard_normal(shape) * 0.1,
        np.abs(rng.standard_normal(shape)) * 0.01,
    ]
    mine = [place(v, d, "contiguous") for v in vals]
    theirs = [place(v, d, "contiguous") for v in vals]
    for step in (1, 2, 3):
        cpu.kernel("adamw_step")(*mine, 1e-3, 0.9, 0.999, 1e-8, 0.01, step)
        ref.kernel("adamw_step")(*theirs, 1e-3, 0.9, 0.999, 1e-8, 0.01, step)
    for i in (0, 2, 3):
        assert_close(logical(mine[i]), logical(theirs[i]), **tol(d, 4.0), msg=f"adamw output {i}")
