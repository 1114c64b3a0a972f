"""matmul and linear: every GEMM path (few rows, few columns, packed; transposed operands,
broadcast batches, accumulation over long k) against float64 NumPy products."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from cpu_helpers import cpu_empty, host_empty, logical, place, tol  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import from_numpy_bits  # noqa: E402
from kael.testing import assert_close  # noqa: E402

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _layout_2d(a: np.ndarray, transposed: bool) -> Any:
    return from_numpy_bits(
        np.ascontiguousarray(a.T).T if transposed else np.ascontiguousarray(a),
        dt.float32 if a.dtype == np.float32 else dt.float64,
    )


def _check(got: np.ndarray, a: np.ndarray, b: np.ndarray, d: dt.DType) -> None:
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    k = a.shape[-1]
    scale = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    eps = 6e-8 if d is dt.float32 else 1.2e-16
    bad = np.abs(got - exact) > 4 * eps * np.sqrt(max(k, 1)) * scale + 1e-30
    assert not bad.any(), f"{int(bad.sum())} elements off; worst {np.abs(got - exact).max()}"


SHAPES = [
    (1, 768, 2304),
    (1, 64, 50257),
    (3, 100, 70),
    (16, 65, 129),
    (17, 33, 300),
    (200, 3, 40),
    (300, 17, 5),
    (129, 257, 300),
    (64, 1000, 64),
    (5, 0, 7),
    (1, 1, 1),
    (7, 1, 9),
]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_paths_and_layouts(cpu: Any, m: int, k: int, n: int, ta: bool, tb: bool) -> None:
    if m * k * n > 5_000_000 and (ta or tb):
        pytest.skip("one layout suffices for the big products")
    rng = np.random.default_rng(m * 7 + k * 3 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = cpu_empty(cpu, (m, n), dt.float32)
    cpu.kernel("matmul")(out, _layout_2d(a, ta), _layout_2d(b, tb))
    _check(logical(out), a, b, dt.float32)


@SETTINGS
@given(
    batch=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    m=st.integers(1, 20),
    k=st.integers(1, 40),
    n=st.integers(1, 20),
    bcast=st.booleans(),
    dtype=st.sampled_from(["float32", "float64", "int32", "int64", "float16", "bfloat16", "int8"]),
    seed=st.integers(0, 2**16),
)
def test_batched_matmul_matches_reference(
    cpu: Any, ref: Any, batch: tuple, m: int, k: int, n: int, bcast: bool, dtype: str, seed: int
) -> None:
    d = dt.BY_NAME[dtype]
    rng = np.random.default_rng(seed)
    if d.is_floating_point:
        av, bv = rng.standard_normal(batch + (m, k)), rng.standard_normal(batch + (k, n))
    else:
        av, bv = rng.integers(-5, 6, batch + (m, k)), rng.integers(-5, 6, batch + (k, n))
    a = place(av, d, "stepped")
    b = place(bv, d, "broadcast" if bcast and batch else "transposed")
    out_shape = batch + (m, n)
    got, want = cpu_empty(cpu, out_shape, d), host_empty(out_shape, d)
    cpu.kernel("matmul")(got, a, b)
    ref.kernel("matmul")(want, a, b)
    assert_close(logical(got), logical(want), **tol(d, 4.0 * np.sqrt(k)), msg=f"{dtype} {out_shape} k={k}")


@pytest.mark.parametrize("m", [1, 4, 16, 100])
@pytest.mark.parametrize("transposed_weight", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_both_weight_layouts(cpu: Any, m: int, transposed_weight: bool, bias: bool) -> None:
    rng = np.random.default_rng(m)
    i, o = 96, 200
    x = rng.standard_normal((2, m, i)).astype(np.float32)
    w = rng.standard_normal((o, i)).astype(np.float32)
    bv = rng.standard_normal(o).astype(np.float32)
    # GPT-2's Conv1D stores [in, out] and passes w.T: a transposed, non-contiguous weight
    w_mem = np.ascontiguousarray(w.T).T if transposed_weight else w
    wt = from_numpy_bits(w_mem, dt.float32)
    out = cpu_empty(cpu, (2, m, o), dt.float32)
    cpu.kernel("linear")(out, from_numpy_bits(x, dt.float32), wt, from_numpy_bits(bv, dt.float32) if bias else None)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (bv if bias else 0)
    assert_close(logical(out), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_linear_other_float_dtypes(cpu: Any, ref: Any, dtype: str) -> None:
    d = dt.BY_NAME[dtype]
    rng = np.random.default_rng(3)
    x = place(rng.standard_normal((5, 3, 24)), d, "offset")
    w = place(rng.standard_normal((10, 24)), d, "transposed")
    b = place(rng.standard_normal(10), d, "stepped")
    got, want = cpu_empty(cpu, (5, 3, 10), d), host_empty((5, 3, 10), d)
    cpu.kernel("linear")(got, x, w, b)
    ref.kernel("linear")(want, x, w, b)
    assert_close(logical(got), logical(want), **tol(d, 10.0))


def test_thread_counts_give_identical_products(cpu: Any) -> None:
    rng = np.random.default_rng(5)
    a = from_numpy_bits(rng.standard_normal((257, 300)).astype(np.float32), dt.float32)
    b = from_numpy_bits(rng.standard_normal((300, 190)).astype(np.float32), dt.float32)
    results = []
    before = cpu.get_num_threads()
    try:
        for n in (1, 2, 3):
            cpu.set_num_threads(n)
            out = cpu_empty(cpu, (257, 190), dt.float32)
            cpu.kernel("matmul")(out, a, b)
            results.append(logical(out))
    finally:
        cpu.set_num_threads(before)
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[0], results[2])


# NOTE [batched = alone] (kael/models/_batched.py): a product with few rows must round each
# row exactly as a product of that row alone, whatever the row count (up to 16, the row
# kernels' limit), in both weight layouts.
FEW_ROWS = [(37, 29), (130, 77), (770, 515), (45, 3001), (9, 33000), (1031, 53), (3072, 100)]


@pytest.mark.parametrize("k,n", FEW_ROWS)
@pytest.mark.parametrize("transposed_weight", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_few_row_products_round_every_row_as_alone(
    cpu: Any, k: int, n: int, transposed_weight: bool, dtype: str
) -> None:
    d = dt.BY_NAME[dtype]
    npd = np.float32 if d is dt.float32 else np.float64
    rng = np.random.default_rng(k * 31 + n)
    x = rng.standard_normal((16, k)).astype(npd)
    w = rng.standard_normal((n, k)).astype(npd)
    # transposed: GPT-2's [in, out] storage passed as w.T (B contiguous along n); else [out, in]
    wt = from_numpy_bits(np.ascontiguousarray(w.T).T if transposed_weight else w, d)
    alone = []
    for i in range(16):
        out = cpu_empty(cpu, (1, n), d)
        cpu.kernel("linear")(out, from_numpy_bits(x[i : i + 1].copy(), d), wt, None)
        alone.append(logical(out)[0])
    _check(np.stack(alone), x, w.T, d)
    for m in (2, 3, 4, 5, 6, 7, 8, 11, 16):
        out = cpu_empty(cpu, (m, n), d)
        cpu.kernel("linear")(out, from_numpy_bits(x[:m].copy(), d), wt, None)
        got = logical(out)
        for i in range(m):
            assert np.array_equal(got[i], alone[i]), f"m={m}: row {i} differs from the row alone"
