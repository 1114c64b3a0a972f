"""The float32-activation path (KAEL_QUANT_ACTIVATIONS=f32) of the CPU backend's weight-format kernels (csrc/quant.cpp, csrc/vec_quant.h): dequantize and
quantized_linear for GGML's Q8_0 / Q4_0 blocks (Q4_1 / Q5_0 / Q5_1: test_quant_types.py) and bfloat16 / float16 weights.

Oracles: the blocks come from the gguf package's quantizer (``gguf.quants.quantize``) and
are decoded by a NumPy dequantizer written here from the block layout (checked against
``gguf.quants.dequantize``); products are compared with float64 NumPy within a bound derived
from the kernels' summation depth. A row of quantized_linear with up to 16 rows is bit-identical
to that row alone. The module runs again in a subprocess under every other vector table this
CPU can run (``KAEL_CPU_ISA``).
"""

from __future__ import annotations

import os
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")
gguf = pytest.importorskip("gguf")

from cpu_helpers import cpu_empty, logical, other_isas, rerun_under_isa  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import Tensor, from_numpy_bits  # noqa: E402
from kael.backends.host import f32_to_bf16_bits  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

SCHEMES = ("q8_0", "q4_0", "bf16", "f16")
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}
GGML_TYPE = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
U = 2.0**-24  # float32 unit roundoff
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


#: tests of the float32-activation path: KAEL_QUANT_ACTIVATIONS=f32 (tests/conftest.py; the default
#: takes the integer path for up to 16 rows, test_quant_int8.py / test_quant_int8_k.py)
pytestmark = pytest.mark.usefixtures("float_activations_module")


# -- the oracle: weights in each format and a NumPy decoder written from the layout ----------


def encode(w: np.ndarray, scheme: str) -> np.ndarray:
    """float32 [N, K] in `scheme`'s storage: uint8 blocks (gguf's quantizer), bf16 bits, float16."""
    if scheme in GGML_TYPE:
        return np.asarray(gguf.quants.quantize(w.astype(np.float32), GGML_TYPE[scheme]))
    if scheme == "bf16":
        return f32_to_bf16_bits(w.astype(np.float32)).reshape(w.shape)
    return w.astype(np.float16)


def decode(data: np.ndarray, scheme: str, k: int) -> np.ndarray:
    """float64 [N, K] values of `data`: q8_0 value d*q[i]; q4_0 d*((q[i] & 15) - 8) for i < 16 and
    d*((q[i] >> 4) - 8) for i + 16; d the block's leading little-endian float16."""
    if scheme == "bf16":
        return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if scheme == "f16":
        return data.astype(np.float64)
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, k // 32, BLOCK_BYTES[scheme])
    with np.errstate(all="ignore"):
        d = blocks[..., :2].copy().view("<f2").astype(np.float64)  # [n, k/32, 1]
        if scheme == "q8_0":
            q = blocks[..., 2:].view(np.int8).astype(np.float64)
        else:
            b = blocks[..., 2:].astype(np.int64)
            q = np.concatenate([(b & 15) - 8, (b >> 4) - 8], axis=-1).astype(np.float64)
        return (d * q).reshape(n, k)


def weight_tensor(data: np.ndarray, scheme: str, layout: str = "contiguous") -> Tensor:
    """The weight operand over NumPy memory; "gapped" rows lie apart in a wider buffer,
    "stepped" has every other element (last stride 2: the kernel copies it)."""
    d = {"bf16": dt.bfloat16, "f16": dt.float16}.get(scheme, dt.uint8)
    bits = data.view(np.uint16) if scheme == "f16" else data
    if layout == "gapped":
        big = np.zeros((bits.shape[0], bits.shape[1] + 7), bits.dtype)
        big[:, 3 : 3 + bits.shape[1]] = bits
        bits = big[:, 3 : 3 + bits.shape[1]]
    elif layout == "stepped":
        big = np.zeros((bits.shape[0], 2 * bits.shape[1]), bits.dtype)
        big[:, ::2] = bits
        bits = big[:, ::2]
    return from_numpy_bits(bits, d)


def f32_tensor(a: np.ndarray, layout: str = "contiguous") -> Tensor:
    a = a.astype(np.float32)
    if layout == "transposed":
        a = np.ascontiguousarray(a.T).T
    elif layout == "stepped":
        big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), np.float32)
        big[..., ::2] = a
        a = big[..., ::2]
    return from_numpy_bits(a, dt.float32)


def bound(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, depth: int) -> np.ndarray:
    """|float32 result - exact| <= (depth + 2) u sum |x w| (+ |b|): any summation tree of height
    `depth` over exact products rounded once each (Higham's gamma bound, rounded up)."""
    mag = np.abs(x) @ np.abs(w).T + (0 if b is None else np.abs(b))
    return 1.01 * (depth + 2) * U * mag + 1e-30


