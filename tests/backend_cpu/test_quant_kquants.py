"""The float32-activation path (KAEL_QUANT_ACTIVATIONS=f32) of the CPU backend's kernels for GGML's 256-value super-blocks: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and
IQ4_XS (csrc/quant_formats.h rows, csrc/vec_quant_k.h): dequantize and quantized_linear, called
through the extension's kernels, and the extension's list of schemes (``quant_schemes``).

Oracles: ``gguf.quants.dequantize`` bit for bit, on random super-blocks (every quant, scale and
min bit random, the float16 super-block scales finite from subnormal to large; and wholly random
bytes, infinities and NaNs included, compared NaN for NaN), and float64 NumPy for the products
within the float32 summation bound of the kernels' order (as test_quant_types.py). A row of
quantized_linear batched (1..16 rows) equals the row alone bit for bit, thread counts change
nothing, and the module runs again in a subprocess under every other vector table this CPU can
run (``KAEL_CPU_ISA``).
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
from kael_backend_cpu._native import C  # noqa: E402

__all__: list[str] = []

Q = gguf.GGMLQuantizationType
GGML_TYPE = {"q2_k": Q.Q2_K, "q3_k": Q.Q3_K, "q4_k": Q.Q4_K, "q5_k": Q.Q5_K, "q6_k": Q.Q6_K, "iq4_xs": Q.IQ4_XS}
BLOCK_BYTES = {"q2_k": 84, "q3_k": 110, "q4_k": 144, "q5_k": 176, "q6_k": 210, "iq4_xs": 136}
# Byte offsets of each super-block's float16 scales (ggml-common.h): d, then dmin where there is one.
SCALE_OFFSETS = {"q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "iq4_xs": (0,)}
SCHEMES = tuple(GGML_TYPE)
QK = 256
U = 2.0**-24  # float32 unit roundoff
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


#: tests of the float32-activation path: KAEL_QUANT_ACTIVATIONS=f32 (tests/conftest.py; the default
#: takes the integer path for up to 16 rows, test_quant_int8.py / test_quant_int8_k.py)
pytestmark = pytest.mark.usefixtures("float_activations_module")


def random_blocks(rng: np.random.Generator, n: int, k: int, scheme: str, lo: int = -6, hi: int = -4) -> np.ndarray:
    """uint8 [n, k / 256 * bytes]: random super-blocks whose float16 scales are finite, of either sign,
    with magnitudes 2**lo .. 2**hi (every other bit random)."""
    nb = k // QK
    data = rng.integers(0, 256, size=(n, nb, BLOCK_BYTES[scheme]), dtype=np.uint8)
    for off in SCALE_OFFSETS[scheme]:
        mag = rng.uniform(1.0, 2.0, (n, nb)) * 2.0 ** rng.integers(lo, hi + 1, (n, nb))
        scale = (mag * rng.choice([-1.0, 1.0], (n, nb))).astype(np.float16)
        data[:, :, off : off + 2] = scale.view(np.uint8).reshape(n, nb, 2)
    return data.reshape(n, -1)


def reference(data: np.ndarray, scheme: str) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and inf - inf where the bytes say so
        return np.asarray(gguf.quants.dequantize(data, GGML_TYPE[scheme]), np.float32)


def dequantize(cpu: Any, data: np.ndarray, scheme: str, k: int) -> np.ndarray:
    out = cpu_empty(cpu, (data.shape[0], k), dt.float32)
    cpu.kernel("dequantize")(out, from_numpy_bits(data, dt.uint8), scheme)
    return logical(out)


def linear(cpu: Any, x: np.ndarray, data: np.ndarray, b: np.ndarray | None, scheme: str) -> np.ndarray:
    out = cpu_empty(cpu, (x.shape[0], data.shape[0]), dt.float32)
    bias: Tensor | None = None if b is None else from_numpy_bits(b, dt.float32)
    cpu.kernel("quantized_linear")(out, from_numpy_bits(x, dt.float32), from_numpy_bits(data, dt.uint8), bias, scheme)
    return logical(out)


def test_quant_schemes_lists_every_kernel_format() -> None:
    names = C.quant_schemes()
    assert isinstance(names, tuple)
    assert names[:8] == ("q8_0", "q4_0", "bf16", "f16", "q4_1", "q5_0", "q5_1", "iq4_nl")
    assert set(SCHEMES) <= set(names) and len(set(names)) == len(names)


@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    n=st.integers(1, 9),
    nb=st.integers(1, 5),
    lo=st.integers(-24, 14),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_random_blocks_equal_gguf(cpu: Any, scheme: str, n: int, nb: int, lo: int, seed: int) -> None:
    """Every quant, scale and min bit random; float16 scales finite, subnormal to large: the same bits."""
    data = random_blocks(np.random.default_rng(seed), n, nb * QK, scheme, lo, min(lo + 1, 15))
    got = dequantize(cpu, data, scheme, nb * QK)
    np.testing.assert_array_equal(got.view(np.uint32), reference(data, scheme).view(np.uint32))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_wide_rows_equal_gguf(cpu: Any, scheme: str) -> None:
    data = random_blocks(np.random.default_rng(11), 5, 4096, scheme)
    got = dequantize(cpu, data, scheme, 4096)
    np.testing.assert_array_equal(got.view(np.uint32), reference(data, scheme).view(np.uint32))


@SETTINGS
@given(scheme=st.sampled_from(SCHEMES), n=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_dequantize_any_bytes_equal_gguf(cpu: Any, scheme: str, n: int, seed: int) -> None:
    """Wholly random bytes (infinite and NaN scales among them): no crash, gguf's values, NaN where it has NaN."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 2 * BLOCK_BYTES[scheme]), dtype=np.uint8)
    for off in SCALE_OFFSETS[scheme]:  # every block gets an inf or NaN scale half the time
        special = rng.choice(np.array([0x7C00, 0xFC00, 0x7E00, 0x7C01], np.uint16), (n, 2))
        keep = rng.random((n, 2)) < 0.5
        cur = data.reshape(n, 2, -1)[:, :, off : off + 2].copy().view(np.uint16)[..., 0]
        data.reshape(n, 2, -1)[:, :, off : off + 2] = np.where(keep, cur, special)[..., None].view(np.uint8)
    np.testing.assert_array_equal(dequantize(cpu, data, scheme, 2 * QK), reference(data, scheme))


