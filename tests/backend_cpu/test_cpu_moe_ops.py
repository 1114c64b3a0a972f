"""The CPU backend's mixture-of-experts kernels (csrc/moe.cpp): moe_route and expert_linear against
float64 NumPy oracles written here and against the frontend's decompositions on this backend (bit for
bit: NOTE [moe_route bits], NOTE [expert_linear grouping]), over shapes, strides (a stride-0 x over
the slots, the transposed weight view the backward passes) and dtypes; ties, nan rows; a row batched
equal to the row alone; their errors; the GIL released while they run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")

from cpu_helpers import bits, cpu_empty, logical, place, runs_while  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import Tensor, from_numpy_bits  # noqa: E402
from kael.backends import catalogue  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = ["float16", "bfloat16", "float32", "float64"]
moe_route_decomp = catalogue.decomposition("moe_route")
expert_linear_decomp = catalogue.decomposition("expert_linear")
#: unit roundoff of each dtype (a result rounded to it is within u * |value|)
UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}


@pytest.fixture(autouse=True)
def _needs_the_kernels(cpu: Any) -> None:
    missing = {"moe_route", "expert_linear"} - set(cpu.supported_ops())
    if missing:
        pytest.skip(f"this build of kael_backend_cpu has no {sorted(missing)} kernels (an older extension)")


@pytest.fixture
def on_cpu(cpu: Any) -> Iterator[None]:
    """The C++ backend serves device cpu (the decompositions run on its primitives)."""
    kael.backends.use("cpu", cpu.name)
    try:
        yield
    finally:
        kael.backends.use("cpu", None)


def vals(t: Tensor) -> np.ndarray:
    return logical(t).astype(np.float64)


def same_bits(a: Tensor, b: Tensor) -> bool:
    return np.array_equal(logical(a), logical(b), equal_nan=True)


# -- moe_route ------------------------------------------------------------------------------


def route64(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """softmax in float64, the k largest by a stable sort (ties in index order), renormalised if asked."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, idx, -1)
    return (w / w.sum(-1, keepdims=True) if normalize else w), idx


