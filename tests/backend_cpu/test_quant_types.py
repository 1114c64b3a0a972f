"""The float32-activation path (KAEL_QUANT_ACTIVATIONS=f32) of the CPU backend's kernels for GGML's Q4_1, Q5_0, Q5_1 and IQ4_NL blocks (csrc/quant_formats.h,
csrc/vec_quant.h): dequantize and quantized_linear, called through the extension's kernels.

Oracles: ``gguf.quants.dequantize`` (bit for bit, on gguf-quantized weights and on random block
bytes) and float64 NumPy for the products, within the summation bound of
test_quant_kernels.py. Rows of quantized_linear batched (up to 16) equal the row alone bit for
bit, and thread counts do not change results. The module runs again in a subprocess under
every other vector table this CPU can run (``KAEL_CPU_ISA``).
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
GGML_TYPE = {"q4_1": Q.Q4_1, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1, "iq4_nl": Q.IQ4_NL}
BLOCK_BYTES = {"q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}
NO_QUANTIZER = {"iq4_nl"}  # gguf has no reference quantizer: random blocks with moderate scales
SCHEMES = tuple(GGML_TYPE)
U = 2.0**-24  # float32 unit roundoff
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


#: tests of the float32-activation path: KAEL_QUANT_ACTIVATIONS=f32 (tests/conftest.py; the default
#: takes the integer path for up to 16 rows, test_quant_int8.py / test_quant_int8_k.py)
pytestmark = pytest.mark.usefixtures("float_activations_module")


def quantize(w: np.ndarray, scheme: str) -> np.ndarray:
    """float32 [N, K] as uint8 blocks by gguf's reference quantizer (random blocks where gguf has none)."""
    if scheme in NO_QUANTIZER:
        rng = np.random.default_rng(int(np.abs(w).sum() * 1000) % 2**32)
        data = rng.integers(0, 256, size=(w.shape[0], w.shape[1] // 32, BLOCK_BYTES[scheme]), dtype=np.uint8)
        d = (rng.uniform(0.5, 2.0, (w.shape[0], w.shape[1] // 32, 1)) / 64).astype(np.float16)
        data[:, :, :2] = d.view(np.uint8)
        return data.reshape(w.shape[0], -1)
    return np.asarray(gguf.quants.quantize(w.astype(np.float32), GGML_TYPE[scheme]))


def random_blocks(rng: np.random.Generator, n: int, k: int, scheme: str) -> np.ndarray:
    """Random block bytes whose float16 scales are finite (every other bit pattern is random)."""
    data = rng.integers(0, 256, size=(n, k // 32, BLOCK_BYTES[scheme]), dtype=np.uint8)
    halves = 2 if scheme in ("q4_1", "q5_1") else 1
    scales = (rng.standard_normal((n, k // 32, halves)) * 2.0 ** rng.integers(-20, 8, (n, k // 32, 1))).astype(
        np.float16
    )
    data[:, :, : 2 * halves] = scales.view(np.uint8).reshape(n, k // 32, 2 * halves)
    return data.reshape(n, -1)


def reference(data: np.ndarray, scheme: str) -> np.ndarray:
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


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("k", [32, 96, 4096])
def test_dequantize_equals_gguf(cpu: Any, scheme: str, k: int) -> None:
    rng = np.random.default_rng(k)
    data = quantize(rng.standard_normal((7, k)) * 3, scheme)
    got = dequantize(cpu, data, scheme, k)
    np.testing.assert_array_equal(got.view(np.uint32), reference(data, scheme).view(np.uint32))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_random_blocks_equal_gguf(cpu: Any, scheme: str) -> None:
    """Arbitrary quant bytes and high bits, scales from subnormal to large."""
    rng = np.random.default_rng(5)
    data = random_blocks(rng, 200, 256, scheme)
    got = dequantize(cpu, data, scheme, 256)
    np.testing.assert_array_equal(got.view(np.uint32), reference(data, scheme).view(np.uint32))


@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    m=st.sampled_from([1, 2, 3, 5, 16, 17, 40]),
    kb=st.integers(1, 12),
    n=st.integers(1, 11),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_linear_matches_float64(cpu: Any, scheme: str, m: int, kb: int, n: int, with_bias: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = 32 * kb
    data = quantize(rng.standard_normal((n, k)), scheme)
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
    k, n = 320, 13
    data = quantize(rng.standard_normal((n, k)), scheme)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((16, k)).astype(np.float32)
    alone = np.stack([linear(cpu, x[i : i + 1], data, b, scheme)[0] for i in range(16)])
    for m in (2, 3, 4, 7, 16):
        np.testing.assert_array_equal(linear(cpu, x[:m], data, b, scheme).view(np.uint32), alone[:m].view(np.uint32))


def test_threads_do_not_change_results(cpu: Any) -> None:
    rng = np.random.default_rng(4)
    k, n = 512, 67
    before = kbc.get_num_threads()
    try:
        for scheme in SCHEMES:
            data = quantize(rng.standard_normal((n, k)), scheme)
            x = rng.standard_normal((24, k)).astype(np.float32)
            results = []
            for threads in (1, max(2, before)):
                kbc.set_num_threads(threads)
                results.append(
                    (
                        linear(cpu, x[:3], data, None, scheme),
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
    data = quantize(rng.standard_normal((2, 64)), "q5_1")
    out = cpu_empty(cpu, (2, 64), dt.float32)
    with pytest.raises(kael.ShapeError, match=r"q5_1 weight for \[N, K\] = \[2, 64\] must be uint8 \[2, 48\]"):
        cpu.kernel("dequantize")(out, from_numpy_bits(data[:, :-1], dt.uint8), "q5_1")
    with pytest.raises(kael.KaelError, match=r"scheme must be one of 'q8_0', 'q4_0', .*'q5_1', 'iq4_nl', .*got 'q9_9'"):
        cpu.kernel("dequantize")(out, from_numpy_bits(data, dt.uint8), "q9_9")


def test_child_runs_requested_isa() -> None:
    want = os.environ.get("KAEL_QUANT_TEST_ISA")
    if want is None:
        pytest.skip("only in the per-ISA subprocess")
    assert C.isa() == want


@pytest.mark.skipif(os.environ.get("KAEL_QUANT_TEST_ISA") is not None, reason="already a per-ISA run")
@pytest.mark.parametrize("isa", other_isas())
def test_every_vector_table(isa: str) -> None:
    rerun_under_isa(__file__, isa)