@SETTINGS
@given(scheme=st.sampled_from(SCHEMES), m=st.sampled_from([1, 3, 16, 17]), seed=st.integers(0, 2**32 - 1))
def test_linear_any_bytes_no_crash(cpu: Any, scheme: str, m: int, seed: int) -> None:
    """Wholly random weight bytes (inf / NaN scales among them): finite where float64 is, inf and NaN
    where it has them (neither depends on the summation order)."""
    rng = np.random.default_rng(seed)
    n, k = 6, 2 * QK
    data = rng.integers(0, 256, size=(n, 2 * BLOCK_BYTES[scheme]), dtype=np.uint8)
    data[rng.integers(0, n), SCALE_OFFSETS[scheme][0] : SCALE_OFFSETS[scheme][0] + 2] = (0x00, 0x7C)  # +inf
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = linear(cpu, x, data, None, scheme).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = x.astype(np.float64) @ reference(data, scheme).astype(np.float64).T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-3, atol=1e-3 * np.abs(want[fin]).max(initial=1.0))


@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    m=st.sampled_from([1, 2, 3, 5, 8, 16, 17, 40]),
    kb=st.integers(1, 4),
    n=st.integers(1, 11),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_linear_matches_float64(cpu: Any, scheme: str, m: int, kb: int, n: int, with_bias: bool, seed: int) -> None:
    """Within the float32 bound of the kernels' summation depth: a few-row product sums 32-value
    chunks pairwise (5 levels) into one accumulator (k / 32 adds) and its lanes (4); the packed
    GEMM of M > 16 rows sums along k."""
    rng = np.random.default_rng(seed)
    k = QK * kb
    data = random_blocks(rng, n, k, scheme)
    w64 = reference(data, scheme).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if with_bias else None
    got = linear(cpu, x, data, b, scheme).astype(np.float64)
    x64 = x.astype(np.float64)
    want = x64 @ w64.T + (0 if b is None else b.astype(np.float64))
    depth = k // 32 + 64 if m <= 16 else k + 2
    mag = np.abs(x64) @ np.abs(w64).T + (0 if b is None else np.abs(b.astype(np.float64)))
    tol = 1.01 * (depth + 2) * U * mag + 1e-30
    err = np.abs(got - want)
    assert np.all(err <= tol), f"{scheme} m={m} k={k} n={n}: max err {err.max()}"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_batched_rows_equal_alone(cpu: Any, scheme: str) -> None:
    rng = np.random.default_rng(3)
    k, n = 768, 13
    data = random_blocks(rng, n, k, scheme)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((16, k)).astype(np.float32)
    alone = np.stack([linear(cpu, x[i : i + 1], data, b, scheme)[0] for i in range(16)])
    for m in range(2, 17):
        np.testing.assert_array_equal(linear(cpu, x[:m], data, b, scheme).view(np.uint32), alone[:m].view(np.uint32))


