"""The CPU backend's integer path of quantized_linear (NOTE [integer quantized linear] in
csrc/quant.cpp, NOTE [integer dot order] in csrc/vec_quant_dot.h): Q8_0 / Q4_0 / Q5_0 / IQ4_NL weights times
activation rows quantized to GGML's Q8_0 blocks, with int32 block sums; Q4_1 / Q5_1 weights times Q8_1
blocks in ggml's own order (NOTE [ggml q8_1 dot order] in csrc/vec_quant_dot_q81.h), checked against
ggml-cpu's own dot products through ctypes where llama_cpp is installed.

Oracle: a NumPy model of the same arithmetic written here from the quantizer ggml's CPU backend runs
on x86 and ARM (quantize_row_q8_0 / q8_1: d = amax / 127 kept as float16, q = x * (127 / amax)
rounded half to even; checked against that very code through ctypes where llama_cpp is installed)
and the stated float order (per block (d_w * d_x) * isum in float32, added into lane b % 8 of eight
float32 accumulators, the lanes summed pairwise, then the bias; Q4_1 / Q5_1: ggml's fused lanes of four
products and its separate sum of m_w * s_x). The kernel must equal it bit for
bit; the module runs again in a subprocess under every other vector table this CPU can run
(``KAEL_CPU_ISA``), so baseline, AVX2 (maddubs) and AVX-512 (VNNI where present) all meet it.
The weights come from the gguf package's quantizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")
gguf = pytest.importorskip("gguf")

from _quant_helpers import F32, SETTINGS, assert_bits, check_requested_isa, not_in_isa_rerun, run  # noqa: E402
from cpu_helpers import other_isas, rerun_under_isa  # noqa: E402

GGML_TYPE = {
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_1": gguf.GGMLQuantizationType.Q5_1,
}
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q5_0": 22, "iq4_nl": 18, "q4_1": 20, "q5_1": 24}
MINS = ("q4_1", "q5_1")  # value d * q + m: Q8_1 activations
SCHEMES = tuple(BLOCK_BYTES)
#: GGML's kvalues_iq4nl: IQ4_NL's 16 levels
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int64)
LANES = 8


@pytest.fixture(autouse=True)
def _integer_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test here runs the integer path unless it says otherwise."""
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "q8")
    yield


# -- the NumPy model -----------------------------------------------------------------------


