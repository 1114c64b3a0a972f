"""The CPU backend's integer GEMMs of quantized_linear for prompts (NOTE [integer GEMM] and NOTE [integer K
GEMM] in csrc/vec_quant_gemm.h): Q8_0 / Q4_0 / Q5_0 / IQ4_NL weights times activation rows quantized to GGML's
Q8_0 blocks, and the super-block formats times Q8_K rows, on AVX-512 VNNI micro-tiles, taken by the default
(auto) above 16 rows.

Oracle: the NumPy model of test_quant_int8.py (ggml's Q8_0 activation quantizer, the gguf package's weight
blocks) with this kernel's float order: per output, p_b = (d_w * d_x) * float(isum_b) added in block order
from +0, then the bias; for the super-blocks, test_quant_int8_k.py's model of NOTE [integer K dot order]
itself (so a prompt's rows are the few-row kernels' bits). The kernels must equal them bit for bit. Tables or CPUs without it keep the packed
float GEMM for prompts: the module runs again under every other vector table this CPU can run.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")
pytest.importorskip("gguf")

from cpu_helpers import other_isas, rerun_under_isa  # noqa: E402
from test_quant_int8 import assert_bits, encode, quantize_act, run, weight_ints  # noqa: E402
from test_quant_int8_k import extreme_weights, special_rows  # noqa: E402
from test_quant_int8_k import model as k_model  # noqa: E402
from test_quant_int8_k import weights as k_weights  # noqa: E402
from test_quant_kquants import SCHEMES as K_SCHEMES  # noqa: E402

F32 = np.float32
SCHEMES = ("q8_0", "q4_0", "q5_0", "iq4_nl")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def has_kernel() -> bool:
    """The selected table has the integer GEMM: the AVX-512 table on a CPU with AVX512_VNNI."""
    from kael_backend_cpu._native import C

    return bool(C.isa() == "avx512" and C.isa_info()["features"]["avx512_vnni"])


needs_kernel = pytest.mark.skipif(not has_kernel(), reason="the table has no integer GEMM (AVX-512 VNNI)")


def gemm_model(x: np.ndarray, data: np.ndarray, bias: np.ndarray | None, scheme: str) -> np.ndarray:
    """The integer GEMM's float32 result [m, n] by NOTE [integer GEMM]."""
    qx, dx, _ = quantize_act(x)
    qw, dw, _ = weight_ints(data, scheme, x.shape[1])
    isum = np.einsum("ibt,jbt->ijb", qx, qw)  # exact in int64
    with np.errstate(all="ignore"):
        p = ((dx[:, None, :] * dw[None, :, :]).astype(F32) * isum.astype(F32)).astype(F32)
        acc = np.zeros(p.shape[:2], F32)
        for b in range(p.shape[2]):
            acc = (acc + p[..., b]).astype(F32)
        if bias is not None:
            acc = (acc + bias.astype(F32)[None, :]).astype(F32)
    return acc


@pytest.fixture(autouse=True)
def _auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "auto")


@needs_kernel
@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    m=st.integers(17, 30),
    blocks=st.integers(1, 40),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    with_bias=st.booleans(),
)
def test_equals_the_model(cpu: Any, scheme: str, m: int, blocks: int, n: int, seed: int, with_bias: bool) -> None:
    """Any shape: depth over several 16-block depth blocks, column and row tails; activations over many
    magnitudes, a zero block among them."""
    rng = np.random.default_rng(seed)
    k = 32 * blocks
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, 1))).astype(F32)
    x[0, :32] = 0
    data = encode(rng.standard_normal((n, k)), scheme)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_bits(run(cpu, x, data, bias, scheme), gemm_model(x, data, bias, scheme))


@needs_kernel
def test_extreme_integers(cpu: Any) -> None:
    """Weight integers at their limits (q8_0 +-127, q4_0 -8 and 7: +-1 and +-2 weights) against activations
    at q_x = +-127: the unsigned offset and its correction stay exact."""
    rng = np.random.default_rng(1)
    k, n = 64, 5
    x = np.where(rng.random((20, k)) < 0.5, -1.0, 1.0).astype(F32)  # q_x = +-127 everywhere
    for scheme in ("q8_0", "q4_0"):
        w = np.where(rng.random((n, k)) < 0.5, -1.0, 1.0) * (np.arange(k) % 2 + 1)
        data = encode(w, scheme)
        assert_bits(run(cpu, x, data, None, scheme), gemm_model(x, data, None, scheme))


