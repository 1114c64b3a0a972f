"""Reduction kernels over random dim sets, layouts and dtypes, against the reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from cpu_helpers import LAYOUTS, cpu_empty, host_empty, logical, place, random_values, tol  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael.testing import assert_close  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NUMERIC = ["uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


@st.composite
def reduction(draw: Any) -> tuple:
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim)))
    dims = tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), min_size=1))))
    return shape, dims


def _out_dtype(op: str, d: dt.DType) -> dt.DType:
    if op in ("argmax", "argmin"):
        return dt.int64
    if op in ("any", "all"):
        return dt.bool_
    if op in ("sum", "prod") and d.category < 2:
        return dt.int64
    return d


@SETTINGS
@given(
    op=st.sampled_from(["sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all"]),
    case=reduction(),
    dtype=st.sampled_from(NUMERIC),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_reductions(cpu: Any, ref: Any, op: str, case: tuple, dtype: str, layout: str, seed: int) -> None:
    shape, dims = case
    d = dt.BY_NAME[dtype]
    if op in ("any", "all"):
        d = dt.bool_
    if op in ("argmax", "argmin"):
        dims = dims[:1]
    reduced = [shape[i] for i in dims]
    if op in ("amax", "amin", "argmax", "argmin") and 0 in reduced:
        return  # the frontend rejects empty max/min
    rng = np.random.default_rng(seed)
    vals = random_values(rng, shape, d)
    if op == "prod" and d.is_floating_point:
        vals = np.clip(vals, -2, 2)
    if op in ("argmax", "argmin") and d.is_floating_point:
        vals = np.round(vals * 2) / 2  # ties: the first index must win
    a = place(vals, d, layout)
    out_shape = tuple(1 if i in dims else n for i, n in enumerate(shape))
    od = _out_dtype(op, d)
    got, want = cpu_empty(cpu, out_shape, od), host_empty(out_shape, od)
    cpu.kernel(op)(got, a, dims)
    ref.kernel(op)(want, a, dims)
    n = int(np.prod(reduced)) if reduced else 1
    assert_close(logical(got), logical(want), **tol(od, max(2.0, n / 8)), msg=f"{op} {dtype} {shape} {dims} {layout}")


@pytest.mark.parametrize(
    "shape,dims",
    [((4096, 1024), (1,)), ((300, 70000), (1,)), ((1 << 20,), (0,)), ((2000, 300), (0,)), ((5, 100000), (0, 1))],
)
def test_large_float_sums_are_accurate(cpu: Any, shape: tuple, dims: tuple) -> None:
    rng = np.random.default_rng(0)
    vals = rng.standard_normal(shape).astype(np.float32) + 1.0
    a = place(vals, dt.float32, "contiguous")
    out_shape = tuple(1 if i in dims else n for i, n in enumerate(shape))
    got = cpu_empty(cpu, out_shape, dt.float32)
    cpu.kernel("sum")(got, a, dims)
    exact = vals.astype(np.float64).sum(axis=dims, keepdims=True)
    assert_close(logical(got), exact, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_float32_products_do_not_underflow_part_way(cpu: Any, ref: Any, layout: str) -> None:
    # 0.01 ** 40 underflows float32 before the 40 factors of 100 bring it back, in any order that
    # multiplies the small ones first; a float64 running product gets the exact 1.0 (a fuzz finding)
    vals = np.tile(np.array([0.01] * 40 + [100.0] * 40, dtype=np.float32), (3, 1))
    a = place(vals, dt.float32, layout)
    exact = vals.astype(np.float64).prod(axis=1, keepdims=True).astype(np.float32)
    for backend, out in ((cpu, cpu_empty(cpu, (3, 1), dt.float32)), (ref, host_empty((3, 1), dt.float32))):
        backend.kernel("prod")(out, a, (1,))
        assert_close(logical(out), exact, rtol=1e-5, atol=0.0, msg=f"{backend.name} {layout}")


def test_nan_propagation(cpu: Any, ref: Any) -> None:
    vals = np.array([[1.0, np.nan, 3.0, 7.0], [2.0, 5.0, 5.0, -1.0]])
    a = place(vals, dt.float32, "contiguous")
    for op in ("amax", "amin", "argmax", "argmin", "sum"):
        od = _out_dtype(op, dt.float32)
        got, want = cpu_empty(cpu, (2, 1), od), host_empty((2, 1), od)
        cpu.kernel(op)(got, a, (1,))
        ref.kernel(op)(want, a, (1,))
        assert_close(logical(got), logical(want), msg=op)


def test_sum_casts_into_a_wider_output(cpu: Any, ref: Any) -> None:
    vals = np.full((3, 200), 100, dtype=np.int64)
    a = place(vals, dt.int8, "contiguous")  # 100 fits int8; the int64 sum must not wrap
    got, want = cpu_empty(cpu, (3, 1), dt.int64), host_empty((3, 1), dt.int64)
    cpu.kernel("sum")(got, a, (1,))
    ref.kernel("sum")(want, a, (1,))
    assert logical(got).ravel().tolist() == [20000] * 3 == logical(want).ravel().tolist()