def quantize_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 [m, k] -> int8 values [m, k/32, 32], float32 scales [m, k/32] and Q8_1 sums
    [m, k/32], as ggml-cpu's quantize_row_q8_0 / q8_1 (q = rint(x * (127 / amax)), half to even;
    s = float16(float(sum q) * d), d unrounded; a block holding inf/nan: scale and sum nan,
    values 0)."""
    m, k = x.shape
    xb = x.astype(F32).reshape(m, k // 32, 32)
    finite = np.all(np.isfinite(xb), axis=-1)
    with np.errstate(all="ignore"):
        amax = np.max(np.abs(np.where(finite[..., None], xb, F32(0))), axis=-1).astype(F32)
        d = (amax / F32(127)).astype(F32)
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
        v = (np.where(finite[..., None], xb, F32(0)) * inv[..., None]).astype(F32)
        q = np.where(np.abs(v) <= F32(127.5), np.rint(v), F32(0))  # 127 / amax overflowed: 0
    q = np.where(finite[..., None], q, 0).astype(np.int64)
    assert np.all(np.abs(q) <= 127)
    with np.errstate(over="ignore", invalid="ignore"):
        scale = d.astype(np.float16).astype(F32)
        sums = (q.sum(axis=-1).astype(F32) * d).astype(F32).astype(np.float16).astype(F32)
    nan = F32(np.nan)
    return q, np.where(finite, scale, nan).astype(F32), np.where(finite, sums, nan).astype(F32)


def weight_ints(data: np.ndarray, scheme: str, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 blocks [n, bytes] -> integers [n, k/32, 32], float32 scales [n, k/32] and mins
    [n, k/32] (zero but for q4_1 / q5_1)."""
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, k // 32, BLOCK_BYTES[scheme])
    d = blocks[..., :2].copy().view("<f2")[..., 0].astype(F32)
    if scheme == "q8_0":
        q = blocks[..., 2:].view(np.int8).astype(np.int64)
    elif scheme in ("q5_0", "q5_1"):
        h0 = 2 if scheme == "q5_0" else 4
        qh = blocks[..., h0 : h0 + 4].copy().view("<u4").astype(np.int64)  # [n, nb, 1]
        b = blocks[..., h0 + 4 :].astype(np.int64)
        j = np.arange(16)
        lo = (b & 15) | (((qh >> j) & 1) << 4)
        hi = (b >> 4) | (((qh >> (j + 16)) & 1) << 4)
        q = np.concatenate([lo, hi], axis=-1) - (16 if scheme == "q5_0" else 0)
    elif scheme == "q4_1":
        b = blocks[..., 4:].astype(np.int64)
        q = np.concatenate([b & 15, b >> 4], axis=-1)
    else:
        b = blocks[..., 2:].astype(np.int64)
        q = np.concatenate([b & 15, b >> 4], axis=-1)
        q = IQ4NL[q] if scheme == "iq4_nl" else q - 8
    mins = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(F32) if scheme in MINS else np.zeros_like(d)
    return q, d, mins


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fma(a, b, c) rounded once (nearest, ties to even): a * b is exact in float64, the sum's rounding
    error comes from TwoSum, and a float64 sum that lands exactly half-way between two float32 values goes the
    way that error points."""
    with np.errstate(all="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c64 = c.astype(np.float64)
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        r = s.astype(F32)
        r64 = r.astype(np.float64)
        other = np.nextafter(r, np.where(s > r64, F32(np.inf), F32(-np.inf)).astype(F32))
        tie = np.isfinite(s) & np.isfinite(r) & (s != r64) & (s == (r64 + other.astype(np.float64)) / 2) & (err != 0)
        fixed = np.where(err > 0, np.maximum(r, other), np.minimum(r, other))
    return np.where(tie, fixed, r).astype(F32)


def ggml_order(
    qx: np.ndarray, dx: np.ndarray, sx: np.ndarray, qw: np.ndarray, dw: np.ndarray, mw: np.ndarray
) -> np.ndarray:
    """q4_1 / q5_1's float32 dot products [m, n] by NOTE [ggml q8_1 dot order] (ggml_vec_dot_q4_1_q8_1 on x86):
    lane j of block b sums the products of values 4j .. 4j + 3, fused into a_j with d_w * d_x; t sums m_w * s_x;
    then (((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))) + t."""
    m, nb = dx.shape
    n = dw.shape[0]
    lanes = np.einsum("ibls,jbls->ijbl", qx.reshape(m, nb, LANES, 4), qw.reshape(n, nb, LANES, 4))  # exact
    acc = np.zeros((m, n, LANES), F32)
    t = np.zeros((m, n), F32)
    with np.errstate(all="ignore"):
        for b in range(nb):
            scale = (dx[:, None, b] * dw[None, :, b]).astype(F32)  # exact
            acc = fma32(np.broadcast_to(scale[..., None], acc.shape), lanes[:, :, b, :].astype(F32), acc)
            t = (t + (sx[:, None, b] * mw[None, :, b]).astype(F32)).astype(F32)  # the product is exact
        a = [acc[..., i] for i in range(LANES)]
        return ((((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))) + t).astype(F32)


def model(x: np.ndarray, data: np.ndarray, bias: np.ndarray | None, scheme: str) -> np.ndarray:
    """The integer path's float32 result [m, n] by NOTE [integer dot order] (q4_1 / q5_1: NOTE [ggml q8_1 dot
    order])."""
    m, k = x.shape
    nb = k // 32
    qx, dx, sx = quantize_act(x)
    qw, dw, mw = weight_ints(data, scheme, k)
    if scheme in MINS:
        s = ggml_order(qx, dx, sx, qw, dw, mw)
        with np.errstate(all="ignore"):
            return s if bias is None else (s + bias.astype(F32)[None, :]).astype(F32)
    isum = np.einsum("ibt,jbt->ijb", qx, qw)  # exact in int64
    assert np.all(np.abs(isum) < 2**24)
    with np.errstate(all="ignore"):
        scale = (dx[:, None, :] * dw[None, :, :]).astype(F32)  # exact
        p = (scale * isum.astype(F32)).astype(F32)
    groups = -(-nb // LANES)
    p = np.concatenate([p, np.zeros((*p.shape[:2], groups * LANES - nb), F32)], axis=-1)
    acc = np.zeros((*p.shape[:2], LANES), F32)
    with np.errstate(all="ignore"):
        for g in range(groups):
            acc = (acc + p[..., g * LANES : (g + 1) * LANES]).astype(F32)
        a = [acc[..., i] for i in range(LANES)]
        s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
        if bias is not None:
            s = (s + bias.astype(F32)[None, :]).astype(F32)
    return s.astype(F32)


# -- running the kernel --------------------------------------------------------------------


def encode(w: np.ndarray, scheme: str) -> np.ndarray:
    """float [N, K] as `scheme`'s blocks: gguf's quantizer; iq4_nl (which gguf does not quantize):
    level index clip(rint(3 w + 8)) of each value, scale 0.05."""
    if scheme != "iq4_nl":
        return np.asarray(gguf.quants.quantize(w.astype(np.float32), GGML_TYPE[scheme]))
    n, k = w.shape
    idx = np.clip(np.rint(w * 3 + 8), 0, 15).astype(np.uint8).reshape(n, k // 32, 32)
    blocks = np.zeros((n, k // 32, 18), np.uint8)
    blocks[..., :2] = np.frombuffer(np.float16(0.05).tobytes(), np.uint8)
    blocks[..., 2:] = idx[..., :16] | (idx[..., 16:] << 4)
    return blocks.reshape(n, k // 32 * 18)


# -- tests ---------------------------------------------------------------------------------


def test_model_quantizer_matches_gguf() -> None:
    """The model's activation quantizer gives the gguf package's Q8_0 blocks (ggml's reference
    quantizer, whose 1 / d and half-away rounding differ from the SIMD one only at exact half-way
    cases and a last-bit difference of the multiplier) on random values."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 256)) * 3).astype(F32)
    q, d, _ = quantize_act(x)
    blocks = encode(x, "q8_0").reshape(6, 8, 34)
    np.testing.assert_array_equal(blocks[..., 2:].view(np.int8).astype(np.int64), q)
    np.testing.assert_array_equal(blocks[..., :2].copy().view("<f2")[..., 0].astype(F32), d)