def run_route(cpu: Any, logits: Tensor, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    t = logits.shape[0]
    w = cpu_empty(cpu, (t, k), dt.float64 if logits.dtype is dt.float64 else dt.float32)
    ex = cpu_empty(cpu, (t, k), dt.int64)
    cpu.kernel("moe_route")(w, ex, logits, k, normalize)
    return w, ex


@SETTINGS
@given(
    t=st.integers(1, 6),
    e=st.integers(1, 20),
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    layout=st.sampled_from(["contiguous", "transposed", "stepped", "offset"]),
    normalize=st.booleans(),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_moe_route(
    cpu: Any, on_cpu: None, t: int, e: int, data: Any, dtype: str, layout: str, normalize: bool, ties: bool, seed: int
) -> None:
    """Against float64 NumPy (experts exactly: equal logits tie exactly, distinct ones are far apart at these
    scales) and against the decomposition on this backend, bit for bit."""
    k = data.draw(st.integers(1, e))
    rng = np.random.default_rng(seed)
    raw = rng.integers(-3, 4, size=(t, e)) if ties else rng.standard_normal((t, e)) * 4
    logits = place(raw, dt.BY_NAME[dtype], layout)
    w, ex = run_route(cpu, logits, k, normalize)
    want_w, want_ex = route64(vals(logits), k, normalize)
    np.testing.assert_array_equal(logical(ex), want_ex)
    rtol = 1e-13 if dtype == "float64" else 2e-6
    np.testing.assert_allclose(vals(w), want_w, rtol=rtol, atol=0)
    dw, dex = moe_route_decomp(logits, k, normalize)
    assert same_bits(w, dw) and same_bits(ex, dex), f"{dtype} {layout}: the kernel differs from the decomposition"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_moe_route_decode_shapes_equal_the_decomposition(cpu: Any, on_cpu: None, dtype: str) -> None:
    """Router shapes of real models (64 and 128 experts, top 8), many rows: the decomposition's bits."""
    rng = np.random.default_rng(1)
    for e in (64, 128):
        logits = place(rng.standard_normal((33, e)) * 2, dt.BY_NAME[dtype], "contiguous")
        for normalize in (False, True):
            w, ex = run_route(cpu, logits, 8, normalize)
            dw, dex = moe_route_decomp(logits, 8, normalize)
            assert same_bits(w, dw) and same_bits(ex, dex), (e, normalize)
            np.testing.assert_allclose(vals(w), route64(vals(logits), 8, normalize)[0], rtol=2e-6)


def test_moe_route_nan_and_infinite_logits(cpu: Any, on_cpu: None) -> None:
    """A nan (or +inf) anywhere makes its row's weights nan, experts the first k (the sort's order for nan);
    -inf logits get probability 0; the decomposition agrees."""
    nan, inf = np.nan, np.inf
    raw = np.array([[0.0, nan, 1.0, 2.0, 3.0], [1.0, inf, 0.0, 2.0, 1.0], [-inf, 2.0, -inf, 1.0, -inf], [-inf] * 5])
    logits = place(raw, dt.float32, "contiguous")
    w, ex = run_route(cpu, logits, 3, True)
    wv, exv = vals(w), logical(ex)
    assert np.isnan(wv[[0, 1, 3]]).all()
    np.testing.assert_array_equal(exv[[0, 1, 3]], [[0, 1, 2]] * 3)
    np.testing.assert_array_equal(exv[2], [1, 3, 0])
    np.testing.assert_allclose(wv[2], [1 / (1 + np.exp(-1)), np.exp(-1) / (1 + np.exp(-1)), 0.0], rtol=2e-6)
    dw, dex = moe_route_decomp(logits, 3, True)
    assert same_bits(w, dw) and same_bits(ex, dex)


def test_moe_route_errors(cpu: Any) -> None:
    k = cpu.kernel("moe_route")
    z = place(np.zeros((2, 4)), dt.float32, "contiguous")
    w, ex = cpu_empty(cpu, (2, 2), dt.float32), cpu_empty(cpu, (2, 2), dt.int64)
    with pytest.raises(kael.ShapeError, match=r"moe_route: k=5 must be in \[1, 4\]"):
        k(cpu_empty(cpu, (2, 5), dt.float32), cpu_empty(cpu, (2, 5), dt.int64), z, 5, False)
    with pytest.raises(kael.ShapeError, match=r"moe_route: weights and experts must be \[2, 3\]"):
        k(w, ex, z, 3, False)
    with pytest.raises(kael.DTypeError, match="moe_route: weights must be float64 and experts int64 for float64"):
        k(w, ex, place(np.zeros((2, 4)), dt.float64, "contiguous"), 2, False)
    with pytest.raises(kael.DTypeError, match="moe_route: logits must be floating-point, got int64"):
        k(w, ex, place(np.zeros((2, 4)), dt.int64, "contiguous"), 2, False)


# -- expert_linear --------------------------------------------------------------------------


def weight_view(values: np.ndarray, d: dt.DType, layout: str) -> Tensor:
    """weight [E, N, C] contiguous, as the backward's transposed view (strides (N*C, 1, N)), or stepped."""
    if layout == "backward":
        return from_numpy_bits(np.ascontiguousarray(bits(values, d).transpose(0, 2, 1)).transpose(0, 2, 1), d)
    return place(values, d, layout)


def x_view(values: np.ndarray, d: dt.DType, layout: str) -> Tensor:
    """x [T, K, C] in a layout; "slots" a stride-0 broadcast of its [T, C] first slot over K (a token's rows)."""
    if layout == "slots":
        b = np.ascontiguousarray(bits(values[:, 0], d))
        return from_numpy_bits(np.broadcast_to(b[:, None, :], values.shape), d)
    return place(values, d, layout)


def linear64(x: np.ndarray, w: np.ndarray, ex: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out, bound): the float64 product and sum |x| |w| (what the rounding error scales with)."""
    return np.einsum("tknc,tkc->tkn", w[ex], x), np.einsum("tknc,tkc->tkn", np.abs(w[ex]), np.abs(x))


def within(got: np.ndarray, want: np.ndarray, bound: np.ndarray, dtype: str, c: int, msg: str) -> None:
    """|got - want| <= (c + 2) u32 bound (float32 accumulation; float64's own u) + the final rounding to dtype."""
    acc = UNIT["float64" if dtype == "float64" else "float32"] * (c + 2) * bound
    tol = acc + (UNIT[dtype] * np.abs(want) + 1e-7 if dtype in ("float16", "bfloat16") else 0.0)
    bad = np.abs(got - want) > tol * 1.01
    assert not bad.any(), f"{msg}: {int(bad.sum())} element(s) off, first {got[bad][:3]} vs {want[bad][:3]}"


def run_linear(cpu: Any, x: Tensor, w: Tensor, ex: Tensor) -> Tensor:
    out = cpu_empty(cpu, (x.shape[0], x.shape[1], w.shape[1]), x.dtype)
    cpu.kernel("expert_linear")(out, x, w, ex)
    return out


@SETTINGS
@given(
    t=st.integers(0, 5),
    kk=st.integers(1, 4),
    e=st.integers(1, 6),
    n=st.integers(1, 40),
    c=st.integers(0, 40),
    dtype=st.sampled_from(FLOATS),
    xl=st.sampled_from(["contiguous", "transposed", "stepped", "slots"]),
    wl=st.sampled_from(["contiguous", "backward", "stepped", "transposed"]),
    seed=st.integers(0, 2**16),
)
def test_expert_linear(
    cpu: Any, on_cpu: None, t: int, kk: int, e: int, n: int, c: int, dtype: str, xl: str, wl: str, seed: int
) -> None:
    """Against float64 NumPy with a rounding bound, and against the decomposition bit for bit where it runs
    the same kernels (float32/float64: any number of rows; the 16-bit floats at most 16 rows an expert; not
    the float32/64 weights contiguous along neither dim, for which matmul packs)."""
    d = dt.BY_NAME[dtype]
    rng = np.random.default_rng(seed)
    x = x_view(rng.standard_normal((t, kk, c)), d, xl)
    w = weight_view(rng.standard_normal((e, n, c)), d, wl)
    ids = rng.integers(0, e, size=(t, kk))
    ex = place(ids, dt.int64, "contiguous")
    out = run_linear(cpu, x, w, ex)
    want, bound = linear64(vals(x), vals(w), ids)
    within(vals(out), want, bound, dtype, c, f"{dtype} x {xl} weight {wl}")
    few = t * kk == 0 or np.bincount(ids.reshape(-1)).max() <= 16
    in_place = wl in ("contiguous", "backward") or d.itemsize == 2
    if (few or d.itemsize > 2) and in_place:
        assert same_bits(out, expert_linear_decomp(x, w, ex)), f"{dtype} x {xl} weight {wl}: not the decomposition"


@pytest.mark.parametrize("dtype", FLOATS)
def test_expert_linear_decode_shapes(cpu: Any, on_cpu: None, dtype: str) -> None:
    """A decode step's shapes (x [T, C] over the top 8 of 64 experts; C above the kernels' depth block):
    float64 NumPy, and the decomposition's bits."""
    d = dt.BY_NAME[dtype]
    rng = np.random.default_rng(2)
    t, kk, e, n, c = 3, 8, 64, 40, 1100
    x = x_view(rng.standard_normal((t, kk, c)), d, "slots")
    w = place(rng.standard_normal((e, n, c)) / 16, d, "contiguous")
    ids = np.stack([rng.permutation(e)[:kk] for _ in range(t)])
    ids[1] = ids[0]  # two tokens on the same experts
    ex = place(ids, dt.int64, "contiguous")
    out = run_linear(cpu, x, w, ex)
    want, bound = linear64(vals(x), vals(w), ids)
    within(vals(out), want, bound, dtype, c, dtype)
    assert same_bits(out, expert_linear_decomp(x, w, ex))


@pytest.mark.parametrize("wl", ["contiguous", "backward", "stepped"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_expert_linear_rows_batched_equal_rows_alone(cpu: Any, dtype: str, wl: str) -> None:
    """A decode batch of 16 tokens, every one on expert 2 (16 rows, one few-row call: ``linear``'s guarantee,
    NOTE [gemm paths]): each token's rows equal the token run alone, bit for bit."""
    d = dt.BY_NAME[dtype]
    rng = np.random.default_rng(3)
    t, kk, e, n, c = 16, 2, 4, 30, 70
    xs = rng.standard_normal((t, kk, c))
    ids = np.stack([np.full(t, 2), rng.choice([0, 1, 3], size=t)], axis=1)
    w = weight_view(rng.standard_normal((e, n, c)), d, wl)
    x = place(xs, d, "contiguous")
    out = logical(run_linear(cpu, x, w, place(ids, dt.int64, "contiguous")))
    for i in range(0, t, 3):
        alone = run_linear(cpu, place(xs[i : i + 1], d, "contiguous"), w, place(ids[i : i + 1], dt.int64, "contiguous"))
        np.testing.assert_array_equal(logical(alone)[0], out[i], err_msg=f"token {i}")


def test_expert_linear_gradients_through_the_kernel(on_cpu: None) -> None:
    """The frontend's backward (the transposed weight view through the kernel, one product per expert for dW)."""
    rng = np.random.default_rng(4)
    t, kk, e, n, c = 5, 3, 4, 7, 9
    x, w = rng.standard_normal((t, c)), rng.standard_normal((e, n, c)).astype(np.float32)
    ids, g = rng.integers(0, e, size=(t, kk)), rng.standard_normal((t, kk, n))
    kx = kael.tensor(x.astype(np.float32), requires_grad=True)
    kw = kael.tensor(w, requires_grad=True)
    kael.sum(kael.expert_linear(kx, kw, kael.tensor(ids)) * kael.tensor(g.astype(np.float32))).backward()
    dx = np.einsum("tknc,tkn->tc", w[ids].astype(np.float64), g)
    assert kx.grad is not None and kw.grad is not None
    np.testing.assert_allclose(kx.grad.numpy(), dx, rtol=1e-5, atol=1e-5)
    dw = np.zeros((e, n, c))
    np.add.at(dw, ids.reshape(-1), np.einsum("rn,rc->rnc", g.reshape(-1, n), np.repeat(x, kk, 0)))
    np.testing.assert_allclose(kw.grad.numpy(), dw, rtol=1e-5, atol=1e-5)


def test_expert_linear_errors(cpu: Any) -> None:
    k = cpu.kernel("expert_linear")
    x = place(np.ones((2, 2, 3)), dt.float32, "contiguous")
    w = place(np.ones((4, 5, 3)), dt.float32, "contiguous")
    out = cpu_empty(cpu, (2, 2, 5), dt.float32)
    for bad, value in (([[0, 3], [4, 1]], 4), ([[0, -2], [1, 1]], -2)):
        with pytest.raises(kael.IndexError_, match=rf"expert_linear: expert {value} at \[\d, \d\] is out of range"):
            k(out, x, w, place(np.array(bad), dt.int64, "contiguous"))
    ex = place(np.zeros((2, 2)), dt.int64, "contiguous")
    with pytest.raises(kael.ShapeError, match=r"expert_linear: x \[2, 2, 3\] and out \[2, 2, 5\] do not fit"):
        k(out, x, place(np.ones((4, 3, 3)), dt.float32, "contiguous"), ex)
    with pytest.raises(kael.DTypeError, match="expert_linear: x, weight and out must share a floating-point dtype"):
        k(out, x, place(np.ones((4, 5, 3)), dt.float64, "contiguous"), ex)
    with pytest.raises(kael.DTypeError, match="expert_linear: experts must be int64, got int32"):
        k(out, x, w, place(np.zeros((2, 2)), dt.int32, "contiguous"))


def test_frontend_runs_the_kernels(cpu: Any, on_cpu: None) -> None:
    seen: list[str] = []

    def record(dev: Any, op: str, backend: Any, kernel: Any) -> Any:
        seen.append(op)
        return kernel

    kael.backends.dispatch.set_kernel_wrapper(record)
    try:
        w, ex = kael.moe_route(kael.randn(3, 8), 2, True)
        kael.expert_linear(kael.randn(3, 4), kael.randn(8, 5, 4), ex)
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert {"moe_route", "expert_linear"} <= set(seen), seen
    assert not {"sort", "index_select", "index_add", "matmul"} & set(seen), seen


# -- the GIL -----------------------------------------------------------------------------


def test_kernels_release_the_gil(cpu: Any) -> None:
    before = kbc.get_num_threads()
    kbc.set_num_threads(1)
    try:
        rng = np.random.default_rng(9)
        logits = place(rng.standard_normal((20000, 64)), dt.float64, "contiguous")
        w, ex = cpu_empty(cpu, (20000, 8), dt.float64), cpu_empty(cpu, (20000, 8), dt.int64)
        x = place(rng.standard_normal((64, 8, 512)), dt.float32, "contiguous")
        wt = place(rng.standard_normal((16, 256, 512)), dt.float32, "contiguous")
        ids = place(rng.integers(0, 16, size=(64, 8)), dt.int64, "contiguous")
        out = cpu_empty(cpu, (64, 8, 256), dt.float32)
        calls = {
            "moe_route": lambda: cpu.kernel("moe_route")(w, ex, logits, 8, True),
            "expert_linear": lambda: cpu.kernel("expert_linear")(out, x, wt, ids),
        }
        for name, call in calls.items():
            assert any(runs_while(call) for _ in range(5)), f"{name} held the GIL"
    finally:
        kbc.set_num_threads(before)
