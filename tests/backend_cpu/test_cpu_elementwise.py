"""Elementwise kernels (copy/cast, fill, arange, where, unary, binary, comparisons) against the reference.

Hypothesis draws shapes (0-d and empty included), dtypes and memory layouts (transposed,
stepped, offset, broadcast with stride 0); both backends run the same kernel on the
same input tensors and the outputs must agree to the conformance tolerances.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from cpu_helpers import (  # noqa: E402
    LAYOUTS,
    bits,
    cpu_empty,
    from_numpy_bits,
    host_empty,
    logical,
    place,
    random_values,
    tol,
)
from kael import _dtype as dt  # noqa: E402
from kael._ops import BINARY_OPS, COMPARE_OPS, UNARY_OPS  # noqa: E402
from kael.testing import assert_close  # noqa: E402

DTYPES = [d.name for d in dt.ALL_DTYPES]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def run_both(cpu: Any, ref: Any, op: str, out_shape: tuple[int, ...], out_dtype: dt.DType, *args: Any) -> tuple:
    got = cpu_empty(cpu, out_shape, out_dtype)
    want = host_empty(out_shape, out_dtype)
    cpu.kernel(op)(got, *args)
    ref.kernel(op)(want, *args)
    return logical(got), logical(want)


@SETTINGS
@given(
    shape=shapes,
    src=st.sampled_from(DTYPES),
    dst=st.sampled_from(DTYPES),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_copy_casts_between_every_dtype_pair(
    cpu: Any, ref: Any, shape: tuple, src: str, dst: str, layout: str, seed: int
) -> None:
    s, d = dt.BY_NAME[src], dt.BY_NAME[dst]
    vals = random_values(np.random.default_rng(seed), shape, s) * (30 if s.is_floating_point else 1)
    if d.category == 1 and s.is_floating_point:
        vals = np.clip(vals, 0 if d is dt.uint8 else -100, 100)  # keep float -> int casts in range
    a = place(vals, s, layout)
    got, want = run_both(cpu, ref, "copy", shape, d, a)
    assert_close(got, want, **tol(d), msg=f"copy {src}->{dst} {layout} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [True, 0, 3, -2, 2.5, -0.75])
def test_fill(cpu: Any, ref: Any, dtype: str, value: Any) -> None:
    d = dt.BY_NAME[dtype]
    if d is dt.uint8 and isinstance(value, (int, float)) and value < 0:
        pytest.skip("negative values do not fit uint8")
    got, want = run_both(cpu, ref, "fill", (3, 4), d, value)
    assert_close(got, want, **tol(d))


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("start,step", [(0, 1), (5, -2), (0.5, 0.25), (-3, 0.1)])
def test_arange(cpu: Any, ref: Any, dtype: str, start: Any, step: Any) -> None:
    d = dt.BY_NAME[dtype]
    got, want = run_both(cpu, ref, "arange", (17,), d, start, step)
    assert_close(got, want, **tol(d))


@SETTINGS
@given(
    shape=shapes,
    dtype=st.sampled_from(DTYPES),
    layouts=st.tuples(*[st.sampled_from(LAYOUTS)] * 3),
    seed=st.integers(0, 2**16),
)
def test_where(cpu: Any, ref: Any, shape: tuple, dtype: str, layouts: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    cond = place(rng.random(shape) < 0.5, dt.bool_, layouts[0])
    a = place(random_values(rng, shape, d), d, layouts[1])
    b = place(random_values(rng, shape, d), d, layouts[2])
    got, want = run_both(cpu, ref, "where", shape, d, cond, a, b)
    assert_close(got, want, **tol(d))


@pytest.mark.parametrize("dtype", ["bool", "uint8", "float16", "float32", "int64", "float64"])
@pytest.mark.parametrize("scalars", ["a", "b", "both"])
def test_where_with_one_value_broadcast_everywhere(cpu: Any, ref: Any, dtype: str, scalars: str) -> None:
    """where(cond, a, b) with a, b or both a single value broadcast over every dim (stride 0 in every dim, as
    the gradient of a mean is, and the 0 of ReLU's backward): the reference's results, so each output element
    takes its own operand's value (the masked-select path for contiguous runs)."""
    rng = np.random.default_rng(3)
    d = dt.BY_NAME[dtype]
    shape = (5, 37)
    cond = place(rng.random(shape) < 0.5, dt.bool_, "contiguous")

    def operand(name: str) -> Any:
        if name in scalars or scalars == "both":
            one = np.array(bits(random_values(rng, (1, 1), d), d), copy=True)
            return from_numpy_bits(np.broadcast_to(one, shape), d)  # strides (0, 0)
        return place(random_values(rng, shape, d), d, "contiguous")

    got, want = run_both(cpu, ref, "where", shape, d, cond, operand("a"), operand("b"))
    assert_close(got, want, **tol(d))


_INT_UNARY = ("neg", "abs", "sign", "floor", "ceil", "round", "logical_not")
_DOMAIN = {"log": "positive", "sqrt": "positive", "rsqrt": "positive", "log1p": "positive"}


@SETTINGS
@given(
    op=st.sampled_from(UNARY_OPS),
    shape=shapes,
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_unary(cpu: Any, ref: Any, op: str, shape: tuple, dtype: str, layout: str, seed: int) -> None:
    d = dt.BY_NAME[dtype]
    if not d.is_floating_point and op not in _INT_UNARY:
        d = dt.float32  # the frontend casts integers to float first
    if d is dt.bool_ and op in ("neg", "sign", "abs"):
        d = dt.int8
    vals = random_values(np.random.default_rng(seed), shape, d, _DOMAIN.get(op, "normal"))
    if op == "round" and d.is_floating_point:
        vals = np.round(vals * 4) / 4  # exercise ties
    a = place(vals, d, layout)
    out_dtype = dt.bool_ if op == "logical_not" else d
    got, want = run_both(cpu, ref, op, shape, out_dtype, a)
    assert_close(got, want, **tol(out_dtype, 2.0), msg=f"{op} {d.name} {layout} {shape}")


@SETTINGS
@given(
    op=st.sampled_from(BINARY_OPS + COMPARE_OPS),
    shape=shapes,
    dtype=st.sampled_from(DTYPES),
    layouts=st.tuples(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS)),
    seed=st.integers(0, 2**16),
)
def test_binary(cpu: Any, ref: Any, op: str, shape: tuple, dtype: str, layouts: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    if op in ("logical_and", "logical_or"):
        d = dt.bool_
    elif d is dt.bool_ and op not in COMPARE_OPS:
        d = dt.uint8
    if op == "div" and not d.is_floating_point:
        d = dt.float32
    kind_b = "nonzero" if op in ("div", "remainder", "floor_divide") else ("positive" if op == "pow" else "normal")
    kind_a = "positive" if op == "pow" and d.is_floating_point else "normal"
    a = place(random_values(rng, shape, d, kind_a), d, layouts[0])
    b = place(random_values(rng, shape, d, kind_b), d, layouts[1])
    out_dtype = dt.bool_ if op in COMPARE_OPS else d
    got, want = run_both(cpu, ref, op, shape, out_dtype, a, b)
    assert_close(got, want, **tol(out_dtype, 2.0), msg=f"{op} {d.name} {layouts} {shape}")


@pytest.mark.parametrize("op", ["add", "mul", "sub", "maximum"])
def test_in_place_binary_writes_through_a_transposed_view(cpu: Any, ref: Any, op: str) -> None:
    rng = np.random.default_rng(1)
    base = rng.standard_normal((40, 30)).astype(np.float32)
    other = place(rng.standard_normal((30, 40)), dt.float32, "stepped")
    mine, theirs = place(base, dt.float32, "contiguous"), place(base, dt.float32, "contiguous")
    mt, tt = mine.T, theirs.T  # out aliases the first operand, both non-contiguous
    cpu.kernel(op)(mt, mt, other)
    ref.kernel(op)(tt, tt, other)
    assert_close(logical(mine), logical(theirs), rtol=0, atol=0)


def test_integer_edge_cases_follow_numpy(cpu: Any) -> None:
    a = place(np.array([7, -7, 7, -7, np.iinfo(np.int64).min, 5]), dt.int64, "contiguous")
    b = place(np.array([2, 2, -2, -2, -1, 3]), dt.int64, "contiguous")
    for op, want in [("floor_divide", [3, -4, -4, 3, np.iinfo(np.int64).min, 1]), ("remainder", [1, 1, -1, -1, 0, 2])]:
        out = cpu_empty(cpu, (6,), dt.int64)
        cpu.kernel(op)(out, a, b)
        assert logical(out).tolist() == want, op
    out = cpu_empty(cpu, (3,), dt.int8)
    x = place(np.array([100, -128, 3]), dt.int8, "contiguous")
    cpu.kernel("add")(out, x, x)
    assert logical(out).tolist() == [-56, 0, 6]  # wraps like NumPy
    cpu.kernel("pow")(out, x, place(np.array([2, 1, 4]), dt.int8, "contiguous"))
    assert logical(out).tolist() == [16, -128, 81]


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_specials_match_reference(cpu: Any, ref: Any, dtype: str) -> None:
    d = dt.BY_NAME[dtype]
    vals = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 2.5, -2.5, 0.5, 1e-30, 60.0])
    a = place(vals, d, "contiguous")
    for op in ("exp", "tanh", "sigmoid", "abs", "round", "floor", "sign", "neg", "expm1", "erf"):
        got, want = run_both(cpu, ref, op, vals.shape, d, a)
        assert_close(got, want, **tol(d, 2.0), msg=f"{op} {dtype}")
    b = place(vals[::-1].copy(), d, "contiguous")
    for op in ("maximum", "minimum", "remainder", "floor_divide", "add", "div"):
        got, want = run_both(cpu, ref, op, vals.shape, d, a, b)
        assert_close(got, want, **tol(d, 2.0), msg=f"{op} {dtype}")


def test_overlapping_in_place_reads_inputs_before_writing(cpu: Any, ref: Any) -> None:
    base = np.arange(10, dtype=np.float32)
    mine, theirs = place(base, dt.float32, "contiguous"), place(base, dt.float32, "contiguous")
    for t, backend in ((mine, cpu), (theirs, ref)):
        dst, src = t[1:], t[:-1]  # shifted views of one buffer
        backend.kernel("add")(dst, dst, src)
        backend.kernel("copy")(t[::2], t[1::2])
        backend.kernel("exp")(t[:5], t[5:])
    assert_close(logical(mine), logical(theirs), rtol=2e-6, atol=0)
