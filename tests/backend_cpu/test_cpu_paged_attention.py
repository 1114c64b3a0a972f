"""The C++ ``paged_attention`` kernel (csrc/paged_attention.cpp) against the reference and C++ attention.

* Against the NumPy reference kernel at the conformance kit's tolerances: decode and
  prefill shapes, grouped/multi-query heads, block sizes 1, 3, 16, rows of different
  lengths at shuffled block ids, strided q / pools / block tables / outputs, every float
  dtype; more than 16 queries (prefill tasks past the few-row kernels).
* Bits (NOTE [paged attention tasks]): with T <= 16 a row equals, bit for bit, the C++
  ``attention`` kernel on that row's gathered keys with causal=True, hence also the
  frontend decomposition on this backend; a row batched with others equals the row alone,
  and the same keys at other block ids give the same bits. On every vector table this
  CPU runs (KAEL_CPU_ISA in a subprocess).
* Bad arguments reaching the kernel directly: a ``kael.KaelError`` subclass, never a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import kael
import numpy as np
import pytest
from kael.backends import catalogue
from kael.testing import assert_close
from kael.testing.conformance import KERNEL_TOL

kbc = pytest.importorskip("kael_backend_cpu")
from kael_backend_cpu._native import C  # noqa: E402

if not hasattr(C, "paged_attention"):
    pytest.skip("this build of kael_backend_cpu has no paged_attention kernel", allow_module_level=True)

FLOATS = ["float32", "float64", "bfloat16", "float16"]


def make_case(
    rng: np.random.Generator, h: int, hkv: int, t: int, d: int, s: int, lengths: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(q, pool, block_table, lengths): each row's blocks at shuffled ids, -1 past the used entries."""
    need = [-(-n // s) for n in lengths]
    nb = sum(need) + 2
    ids = rng.permutation(nb)
    table = np.full((len(lengths), max(need) + 1), -1, np.int64)
    at = 0
    for r, k in enumerate(need):
        table[r, :k] = ids[at : at + k]
        at += k
    q = rng.standard_normal((len(lengths), h, t, d))
    pool = rng.standard_normal((nb, 2, hkv, s, d))
    return q, pool, table, np.array(lengths, np.int64)


def gathered(pool: np.ndarray, row: np.ndarray, n: int, part: int) -> np.ndarray:
    """[1, Hkv, n, D]: positions 0..n-1 of one row, from its blocks."""
    s = pool.shape[3]
    return np.stack([pool[row[p // s], part, :, p % s] for p in range(n)], axis=1)[None]


def _t(a: np.ndarray, dtype: str) -> kael.Tensor:
    return kael.tensor(a, dtype=getattr(kael, dtype))


def _np(t: kael.Tensor) -> np.ndarray:
    return np.asarray(t.to(dtype=kael.float64) if t.dtype.itemsize == 2 else t, dtype=np.float64)


def _run(kernel: Any, q: kael.Tensor, pool: kael.Tensor, table: Any, lens: Any, scale: float) -> kael.Tensor:
    out = kael.empty(*q.shape, dtype=q.dtype)
    kernel(out, q, pool, kael.tensor(table) if isinstance(table, np.ndarray) else table, kael.tensor(lens), scale)
    return out


SHAPES = {
    # name: (H, Hkv, T, D, S, lengths)
    "decode": (4, 4, 1, 8, 16, [1, 17, 40]),
    "gqa_decode": (8, 2, 1, 16, 3, [5, 9, 2]),
    "mqa_decode_wide_group": (20, 1, 1, 8, 4, [7, 30]),
    "prefill_after_cache": (6, 3, 4, 16, 3, [4, 11, 7]),
    "prefill_16": (4, 1, 16, 8, 16, [16, 33]),
    "block_size_1": (2, 2, 3, 5, 1, [3, 8]),
    "head_dim_1": (4, 2, 2, 1, 4, [6, 2]),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_matches_the_reference_kernel(cpu: Any, ref: Any, name: str, dtype: str) -> None:
    h, hkv, t, d, s, lengths = SHAPES[name]
    q, pool, table, lens = make_case(np.random.default_rng(len(name)), h, hkv, t, d, s, lengths)
    qt, pt = _t(q, dtype), _t(pool, dtype)
    got = _run(cpu.kernel("paged_attention"), qt, pt, table, lens, 0.35)
    want = _run(ref.kernel("paged_attention"), qt, pt, table, lens, 0.35)
    rtol, atol = KERNEL_TOL[dtype]
    assert_close(_np(got), _np(want), rtol=4 * rtol, atol=4 * atol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_bits_equal_cpp_attention_on_the_gathered_keys(cpu: Any, name: str, dtype: str) -> None:
    h, hkv, t, d, s, lengths = SHAPES[name]
    q, pool, table, lens = make_case(np.random.default_rng(len(name) + 1), h, hkv, t, d, s, lengths)
    got = _run(cpu.kernel("paged_attention"), _t(q, dtype), _t(pool, dtype), table, lens, 0.35)
    for r, n in enumerate(lens):
        k, v = (_t(gathered(pool, table[r], int(n), i), dtype) for i in (0, 1))
        want = kael.empty(1, h, t, d, dtype=getattr(kael, dtype))
        cpu.kernel("attention")(want, _t(q[r : r + 1], dtype), k, v, 0.35, True, None)
        assert np.array_equal(_np(got)[r : r + 1], _np(want)), f"row {r}"


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_bits_equal_the_decomposition_on_this_backend(cpu: Any, dtype: str) -> None:
    """The decomposition gathers and runs this backend's attention kernel: the same bits."""
    assert kael.backends.current("cpu").name == cpu.name
    q, pool, table, lens = make_case(np.random.default_rng(3), 6, 2, 3, 8, 4, [3, 10, 7, 12])
    qt, pt = _t(q, dtype), _t(pool, dtype)
    got = _run(cpu.kernel("paged_attention"), qt, pt, table, lens, 0.25)
    decomposed = catalogue.decomposition("paged_attention")(qt, pt, kael.tensor(table), kael.tensor(lens), 0.25)
    assert np.array_equal(_np(got), _np(decomposed))
    # the frontend dispatches to this kernel
    assert np.array_equal(
        _np(kael.paged_attention(qt, pt, kael.tensor(table), kael.tensor(lens), scale=0.25)), _np(got)
    )


@pytest.mark.parametrize("t", [1, 3, 20])
def test_a_row_batched_equals_the_row_alone_and_ignores_block_ids(cpu: Any, t: int) -> None:
    rng = np.random.default_rng(t)
    q, pool, table, lens = make_case(rng, 8, 2, t, 16, 4, [t, t + 9, t + 30, t + 3, t + 17])
    kern = cpu.kernel("paged_attention")
    batched = _np(_run(kern, _t(q, "float32"), _t(pool, "float32"), table, lens, 0.25))
    for r in range(len(lens)):
        alone = _run(kern, _t(q[r : r + 1], "float32"), _t(pool, "float32"), table[r : r + 1], lens[r : r + 1], 0.25)
        assert np.array_equal(batched[r : r + 1], _np(alone)), f"row {r}"
    # every block moved to another id of a bigger pool (reversed, junk in between)
    nb = pool.shape[0]
    moved = rng.standard_normal((3 * nb, *pool.shape[1:]))
    new_id = 3 * nb - 1 - 3 * np.arange(nb)
    moved[new_id] = pool
    table2 = np.where(table >= 0, new_id[np.clip(table, 0, None)], -1)
    there = _np(_run(kern, _t(q, "float32"), _t(moved, "float32"), table2, lens, 0.25))
    assert np.array_equal(batched, there)


def test_more_than_16_queries(cpu: Any, ref: Any) -> None:
    q, pool, table, lens = make_case(np.random.default_rng(5), 4, 2, 37, 8, 16, [37, 60])
    for dtype in ("float32", "float64"):
        qt, pt = _t(q, dtype), _t(pool, dtype)
        got = _run(cpu.kernel("paged_attention"), qt, pt, table, lens, 0.35)
        want = _run(ref.kernel("paged_attention"), qt, pt, table, lens, 0.35)
        rtol, atol = KERNEL_TOL[dtype]
        assert_close(_np(got), _np(want), rtol=4 * rtol, atol=4 * atol)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_strided_operands(cpu: Any, ref: Any, dtype: str) -> None:
    h, hkv, t, d, s = 6, 2, 3, 8, 4
    q, pool, table, lens = make_case(np.random.default_rng(9), h, hkv, t, d, s, [5, 12, 3])
    want = _run(ref.kernel("paged_attention"), _t(q, dtype), _t(pool, dtype), table, lens, 0.35)
    # q [B, H, T, D] viewed from [B, T, H, D]; the block table a transposed view
    qv = _t(np.ascontiguousarray(q.transpose(0, 2, 1, 3)), dtype).permute(0, 2, 1, 3)
    tv = kael.tensor(np.ascontiguousarray(table.T)).T
    pools = {
        # positions-major pool storage [NB, 2, S, Hkv, D]
        "positions_major": _t(np.ascontiguousarray(pool.transpose(0, 1, 3, 2, 4)), dtype).permute(0, 1, 3, 2, 4),
        # every other element of the last dim, and every other block
        "stepped": _t(np.repeat(np.repeat(pool, 2, axis=-1), 2, axis=0), dtype)[::2, :, :, :, ::2],
        # every other block, D contiguous: read in place
        "every_other_block": _t(np.repeat(pool, 2, axis=0), dtype)[::2],
    }
    rtol, atol = KERNEL_TOL[dtype]
    for name, pv in pools.items():
        # the output a strided view too: every other element of a wider buffer's last dim
        big = kael.zeros(len(lens), h, t, 2 * d, dtype=getattr(kael, dtype))
        out = big[:, :, :, ::2]
        cpu.kernel("paged_attention")(out, qv, pv, tv, kael.tensor(lens), 0.35)
        assert_close(_np(out), _np(want), rtol=4 * rtol, atol=4 * atol, msg=name)
        assert not np.any(_np(big)[..., 1::2]), name  # nothing written between the output's elements


# -- every vector table ------------------------------------------------------------------------------

_ISA_CHECK = r"""
import json, sys
import numpy as np
import kael
from kael.backends.reference import ReferenceBackend
sys.path.insert(0, sys.argv[1])
from test_cpu_paged_attention import SHAPES, gathered, make_case
from kael_backend_cpu._native import C
cpu = kael.backends.current("cpu")
ref = ReferenceBackend()
worst = 0.0
for name, (h, hkv, t, d, s, lengths) in sorted(SHAPES.items()):
    q, pool, table, lens = make_case(np.random.default_rng(len(name)), h, hkv, t, d, s, lengths)
    for dtype in ("float32", "float64"):
        dd = getattr(kael, dtype)
        qt, pt = kael.tensor(q, dtype=dd), kael.tensor(pool, dtype=dd)
        got, want = kael.empty(*q.shape, dtype=dd), kael.empty(*q.shape, dtype=dd)
        cpu.kernel("paged_attention")(got, qt, pt, kael.tensor(table), kael.tensor(lens), 0.35)
        ref.kernel("paged_attention")(want, qt, pt, kael.tensor(table), kael.tensor(lens), 0.35)
        worst = max(worst, float(np.max(np.abs(np.asarray(got) - np.asarray(want)))))
        for r, n in enumerate(lens):
            k, v = (kael.tensor(gathered(pool, table[r], int(n), i), dtype=dd) for i in (0, 1))
            o = kael.empty(1, h, t, d, dtype=dd)
            cpu.kernel("attention")(o, kael.tensor(q[r : r + 1], dtype=dd), k, v, 0.35, True, None)
            assert np.array_equal(np.asarray(got)[r : r + 1], np.asarray(o)), (name, dtype, r)
print(json.dumps({"table": C.isa(), "worst": worst}))
"""


@pytest.mark.parametrize("table", ["baseline", "avx2", "avx512"])
def test_every_vector_table(table: str) -> None:
    info = C.isa_info()
    if table not in info["tables"] or table not in info["runnable"]:
        pytest.skip(f"the {table} table is not compiled in or this CPU cannot run it")
    env = {k: v for k, v in os.environ.items() if k not in ("KAEL_CPU_ISA", "KAEL_BACKEND_CPU")}
    env["KAEL_CPU_ISA"] = table
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", _ISA_CHECK, here], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["table"] == table and res["worst"] < 1e-5


# -- bad arguments -------------------------------------------------------------------------------------


def test_bad_arguments_are_kael_errors_not_crashes(cpu: Any) -> None:
    q, pool, table, lens = make_case(np.random.default_rng(1), 4, 2, 2, 8, 4, [5, 3])
    qt, pt = _t(q, "float32"), _t(pool, "float32")
    out = kael.full((2, 4, 2, 8), 7.0)
    kern = cpu.kernel("paged_attention")
    bad_ids = table.copy()
    bad_ids[0, 1] = pool.shape[0]
    cases = [
        ((out, qt, pt, kael.tensor(bad_ids), kael.tensor(lens), 0.5), kael.IndexError_, r"block_table\[0, 1\]"),
        (
            (out, qt, pt, kael.tensor(np.where(table == table[1, 0], -3, table)), kael.tensor(lens), 0.5),
            kael.IndexError_,
            "-3",
        ),
        ((out, qt, pt, kael.tensor(table), kael.tensor(np.array([5, 1])), 0.5), kael.ShapeError, r"lengths\[1\] = 1"),
        ((out, qt, pt, kael.tensor(table), kael.tensor(np.array([99, 3])), 0.5), kael.ShapeError, r"lengths\[0\] = 99"),
        (
            (out, qt, _t(pool[:, :, :1].repeat(3, axis=2), "float32"), kael.tensor(table), kael.tensor(lens), 0.5),
            kael.ShapeError,
            "kv heads",
        ),
        ((out, qt, _t(pool, "float64"), kael.tensor(table), kael.tensor(lens), 0.5), kael.DTypeError, "share a dtype"),
        ((out, qt, pt, kael.tensor(table[:1]), kael.tensor(lens), 0.5), kael.ShapeError, "block_table"),
        (
            (kael.full((2, 4, 2, 4), 7.0), qt, pt, kael.tensor(table), kael.tensor(lens), 0.5),
            kael.ShapeError,
            "out must be",
        ),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match) as info:
            kern(*args)
        assert "paged_attention" in str(info.value)
    assert np.all(np.asarray(out) == 7.0)  # nothing written