def depth(m: int, k: int) -> int:
    """Height of the kernels' summation trees: up to 16 rows, k/32 block sums after a pairwise
    block tree (<= 5), a 16-bit row's tail (< 32), the lanes (<= 16) and the bias; above, the
    packed GEMM (at most k sequential adds)."""
    return k // 32 + 64 if m <= 16 else k + 2


def run_linear(cpu: Any, x: Tensor, w: Tensor, b: Tensor | None, scheme: str, n: int) -> np.ndarray:
    out = cpu_empty(cpu, (*x.shape[:-1], n), dt.float32)
    cpu.kernel("quantized_linear")(out, x, w, b, scheme)
    return logical(out).astype(np.float64)


def check_linear(
    cpu: Any,
    rng: np.random.Generator,
    m: int,
    k: int,
    n: int,
    scheme: str,
    with_bias: bool,
    x_layout: str = "contiguous",
    w_layout: str = "contiguous",
) -> np.ndarray:
    data = encode(rng.standard_normal((n, k)), scheme)
    w64 = decode(data, scheme, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if with_bias else None
    got = run_linear(
        cpu,
        f32_tensor(x, x_layout),
        weight_tensor(data, scheme, w_layout),
        None if b is None else f32_tensor(b),
        scheme,
        n,
    )
    x64 = x.astype(np.float64)
    want = x64 @ w64.T + (0 if b is None else b.astype(np.float64))
    err = np.abs(got - want)
    tol = bound(x64, w64, None if b is None else b.astype(np.float64), depth(m, k))
    assert np.all(err <= tol), f"{scheme} m={m} k={k} n={n}: max err {err.max()} vs tol {tol.min()}"
    return got


# -- dequantize --------------------------------------------------------------------------


def test_decoder_matches_gguf() -> None:
    """The test's own decoder agrees with the gguf package's, so it can be the oracle."""
    rng = np.random.default_rng(0)
    for scheme in ("q8_0", "q4_0"):
        data = encode(rng.standard_normal((5, 96)) * 3, scheme)
        ref = np.asarray(gguf.quants.dequantize(data, GGML_TYPE[scheme]), np.float64)
        np.testing.assert_array_equal(decode(data, scheme, 96), ref)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("k", [32, 64, 96, 4096])
@pytest.mark.parametrize("w_layout", ["contiguous", "gapped", "stepped"])
def test_dequantize_exact(cpu: Any, scheme: str, k: int, w_layout: str) -> None:
    rng = np.random.default_rng(k)
    n = 7
    data = encode(rng.standard_normal((n, k)) * 4, scheme)
    out = cpu_empty(cpu, (n, k), dt.float32)
    cpu.kernel("dequantize")(out, weight_tensor(data, scheme, w_layout), scheme)
    np.testing.assert_array_equal(logical(out), decode(data, scheme, k).astype(np.float32))


@pytest.mark.parametrize("scheme", ["q8_0", "q4_0"])
def test_dequantize_random_block_bytes(cpu: Any, scheme: str) -> None:
    """Arbitrary bytes: every float16 scale (subnormal, inf, nan) decodes like NumPy's."""
    rng = np.random.default_rng(1)
    k = 256
    data = rng.integers(0, 256, size=(300, k // 32 * BLOCK_BYTES[scheme]), dtype=np.uint8)
    out = cpu_empty(cpu, (300, k), dt.float32)
    cpu.kernel("dequantize")(out, weight_tensor(data, scheme), scheme)
    np.testing.assert_array_equal(logical(out), decode(data, scheme, k).astype(np.float32))


@pytest.mark.parametrize("scheme", ["bf16", "f16"])
def test_dequantize_every_16bit_pattern(cpu: Any, scheme: str) -> None:
    """All 65536 bit patterns, in rows of 4096 and 65536 values, and in rows of 32767 (a tail
    shorter than a block and than a vector)."""
    bits = np.arange(65536, dtype=np.uint16)
    for n, k in ((16, 4096), (1, 65536)):
        data = bits.reshape(n, k)
        if scheme == "f16":
            data = data.view(np.float16)
        out = cpu_empty(cpu, (n, k), dt.float32)
        cpu.kernel("dequantize")(out, weight_tensor(data, scheme), scheme)
        want = decode(data, scheme, k).astype(np.float32)
        got = logical(out)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    data = bits[:65534].reshape(2, 32767)  # k not a multiple of 32 or of the vector width
    if scheme == "f16":
        data = data.view(np.float16)
    out = cpu_empty(cpu, (2, 32767), dt.float32)
    cpu.kernel("dequantize")(out, weight_tensor(data, scheme), scheme)
    want = decode(data, scheme, 32767).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(logical(out)), np.isnan(want))
    np.testing.assert_array_equal(np.nan_to_num(logical(out)), np.nan_to_num(want))


def test_dequantize_strided_out(cpu: Any) -> None:
    rng = np.random.default_rng(2)
    data = encode(rng.standard_normal((6, 64)), "q4_0")
    big = np.full((12, 64), -5.0, np.float32)
    out = from_numpy_bits(np.asarray(big.T)[:, ::2].T, dt.float32)  # [6, 64], column-major, rows 2 apart
    cpu.kernel("dequantize")(out, weight_tensor(data, "q4_0"), "q4_0")
    np.testing.assert_array_equal(logical(out), decode(data, "q4_0", 64).astype(np.float32))


# -- quantized_linear ----------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 2, 3, 7, 16, 17, 64])
@pytest.mark.parametrize("k", [32, 64, 96, 4096])
@pytest.mark.parametrize("n", [5, 8])
def test_linear_grid(cpu: Any, scheme: str, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * 10007 + k * 13 + n)
    check_linear(cpu, rng, m, k, n, scheme, with_bias=(m + n) % 2 == 0)


@pytest.mark.parametrize("scheme", ["bf16", "f16"])
@pytest.mark.parametrize("k", [1, 7, 33, 100])
def test_linear_16bit_any_k(cpu: Any, scheme: str, k: int) -> None:
    rng = np.random.default_rng(k)
    for m in (1, 5, 20):
        check_linear(cpu, rng, m, k, 9, scheme, with_bias=True)


@SETTINGS
@given(
    m=st.sampled_from([1, 2, 3, 4, 5, 8, 13, 16, 17, 40]),
    k32=st.integers(1, 24),
    n=st.integers(1, 70),
    scheme=st.sampled_from(SCHEMES),
    with_bias=st.booleans(),
    x_layout=st.sampled_from(["contiguous", "transposed", "stepped"]),
    w_layout=st.sampled_from(["contiguous", "gapped", "stepped"]),
    seed=st.integers(0, 2**16),
)
def test_linear_layouts(
    cpu: Any, m: int, k32: int, n: int, scheme: str, with_bias: bool, x_layout: str, w_layout: str, seed: int
) -> None:
    check_linear(cpu, np.random.default_rng(seed), m, 32 * k32, n, scheme, with_bias, x_layout, w_layout)


def test_linear_leading_dims_and_strided_out(cpu: Any) -> None:
    rng = np.random.default_rng(3)
    data = encode(rng.standard_normal((10, 64)), "q8_0")
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    want = x.astype(np.float64) @ decode(data, "q8_0", 64).T
    got = run_linear(cpu, f32_tensor(x), weight_tensor(data, "q8_0"), None, "q8_0", 10)
    assert got.shape == (2, 3, 10)
    assert np.all(np.abs(got - want) <= bound(x.reshape(6, 64), decode(data, "q8_0", 64), None, 66).reshape(2, 3, 10))
    big = np.full((6, 20), -9.0, np.float32)
    out = from_numpy_bits(big[:, ::2], dt.float32)  # [6, 10], last stride 2
    cpu.kernel("quantized_linear")(out, f32_tensor(x.reshape(6, 64)), weight_tensor(data, "q8_0"), None, "q8_0")
    np.testing.assert_array_equal(logical(out), got.reshape(6, 10).astype(np.float32))
    np.testing.assert_array_equal(big[:, 1::2], -9.0)  # nothing written between


def test_linear_empty(cpu: Any) -> None:
    data = encode(np.ones((4, 32)), "q4_0")
    out = cpu_empty(cpu, (0, 4), dt.float32)
    cpu.kernel("quantized_linear")(out, f32_tensor(np.zeros((0, 32))), weight_tensor(data, "q4_0"), None, "q4_0")
    assert logical(out).shape == (0, 4)
    # K = 0: an empty sum, out = bias
    out = cpu_empty(cpu, (3, 4), dt.float32)
    w0 = from_numpy_bits(np.zeros((4, 0), np.uint8), dt.uint8)
    b = np.arange(4, dtype=np.float32)
    cpu.kernel("quantized_linear")(out, f32_tensor(np.zeros((3, 0))), w0, f32_tensor(b), "q8_0")
    np.testing.assert_array_equal(logical(out), np.broadcast_to(b, (3, 4)))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("k", [64, 768, 3072, 1001])
def test_batched_rows_equal_alone(cpu: Any, scheme: str, k: int) -> None:
    """Up to 16 rows, each row of the result is bit-identical to that row computed alone (16-bit
    rows of 1001 values: a tail shorter than a block, a vector and a lane count)."""
    if scheme in GGML_TYPE:
        k = k // 32 * 32
    rng = np.random.default_rng(k)
    n = 37
    data = encode(rng.standard_normal((n, k)), scheme)
    w = weight_tensor(data, scheme)
    b = f32_tensor(rng.standard_normal(n))
    x = rng.standard_normal((16, k)).astype(np.float32)
    alone = np.stack([run_linear(cpu, f32_tensor(x[i : i + 1]), w, b, scheme, n)[0] for i in range(16)])
    for m in range(2, 17):
        got = run_linear(cpu, f32_tensor(x[:m]), w, b, scheme, n)
        np.testing.assert_array_equal(got, alone[:m], err_msg=f"{scheme} m={m}")
    got = run_linear(cpu, f32_tensor(x[5:12], "stepped"), w, b, scheme, n)  # other strides, same bits
    np.testing.assert_array_equal(got, alone[5:12])


def test_threads_do_not_change_results(cpu: Any) -> None:
    rng = np.random.default_rng(4)
    data = encode(rng.standard_normal((300, 256)), "q8_0")
    x = f32_tensor(rng.standard_normal((40, 256)))
    before = kbc.get_num_threads()
    try:
        kbc.set_num_threads(1)
        one = [run_linear(cpu, x[:m], weight_tensor(data, "q8_0"), None, "q8_0", 300) for m in (3, 40)]
        kbc.set_num_threads(max(2, before))
        many = [run_linear(cpu, x[:m], weight_tensor(data, "q8_0"), None, "q8_0", 300) for m in (3, 40)]
    finally:
        kbc.set_num_threads(before)
    for a, b in zip(one, many):
        np.testing.assert_array_equal(a, b)


# -- bad input -----------------------------------------------------------------------------


def test_errors(cpu: Any) -> None:
    ql, dq = cpu.kernel("quantized_linear"), cpu.kernel("dequantize")
    x = f32_tensor(np.ones((2, 64)))
    q8 = weight_tensor(encode(np.ones((3, 64)), "q8_0"), "q8_0")
    out = cpu_empty(cpu, (2, 3), dt.float32)
    with pytest.raises(kael.DTypeError, match=r"q8_0 weight must be uint8.*float32"):
        ql(out, x, f32_tensor(np.ones((3, 64))), None, "q8_0")
    with pytest.raises(kael.ShapeError, match=r"K = 33 is not a multiple"):
        ql(out, f32_tensor(np.ones((2, 33))), q8, None, "q8_0")
    bad_rows = weight_tensor(np.zeros((3, 70), np.uint8), "q8_0")
    with pytest.raises(kael.ShapeError, match=r"must be uint8 \[3, 68\].*got \[3, 70\]"):
        ql(out, x, bad_rows, None, "q8_0")
    with pytest.raises(kael.ShapeError, match=r"must be uint8 \[3, 36\]"):  # q8_0 blocks read as q4_0
        ql(out, x, q8, None, "q4_0")
    with pytest.raises(kael.DTypeError, match=r"bf16 weight must be bfloat16, got float16"):
        ql(out, x, weight_tensor(np.ones((3, 64), np.float16), "f16"), None, "bf16")
    with pytest.raises(kael.DTypeError, match=r"x and out must be float32.*float64"):
        ql(out, from_numpy_bits(np.ones((2, 64)), dt.float64), q8, None, "q8_0")
    with pytest.raises(kael.ShapeError, match=r"bias must be \[3\]"):
        ql(out, x, q8, f32_tensor(np.ones(4)), "q8_0")
    with pytest.raises(kael.ShapeError, match=r"leading dims"):
        ql(cpu_empty(cpu, (5, 3), dt.float32), x, q8, None, "q8_0")
    with pytest.raises(kael.KaelError, match=r"scheme must be one of 'q8_0', 'q4_0', .*got 'q9_9'"):
        ql(out, x, q8, None, "q9_9")
    with pytest.raises(kael.KaelError, match=r"scheme must be a str.*int"):
        dq(cpu_empty(cpu, (3, 64), dt.float32), q8, 8)
    with pytest.raises(kael.ShapeError, match=r"dequantize: out must be float32 \[N, K\]"):
        dq(cpu_empty(cpu, (3, 64, 1), dt.float32), q8, "q8_0")
    with pytest.raises(kael.DTypeError, match=r"dequantize: out must be float32, got float64"):
        dq(cpu_empty(cpu, (3, 64), dt.float64), q8, "q8_0")
    with pytest.raises(kael.ShapeError, match=r"dequantize: a q8_0 weight for \[N, K\] = \[4, 64\]"):
        dq(cpu_empty(cpu, (4, 64), dt.float32), q8, "q8_0")


# -- every vector table ----------------------------------------------------------------------


def test_child_runs_requested_isa() -> None:
    want = os.environ.get("KAEL_QUANT_TEST_ISA")
    if want is None:
        pytest.skip("only in the per-ISA subprocess")
    assert C.isa() == want


@pytest.mark.skipif(os.environ.get("KAEL_QUANT_TEST_ISA") is not None, reason="already a per-ISA run")
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)