def test_model_quantizer_is_ggml_cpus() -> None:
    """The model's Q8_0 and Q8_1 blocks are ggml-cpu's own quantize_row_q8_0 / q8_1 (llama_cpp's
    library, SIMD on this machine) bit for bit, half-way cases included: a row of k + 0.5 with
    amax 127 (multiplier exactly 1) rounds to even, as ggml does, where roundf would not."""
    import ggml_activation_quant as ggml

    rng = np.random.default_rng(1)
    rows = (rng.standard_normal((5, 256)) * 3).astype(F32)
    rows[1] = np.tile(np.concatenate([np.arange(-15, 16, dtype=F32) + F32(0.5), [F32(127)]]), 8)
    rows[2, :64] = 0.0
    rows[3] *= F32(1e-30)
    q, d, s = quantize_act(rows)
    assert q[1, 0, 0] == -14 and q[1, 0, 1] == -14  # -14.5 and -13.5 to even
    for i, row in enumerate(rows):
        b0, b1 = ggml.quantize_q8_0(row), ggml.quantize_q8_1(row)
        np.testing.assert_array_equal(b0["qs"].astype(np.int64), q[i], err_msg=f"row {i}")
        np.testing.assert_array_equal(b1["qs"].astype(np.int64), q[i], err_msg=f"row {i}")
        np.testing.assert_array_equal(b0["d"].astype(F32), d[i])
        np.testing.assert_array_equal(b1["s"].astype(F32), s[i])


