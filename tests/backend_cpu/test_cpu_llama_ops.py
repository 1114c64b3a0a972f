"""The CPU backend's Llama-family fused kernels (csrc/rms_norm.cpp, rope.cpp, silu_mul.cpp):
rms_norm, rope and silu_mul against float64 NumPy oracles written here (and Hugging Face's
modules via torch where it exists), over shapes, strides and dtypes; in place; their errors;
the GIL released while they run; no allocation on the decode-sized call."""

from __future__ import annotations

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
    logical,
    place,
    round_to,
    runs_while,
    tol,
    vals,
)
from kael import _dtype as dt  # noqa: E402
from kael._tensor import Tensor, from_numpy_bits  # noqa: E402
from kael.testing import assert_close  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = ["float16", "bfloat16", "float32", "float64"]


# -- rms_norm ----------------------------------------------------------------------------


def rms_norm64(x: np.ndarray, w: np.ndarray | None, eps: float, d: dt.DType) -> tuple[np.ndarray, np.ndarray]:
    """The float64 oracle: rstd, and (x * rstd rounded to d) * w."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)
    y = round_to(x * r[..., None], d)
    return (y if w is None else y * w), r


@SETTINGS
@given(
    rows=st.lists(st.integers(0, 4), min_size=0, max_size=2).map(tuple),
    n=st.one_of(st.integers(1, 40), st.sampled_from([255, 256, 257, 576, 2048])),
    dtype=st.sampled_from(FLOATS),
    layout=st.sampled_from(LAYOUTS),
    with_weight=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-5, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_rms_norm(
    cpu: Any, rows: tuple, n: int, dtype: str, layout: str, with_weight: bool, eps: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    shape = (*rows, n)
    x = place(rng.standard_normal(shape) * 3, d, layout)
    w = place(rng.standard_normal(n) + 1, d, "stepped") if with_weight else None
    sd = dt.float64 if d is dt.float64 else dt.float32
    out, rstd = cpu_empty(cpu, shape, d), cpu_empty(cpu, rows, sd)
    cpu.kernel("rms_norm")(out, rstd, x, w, eps)
    want, want_r = rms_norm64(vals(x), None if w is None else vals(w), eps, d)
    close(vals(rstd), want_r, sd, 4.0, msg=f"rms_norm rstd {dtype} {layout}")
    # 16-bit floats: x * rstd may round the other way from the float64 oracle (one ulp)
    scale = 4.0 if d in (dt.float32, dt.float64) else 2.0
    close(vals(out), want, d, scale, msg=f"rms_norm {dtype} {layout} n={n}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_rms_norm_against_hugging_face(cpu: Any, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    d = dt.BY_NAME[dtype]
    rng = np.random.default_rng(3)
    n = 576
    xv = rng.standard_normal((5, n)).astype(np.float32) * 2
    wv = (rng.standard_normal(n) * 0.3 + 1).astype(np.float32)
    x, w = place(xv, d, "contiguous"), place(wv, d, "contiguous")
    norm = llama.LlamaRMSNorm(n, eps=1e-5)
    tdt = getattr(torch, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(vals(w).astype(np.float32)))
        norm = norm.to(tdt)
        want = norm(torch.from_numpy(vals(x).astype(np.float32)).to(tdt)).float().numpy()
    out, rstd = cpu_empty(cpu, (5, n), d), cpu_empty(cpu, (5,), dt.float32)
    cpu.kernel("rms_norm")(out, rstd, x, w, 1e-5)
    got = logical(out).astype(np.float32)
    if d is not dt.float32:
        close(got, want, d, 1.0, msg=f"rms_norm vs LlamaRMSNorm {dtype}")
        return
    # torch's float32 mean(x^2) may be a last bit off the correctly rounded one, which
    # the kernel gets (a float64 sum): from there on it is HF's formula bit for bit
    xt = torch.from_numpy(vals(x).astype(np.float32))
    mean = torch.from_numpy((vals(x) ** 2).mean(-1, keepdims=True).astype(np.float32))
    r = torch.rsqrt(mean + 1e-5)
    np.testing.assert_array_equal(logical(rstd), r[:, 0].numpy())
    np.testing.assert_array_equal(got, (torch.from_numpy(vals(w).astype(np.float32)) * (xt * r)).numpy())
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert int(ulps.max()) <= 4, f"{int(ulps.max())} ulps from LlamaRMSNorm"


def test_rms_norm_widening_output_is_the_float32_weight_product(cpu: Any) -> None:
    # a float32 weight with bfloat16 x: HF returns weight * x_normed.to(bfloat16) in float32
    rng = np.random.default_rng(4)
    xv, wv = rng.standard_normal((3, 64)), rng.standard_normal(64)
    x, w = place(xv, dt.bfloat16, "contiguous"), place(wv, dt.float32, "contiguous")
    out, rstd = cpu_empty(cpu, (3, 64), dt.float32), cpu_empty(cpu, (3,), dt.float32)
    cpu.kernel("rms_norm")(out, rstd, x, w, 1e-6)
    want, _ = rms_norm64(vals(x), vals(w), 1e-6, dt.bfloat16)
    assert_close(vals(out), want, rtol=2e-6, atol=1e-6)


def test_rms_norm_in_place_and_empty_rows(cpu: Any) -> None:
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((4, 300))
    x = from_numpy_bits(xv.astype(np.float32), dt.float32)
    want, _ = rms_norm64(vals(x), None, 1e-6, dt.float32)
    rstd = cpu_empty(cpu, (4,), dt.float32)
    cpu.kernel("rms_norm")(x, rstd, x, None, 1e-6)
    assert_close(vals(x), want, rtol=4e-6, atol=4e-6)
    empty, r0 = cpu_empty(cpu, (3, 0), dt.float32), cpu_empty(cpu, (3,), dt.float32)
    cpu.kernel("rms_norm")(empty, r0, cpu_empty(cpu, (3, 0), dt.float32), None, 1e-6)
    assert np.isnan(vals(r0)).all()  # mean of no elements


def test_rms_norm_errors(cpu: Any) -> None:
    k = cpu.kernel("rms_norm")
    x = place(np.ones((2, 8)), dt.float32, "contiguous")
    out, rstd = cpu_empty(cpu, (2, 8), dt.float32), cpu_empty(cpu, (2,), dt.float32)
    with pytest.raises(kael.ShapeError, match=r"rms_norm: weight must be \[8\]"):
        k(out, rstd, x, place(np.ones(7), dt.float32, "contiguous"), 1e-6)
    with pytest.raises(kael.ShapeError, match="rms_norm: rstd must have x's shape"):
        k(out, cpu_empty(cpu, (3,), dt.float32), x, None, 1e-6)
    with pytest.raises(kael.DTypeError, match="rms_norm: rstd must be float32 or float64, got int64"):
        k(out, cpu_empty(cpu, (2,), dt.int64), x, None, 1e-6)
    with pytest.raises(kael.DTypeError, match="rms_norm: expected a floating-point x, got int32"):
        k(cpu_empty(cpu, (2, 8), dt.int32), rstd, place(np.ones((2, 8)), dt.int32, "contiguous"), None, 1e-6)
    with pytest.raises(kael.ShapeError, match="rms_norm: out must have x's shape"):
        k(cpu_empty(cpu, (2, 9), dt.float32), rstd, x, None, 1e-6)


def test_decode_sized_rms_norm_allocates_nothing(cpu: Any) -> None:
    rng = np.random.default_rng(6)
    for d, n in ((dt.float32, 576), (dt.bfloat16, 2048)):
        x, w = place(rng.standard_normal((1, n)), d, "contiguous"), place(rng.standard_normal(n), d, "contiguous")
        out, rstd = cpu_empty(cpu, (1, n), d), cpu_empty(cpu, (1,), dt.float32)
        before = kbc.memory_stats()["num_allocs"]
        for _ in range(5):
            cpu.kernel("rms_norm")(out, rstd, x, w, 1e-6)
        assert kbc.memory_stats()["num_allocs"] == before


# -- silu_mul ----------------------------------------------------------------------------


def silu_mul64(g: np.ndarray, u: np.ndarray, d: dt.DType) -> np.ndarray:
    with np.errstate(over="ignore"):
        s = g / (1.0 + np.exp(-g))
    return round_to(s, d) * u  # 16-bit floats round silu(gate) before the product


@SETTINGS
@GATED_CASES
def test_silu_mul(cpu: Any, shape: tuple, dtype: str, layout: str, scale: float, seed: int) -> None:
    check_gated(cpu, "silu_mul", silu_mul64, shape, dtype, layout, scale, seed)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("inter", [1, 7, 1536])
def test_silu_mul_on_the_halves_of_one_projection(cpu: Any, dtype: str, inter: int) -> None:
    # the Llama MLP passes gate and up as the two halves of one [.., 2I] linear output
    check_gated_halves(cpu, "silu_mul", silu_mul64, dtype, inter)


def test_silu_mul_in_place_and_errors(cpu: Any) -> None:
    rng = np.random.default_rng(7)
    gv, uv = rng.standard_normal(100), rng.standard_normal(100)
    g = from_numpy_bits(gv.astype(np.float32), dt.float32)
    u = from_numpy_bits(uv.astype(np.float32), dt.float32)
    want = silu_mul64(vals(g), vals(u), dt.float32)
    cpu.kernel("silu_mul")(g, g, u)
    close(vals(g), want, dt.float32, 2.0)
    k = cpu.kernel("silu_mul")
    with pytest.raises(kael.ShapeError, match="silu_mul: gate, up and out must share a shape"):
        k(cpu_empty(cpu, (100,), dt.float32), u, place(np.ones(99), dt.float32, "contiguous"))
    with pytest.raises(kael.DTypeError, match=r"silu_mul: gate \(float64\), up \(float32\)"):
        k(cpu_empty(cpu, (100,), dt.float32), place(gv, dt.float64, "contiguous"), u)


# -- rope --------------------------------------------------------------------------------


def tables(p: int, half: int, d: dt.DType, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    inv = 1.0 / base ** (np.arange(half) / half)
    ang = np.arange(p)[:, None] * inv[None, :]
    return place(np.cos(ang), d, "contiguous"), place(np.sin(ang), d, "contiguous")


def rope64(x: np.ndarray, c: np.ndarray, s: np.ndarray, pos: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    cc, ss = c[pos][:, None], s[pos][:, None]  # [B, 1, T, h]
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cc - x2 * ss, x2 * cc + x1 * ss], axis=-1)


@SETTINGS
@given(
    b=st.integers(1, 2),
    nh=st.integers(1, 3),
    t=st.integers(1, 4),
    d=st.one_of(st.sampled_from([2, 6, 16, 18, 64]), st.integers(1, 12).map(lambda v: 2 * v)),
    dtype=st.sampled_from(FLOATS),
    table_dtype=st.sampled_from(["float32", "float64"]),
    layout=st.sampled_from(["contiguous", "transposed", "stepped", "offset"]),
    broadcast_positions=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rope(
    cpu: Any,
    b: int,
    nh: int,
    t: int,
    d: int,
    dtype: str,
    table_dtype: str,
    layout: str,
    broadcast_positions: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    xd, td = dt.BY_NAME[dtype], dt.BY_NAME[table_dtype]
    npos = 40
    x = place(rng.standard_normal((b, nh, t, d)), xd, layout)
    c, s = tables(npos, d // 2, td)
    if broadcast_positions:  # one row of positions for every batch row (stride 0)
        pv = np.broadcast_to(rng.integers(0, npos, (1, t)), (b, t))
    else:
        pv = rng.integers(0, npos, (b, t))
    pos = from_numpy_bits(pv.astype(np.int64), dt.int64)
    out = cpu_empty(cpu, (b, nh, t, d), xd)
    cpu.kernel("rope")(out, x, c, s, pos)
    want = rope64(vals(x), vals(c), vals(s), np.asarray(pv))
    wide = dt.float64 in (xd, td)
    t_ = tol(xd, 2.0) if xd is not dt.float32 or not wide else {"rtol": 2e-7, "atol": 1e-7}
    assert_close(vals(out), want, rtol=t_["rtol"], atol=t_["atol"], msg=f"rope {dtype} tables {table_dtype} {layout}")
    # in place: out is x itself, bit for bit the out-of-place result
    y = place(vals(x), xd, "contiguous")
    cpu.kernel("rope")(y, y, c, s, pos)
    np.testing.assert_array_equal(logical(y), logical(out))


def test_rope_against_hugging_face(cpu: Any) -> None:
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    rng = np.random.default_rng(8)
    b, nh, t, d = 2, 3, 5, 64
    xv = rng.standard_normal((b, nh, t, d)).astype(np.float32)
    c, s = tables(50, d // 2, dt.float32)
    pv = rng.integers(0, 50, (b, t))
    cos = torch.from_numpy(np.concatenate([vals(c), vals(c)], -1).astype(np.float32))[torch.from_numpy(pv)]
    sin = torch.from_numpy(np.concatenate([vals(s), vals(s)], -1).astype(np.float32))[torch.from_numpy(pv)]
    q = torch.from_numpy(xv)
    want, _ = llama.apply_rotary_pos_emb(q, q, cos, sin)
    out = cpu_empty(cpu, (b, nh, t, d), dt.float32)
    cpu.kernel("rope")(out, place(xv, dt.float32, "contiguous"), c, s, from_numpy_bits(pv.astype(np.int64), dt.int64))
    assert_close(logical(out), want.numpy(), rtol=1e-6, atol=1e-6)


def test_rope_errors_write_nothing(cpu: Any) -> None:
    k = cpu.kernel("rope")
    c, s = tables(8, 4, dt.float32)
    x = place(np.ones((1, 2, 3, 8)), dt.float32, "contiguous")
    out = from_numpy_bits(np.full((1, 2, 3, 8), 7.0, np.float32), dt.float32)
    for bad in (8, -1, 2**40):
        pos = from_numpy_bits(np.array([[0, bad, 1]], np.int64), dt.int64)
        with pytest.raises(kael.IndexError_, match=rf"rope: positions\[0, 1\] = {bad} is out of range for tables of 8"):
            k(out, x, c, s, pos)
        assert (logical(out) == 7.0).all()
    pos = from_numpy_bits(np.zeros((1, 3), np.int64), dt.int64)
    with pytest.raises(kael.ShapeError, match="rope: the head dim D must be even, got 7"):
        k(cpu_empty(cpu, (1, 2, 3, 7), dt.float32), place(np.ones((1, 2, 3, 7)), dt.float32, "contiguous"), c, s, pos)
    with pytest.raises(kael.ShapeError, match=r"rope: cos and sin must both be \[P, 4\]"):
        k(out, x, *tables(8, 3, dt.float32), pos)
    with pytest.raises(kael.DTypeError, match="rope: cos and sin must both be float32 or float64, got float16"):
        k(out, x, *tables(8, 4, dt.float16), pos)
    with pytest.raises(kael.ShapeError, match=r"rope: positions must be \[B, T\] = \[1, 3\]"):
        k(out, x, c, s, from_numpy_bits(np.zeros((1, 2), np.int64), dt.int64))
    with pytest.raises(kael.DTypeError, match="rope: positions must be int64, got int32"):
        k(out, x, c, s, from_numpy_bits(np.zeros((1, 3), np.int32), dt.int32))
    with pytest.raises(kael.ShapeError, match="rope: x must be"):
        k(out[0], x[0], c, s, pos)


# -- the GIL -----------------------------------------------------------------------------


@pytest.fixture
def one_thread() -> Any:
    before = kbc.get_num_threads()
    kbc.set_num_threads(1)
    yield
    kbc.set_num_threads(before)


def test_kernels_release_the_gil(cpu: Any, one_thread: Any) -> None:
    rng = np.random.default_rng(9)
    n = 1 << 22
    x = from_numpy_bits(rng.standard_normal((n // 1024, 1024)).astype(np.float64), dt.float64)
    out, rstd = cpu_empty(cpu, (n // 1024, 1024), dt.float64), cpu_empty(cpu, (n // 1024,), dt.float64)
    x4 = x.reshape((1, 64, n // (1024 * 64), 1024))
    c, s = tables(1, 512, dt.float64)
    pos = from_numpy_bits(np.zeros((1, n // (1024 * 64)), np.int64), dt.int64)
    calls = {
        "rms_norm": lambda: cpu.kernel("rms_norm")(out, rstd, x, None, 1e-6),
        "silu_mul": lambda: cpu.kernel("silu_mul")(out, x, x),
        "rope": lambda: cpu.kernel("rope")(out.reshape(x4.shape), x4, c, s, pos),
    }
    for name, call in calls.items():
        # a loaded machine may not schedule this thread during one call; holding the GIL
        # fails every attempt
        assert any(runs_while(call) for _ in range(5)), f"{name} held the GIL"
