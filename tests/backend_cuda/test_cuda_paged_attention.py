"""``paged_attention`` on emulated cuda: the raw kernel's twin and the backend's glue.

* The twin of ``paged_attention_rows`` (what the CUDA source computes) against a float64
  oracle written here with the math module, one (row, head, query) at a time: grouped and
  multi-query heads, decode and prefill after cached positions, block sizes 1, 3, 16.
* ``kael.paged_attention`` on device ``cuda`` runs the backend's kernel (no gather, no
  ``attention``) with the right values for every float dtype, strided q / pools / block
  tables; float16 gives exactly the reference kernel's bits (the reference's float16
  arithmetic, as the backend's float16 ``attention``). A row batched with others gives the
  bits it gives alone, and the same keys at other block ids give the same bits.
* The CUDA source itself compiles to PTX in ``test_cuda_raw_kernels.py`` (nvcc, every row
  kernel), which also checks its launch arguments against the kernel's signature.
"""

from __future__ import annotations

import math
from typing import Any

import kael
import numpy as np
import pytest

from kael_backend_cuda import _raw_kernels as raw

TOL = {"float32": 2e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}


def make_case(
    rng: np.random.Generator, b: int, h: int, hkv: int, t: int, d: int, s: int, lengths: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    need = [-(-n // s) for n in lengths]
    nb = sum(need) + 2
    ids = rng.permutation(nb)
    table = np.full((b, max(need) + 1), -1, np.int64)
    at = 0
    for r, k in enumerate(need):
        table[r, :k] = ids[at : at + k]
        at += k
    return rng.standard_normal((b, h, t, d)), rng.standard_normal((nb, 2, hkv, s, d)), table, np.array(lengths)


def oracle(q: np.ndarray, pool: np.ndarray, table: np.ndarray, lengths: np.ndarray, scale: float) -> np.ndarray:
    """float64 with math.fsum: query i of row b against positions 0..lengths[b]-T+i of its blocks."""
    b, h, t, d = q.shape
    hkv, s = pool.shape[2], pool.shape[3]
    out = np.zeros((b, h, t, d))
    for r in range(b):
        n = int(lengths[r])
        for head in range(h):
            j = head // (h // hkv)
            for i in range(t):
                seen = range(n - t + i + 1)
                keys = [pool[table[r, p // s], 0, j, p % s] for p in seen]
                vals = [pool[table[r, p // s], 1, j, p % s] for p in seen]
                z = [scale * math.fsum(float(a) * float(c) for a, c in zip(q[r, head, i], k)) for k in keys]
                m = max(z)
                w = [math.exp(v - m) for v in z]
                tot = math.fsum(w)
                for c in range(d):
                    out[r, head, i, c] = math.fsum(wi / tot * float(v[c]) for wi, v in zip(w, vals))
    return out


CASES = {
    # name: (B, H, Hkv, T, D, S, lengths)
    "decode": (3, 4, 4, 1, 8, 16, [1, 17, 40]),
    "gqa_decode": (2, 8, 2, 1, 4, 3, [5, 9]),
    "mqa_prefill_after_cache": (2, 4, 1, 3, 6, 3, [3, 10]),
    "prefill": (2, 6, 3, 5, 8, 16, [5, 21]),
    "block_size_1": (2, 2, 2, 2, 5, 1, [7, 2]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_raw_kernel_twin_against_the_oracle(emulate: Any, name: str, dtype: Any) -> None:
    b, h, hkv, t, d, s, lengths = CASES[name]
    q, pool, table, lens = make_case(np.random.default_rng(len(name)), b, h, hkv, t, d, s, lengths)
    out = np.full((b, h, t, d), 7.0, dtype)
    raw.paged_attention_rows(q.astype(dtype), pool.astype(dtype), table, lens.astype(np.int64), out, 0.4)
    want = oracle(q.astype(dtype), pool.astype(dtype), table, lens, 0.4)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def _cuda(a: np.ndarray, dtype: str) -> kael.Tensor:
    return kael.tensor(a, dtype=getattr(kael, dtype), device="cuda")


def _host(t: kael.Tensor) -> np.ndarray:
    return np.asarray(t.to(dtype=kael.float64).cpu(), dtype=np.float64)


def _ops_seen(fn: Any) -> tuple[Any, list[str]]:
    seen: list[str] = []

    def wrap(dev: Any, op: str, backend: Any, kernel: Any) -> Any:
        seen.append(op)
        return kernel

    kael.backends.dispatch.set_kernel_wrapper(wrap)
    try:
        return fn(), seen
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_backend_kernel_runs_with_the_right_values(emulate: Any, name: str, dtype: str) -> None:
    assert "paged_attention" in emulate.supported_ops()
    b, h, hkv, t, d, s, lengths = CASES[name]
    q, pool, table, lens = make_case(np.random.default_rng(len(name) + 1), b, h, hkv, t, d, s, lengths)
    qt, pt = _cuda(q, dtype), _cuda(pool, dtype)
    tt, lt = kael.tensor(table, device="cuda"), kael.tensor(lens, device="cuda")
    out, seen = _ops_seen(lambda: kael.paged_attention(qt, pt, tt, lt, scale=0.4))
    assert "paged_attention" in seen and "attention" not in seen and "index_select" not in seen, seen
    assert out.device.type == "cuda" and out.dtype is getattr(kael, dtype)
    want = oracle(_host(qt), _host(pt), table, lens, 0.4)  # the values the dtype holds
    np.testing.assert_allclose(_host(out), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_float16_gives_the_reference_kernels_bits(emulate: Any) -> None:
    from kael.backends.reference import ReferenceBackend

    q, pool, table, lens = make_case(np.random.default_rng(4), 3, 6, 2, 2, 8, 4, [2, 9, 14])
    got = kael.paged_attention(
        _cuda(q, "float16"), _cuda(pool, "float16"), kael.tensor(table, device="cuda"), kael.tensor(lens, device="cuda")
    )
    want = kael.empty(*q.shape, dtype=kael.float16)
    ReferenceBackend().kernel("paged_attention")(
        want,
        kael.tensor(q, dtype=kael.float16),
        kael.tensor(pool, dtype=kael.float16),
        kael.tensor(table),
        kael.tensor(lens),
        1 / math.sqrt(8),
    )
    assert np.array_equal(_host(got), np.asarray(want.to(dtype=kael.float64)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_strided_operands(emulate: Any, dtype: str) -> None:
    q, pool, table, lens = make_case(np.random.default_rng(5), 2, 4, 2, 3, 6, 3, [5, 8])
    want = oracle(_host(_cuda(q, dtype)), _host(_cuda(pool, dtype)), table, lens, 0.5)
    qv = _cuda(np.ascontiguousarray(q.transpose(0, 2, 1, 3)), dtype).permute(0, 2, 1, 3)
    pv = _cuda(np.ascontiguousarray(pool.transpose(0, 1, 3, 2, 4)), dtype).permute(0, 1, 3, 2, 4)
    tv = kael.tensor(np.ascontiguousarray(table.T), device="cuda").T
    out = kael.paged_attention(qv, pv, tv, kael.tensor(lens, device="cuda"), scale=0.5)
    np.testing.assert_allclose(_host(out), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_rows_alone_and_block_ids_do_not_change_the_bits(emulate: Any) -> None:
    rng = np.random.default_rng(6)
    q, pool, table, lens = make_case(rng, 4, 4, 2, 2, 8, 3, [2, 11, 7, 5])

    def run(qa: np.ndarray, pa: np.ndarray, ta: np.ndarray, la: np.ndarray) -> np.ndarray:
        return _host(
            kael.paged_attention(
                _cuda(qa, "float32"),
                _cuda(pa, "float32"),
                kael.tensor(ta, device="cuda"),
                kael.tensor(la, device="cuda"),
            )
        )

    batched = run(q, pool, table, lens)
    for r in range(4):
        assert np.array_equal(batched[r : r + 1], run(q[r : r + 1], pool, table[r : r + 1], lens[r : r + 1])), r
    nb = pool.shape[0]
    moved = rng.standard_normal((2 * nb, *pool.shape[1:]))
    new_id = 2 * nb - 1 - 2 * np.arange(nb)
    moved[new_id] = pool
    assert np.array_equal(batched, run(q, moved, np.where(table >= 0, new_id[np.clip(table, 0, None)], -1), lens))


def test_mixed_devices_are_a_device_error(emulate: Any) -> None:
    q, pool, table, lens = make_case(np.random.default_rng(7), 1, 2, 2, 1, 4, 4, [3])
    with pytest.raises(kael.DeviceError, match="paged_attention"):
        kael.paged_attention(_cuda(q, "float32"), _cuda(pool, "float32"), kael.tensor(table), kael.tensor(lens))