def _round_exact(v: Fraction) -> np.float32:
    """The float32 nearest the rational v (ties to even), by comparing exact distances."""
    r = np.float32(float(v))
    cands = [np.nextafter(r, F32(-np.inf)), r, np.nextafter(r, F32(np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(c.view(np.uint32)) & 1))


@SETTINGS
@given(
    a=st.floats(-(2.0**20), 2.0**20, width=32),
    b=st.floats(-(2.0**20), 2.0**20, width=32),
    c=st.floats(-(2.0**40), 2.0**40, width=32),
)
def test_fma32_model_rounds_once(a: float, b: float, c: float) -> None:
    """The model's fma32 is the exact a * b + c rounded once to float32 (ties to even), on random values
    and on sums whose float64 rounding lands exactly half-way, where a float64 fma would round twice:
    (24929 / 2^15) (673 / 2^9) = 1 + 2^-24, half-way between 1 and 1 + 2^-23, plus or minus 2^-80."""
    got = fma32(np.array([a], F32), np.array([b], F32), np.array([c], F32))[0]
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    want = _round_exact(exact)
    if exact == 0:  # IEEE: -0 only when the product and c are both zeros of sign -
        negative = (np.signbit(a) != np.signbit(b)) and np.signbit(c) and a * b == 0 and c == 0
        want = F32(-0.0) if negative else F32(0.0)
    assert got.view(np.uint32) == want.view(np.uint32)
    x, y = np.array([24929 / 2**15], F32), np.array([673 / 2**9], F32)
    up = fma32(x, y, np.array([2.0**-80], F32))[0]
    down = fma32(x, y, np.array([-(2.0**-80)], F32))[0]
    assert up == F32(1 + 2.0**-23) and down == F32(1.0)
    assert fma32(x, y, np.array([0.0], F32))[0] == F32(1.0)  # an exact tie: to even


@pytest.mark.parametrize("scheme", MINS)
def test_q4_1_q5_1_are_ggml_cpus_own_dot_products(cpu: Any, scheme: str) -> None:
    """Q4_1 / Q5_1 weights: the kernel (1, 3 and 16 rows) and the NumPy model give ggml-cpu's own
    ggml_vec_dot_q4_1_q8_1 / q5_1_q8_1 (llama_cpp's library, SIMD on this machine; every row count of these
    formats in llama.cpp) bit for bit, on the same weight blocks and ggml's own Q8_1 activation blocks: NOTE
    [ggml q8_1 dot order] is llama.cpp's. Rows span block counts 1 .. 20 and scales from 1e-3 to 50."""
    import ggml_activation_quant as ggml

    rng = np.random.default_rng(21)
    for nb in (1, 2, 7, 8, 9, 20):
        k, n = 32 * nb, 9
        data = encode(rng.standard_normal((n, k)) + rng.uniform(-1, 1, (n, 1)), scheme)
        for m, scale in ((1, 1.0), (3, 1e-3), (16, 50.0)):
            x = (rng.standard_normal((m, k)) * scale).astype(F32)
            theirs = np.array(
                [[ggml.dot_q8_1(scheme, data[j], ggml.quantize_q8_1(x[i])) for j in range(n)] for i in range(m)], F32
            )
            assert_bits(model(x, data, None, scheme), theirs)
            assert_bits(run(cpu, x, data, None, scheme), theirs)


@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    m=st.integers(1, 16),
    nb=st.integers(1, 40),
    n=st.integers(0, 20).map(lambda v: 2 * v + 1),
    with_bias=st.booleans(),
    scale=st.sampled_from([1e-3, 1.0, 50.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_bit_identical_to_the_model(
    cpu: Any, scheme: str, m: int, nb: int, n: int, with_bias: bool, scale: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    k = 32 * nb
    x = (rng.standard_normal((m, k)) * scale).astype(F32)
    data = encode(rng.standard_normal((n, k)), scheme)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_bits(run(cpu, x, data, bias, scheme), model(x, data, bias, scheme))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_block_count_and_any_block_bytes(cpu: Any, scheme: str) -> None:
    """Every block count 1 .. 17 (each tail of the vector kernels' groups of eight blocks and pairs of
    two, NOTE [integer dot in vectors]) for 1, 2 and 5 activation rows (tiles of 1, 2, 4 + 1 rows)
    against weight blocks of random bytes, the scales then set to finite float16: every integer a
    format can hold (q8_0's -128, nibbles 0 and 15, any high bits) meets the unsigned-byte kernels;
    rows of all-zero and all-one quant bytes too."""
    rng = np.random.default_rng(11)
    width = BLOCK_BYTES[scheme]
    for nb in range(1, 18):
        k, n = 32 * nb, 7
        blocks = rng.integers(0, 256, (n, nb, width), dtype=np.uint8)
        blocks[0, :, 2:] = 0
        blocks[1, :, 2:] = 255
        scales = 2 if scheme in MINS else 1
        halves = rng.uniform(-2, 2, (n, nb, scales)).astype(np.float16)
        blocks[..., : 2 * scales] = halves.view(np.uint8).reshape(n, nb, 2 * scales)
        data = blocks.reshape(n, nb * width)
        for m in (1, 2, 5):
            x = rng.standard_normal((m, k)).astype(F32)
            assert_bits(run(cpu, x, data, None, scheme), model(x, data, None, scheme))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rows_batched_equal_alone_and_threads_agree(cpu: Any, scheme: str) -> None:
    rng = np.random.default_rng(3)
    k, n = 768, 301
    x = rng.standard_normal((16, k)).astype(F32)
    data = encode(rng.standard_normal((n, k)), scheme)
    bias = rng.standard_normal(n).astype(F32)
    before = kbc.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            kbc.set_num_threads(threads)
            batched = run(cpu, x, data, bias, scheme)
            for i in (0, 5, 15):
                assert_bits(run(cpu, x[i : i + 1], data, bias, scheme)[0], batched[i])
            results.append(batched)
        assert_bits(results[0], results[1])
        assert_bits(results[0], model(x, data, bias, scheme))
    finally:
        kbc.set_num_threads(before)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_special_activations(cpu: Any, scheme: str) -> None:
    """Zeros, all-zero blocks, half-way values, exact ties, tiny values (float16 scale underflow), subnormal
    blocks (1 / d overflows), huge values (float16 scale overflow: inf), inf and nan: the kernel is
    the model's bits (nan where it is)."""
    rng = np.random.default_rng(4)
    k, n = 512, 9
    data = encode(rng.standard_normal((n, k)), scheme)
    rows = np.zeros((9, k), F32)
    rows[1] = rng.standard_normal(k)
    rows[1, 64:160] = 0.0  # three all-zero blocks
    rows[2] = np.tile(np.arange(-16, 16, dtype=F32) + 0.5, k // 32) * F32(127 / 31.5)  # half-way cases
    rows[3] = rng.standard_normal(k) * 1e-7
    rows[4] = rng.standard_normal(k) * 1e30
    rows[5] = rng.standard_normal(k)
    rows[5, 40] = np.inf
    rows[6] = rng.standard_normal(k)
    rows[6, 300] = np.nan
    rows[7] = rng.standard_normal(k) * 3e6
    rows[7, 32:64] = rng.standard_normal(32) * 1e-39  # subnormal: 1 / d overflows to inf
    # exact ties: a block whose largest magnitude is 127 scales by exactly 1 (Q8_K's by -1), so x + 0.5 rounds to even
    ties = np.arange(-15.5, 16, 1.0, dtype=F32)
    ties[0], ties[-1] = -127.0, 127.0
    rows[8] = np.tile(ties, k // 32)
    bias = rng.standard_normal(n).astype(F32)
    got = run(cpu, rows, data, bias, scheme)
    assert_bits(got, model(rows, data, bias, scheme))
    assert np.all(got[0] == bias)
    assert np.all(np.isnan(got[5])) and np.all(np.isnan(got[6]))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_close_to_the_float_path(cpu: Any, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """KAEL_QUANT_ACTIVATIONS=f32 selects the float32-activation path: it is another result, and
    the integer one stays within the activation rounding (|x - d_x q_x| <= d_x / 2 a value)."""
    rng = np.random.default_rng(5)
    k, n = 768, 64
    x = rng.standard_normal((4, k)).astype(F32)
    data = encode(rng.standard_normal((n, k)), scheme)
    q8 = run(cpu, x, data, None, scheme)
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
    f32 = run(cpu, x, data, None, scheme)
    assert not np.array_equal(q8, f32)
    qw, dw, mw = weight_ints(data, scheme, k)
    w = (qw * dw[..., None].astype(np.float64) + mw[..., None]).reshape(n, k)
    _, dx, _ = quantize_act(x)
    bound = (np.repeat(dx.astype(np.float64), 32, axis=1) / 2) @ np.abs(w).T * 1.01 + 1e-5 * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(q8.astype(np.float64) - f32) <= bound)


def test_bad_mode_is_refused(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(np.ones((3, 32)), "q8_0")
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "int4")
    with pytest.raises(kael.KaelError, match=r"KAEL_QUANT_ACTIVATIONS must be 'auto', 'f32' or 'q8'.*'int4'"):
        run(cpu, np.ones((1, 32), F32), data, None, "q8_0")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    m=st.integers(17, 70),
    scheme=st.sampled_from(["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_more_than_16_rows_take_the_integer_path_in_waves(cpu: Any, m: int, scheme: str, seed: int) -> None:
    """q8 with a prompt's rows (M > 16, waves of 16): every row is the NumPy model's bits, so a row's result
    is the same whatever the row count, and the same as that row alone."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, 96)).astype(F32)
    data = encode(rng.standard_normal((37, 96)), scheme)
    bias = rng.standard_normal(37).astype(F32)
    got = run(cpu, x, data, bias, scheme)
    assert_bits(got, model(x, data, bias, scheme))
    assert_bits(got[m - 1 : m], run(cpu, x[m - 1 : m], data, bias, scheme))


def test_child_runs_requested_isa() -> None:
    check_requested_isa()


@not_in_isa_rerun
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)


@pytest.mark.parametrize("mode", [None, "auto"])
def test_default_selection(cpu: Any, monkeypatch: pytest.MonkeyPatch, mode: str | None) -> None:
    """Unset (or auto): the integer path (the NumPy model's bits) up to 16 rows on the AVX2 and AVX-512
    tables, the float32-activation path (as f32) above 16 rows where there is no integer GEMM (AVX-512
    VNNI) and on the baseline table; q8: the integer
    path at 16 rows and at 17 (a wave of 16, then one)."""
    from kael_backend_cpu._native import C

    rng = np.random.default_rng(7)
    x = rng.standard_normal((17, 256)).astype(F32)
    data = encode(rng.standard_normal((7, 256)), "q4_0")
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
    f32 = [run(cpu, x[:rows], data, None, "q4_0") for rows in (1, 16, 17)]
    if mode is None:
        monkeypatch.delenv("KAEL_QUANT_ACTIVATIONS", raising=False)
    else:
        monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", mode)
    simd = C.isa() not in ("baseline", "base")
    for rows, want in zip((1, 16), f32[:2], strict=True):
        got = run(cpu, x[:rows], data, None, "q4_0")
        assert_bits(got, model(x[:rows], data, None, "q4_0") if simd else want)
    if not (C.isa() == "avx512" and C.isa_info()["features"]["avx512_vnni"]):  # else the integer GEMM
        assert_bits(run(cpu, x, data, None, "q4_0"), f32[2])  # (test_quant_int8_gemm.py)
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "q8")
    assert_bits(run(cpu, x[:16], data, None, "q4_0"), model(x[:16], data, None, "q4_0"))
    got = run(cpu, x, data, None, "q4_0")
    assert_bits(got, model(x, data, None, "q4_0"))
    assert not np.array_equal(got, f32[2])


def test_gpt2_gguf_q8_0_logits_close_to_the_float_path(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A random GPT-2 written as a Q8_0 GGUF file and read back: its logits through the integer
    path stay within 2% of the logit range of the float32-activation path's (measured here:
    printed), and the first prompt's rows equal the same prompt decoded alone."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kael.models import from_pretrained, load_gguf, save_gguf

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=64, n_embd=128, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(tmp_path / "hf")
    save_gguf(from_pretrained(tmp_path / "hf"), tmp_path / "q8.gguf", weights="q8_0")
    model, _ = load_gguf(tmp_path / "q8.gguf")
    assert model.weights_scheme == "q8_0"
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 96, size=12)]
    kael.backends.use("cpu", "cpu")
    try:
        logits = {}
        for mode in ("f32", "q8"):
            monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", mode)
            with kael.no_grad():
                logits[mode] = model(kael.tensor([ids])).numpy()[0].copy()
                alone = model(kael.tensor([ids[:1]])).numpy()[0].copy()
            if mode == "q8":
                assert_bits(alone[0], logits[mode][0])
    finally:
        kael.backends.use("cpu", None)
    diff = float(np.abs(logits["q8"] - logits["f32"]).max())
    span = float(np.ptp(logits["f32"]))
    with capsys.disabled():
        print(f"\nGPT-2 (128 wide, 2 layers) Q8_0 GGUF: max |q8 - f32 logits| = {diff:.3g} (logit range {span:.3g})")
    assert 0 < diff <= 0.02 * span
