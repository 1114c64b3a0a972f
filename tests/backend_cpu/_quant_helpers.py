"""What the tests of quantized_linear's integer, bfloat16 and float16 paths share (test_quant_int8.py,
test_quant_bf16.py, test_quant_f16.py; the int8 GEMM and K-quant modules through test_quant_int8.py): running the
kernel on NumPy operands, the bit-for-bit comparison with a NumPy model, the hypothesis settings, and the per-ISA
reruns (each module runs again in a child pytest under every other vector table this CPU can run, ``KAEL_CPU_ISA``;
cpu_helpers.rerun_under_isa).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from cpu_helpers import cpu_empty, logical
from hypothesis import HealthCheck, settings
from kael import _dtype as dt
from kael._tensor import Tensor, from_numpy_bits

__all__ = ["F32", "SETTINGS", "assert_bits", "check_requested_isa", "not_in_isa_rerun", "run"]

F32 = np.float32
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
#: the 16-bit formats' weight dtypes; the block formats' weights are uint8 blocks
WEIGHT_DTYPES = {"bf16": dt.bfloat16, "f16": dt.float16}
#: for the tests that start the per-ISA reruns: not run again inside one (``KAEL_QUANT_TEST_ISA`` names its table)
not_in_isa_rerun = pytest.mark.skipif(os.environ.get("KAEL_QUANT_TEST_ISA") is not None, reason="already a per-ISA run")


def run(cpu: Any, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, scheme: str) -> np.ndarray:
    """out [.., N] = quantized_linear(x [.., K], weight, bias) on the backend `cpu`, as float32 NumPy values: weight
    holds `scheme`'s storage (uint8 blocks [N, bytes]; bf16: bfloat16 bits [N, K] as uint16; f16: float16 [N, K])."""
    out = cpu_empty(cpu, (*x.shape[:-1], weight.shape[0]), dt.float32)
    b: Tensor | None = None if bias is None else from_numpy_bits(bias.astype(F32), dt.float32)
    w = from_numpy_bits(weight, WEIGHT_DTYPES.get(scheme, dt.uint8))
    cpu.kernel("quantized_linear")(out, from_numpy_bits(x.astype(F32), dt.float32), w, b, scheme)
    return logical(out)


def assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    """got is want bit for bit (float32), nans where want has them (any nan bits)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def check_requested_isa() -> None:
    """In a per-ISA rerun, the native module runs the table it was asked for (baseline names itself base);
    elsewhere the calling test skips."""
    want = os.environ.get("KAEL_QUANT_TEST_ISA")
    if want is None:
        pytest.skip("not a per-ISA run")
    from kael_backend_cpu._native import C

    isa = C.isa()
    assert isa in (want, "base" if want == "baseline" else want), f"asked for table {want!r}, running {isa!r}"
