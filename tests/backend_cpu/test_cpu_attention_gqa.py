"""Grouped-query attention in the CPU backend's attention kernel (csrc/attention.cpp, NOTE
[grouped-query attention]): k/v with Hkv heads serving H query heads, against a float64
NumPy oracle with Hugging Face's repeat_kv order; bit for bit the kernel's own result on
materialised repeated K/V (decode steps stack a kv head's query heads into one product);
each batch row what it is alone; errors."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from cpu_helpers import close, cpu_empty, logical, place, vals  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import Tensor  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = ["float16", "bfloat16", "float32", "float64"]


def attention64(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool, lengths: np.ndarray | None
) -> np.ndarray:
    """float64 oracle: query head h reads kv head h // (H // Hkv) (repeat_kv)."""
    b, nh, tq, _ = q.shape
    tk = k.shape[2]
    g = nh // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, kk) * scale
    keys = np.arange(tk)
    allowed = np.ones((b, 1, tq, tk), bool)
    if causal:
        allowed &= keys[None, None, None, :] <= (np.arange(tq) + tk - tq)[None, None, :, None]
    if lengths is not None:
        allowed &= keys[None, None, None, :] < lengths[:, None, None, None]
    s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    den = e.sum(-1, keepdims=True)
    p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)  # a row with no keys gives zeros
    return np.einsum("bhqk,bhkd->bhqd", p, vv)


def run(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, lengths: Tensor | None, cpu: Any) -> Tensor:
    out = cpu_empty(cpu, (*q.shape[:3], v.shape[3]), q.dtype)
    C.attention(out, q, k, v, scale, causal, lengths)  # the C++ kernel itself, float16 included
    return out


@SETTINGS
@given(
    b=st.integers(1, 2),
    nkv=st.integers(1, 3),
    group=st.sampled_from([1, 2, 3, 4, 17, 20]),
    tq=st.sampled_from([1, 1, 2, 5]),
    extra=st.integers(0, 9),
    dim=st.sampled_from([1, 8, 16]),
    causal=st.booleans(),
    use_lengths=st.booleans(),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_grouped_query_attention(
    cpu: Any,
    b: int,
    nkv: int,
    group: int,
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
    nh, tk = nkv * group, tq + extra
    q = place(rng.standard_normal((b, nh, tq, dim)), d, "transposed")
    # k and v are slices of a longer cache buffer, in two layouts
    cache = rng.standard_normal((2, b, nkv, tk + 3, dim))
    k = place(cache[0], d, "contiguous")[:, :, :tk]
    v = place(cache[1], d, "stepped")[:, :, :tk]
    lv = rng.integers(0, tk + 1, b)
    lengths = place(lv, dt.int64, "contiguous") if use_lengths else None
    got = run(q, k, v, 1 / np.sqrt(dim), causal, lengths, cpu)
    want = attention64(vals(q), vals(k), vals(v), 1 / np.sqrt(dim), causal, lv if use_lengths else None)
    close(vals(got), want, d, 8.0, msg=f"gqa H={nh} Hkv={nkv} tq={tq} {dtype}")
    # the same kernel on K/V repeated in memory (plain multi-head attention): bit for bit
    kr = place(np.repeat(vals(k), group, axis=1), d, "contiguous")
    vr = place(np.repeat(vals(v), group, axis=1), d, "contiguous")
    np.testing.assert_array_equal(logical(got), logical(run(q, kr, vr, 1 / np.sqrt(dim), causal, lengths, cpu)))


@pytest.mark.parametrize(("nh", "nkv"), [(9, 3), (32, 8), (20, 1), (4, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_decode_rows_are_what_they_are_alone(cpu: Any, nh: int, nkv: int, dtype: str) -> None:
    # batched decoding: each batch row's result must not depend on the other rows in the call
    rng = np.random.default_rng(nh * nkv)
    d = dt.BY_NAME[dtype]
    b, tk, dim = 3, 37, 64
    q = place(rng.standard_normal((b, nh, 1, dim)), d, "contiguous")
    k = place(rng.standard_normal((b, nkv, tk, dim)), d, "contiguous")
    v = place(rng.standard_normal((b, nkv, tk, dim)), d, "contiguous")
    lv = np.array([37, 5, 20])
    lengths = place(lv, dt.int64, "contiguous")
    together = logical(run(q, k, v, 0.125, True, lengths, cpu))
    for i in range(b):
        alone = run(q[i : i + 1], k[i : i + 1], v[i : i + 1], 0.125, True, lengths[i : i + 1], cpu)
        np.testing.assert_array_equal(together[i : i + 1], logical(alone), err_msg=f"row {i}")
    want = attention64(vals(q), vals(k), vals(v), 0.125, True, lv)
    close(together.astype(np.float64), want, d, 8.0)


def test_grouped_query_attention_errors(cpu: Any) -> None:
    q = place(np.ones((1, 6, 1, 8)), dt.float32, "contiguous")
    k = place(np.ones((1, 4, 3, 8)), dt.float32, "contiguous")
    out = cpu_empty(cpu, (1, 6, 1, 8), dt.float32)
    with pytest.raises(kael.ShapeError, match="attention: q has 6 heads, which k/v's 4 heads must divide"):
        C.attention(out, q, k, k, 1.0, True, None)
    v = place(np.ones((1, 3, 3, 8)), dt.float32, "contiguous")
    with pytest.raises(kael.ShapeError, match=r"attention: q \[1, 6, 1, 8\], k \[1, 4, 3, 8\] and v \[1, 3, 3, 8\]"):
        C.attention(out, q, k, v, 1.0, True, None)
