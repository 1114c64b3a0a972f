"""The CPU backend's integer path of quantized_linear for GGML's super-blocks (NOTE [integer
quantized linear] in csrc/quant.cpp, NOTE [integer K dot order] in csrc/vec_quant_dot_k.h): Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights times activation rows quantized to GGML's Q8_K blocks.

Oracle: a NumPy model of the same arithmetic written here: ggml's reference quantizer
(quantize_row_q8_K_ref: per 256 values the first value of largest magnitude max, iscale =
-127 / max, q = nearest (ties to even) of iscale * x, at most 127, d = 1 / iscale in float32,
bsums of 16 q), the weights' integers decoded from their bytes, and the stated float order (per
super-block (d_w * d_x) * float(isum) [- (dmin_w * d_x) * float(msum)], added in order into
one float32 accumulator, then the bias). The kernel must equal it bit for bit, under every vector
table this CPU can run (``KAEL_CPU_ISA``, in a subprocess). The model itself is checked against
ggml's own code where llama-cpp-python ships it: its quantizer bit for bit, its generic dot
products to float rounding; its weight decoding against ``gguf.quants.dequantize``. The weights
come from kael's own K-quant quantizers (``kael.quant.quantize_array``, byte-exact with ggml's).
"""

from __future__ import annotations

import os
from typing import Any

import ggml_activation_quant as ggml_q8_k
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")
gguf = pytest.importorskip("gguf")

from cpu_helpers import other_isas, rerun_under_isa  # noqa: E402
from kael.quant import quantize_array  # noqa: E402
from test_quant_int8 import IQ4NL, SETTINGS, assert_bits, run  # noqa: E402
from test_quant_int8 import _integer_path as _integer_path  # noqa: E402  (autouse: every test on the integer path)
from test_quant_kquants import BLOCK_BYTES, GGML_TYPE, SCHEMES  # noqa: E402

__all__: list[str] = []

MINS = ("q2_k", "q4_k", "q5_k")  # value d * sc * q - dmin * mn
QK = 256
F32 = np.float32


# -- the NumPy model -----------------------------------------------------------------------


