"""Indexing kernels against the reference: gather, index_select, index_add, scatter_add,
cat, nonzero, sort (stable, nan order), topk and embedding, on strided operands."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

import kael  # noqa: E402
from cpu_helpers import LAYOUTS, cpu_empty, host_empty, logical, place, random_values, tol  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import from_numpy_bits  # noqa: E402
from kael.testing import assert_close  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DTYPES = [d.name for d in dt.ALL_DTYPES]


@st.composite
def shape_and_dim(draw: Any, min_size: int = 0) -> tuple:
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(min_size, 5), min_size=ndim, max_size=ndim)))
    return shape, draw(st.integers(0, ndim - 1))


def _index(values: np.ndarray, layout: str = "contiguous") -> Any:
    return place(np.asarray(values, dtype=np.int64), dt.int64, layout)


def _same(cpu: Any, ref: Any, op: str, shape: tuple, d: dt.DType, *args: Any, init: np.ndarray | None = None) -> None:
    if init is None:
        got, want = cpu_empty(cpu, shape, d), host_empty(shape, d)
    else:
        got = cpu_empty(cpu, shape, d)
        cpu.from_host(got, place(init, d, "contiguous")._np_view())
        want = place(init, d, "contiguous")
    cpu.kernel(op)(got, *args)
    ref.kernel(op)(want, *args)
    assert_close(logical(got), logical(want), **tol(d, 4.0), msg=f"{op} {d.name} {shape}")


@SETTINGS
@given(
    case=shape_and_dim(min_size=1),
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_gather(cpu: Any, ref: Any, case: tuple, dtype: str, layout: str, seed: int) -> None:
    shape, dim = case
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    a = place(random_values(rng, shape, d), d, layout)
    ishape = tuple(rng.integers(0, n + 1) if i != dim else rng.integers(0, 6) for i, n in enumerate(shape))
    idx = _index(rng.integers(0, shape[dim], ishape), "transposed")
    _same(cpu, ref, "gather", ishape, d, a, idx, dim)


@SETTINGS
@given(
    case=shape_and_dim(min_size=1),
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_index_select_and_index_add(cpu: Any, ref: Any, case: tuple, dtype: str, layout: str, seed: int) -> None:
    shape, dim = case
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    a = place(random_values(rng, shape, d), d, layout)
    count = int(rng.integers(0, 7))
    idx = _index(rng.integers(0, shape[dim], count), "stepped")
    oshape = shape[:dim] + (count,) + shape[dim + 1 :]
    _same(cpu, ref, "index_select", oshape, d, a, idx, dim)
    if d is dt.bool_:
        return
    src = place(random_values(rng, oshape, d), d, layout)
    _same(cpu, ref, "index_add", shape, d, idx, src, dim, init=random_values(rng, shape, d))


@SETTINGS
@given(
    case=shape_and_dim(min_size=1),
    dtype=st.sampled_from(["int32", "int64", "float32", "float64", "float16"]),
    seed=st.integers(0, 2**16),
)
def test_scatter_add(cpu: Any, ref: Any, case: tuple, dtype: str, seed: int) -> None:
    shape, dim = case
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    ishape = tuple(int(rng.integers(0, n + 1)) for n in shape)
    idx = _index(rng.integers(0, shape[dim], ishape), "transposed")
    src = place(random_values(rng, tuple(n + 1 for n in shape), d), d, "offset")
    _same(cpu, ref, "scatter_add", shape, d, idx, src, dim, init=random_values(rng, shape, d))


@SETTINGS
@given(case=shape_and_dim(), dtype=st.sampled_from(DTYPES), parts=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_cat(cpu: Any, ref: Any, case: tuple, dtype: str, parts: int, seed: int) -> None:
    shape, dim = case
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    sizes = [int(rng.integers(0, 4)) for _ in range(parts)]
    ts = [
        place(random_values(rng, shape[:dim] + (s,) + shape[dim + 1 :], d), d, LAYOUTS[i % len(LAYOUTS)])
        for i, s in enumerate(sizes)
    ]
    _same(cpu, ref, "cat", shape[:dim] + (sum(sizes),) + shape[dim + 1 :], d, ts, dim)


@SETTINGS
@given(
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_nonzero(cpu: Any, ref: Any, shape: tuple, layout: str, seed: int) -> None:
    mask = place(np.random.default_rng(seed).random(shape) < 0.4, dt.bool_, layout)
    count = int(np.count_nonzero(mask._np_view()))
    _same(cpu, ref, "nonzero", (count, len(shape)), dt.int64, mask)


@SETTINGS
@given(
    case=shape_and_dim(),
    dtype=st.sampled_from(DTYPES),
    descending=st.booleans(),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_sort_is_stable_with_nans(
    cpu: Any, ref: Any, case: tuple, dtype: str, descending: bool, layout: str, seed: int
) -> None:
    shape, dim = case
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    vals = random_values(rng, shape, d)
    if d.is_floating_point:
        vals = np.round(vals)  # many ties
        vals[rng.random(shape) < 0.1] = np.nan
    elif d is not dt.bool_:
        vals = vals % 4
    a = place(vals, d, layout)
    gv, gi = cpu_empty(cpu, shape, d), cpu_empty(cpu, shape, dt.int64)
    wv, wi = host_empty(shape, d), host_empty(shape, dt.int64)
    cpu.kernel("sort")(gv, gi, a, dim, descending)
    ref.kernel("sort")(wv, wi, a, dim, descending)
    assert_close(logical(gi), logical(wi))
    assert_close(logical(gv), logical(wv))


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_topk(cpu: Any, ref: Any, shape: tuple, dtype: str, seed: int, data: Any) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    vals = random_values(rng, shape, d)
    if d.is_floating_point:
        vals = np.round(vals * 2)
        vals[rng.random(shape) < 0.1] = np.nan
    k = data.draw(st.integers(1, shape[-1]))
    x = place(vals, d, "transposed")
    oshape = shape[:-1] + (k,)
    gv, gi = cpu_empty(cpu, oshape, d), cpu_empty(cpu, oshape, dt.int64)
    wv, wi = host_empty(oshape, d), host_empty(oshape, dt.int64)
    cpu.kernel("topk")(gv, gi, x, k)
    ref.kernel("topk")(wv, wi, x, k)
    assert_close(logical(gi), logical(wi))
    assert_close(logical(gv), logical(wv))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int64"])
@pytest.mark.parametrize("transposed", [False, True])
def test_embedding(cpu: Any, ref: Any, dtype: str, transposed: bool) -> None:
    rng = np.random.default_rng(2)
    d = dt.BY_NAME[dtype]
    w = place(random_values(rng, (50, 16), d), d, "transposed" if transposed else "contiguous")
    ids = _index(rng.integers(0, 50, (3, 7)), "transposed")
    _same(cpu, ref, "embedding", (3, 7, 16), d, w, ids)


def test_out_of_range_indices_raise_index_errors(cpu: Any) -> None:
    w = from_numpy_bits(np.zeros((4, 3), np.float32), dt.float32)
    out = cpu_empty(cpu, (2, 3), dt.float32)
    with pytest.raises(kael.IndexError_, match="embedding: id 4 is out of range for 4"):
        cpu.kernel("embedding")(out, w, _index([0, 4]))
    with pytest.raises(kael.IndexError_, match="gather"):
        cpu.kernel("gather")(cpu_empty(cpu, (1, 3), dt.float32), w, _index([[0, 9, 1]]), 0)
    with pytest.raises(kael.IndexError_, match="index_select"):
        cpu.kernel("index_select")(cpu_empty(cpu, (1, 3), dt.float32), w, _index([-1]), 0)
