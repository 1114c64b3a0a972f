"""The CPU backend's bfloat16 path of quantized_linear for bf16 weights (NOTE [bfloat16 activations] in
csrc/quant.cpp, NOTE [bfloat16 dot order] and NOTE [bfloat16 GEMM] in csrc/vec_bf16_dot.h): activation rows
rounded to bfloat16 as ggml's GGML_FP32_TO_BF16, dot products by AVX512_BF16's vdpbf16ps, in few-row kernels
and, for prompts, a GEMM (on a CPU with AMX-BF16, the AMX GEMM instead: test_quant_bf16_amx.py; the vdpbf16ps
GEMM is then checked here in a run with KAEL_CPU_DISABLE=amx_bf16).

Oracle: a NumPy model of Intel's definition of vdpbf16ps (per float32 lane, the odd value's exact product
added first, then the even one's, each addition rounded to nearest even; bfloat16 inputs with a zero
exponent read as zero and results below float32's normal range flushed to zero) and of the stated
accumulator and lane-tree order; the activation rounding is checked against PyTorch's float32 ->
bfloat16 conversion. The kernel must equal the model bit for bit. Where the CPU or the table lacks
AVX512_BF16 there is no such kernel and bf16 weights keep the float32-activation path: the module runs
again under every other vector table this CPU can run (``KAEL_CPU_ISA``) and checks that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")

import kael  # noqa: E402
from _quant_helpers import F32, SETTINGS, assert_bits, check_requested_isa, not_in_isa_rerun, run  # noqa: E402
from cpu_helpers import other_isas, pytest_child, rerun_under_isa  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

LANES = 16


def has_kernel() -> bool:
    """The selected table has the vdpbf16ps kernel: the AVX-512 table on a CPU with AVX512_BF16."""
    from kael_backend_cpu._native import C

    return bool(C.isa() == "avx512" and C.isa_info()["features"]["avx512_bf16"])


def has_amx() -> bool:
    """Prompts of bf16 weights take the AMX GEMM (NOTE [AMX bfloat16 GEMM]) where a GEMM is taken."""
    return bool(C.bf16_gemm_kernel() == "amx")


@pytest.fixture(autouse=True)
def _bf16_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test here asks for llama.cpp's rounding of activations (q8) unless it says otherwise."""
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "q8")
    monkeypatch.delenv("KAEL_BF16_GEMM", raising=False)
    yield


# -- the NumPy model -----------------------------------------------------------------------


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits as ggml's GGML_FP32_TO_BF16: nearest, ties to even; a nan keeps its upper
    bits with the quiet bit set."""
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32, a zero exponent read as a zero of the same sign (the instruction's DAZ)."""
    f = (bits.astype(np.uint32) << 16).view(F32)
    return np.where((bits & 0x7F80) == 0, np.copysign(F32(0), f), f).astype(F32)


def flush(a: np.ndarray) -> np.ndarray:
    """Results below float32's normal range as zeros of their sign (FTZ)."""
    return np.where(np.abs(a) < np.finfo(F32).tiny, np.copysign(F32(0), a), a).astype(F32)