@needs_kernel
def test_rows_do_not_depend_on_the_prompt(cpu: Any) -> None:
    """A prompt row's result is the same bits in prompts of 17, 29 and 50 rows, on 1 and 2 threads."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 640)).astype(F32)
    data = encode(rng.standard_normal((75, 640)), "q4_0")
    want = gemm_model(x, data, None, "q4_0")
    before = kbc.get_num_threads()
    try:
        for threads in (1, 2):
            kbc.set_num_threads(threads)
            for rows in (17, 29, 50):
                assert_bits(run(cpu, x[:rows], data, None, "q4_0"), want[:rows])
    finally:
        kbc.set_num_threads(before)


@needs_kernel
@SETTINGS
@given(
    scheme=st.sampled_from(K_SCHEMES),
    m=st.integers(17, 26),
    nb=st.integers(1, 5),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    with_bias=st.booleans(),
)
def test_k_equals_the_model(cpu: Any, scheme: str, m: int, nb: int, n: int, seed: int, with_bias: bool) -> None:
    """The super-block formats: NOTE [integer K dot order]'s bits at any shape (several depth blocks, column and
    row tails)."""
    rng = np.random.default_rng(seed)
    k = 256 * nb
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, 1))).astype(F32)
    data = k_weights(rng, n, k, scheme)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_bits(run(cpu, x, data, bias, scheme), k_model(x, data, bias, scheme))


@needs_kernel
@pytest.mark.parametrize("scheme", K_SCHEMES)
def test_k_extremes_and_special_rows(cpu: Any, scheme: str) -> None:
    """Weight integers and scales at their limits (every byte 0x00 / 0xFF / 0x80) against activations at
    q_x = +-127 (alternating, and all of one sign), and the edge activation rows (zeros, ties, tiny, huge,
    subnormal, inf, nan), in one prompt;
    each row equals itself decoded alone (the few-row kernel)."""
    rng = np.random.default_rng(5)
    k = 512
    # (rows of all +1 and all -1: q_x = +-127 throughout, each group's sum at the format's largest magnitude, which
    # for Q2_K / Q3_K / Q4_K must fit the 16 bits the GEMM scales it in: kIkSum16)
    x = np.concatenate(
        [
            special_rows(rng, k),
            np.where(np.arange(k) % 2 == 0, F32(1), F32(-1))[None].repeat(12, 0),
            np.ones((3, k), F32),
            -np.ones((3, k), F32),
        ],
        axis=0,
    ).astype(F32)
    for quants, scales in ((0x00, 0x80), (0xFF, 0x7F), (0xFF, 0xFF), (0x80, 0x00)):
        data = extreme_weights(rng, 6, k, scheme, quants, scales)
        got = run(cpu, x, data, None, scheme)
        assert_bits(got, k_model(x, data, None, scheme))
        for i in (0, 7, 19):
            assert_bits(run(cpu, x[i : i + 1], data, None, scheme), got[i : i + 1])


@pytest.mark.parametrize("mode", ["f32", "q8"])
def test_other_modes_keep_their_paths(cpu: Any, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """f32 and q8 never take the GEMM: f32's prompt is the float GEMM (within float32 rounding of the
    float64 product of x and the dequantized weights), q8's its waves of the few-row kernels (each row as
    decoded alone)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((20, 128)).astype(F32)
    data = encode(rng.standard_normal((9, 128)), "q8_0")
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", mode)
    got = run(cpu, x, data, None, "q8_0")
    if mode == "q8":
        for i in (0, 19):
            assert_bits(got[i : i + 1], run(cpu, x[i : i + 1], data, None, "q8_0"))
    else:
        qw, dw, _ = weight_ints(data, "q8_0", 128)
        w = (qw * dw[..., None].astype(np.float64)).reshape(9, 128)
        np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-4)
    if has_kernel():
        assert not np.array_equal(got, gemm_model(x, data, None, "q8_0"))


def test_default_prompt_path(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto at 17 rows: the integer GEMM where the table has it, else the float GEMM (f32's bits)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((17, 96)).astype(F32)
    data = encode(rng.standard_normal((7, 96)), "q4_0")
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
    f32 = run(cpu, x, data, None, "q4_0")
    monkeypatch.delenv("KAEL_QUANT_ACTIVATIONS")
    assert_bits(run(cpu, x, data, None, "q4_0"), gemm_model(x, data, None, "q4_0") if has_kernel() else f32)


def test_runs_on_the_requested_table() -> None:
    want = os.environ.get("KAEL_QUANT_TEST_ISA")
    if want is None:
        pytest.skip("not a per-ISA run")
    from kael_backend_cpu._native import C

    assert C.isa() in (want, "base" if want == "baseline" else want)


@pytest.mark.skipif(os.environ.get("KAEL_QUANT_TEST_ISA") is not None, reason="already a per-ISA run")
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)
