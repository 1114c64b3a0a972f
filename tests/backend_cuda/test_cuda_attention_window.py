"""Sliding-window ``attention`` and ``paged_attention`` (API 1.4's ``window``) on emulated cuda.

Oracle: a float64 NumPy loop over the definition (the query at position p sees keys p-W+1..p), for the
backend's glue on every float dtype (``attention_softmax`` and ``paged_attention_rows`` twins in float32 and
float64, the reference float16 arithmetic); float16 gives the reference kernel's bits. The CUDA source itself
compiles with the window argument in ``test_cuda_raw_kernels.py`` (nvcc, launch arguments against signatures).
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest

TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 3e-3, "bfloat16": 2e-2}


def oracle(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int) -> np.ndarray:
    b, h, tq, _ = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    out = np.zeros((b, h, tq, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            j = hi // (h // hkv)
            for t in range(tq):
                p = t + tk - tq
                lo = max(0, p - window + 1)
                s = q[bi, hi, t] @ k[bi, j, lo : p + 1].T * scale
                e = np.exp(s - s.max())
                out[bi, hi, t] = (e / e.sum()) @ v[bi, j, lo : p + 1]
    return out


def _cuda(a: np.ndarray, dtype: str) -> Any:
    return kael.tensor(a, dtype=getattr(kael, dtype), device="cuda")


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    return kael.tensor(a, dtype=getattr(kael, dtype)).to(kael.float64).numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(("tq", "tk", "window"), [(6, 6, 2), (1, 9, 4), (3, 11, 5)])
def test_attention_window(emulate: Any, dtype: str, tq: int, tk: int, window: int) -> None:
    rng = np.random.default_rng(tk + window)
    q, k, v = (_rounded(rng.standard_normal(s), dtype) for s in ((2, 4, tq, 8), (2, 2, tk, 8), (2, 2, tk, 8)))
    got = kael.attention(_cuda(q, dtype), _cuda(k, dtype), _cuda(v, dtype), causal=True, window=window)
    ref = oracle(q, k, v, 1 / np.sqrt(8), window)
    np.testing.assert_allclose(got.to(kael.float64).cpu().numpy(), ref, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize(("tq", "n", "s", "window"), [(1, 13, 4, 5), (4, 10, 3, 3)])
def test_paged_attention_window(emulate: Any, dtype: str, tq: int, n: int, s: int, window: int) -> None:
    rng = np.random.default_rng(n * s)
    q = _rounded(rng.standard_normal((1, 4, tq, 8)), dtype)
    k, v = (_rounded(rng.standard_normal((1, 2, n, 8)), dtype) for _ in range(2))
    nb = -(-n // s)
    ids = rng.permutation(nb + 1)[:nb]
    pool = np.zeros((nb + 1, 2, 2, s, 8))
    for j, blk in enumerate(ids):
        seg = k[0, :, j * s : (j + 1) * s].shape[1]
        pool[blk, 0, :, :seg], pool[blk, 1, :, :seg] = k[0, :, j * s : j * s + seg], v[0, :, j * s : j * s + seg]
    got = kael.paged_attention(
        _cuda(q, dtype),
        _cuda(pool, dtype),
        kael.tensor(ids[None].astype(np.int64), device="cuda"),
        kael.tensor(np.array([n]), device="cuda"),
        window=window,
    )
    ref = oracle(q, k, v, 1 / np.sqrt(8), window)
    np.testing.assert_allclose(got.to(kael.float64).cpu().numpy(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    if dtype == "float16":  # the reference kernel's float16 arithmetic, bit for bit
        kael.backends.use("cpu", "reference")
        try:
            want = kael.paged_attention(
                kael.tensor(q, dtype=kael.float16),
                kael.tensor(pool, dtype=kael.float16),
                kael.tensor(ids[None].astype(np.int64)),
                kael.tensor(np.array([n])),
                window=window,
            )
        finally:
            kael.backends.use("cpu", None)
        np.testing.assert_array_equal(got.cpu().numpy(), want.numpy())
