"""Sliding-window attention (NOTE [sliding window] in kael/ops/_attention_fused.py): ``attention`` and
``paged_attention`` with ``window`` W, where the query at position p sees the keys p-W+1..p only.

Oracles: a float64 NumPy loop over the definition; PyTorch's ``scaled_dot_product_attention`` with the boolean
mask transformers builds for a sliding window (``q_idx - W < kv_idx <= q_idx``); float64 finite differences for
the gradients (``kael.testing.gradcheck``); on the C++ backend the ``attention`` kernel on a row's gathered keys,
bit for bit, for ``paged_attention`` (up to 16 queries, NOTE [attention window]); no window at all when W covers
the context (bit for bit). A backend of API 1.3 (no window argument) runs the decomposition.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import _dispatch
from kael.testing import gradcheck


def oracle(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int) -> np.ndarray:
    """softmax over each query's causal window, in float64: q [B,H,Tq,D], k/v [B,Hkv,Tk,D]."""
    b, h, tq, _ = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    out = np.zeros((b, h, tq, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            j = hi // (h // hkv)
            for t in range(tq):
                p = t + tk - tq
                lo = max(0, p - window + 1) if window else 0
                s = q[bi, hi, t].astype(np.float64) @ k[bi, j, lo : p + 1].astype(np.float64).T * scale
                e = np.exp(s - s.max())
                out[bi, hi, t] = (e / e.sum()) @ v[bi, j, lo : p + 1].astype(np.float64)
    return out


def _qkv(rng: np.random.Generator, b: int, h: int, hkv: int, tq: int, tk: int, d: int) -> tuple[np.ndarray, ...]:
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((b, h, tq, d), (b, hkv, tk, d), (b, hkv, tk, d)))


@pytest.mark.parametrize(
    ("b", "h", "hkv", "tq", "tk", "d", "window"),
    [
        (1, 2, 2, 9, 9, 8, 3),  # prefill longer than the window
        (2, 4, 2, 1, 20, 16, 5),  # decode with a cache, grouped heads
        (1, 4, 1, 5, 23, 8, 4),  # a chunk appended to a cache, multi-query
        (1, 2, 1, 70, 70, 4, 17),  # more than 64 queries: several query blocks per head
        (2, 3, 3, 6, 6, 8, 1),  # each query sees itself only
    ],
)
def test_attention_window_matches_the_definition(
    backend: str, b: int, h: int, hkv: int, tq: int, tk: int, d: int, window: int
) -> None:
    q, k, v = _qkv(np.random.default_rng(tk * 7 + window), b, h, hkv, tq, tk, d)
    got = kael.attention(kael.tensor(q), kael.tensor(k), kael.tensor(v), causal=True, window=window).numpy()
    np.testing.assert_allclose(got, oracle(q, k, v, 1 / np.sqrt(d), window), rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    hkv=st.integers(1, 2),
    group=st.integers(1, 3),
    tq=st.integers(1, 12),
    extra=st.integers(0, 12),
    d=st.sampled_from([1, 4, 8]),
    window=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_attention_window_property(hkv: int, group: int, tq: int, extra: int, d: int, window: int, seed: int) -> None:
    q, k, v = _qkv(np.random.default_rng(seed), 1, hkv * group, hkv, tq, tq + extra, d)
    got = kael.attention(kael.tensor(q), kael.tensor(k), kael.tensor(v), causal=True, window=window).numpy()
    np.testing.assert_allclose(got, oracle(q, k, v, 1 / np.sqrt(d), window), rtol=1e-5, atol=1e-5)


def test_attention_window_matches_torch_with_transformers_mask() -> None:
    torch = pytest.importorskip("torch")
    q, k, v = _qkv(np.random.default_rng(3), 2, 4, 2, 12, 12, 16)
    w = 5
    idx = torch.arange(12)
    mask = (idx[None, :] <= idx[:, None]) & (idx[None, :] > idx[:, None] - w)  # transformers' sliding_window_overlay
    ref = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), attn_mask=mask, enable_gqa=True
    ).numpy()
    got = kael.attention(kael.tensor(q), kael.tensor(k), kael.tensor(v), causal=True, window=w).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_a_window_covering_the_context_changes_no_bit(backend: str) -> None:
    q, k, v = _qkv(np.random.default_rng(5), 2, 4, 2, 7, 19, 8)
    args = (kael.tensor(q), kael.tensor(k), kael.tensor(v))
    plain = kael.attention(*args, causal=True).numpy()
    np.testing.assert_array_equal(kael.attention(*args, causal=True, window=19).numpy(), plain)
    np.testing.assert_array_equal(kael.attention(*args, causal=True, window=1000).numpy(), plain)