def quantize_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 [m, k] -> int q [m, k/256, 256], float32 d [m, k/256], int bsums [m, k/256, 16] as
    quantize_row_q8_K_ref; a block holding inf/nan: d nan, q 0; all zero: d 0; so small that
    -127 / max overflows: d = 1 / iscale (a signed zero), q 0."""
    m, k = x.shape
    xb = x.astype(F32).reshape(m, k // QK, QK)
    finite = np.all(np.isfinite(xb), axis=-1)
    safe = np.where(finite[..., None], xb, F32(0))
    pick = np.argmax(np.abs(safe), axis=-1)[..., None]  # the first value of largest magnitude
    mx = np.take_along_axis(safe, pick, axis=-1)[..., 0]
    with np.errstate(all="ignore"):
        iscale = (F32(-127) / mx).astype(F32)
        v = (iscale[..., None] * safe).astype(F32)
        q = np.minimum(np.rint(v), F32(127))  # rint: ties to even
        d = (F32(1) / iscale).astype(F32)
    bad = ~finite | (mx == 0) | np.isinf(iscale)
    q = np.where(bad[..., None], 0, q).astype(np.int64)
    assert np.all(np.abs(q) <= 127)
    d = np.where(~finite, F32(np.nan), np.where(mx == 0, F32(0), d)).astype(F32)
    return q, d, q.reshape(m, k // QK, 16, 16).sum(axis=-1)


def _half(b: np.ndarray, off: int) -> np.ndarray:
    return b[..., off : off + 2].copy().view("<f2")[..., 0].astype(F32)


def weight_ints(data: np.ndarray, scheme: str, k: int) -> tuple[np.ndarray, ...]:
    """uint8 super-blocks [n, bytes] -> q [n, nb, 256], scales sc [n, nb, 16] and mins mn [n, nb, 16]
    (one per 16 values; zero mins but for q2_k / q4_k / q5_k), float32 d and dmin [n, nb]: value i
    = d * sc[i // 16] * q[i] - dmin * mn[i // 16]."""
    n = data.shape[0]
    raw = np.ascontiguousarray(data).reshape(n, k // QK, BLOCK_BYTES[scheme])
    b = raw.astype(np.int64)
    zeros = np.zeros(b.shape[:2], F32)
    mn = np.zeros((*b.shape[:2], 16), np.int64)
    dmin = zeros
    if scheme == "q2_k":
        sc, mn = b[..., :16] & 15, b[..., :16] >> 4
        qs = b[..., 16:80].reshape(*b.shape[:2], 2, 1, 32)
        q = ((qs >> (2 * np.arange(4))[:, None]) & 3).reshape(*b.shape[:2], QK)
        d, dmin = _half(raw, 80), _half(raw, 82)
    elif scheme == "q3_k":
        s = b[..., 96:108]
        g = np.arange(16)
        lo = np.where(g < 8, s[..., g % 8] & 15, s[..., g % 8] >> 4)
        hi = (s[..., 8 + g % 4] >> (2 * (g // 4))) & 3
        sc = (lo | (hi << 4)) - 32
        qs = b[..., 32:96].reshape(*b.shape[:2], 2, 1, 32)
        low = (qs >> (2 * np.arange(4))[:, None]) & 3  # [.., h, j, l]
        bit = np.arange(8).reshape(2, 4, 1)  # 4h + j
        high = (b[..., None, None, :32] >> bit) & 1
        q = (low - np.where(high != 0, 0, 4)).reshape(*b.shape[:2], QK)
        d = _half(raw, 108)
    elif scheme in ("q4_k", "q5_k"):
        p = b[..., 4:16]
        j = np.arange(4)
        s8 = np.concatenate([p[..., j] & 63, (p[..., j + 8] & 15) | ((p[..., j] >> 6) << 4)], axis=-1)
        m8 = np.concatenate([p[..., j + 4] & 63, (p[..., j + 8] >> 4) | ((p[..., j + 4] >> 6) << 4)], axis=-1)
        sc, mn = np.repeat(s8, 2, axis=-1), np.repeat(m8, 2, axis=-1)
        qs = b[..., (16 if scheme == "q4_k" else 48) :][..., :128].reshape(*b.shape[:2], 4, 1, 32)
        q = ((qs >> (4 * np.arange(2))[:, None]) & 15).reshape(*b.shape[:2], QK)
        if scheme == "q5_k":
            c = np.arange(8)[:, None]
            q = q + (((b[..., None, 16:48] >> c) & 1) << 4).reshape(*b.shape[:2], QK)
        d, dmin = _half(raw, 0), _half(raw, 2)
    elif scheme == "q6_k":
        sc = b[..., 192:208].astype(np.uint8).view(np.int8).astype(np.int64)
        ql = b[..., :128].reshape(*b.shape[:2], 2, 2, 32)  # [.., h, t & 1, l]
        qh = b[..., 128:192].reshape(*b.shape[:2], 2, 1, 32)
        t = np.arange(4)
        lo = (ql[..., t & 1, :] >> np.where(t < 2, 0, 4)[:, None]) & 15  # [.., h, t, l]
        hi = (qh >> (2 * t)[:, None]) & 3
        q = ((lo | (hi << 4)) - 32).reshape(*b.shape[:2], QK)
        d = _half(raw, 208)
    else:
        sh = b[..., 2] | (b[..., 3] << 8)
        c = np.arange(8)
        ls = ((b[..., 4 + c // 2] >> (4 * (c % 2))) & 15) | (((sh[..., None] >> (2 * c)) & 3) << 4)
        sc = np.repeat(ls - 32, 2, axis=-1)
        qs = b[..., 8:].reshape(*b.shape[:2], 8, 16)
        q = IQ4NL[np.concatenate([qs & 15, qs >> 4], axis=-1)].reshape(*b.shape[:2], QK)
        d = _half(raw, 0)
    return q, sc, mn, d, dmin


def model(x: np.ndarray, data: np.ndarray, bias: np.ndarray | None, scheme: str) -> np.ndarray:
    """The integer path's float32 result [m, n] by NOTE [integer K dot order]."""
    m, k = x.shape
    nb = k // QK
    qx, dx, bsums = quantize_act(x)
    qw, sc, mn, dw, dmin = weight_ints(data, scheme, k)
    g = np.einsum("ibgt,jbgt->ijbg", qx.reshape(m, nb, 16, 16), qw.reshape(-1, nb, 16, 16))  # exact
    isum = np.einsum("ijbg,jbg->ijb", g, sc)
    msum = np.einsum("ibg,jbg->ijb", bsums, mn)
    assert np.all(np.abs(isum) < 2**31) and np.all(np.abs(msum) < 2**31)
    with np.errstate(all="ignore"):
        p = ((dw[None] * dx[:, None]).astype(F32) * isum.astype(F32)).astype(F32)
        if scheme in MINS:
            p = (p - ((dmin[None] * dx[:, None]).astype(F32) * msum.astype(F32)).astype(F32)).astype(F32)
        acc = np.zeros(p.shape[:2], F32)
        for b in range(nb):
            acc = (acc + p[..., b]).astype(F32)
        if bias is not None:
            acc = (acc + bias.astype(F32)[None, :]).astype(F32)
    return acc


def encode(w: np.ndarray, scheme: str) -> np.ndarray:
    """float [N, K] as `scheme`'s super-blocks, by kael's quantizer (ggml's bytes)."""
    return quantize_array(w.astype(np.float32), scheme)


def weights(rng: np.random.Generator, n: int, k: int, scheme: str) -> np.ndarray:
    """Weight-like rows (scales differing by row) quantized to `scheme`."""
    return encode(rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1)), scheme)


# -- the model against ggml and gguf -------------------------------------------------------


def special_rows(rng: np.random.Generator, k: int) -> np.ndarray:
    """Rows of edge blocks: zeros, an all-zero block, half-way values (ties), tiny values, a block
    with one huge value, a subnormal block (-127 / max overflows), inf, nan."""
    rows = np.zeros((8, k), F32)
    rows[1] = rng.standard_normal(k)
    rows[1, :QK] = 0.0  # an all-zero block
    rows[2] = np.tile(np.arange(-64, 64, dtype=F32), k // 128) + F32(0.5)  # ties
    rows[2, ::QK] = F32(-127)  # max = -127: iscale = 1, every tie exact
    rows[3] = rng.standard_normal(k) * 1e-30
    rows[4] = rng.standard_normal(k)
    rows[4, 7] = F32(1e30)  # one huge value: the rest of its block rounds to 0
    rows[5] = rng.standard_normal(k)
    rows[5, :QK] = rng.standard_normal(QK) * 1e-40  # subnormal: -127 / max = -inf
    rows[6] = rng.standard_normal(k)
    rows[6, 40] = np.inf
    rows[7] = rng.standard_normal(k)
    rows[7, k - 1] = np.nan
    return rows


def test_model_quantizer_is_ggml_reference() -> None:
    """The model's Q8_K quantizer is ggml's quantize_row_q8_K_ref bit for bit (finite blocks)."""
    rng = np.random.default_rng(0)
    k = 512
    rows = np.concatenate([(rng.standard_normal((6, k)) * 10.0 ** rng.integers(-8, 8, (6, 1))), special_rows(rng, k)])
    rows = rows[:-2].astype(F32)  # ggml's inf / nan blocks are undefined behaviour: ours are nan
    q, d, bsums = quantize_act(rows)
    for i, row in enumerate(rows):
        want = ggml_q8_k.quantize(row)
        np.testing.assert_array_equal(q[i], want["qs"].astype(np.int64), err_msg=f"row {i}")
        np.testing.assert_array_equal(bsums[i], want["bsums"].astype(np.int64), err_msg=f"row {i}")
        np.testing.assert_array_equal(d[i].view(np.uint32), want["d"].astype(F32).view(np.uint32), err_msg=f"row {i}")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_model_weight_ints_are_gguf_dequantize(scheme: str) -> None:
    rng = np.random.default_rng(1)
    k = 512
    data = weights(rng, 9, k, scheme)
    q, sc, mn, d, dmin = weight_ints(data, scheme, k)
    s = np.repeat(sc, 16, axis=-1).reshape(q.shape)
    m = np.repeat(mn, 16, axis=-1).reshape(q.shape)
    got = d[..., None].astype(np.float64) * s * q - dmin[..., None].astype(np.float64) * m
    want = np.asarray(gguf.quants.dequantize(data, GGML_TYPE[scheme]), np.float64).reshape(got.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_model_is_ggml_generic_dot_to_rounding(scheme: str) -> None:
    """ggml's ggml_vec_dot_<format>_q8_K_generic on the model's Q8_K rows: the same integer sums,
    so the results differ only by the float32 roundings of the scale products (a few ulps of the
    sum of |terms|)."""
    rng = np.random.default_rng(2)
    k, n = 1024, 7
    x = rng.standard_normal((3, k)).astype(F32)
    data = weights(rng, n, k, scheme)
    ours = model(x, data, None, scheme).astype(np.float64)
    qw, sc, mn, dw, dmin = weight_ints(data, scheme, k)
    for i in range(3):
        blocks = ggml_q8_k.quantize(x[i])
        for j in range(n):
            theirs = ggml_q8_k.dot(scheme, data[j], blocks)
            w = (np.abs(dw[j, :, None]) * np.repeat(np.abs(sc[j]), 16, -1) * np.abs(qw[j])).ravel()
            w = w + (np.abs(dmin[j, :, None]) * np.repeat(mn[j], 16, -1)).ravel()
            mag = float(np.abs(np.asarray(blocks["d"], np.float64)).repeat(QK) @ (127 * w))
            assert abs(ours[i, j] - theirs) <= 1e-6 * mag + 1e-30, (i, j, ours[i, j], theirs)


# -- the kernel against the model ----------------------------------------------------------


@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    m=st.integers(1, 40),
    nb=st.integers(1, 4),
    n=st.integers(0, 12).map(lambda v: 2 * v + 1),
    with_bias=st.booleans(),
    scale=st.sampled_from([1e-3, 1.0, 50.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_bit_identical_to_the_model(
    cpu: Any, scheme: str, m: int, nb: int, n: int, with_bias: bool, scale: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    k = QK * nb
    x = (rng.standard_normal((m, k)) * scale).astype(F32)
    data = weights(rng, n, k, scheme)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    assert_bits(run(cpu, x, data, bias, scheme), model(x, data, bias, scheme))


# Byte spans of a super-block: its integer scales (and mins) and its float16 scales d (and dmin).
SCALE_BYTES = {
    "q2_k": (0, 16),
    "q3_k": (96, 108),
    "q4_k": (4, 16),
    "q5_k": (4, 16),
    "q6_k": (192, 208),
    "iq4_xs": (2, 8),
}
HALF_AT = {"q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "iq4_xs": (0,)}
FILLS = (0x00, 0x7F, 0x80, 0xFF, -1)  # a byte, or -1: random bytes


def extreme_weights(rng: np.random.Generator, n: int, k: int, scheme: str, quants: int, scales: int) -> np.ndarray:
    """n rows of super-blocks whose integer bytes are all `quants` and scale bytes all `scales` (or
    random, -1): with 0x00 / 0xFF / 0x80 the formats' integers and scales at their limits (q6_k's
    q = -32 and sc = -128; q = 31 and sc = -1; ...); float16 d (and dmin) random and finite."""
    nbytes = BLOCK_BYTES[scheme]
    blocks = n * k // QK
    data = np.full((blocks, nbytes), quants, np.uint8) if quants >= 0 else rng.integers(0, 256, (blocks, nbytes))
    data = data.astype(np.uint8)
    lo, hi = SCALE_BYTES[scheme]
    data[:, lo:hi] = scales if scales >= 0 else rng.integers(0, 256, (blocks, hi - lo))
    for off in HALF_AT[scheme]:
        data[:, off : off + 2] = (rng.standard_normal(blocks) * 0.02).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return data.reshape(n, -1)


@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    m=st.integers(1, 16),
    nb=st.integers(1, 3),
    quants=st.sampled_from(FILLS),
    scales=st.sampled_from(FILLS),
    acts=st.sampled_from(["same", "alternate", "random"]),
    seed=st.integers(0, 2**31 - 1),
)
@example(scheme="q6_k", m=3, nb=2, quants=0x00, scales=0x80, acts="same", seed=0)  # q = -32, sc = -128
@example(scheme="q6_k", m=16, nb=1, quants=0xFF, scales=0x7F, acts="alternate", seed=1)  # q = 31, sc = 127
@example(scheme="q5_k", m=5, nb=1, quants=0xFF, scales=0xFF, acts="same", seed=2)  # q = 31, sc = mn = 63
@example(scheme="q4_k", m=1, nb=3, quants=0xFF, scales=0xFF, acts="alternate", seed=3)
def test_extreme_integers_bit_identical_to_the_model(
    cpu: Any, scheme: str, m: int, nb: int, quants: int, scales: int, acts: str, seed: int
) -> None:
    """Weight integers and scales at their limits against activations whose q_x are all -127
    ("same": equal positive values), +-127 ("alternate") or random: the worst magnitudes of the
    vector kernels' int16 steps (NOTE [integer K dot in vectors]); each row also alone."""
    rng = np.random.default_rng(seed)
    k, n = QK * nb, 5
    data = extreme_weights(rng, n, k, scheme, quants, scales)
    if acts == "random":
        x = rng.standard_normal((m, k)).astype(F32)
    else:
        sign = np.ones(k, F32) if acts == "same" else np.where(np.arange(k) % 2 == 0, F32(1), F32(-1))
        x = (rng.uniform(0.5, 2.0, (m, 1)) * sign).astype(F32)
    got = run(cpu, x, data, None, scheme)
    assert_bits(got, model(x, data, None, scheme))
    assert_bits(run(cpu, x[m - 1 :], data, None, scheme)[0], got[m - 1])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rows_batched_equal_alone_and_threads_agree(cpu: Any, scheme: str) -> None:
    """40 rows (waves of 16, 16, 8): each row the same bits alone, at 1 and 2 threads."""
    rng = np.random.default_rng(3)
    k, n = 768, 301
    x = rng.standard_normal((40, k)).astype(F32)
    data = weights(rng, n, k, scheme)
    bias = rng.standard_normal(n).astype(F32)
    before = kbc.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            kbc.set_num_threads(threads)
            batched = run(cpu, x, data, bias, scheme)
            for i in (0, 5, 15, 16, 39):
                assert_bits(run(cpu, x[i : i + 1], data, bias, scheme)[0], batched[i])
            results.append(batched)
        assert_bits(results[0], results[1])
        assert_bits(results[0], model(x, data, bias, scheme))
    finally:
        kbc.set_num_threads(before)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_special_activations(cpu: Any, scheme: str) -> None:
    """special_rows: the kernel is the model's bits, nan where it is; an all-zero row gives the bias,
    an inf or nan anywhere in a row makes the row nan."""
    rng = np.random.default_rng(4)
    k, n = 512, 9
    data = weights(rng, n, k, scheme)
    rows = special_rows(rng, k)
    bias = rng.standard_normal(n).astype(F32)
    got = run(cpu, rows, data, bias, scheme)
    assert_bits(got, model(rows, data, bias, scheme))
    assert np.all(got[0] == bias)
    assert np.all(np.isnan(got[6])) and np.all(np.isnan(got[7]))
    assert not np.any(np.isnan(got[:6]))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_close_to_the_float_path(cpu: Any, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """KAEL_QUANT_ACTIVATIONS=f32 keeps float32 activations: another result, and the integer one stays
    within the activation rounding (|x - d_x q_x| <= |d_x| / 2 a value). Unset (auto), these 4 rows take
    the integer path on the AVX2 / AVX-512 tables and the float path on the baseline table, and 17 rows
    the integer K GEMM (the same bits as the model) on AVX-512 VNNI, the float path elsewhere."""
    rng = np.random.default_rng(5)
    k, n = 768, 64
    x = rng.standard_normal((4, k)).astype(F32)
    data = weights(rng, n, k, scheme)
    q8 = run(cpu, x, data, None, scheme)
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
    f32 = run(cpu, x, data, None, scheme)
    x17 = np.concatenate([x, rng.standard_normal((13, k)).astype(F32)])
    f32_17 = run(cpu, x17, data, None, scheme)
    monkeypatch.delenv("KAEL_QUANT_ACTIVATIONS")
    simd = kbc._native.C.isa() not in ("baseline", "base")
    assert_bits(run(cpu, x, data, None, scheme), q8 if simd else f32)
    c = kbc._native.C
    gemm = c.isa() == "avx512" and c.isa_info()["features"]["avx512_vnni"]
    assert_bits(run(cpu, x17, data, None, scheme), model(x17, data, None, scheme) if gemm else f32_17)
    assert not np.array_equal(q8, f32)
    w = np.asarray(gguf.quants.dequantize(data, GGML_TYPE[scheme]), np.float64).reshape(n, k)
    _, dx, _ = quantize_act(x)
    half = np.repeat(np.abs(dx.astype(np.float64)), QK, axis=1) / 2
    bound = half @ np.abs(w).T * 1.01 + 1e-5 * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(q8.astype(np.float64) - f32) <= bound)


def test_child_runs_requested_isa() -> None:
    want = os.environ.get("KAEL_QUANT_TEST_ISA")
    if want is None:
        pytest.skip("not a per-ISA run")
    from kael_backend_cpu._native import C

    assert C.isa() in (want, "base" if want == "baseline" else want)


@pytest.mark.skipif(os.environ.get("KAEL_QUANT_TEST_ISA") is not None, reason="already a per-ISA run")
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)