def test_threads_do_not_change_results(cpu: Any) -> None:
    rng = np.random.default_rng(4)
    k, n = 512, 67
    before = kbc.get_num_threads()
    try:
        for scheme in SCHEMES:
            data = random_blocks(rng, n, k, scheme)
            x = rng.standard_normal((24, k)).astype(np.float32)
            results = []
            for threads in (1, max(2, before)):
                kbc.set_num_threads(threads)
                results.append(
                    (
                        linear(cpu, x[:1], data, None, scheme),
                        linear(cpu, x[:5], data, None, scheme),
                        linear(cpu, x, data, None, scheme),
                        dequantize(cpu, data, scheme, k),
                    )
                )
            for a, c in zip(results[0], results[1], strict=True):
                np.testing.assert_array_equal(a.view(np.uint32), c.view(np.uint32))
    finally:
        kbc.set_num_threads(before)


def test_errors(cpu: Any) -> None:
    rng = np.random.default_rng(6)
    data = random_blocks(rng, 2, 512, "q4_k")
    out = cpu_empty(cpu, (2, 512), dt.float32)
    with pytest.raises(
        kael.ShapeError, match=r"dequantize: a q4_k weight for \[N, K\] = \[2, 512\] must be uint8 \[2, 288\]"
    ):
        cpu.kernel("dequantize")(out, from_numpy_bits(data[:, :-1], dt.uint8), "q4_k")
    x = rng.standard_normal((3, 96)).astype(np.float32)
    y = cpu_empty(cpu, (3, 2), dt.float32)
    with pytest.raises(kael.ShapeError, match=r"quantized_linear: K = 96 is not a multiple of the q6_k block size 256"):
        cpu.kernel("quantized_linear")(y, from_numpy_bits(x, dt.float32), from_numpy_bits(data, dt.uint8), None, "q6_k")
    with pytest.raises(kael.DTypeError, match=r"quantized_linear: a iq4_xs weight must be uint8 blocks, got float32"):
        w = from_numpy_bits(np.zeros((2, 96), np.float32), dt.float32)
        cpu.kernel("quantized_linear")(y, from_numpy_bits(x, dt.float32), w, None, "iq4_xs")
    with pytest.raises(kael.KaelError, match=r"scheme must be one of 'q8_0', .*'q6_k', 'iq4_xs', got 'q7_k'"):
        cpu.kernel("dequantize")(out, from_numpy_bits(data, dt.uint8), "q7_k")


def test_child_runs_requested_isa() -> None:
    want = os.environ.get("KAEL_QUANT_TEST_ISA")
    if want is None:
        pytest.skip("only in the per-ISA subprocess")
    assert C.isa() == want


@pytest.mark.skipif(os.environ.get("KAEL_QUANT_TEST_ISA") is not None, reason="already a per-ISA run")
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)