def test_attention_window_gradients() -> None:
    rng = np.random.default_rng(11)
    q, k, v = (kael.tensor(a.astype(np.float64), requires_grad=True) for a in _qkv(rng, 1, 2, 1, 5, 8, 3))
    assert gradcheck(lambda q, k, v: kael.attention(q, k, v, causal=True, window=3), (q, k, v))


def _paged(rng: np.random.Generator, k: np.ndarray, v: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """k/v [1, Hkv, n, D] in a pool of blocks of s positions at shuffled ids, and the block table [1, M]."""
    _, hkv, n, d = k.shape
    nb = -(-n // s)
    ids = rng.permutation(nb + 2)[:nb]
    pool = rng.standard_normal((nb + 2, 2, hkv, s, d)).astype(np.float32)
    for j, blk in enumerate(ids):
        seg = slice(j * s, min(n, (j + 1) * s))
        pool[blk, 0, :, : seg.stop - seg.start] = k[0, :, seg]
        pool[blk, 1, :, : seg.stop - seg.start] = v[0, :, seg]
    return pool, ids[None].astype(np.int64)


@pytest.mark.parametrize(("tq", "n", "s", "window"), [(1, 40, 16, 7), (1, 33, 4, 16), (5, 21, 3, 4), (16, 50, 16, 9)])
def test_paged_attention_window(backend: str, tq: int, n: int, s: int, window: int) -> None:
    rng = np.random.default_rng(n + window)
    q, k, v = _qkv(rng, 1, 4, 2, tq, n, 8)
    pool, table = _paged(rng, k, v, s)
    got = kael.paged_attention(
        kael.tensor(q), kael.tensor(pool), kael.tensor(table), kael.tensor(np.array([n])), window=window
    ).numpy()
    np.testing.assert_allclose(got, oracle(q, k, v, 1 / np.sqrt(8), window), rtol=1e-5, atol=1e-5)
    # NOTE [attention window]: the bits of attention on the row's gathered keys
    whole = kael.attention(kael.tensor(q), kael.tensor(k), kael.tensor(v), causal=True, window=window).numpy()
    np.testing.assert_array_equal(got, whole)


def test_window_errors() -> None:
    q = kael.zeros((1, 2, 3, 4))
    for bad in (0, -2, True, 2.5):
        with pytest.raises(kael.ShapeError, match="window must be a positive int"):
            kael.attention(q, q, q, causal=True, window=bad)
    with pytest.raises(kael.ShapeError, match="needs causal attention"):
        kael.attention(q, q, q, window=2)
    pool, table, lengths = kael.zeros((2, 2, 2, 4, 4)), kael.tensor([[0]]), kael.tensor([3])
    with pytest.raises(kael.ShapeError, match="window must be a positive int"):
        kael.paged_attention(q[:, :, :1], pool, table, lengths, window=0)


def test_a_backend_of_api_1_3_runs_the_decomposition(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend that predates the window argument is never handed one: the decomposition runs instead."""
    backend = _dispatch.backend_for("cpu")
    calls: list[int] = []
    real = _dispatch.fused_kernel("cpu", "attention")
    assert real is not None

    def counting(*args: Any) -> None:
        calls.append(len(args))
        real(*args)

    monkeypatch.setattr(backend, "api_version", "1.3")
    monkeypatch.setitem(_dispatch._cache, ("cpu", "attention"), counting)
    q, k, v = _qkv(np.random.default_rng(2), 1, 2, 1, 6, 6, 4)
    args = (kael.tensor(q), kael.tensor(k), kael.tensor(v))
    got = kael.attention(*args, causal=True, window=2).numpy()
    np.testing.assert_allclose(got, oracle(q, k, v, 0.5, 2), rtol=1e-5, atol=1e-6)
    kael.attention(*args, causal=True)
    assert calls and all(n == 7 for n in calls)  # the kernel ran without a window argument, never with one