def model(x: np.ndarray, w_bits: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The bfloat16 path's float32 result [m, n] by NOTE [bfloat16 dot order]."""
    m, k = x.shape
    n = w_bits.shape[0]
    kp = -(-k // 32) * 32
    xb = np.zeros((m, kp), np.uint16)
    xb[:, :k] = round_bf16(x)
    wb = np.zeros((n, kp), np.uint16)
    wb[:, :k] = w_bits
    xf = bf16_values(xb).reshape(m, 1, kp // 32, LANES, 2)
    wf = bf16_values(wb).reshape(1, n, kp // 32, LANES, 2)
    acc = np.zeros((2, m, n, LANES), F32)
    with np.errstate(all="ignore"):
        for c in range(kp // 32):
            p = flush((xf[:, :, c] * wf[:, :, c]).astype(F32))  # exact but for underflow and overflow
            a = flush(acc[c % 2] + p[..., 1])
            acc[c % 2] = flush(a + p[..., 0])
        s = (acc[0] + acc[1]).astype(F32)
        for half in (8, 4, 2, 1):
            s = (s[..., :half] + s[..., half : 2 * half]).astype(F32)
        s = s[..., 0]
        if bias is not None:
            s = (s + bias.astype(F32)[None, :]).astype(F32)
    return s.astype(F32)


def gemm_model(x: np.ndarray, w_bits: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The bfloat16 GEMM's float32 result [m, n] by NOTE [bfloat16 GEMM]: one sum per output over the value
    pairs in order, the odd value's product first."""
    m, k = x.shape
    n = w_bits.shape[0]
    kk = -(-k // 2) * 2
    xb = np.zeros((m, kk), np.uint16)
    xb[:, :k] = round_bf16(x)
    wb = np.zeros((n, kk), np.uint16)
    wb[:, :k] = w_bits
    xf, wf = bf16_values(xb), bf16_values(wb)
    c = np.zeros((m, n), F32)
    with np.errstate(all="ignore"):
        for t in range(kk // 2):
            for v in (2 * t + 1, 2 * t):
                c = flush(c + flush(np.outer(xf[:, v], wf[:, v]).astype(F32)))
        if bias is not None:
            c = (c + bias.astype(F32)[None, :]).astype(F32)
    return c.astype(F32)


def amx_bound(x: np.ndarray, w_bits: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The AMX GEMM's oracle (NOTE [AMX bfloat16 GEMM]: no bit-exact model): the float64 product of the same
    bfloat16 values (+ bias) and a bound on the distance from it, 8 units in the last place of float32 (2^-24)
    per 32 values of depth, of the sum of the products' magnitudes, plus one rounding of the bias."""
    k = x.shape[1]
    xf = bf16_values(round_bf16(x)).astype(np.float64)
    wf = bf16_values(w_bits).astype(np.float64)
    exact = xf @ wf.T
    scale = np.abs(xf) @ np.abs(wf).T
    if bias is not None:
        exact = exact + bias.astype(np.float64)[None, :]
        scale = scale + np.abs(bias.astype(np.float64))[None, :]
    return exact, 8 * 2.0**-24 * -(-k // 32) * scale + 2.0**-24 * np.abs(exact)


def check_gemm(got: np.ndarray, x: np.ndarray, w_bits: np.ndarray, bias: np.ndarray | None) -> None:
    """A prompt's result from the GEMM this CPU takes: the vdpbf16ps GEMM's model bit for bit, or AMX's bound."""
    if has_amx():
        exact, bound = amx_bound(x, w_bits, bias)
        assert np.all(np.abs(got - exact) <= bound), np.max(np.abs(got - exact) - bound)
    else:
        assert_bits(got, gemm_model(x, w_bits, bias))


# -- running the kernel --------------------------------------------------------------------


def float_path(cpu: Any, monkeypatch: pytest.MonkeyPatch, x: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    with monkeypatch.context() as mp:
        mp.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
        return run(cpu, x, w_bits, None, "bf16")


def weights(rng: np.random.Generator, n: int, k: int, scale: float = 1.0) -> np.ndarray:
    return round_bf16((rng.standard_normal((n, k)) * scale).astype(F32))


needs_kernel = pytest.mark.skipif(not has_kernel(), reason="the table has no vdpbf16ps kernel (AVX512_BF16)")


# -- tests ---------------------------------------------------------------------------------


def test_model_rounding_matches_pytorch() -> None:
    """round_bf16 is PyTorch's float32 -> bfloat16 conversion (nearest, ties to even) on finite values,
    including exact ties and values that round up to the next binade or to inf."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4096) * rng.choice([1e-30, 1e-3, 1.0, 1e30], 4096)).astype(F32)
    ties = (rng.integers(0, 2**16, 512, dtype=np.uint32) << 16 | 0x8000).view(F32)
    edges = np.array([3.4028235e38, -3.4028235e38, 1e-45, 0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8], F32)
    x = np.concatenate([x, ties[np.isfinite(ties)], edges])
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(round_bf16(x), want)


@needs_kernel
@SETTINGS
@given(
    m=st.integers(1, 16),
    k=st.integers(1, 300),
    n=st.integers(1, 24),
    seed=st.integers(0, 2**32 - 1),
    with_bias=st.booleans(),
)
def test_equals_the_model(cpu: Any, m: int, k: int, n: int, seed: int, with_bias: bool) -> None:
    """Any shape (k not a multiple of 32 included: the zero padding), activations over many magnitudes."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, k))).astype(F32)
    w = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_bits(run(cpu, x, w, bias, "bf16"), model(x, w, bias))


@needs_kernel
def test_rows_alone_and_batched(cpu: Any) -> None:
    """A row's result is the same bits alone, in a batch of 16 and in q8's waves of 16 (40 rows)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 200)).astype(F32)
    w = weights(rng, 33, 200)
    want = model(x, w, None)
    assert_bits(run(cpu, x, w, None, "bf16"), want)
    assert_bits(run(cpu, x[:16], w, None, "bf16"), want[:16])
    for i in (0, 15, 39):
        assert_bits(run(cpu, x[i : i + 1], w, None, "bf16"), want[i : i + 1])


@needs_kernel
def test_flushes_and_non_finite(cpu: Any) -> None:
    """Products below the normal range flush to zero (1e-20 * 1e-20: a subnormal float32), activations too
    small for bfloat16's normal range read as zero; inf and nan propagate."""
    x = np.full((4, 64), 1e-20, F32)
    x[1] = 1e-39  # a subnormal bfloat16 after rounding
    x[2, 5] = np.inf
    x[3, 7] = np.nan
    w = round_bf16(np.full((2, 64), 1e-20, F32))
    w[1] = round_bf16(np.full(64, 1.0, F32))
    got = run(cpu, x, w, None, "bf16")
    assert_bits(got, model(x, w, None))
    assert got[0, 0] == 0 and got[1, 1] == 0 and np.isinf(got[2, 1]) and np.isnan(got[3, 1])


@needs_kernel
def test_close_to_the_float_path(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The activation rounding is the only approximation: the result is within the rounding's bound of the
    float32-activation path (|x - bf16(x)| <= 2^-9 |x| per value)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 768)).astype(F32)
    w = weights(rng, 50, 768)
    got = run(cpu, x, w, None, "bf16")
    exact = x.astype(np.float64) @ bf16_values(w).astype(np.float64).T
    bound = 2.0**-9 * (np.abs(x).astype(np.float64) @ np.abs(bf16_values(w)).astype(np.float64).T) * 1.01 + 1e-5
    assert np.all(np.abs(got - exact) <= bound)
    assert not np.array_equal(got, float_path(cpu, monkeypatch, x, w))  # the rounding is there


needs_vdpbf16ps_gemm = pytest.mark.skipif(
    not has_kernel() or has_amx(), reason="prompts take the AMX GEMM here (this file reruns without it)"
)


@needs_vdpbf16ps_gemm
@SETTINGS
@given(
    m=st.integers(17, 40),
    k=st.integers(1, 600),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    with_bias=st.booleans(),
)
def test_gemm_equals_the_model(
    cpu: Any, monkeypatch: pytest.MonkeyPatch, m: int, k: int, n: int, seed: int, with_bias: bool
) -> None:
    """auto on a prompt (more than 16 rows), the GEMM asked for: any shape (odd k, several depth blocks, column tails)."""
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "auto")
    monkeypatch.setenv("KAEL_BF16_GEMM", "1")
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, k))).astype(F32)
    w = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_bits(run(cpu, x, w, bias, "bf16"), gemm_model(x, w, bias))


@needs_vdpbf16ps_gemm
def test_gemm_rows_do_not_depend_on_the_prompt(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt row's result is the same bits in prompts of 17, 30 and 61 rows, on 1 and 2 threads."""
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "auto")
    monkeypatch.setenv("KAEL_BF16_GEMM", "1")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((61, 300)).astype(F32)
    w = weights(rng, 100, 300)
    want = gemm_model(x, w, None)
    before = kbc.get_num_threads()
    try:
        for threads in (1, 2):
            kbc.set_num_threads(threads)
            for rows in (17, 30, 61):
                assert_bits(run(cpu, x[:rows], w, None, "bf16"), want[:rows])
    finally:
        kbc.set_num_threads(before)


@pytest.mark.parametrize("mode", [None, "auto"])
def test_default_selection(cpu: Any, monkeypatch: pytest.MonkeyPatch, mode: str | None) -> None:
    """Unset (or auto): where the kernels exist, the few-row bfloat16 kernel up to 16 rows and, where it pays
    on this CPU (NOTE [bfloat16 GEMM pays]), the bfloat16 GEMM above; the float32-activation path (as f32)
    otherwise; q8 takes the few-row kernel at 17 rows too (waves of 16)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((17, 96)).astype(F32)
    w = weights(rng, 9, 96)
    f32 = [float_path(cpu, monkeypatch, x[:rows], w) for rows in (1, 16, 17)]
    if mode is None:
        monkeypatch.delenv("KAEL_QUANT_ACTIVATIONS", raising=False)
    else:
        monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", mode)
    for rows, want in zip((1, 16), f32[:2], strict=True):
        assert_bits(run(cpu, x[:rows], w, None, "bf16"), model(x[:rows], w, None) if has_kernel() else want)
    if C.bf16_gemm_pays():
        check_gemm(run(cpu, x, w, None, "bf16"), x, w, None)
    else:
        assert_bits(run(cpu, x, w, None, "bf16"), f32[2])
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "q8")
    assert_bits(run(cpu, x, w, None, "bf16"), model(x, w, None) if has_kernel() else f32[2])


def test_the_gemm_choice_follows_kael_bf16_gemm(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """KAEL_BF16_GEMM=1 takes the bfloat16 GEMM for a prompt wherever the table has it, 0 the float32 path;
    unset, the measured issue ratio decides (NOTE [bfloat16 GEMM pays]); any other value is refused."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((20, 64)).astype(F32)
    w = weights(rng, 5, 64)
    want_f32 = float_path(cpu, monkeypatch, x, w)
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "auto")
    monkeypatch.setenv("KAEL_BF16_GEMM", "0")
    assert_bits(run(cpu, x, w, None, "bf16"), want_f32)
    monkeypatch.setenv("KAEL_BF16_GEMM", "1")
    if C.bf16_gemm_kernel() != "none":
        check_gemm(run(cpu, x, w, None, "bf16"), x, w, None)
    else:
        assert_bits(run(cpu, x, w, None, "bf16"), want_f32)
    monkeypatch.setenv("KAEL_BF16_GEMM", "yes")
    with pytest.raises(
        kael.KaelError, match=r"KAEL_BF16_GEMM must be '0' or '1' \(or unset: where it pays\), got 'yes'"
    ):
        run(cpu, x, w, None, "bf16")
    ratio = C.bf16_issue_ratio()
    if has_kernel():
        assert 0.05 < ratio < 4.0  # instructions a second over FMAs': 0.26 on one host, about 1 on others
        assert C.bf16_gemm_pays() == (has_amx() or ratio >= 0.375)
    else:
        assert ratio == 0.0 and C.bf16_gemm_pays() == has_amx()


def test_runs_on_the_requested_table() -> None:
    check_requested_isa()


@not_in_isa_rerun
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)


@pytest.mark.skipif(not has_kernel(), reason="the CPU has no AVX512_BF16 to take away")
def test_without_avx512_bf16() -> None:
    """The AVX-512 table on a CPU without AVX512_BF16 (KAEL_CPU_DISABLE) has no kernel: auto and q8 keep
    the float32-activation path there."""
    rc, out = pytest_child(
        __file__,
        "default_selection or requested_table",
        KAEL_CPU_DISABLE="avx512_bf16",
        KAEL_QUANT_TEST_ISA="avx512",
        KAEL_CPU_ISA="avx512",
    )
    assert rc == 0 and "3 passed" in out, out


@not_in_isa_rerun
@pytest.mark.skipif(not has_amx(), reason="the CPU has no AMX-BF16 to take away")
def test_vdpbf16ps_gemm_without_amx() -> None:
    """On a CPU with AMX-BF16, this file again with KAEL_CPU_DISABLE=amx_bf16: prompts then take the vdpbf16ps
    GEMM, whose tests here ran skipped, and its model holds bit for bit."""
    rc, out = pytest_child(__file__, "(gemm and not without_amx) or default_selection", KAEL_CPU_DISABLE="amx_bf16")
    assert rc == 0 and " skipped" not in out and "5 passed" in out, out
