"""The CPU backend's AMX bfloat16 GEMM for prompts of bf16 weights (NOTE [AMX bfloat16 GEMM] in
csrc/vec_bf16_amx.h): activation rows rounded to bfloat16 as for the vdpbf16ps kernels, 16 x 16 float32 tiles
from AMX-BF16's tdpbf16ps, 32 values of depth an instruction.

Oracle: the float64 product of the same bfloat16 values (the rounding checked against PyTorch in
test_quant_bf16.py), within a bound of 8 float32 ulps per 32 values of depth of the sum of the products'
magnitudes (the hardware rounds inside an instruction in a way no float32 order reproduces, so there is no
bit-exact model); exactly: a row's bits do not depend on the other rows, their number or order, the columns, or
the thread count. Skipped where prompts do not take the AMX GEMM (a CPU without AMX-BF16 or an OS that does not
grant the tile state).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")

from _quant_helpers import F32, SETTINGS, assert_bits, run  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402
from test_quant_bf16 import amx_bound, bf16_values, has_amx, round_bf16, weights  # noqa: E402

pytestmark = pytest.mark.skipif(not has_amx(), reason="prompts of bf16 weights do not take the AMX GEMM here")


@pytest.fixture(autouse=True)
def _amx_gemm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """auto activations, the bfloat16 GEMM asked for: prompts of more than 16 rows take AMX."""
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "auto")
    monkeypatch.setenv("KAEL_BF16_GEMM", "1")
    yield


def assert_within_bound(got: np.ndarray, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> None:
    exact, bound = amx_bound(x, w, bias)
    excess = np.abs(got.astype(np.float64) - exact) - bound
    assert np.all(excess <= 0), (
        f"worst excess over the bound {excess.max()} at {np.unravel_index(excess.argmax(), excess.shape)}"
    )


@SETTINGS
@given(
    m=st.integers(17, 70),
    k=st.integers(1, 600),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    with_bias=st.booleans(),
)
def test_within_the_bound(cpu: Any, m: int, k: int, n: int, seed: int, with_bias: bool) -> None:
    """Any shape: rows not a multiple of 16 or 32 (the padded tile rows), odd k and k not a multiple of 32 (the
    zero pairs), column tails of a 32-column strip and of a 16-column tile; activations over many magnitudes."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, k))).astype(F32)
    w = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_within_bound(run(cpu, x, w, bias, "bf16"), x, w, bias)


def test_bound_is_tight_enough_to_fail(cpu: Any) -> None:
    """The bound is far below one product's size: a result off by one value pair of the depth would fail it. The
    measured error is a small fraction of the bound."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 512)).astype(F32)
    w = weights(rng, 48, 512)
    got = run(cpu, x, w, None, "bf16")
    exact, bound = amx_bound(x, w, None)
    xf, wf = bf16_values(round_bf16(x)).astype(np.float64), bf16_values(w).astype(np.float64)
    one_pair = np.abs(xf[:, :2] @ wf[:, :2].T)
    assert np.median(bound / np.maximum(one_pair, 1e-30)) < 0.01
    assert np.abs(got - exact).max() <= 0.25 * bound.max()


def test_rows_do_not_depend_on_the_prompt(cpu: Any) -> None:
    """A row's bits are the same in prompts of 17, 30, 33 and 61 rows, with the rows reversed (each row at
    another position of its tile), and on 1 and 2 threads; a column's are the same with the weight rows
    reversed and in a call with only its 32-column strip."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((61, 300)).astype(F32)
    w = weights(rng, 100, 300)
    before = kbc.get_num_threads()
    try:
        kbc.set_num_threads(1)
        want = run(cpu, x, w, None, "bf16")
        kbc.set_num_threads(2)
        assert_bits(run(cpu, x, w, None, "bf16"), want)
        for rows in (17, 30, 33):
            assert_bits(run(cpu, x[:rows], w, None, "bf16"), want[:rows])
        assert_bits(run(cpu, x[::-1].copy(), w, None, "bf16"), want[::-1])
        assert_bits(run(cpu, x, w[::-1].copy(), None, "bf16"), want[:, ::-1])
        assert_bits(run(cpu, x, w[32:64].copy(), None, "bf16"), want[:, 32:64])
    finally:
        kbc.set_num_threads(before)
    assert_within_bound(want, x, w, None)


def test_bias_and_non_finite(cpu: Any) -> None:
    """The bias is added after the sums; inf and nan in an activation row reach that row only."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((20, 64)).astype(F32)
    x[2, 5] = np.inf
    x[3, 7] = np.nan
    w = round_bf16(np.abs(rng.standard_normal((3, 64))).astype(F32) + 0.5)
    bias = np.array([1.0, -2.0, 1e6], F32)
    got = run(cpu, x, w, bias, "bf16")
    assert np.all(np.isposinf(got[2])) and np.all(np.isnan(got[3]))
    finite = [i for i in range(20) if i not in (2, 3)]
    assert_within_bound(got[finite], x[finite], w, bias)


def test_differs_from_the_float_path_only_by_the_rounding(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """KAEL_BF16_GEMM=0 keeps the float32-activation path (other bits); both are within the activation
    rounding's bound (2^-9 |x| per value) of the exact product with the float32 activations."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((24, 768)).astype(F32)
    w = weights(rng, 40, 768)
    got = run(cpu, x, w, None, "bf16")
    monkeypatch.setenv("KAEL_BF16_GEMM", "0")
    f32 = run(cpu, x, w, None, "bf16")
    assert not np.array_equal(got, f32)
    exact = x.astype(np.float64) @ bf16_values(w).astype(np.float64).T
    bound = 2.0**-9 * (np.abs(x).astype(np.float64) @ np.abs(bf16_values(w)).astype(np.float64).T) * 1.01 + 1e-5
    assert np.all(np.abs(got - exact) <= bound) and np.all(np.abs(f32 - exact) <= bound)


def test_features_and_kernel_name() -> None:
    """Where prompts take the AMX GEMM (the module's skip), the table is AVX-512 with both AMX features reported,
    and auto mode counts the GEMM as paying whatever vdpbf16ps's measured issue ratio is."""
    features = C.isa_info()["features"]
    assert features["amx_bf16"] and features["os_amx"] and C.isa() == "avx512"
    assert C.bf16_gemm_pays()


def test_disabled_by_kael_cpu_disable() -> None:
    """KAEL_CPU_DISABLE=amx_bf16: the AVX-512 table names the vdpbf16ps GEMM instead (or none without
    AVX512_BF16), in a fresh process."""
    code = "from kael_backend_cpu._native import C; print(C.bf16_gemm_kernel(), C.isa_info()['features']['amx_bf16'])"
    env = dict(os.environ, KAEL_CPU_DISABLE="amx_bf16")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    want = "vdpbf16ps" if C.isa_info()["features"]["avx512_bf16"] else "none"
    assert out.returncode == 0 and out.stdout.split() == [want, "False"], out.stdout + out.stderr
