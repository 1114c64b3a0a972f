"""The weight-format ops end to end on the backend's device: batch invariance and the gradient in x.

Kernel rows (``_table_quant``) compare each kernel with the reference; this checks what a
row-by-row comparison cannot: that a row of quantized_linear's result does not depend on
how many rows x has (batched decoding equals decoding alone, bit for bit), and that the
backward (``dx = grad @ dequantize(weight)``, ``dbias = sum of grad``), float32 only so
outside the float64 gradient checks, agrees with NumPy on the backend's kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kael
from kael.quant import SCHEMES, dequantize_array, to_device_weight
from kael.testing import assert_close, weight_blocks


def _weight(n: int, k: int, scheme: str, device: Any) -> tuple[kael.Tensor, np.ndarray]:
    data = weight_blocks(scheme, n, k, np.random.default_rng(n * k))
    return to_device_weight(data, scheme, device), dequantize_array(data, scheme, k)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_linear_rows_do_not_depend_on_the_batch(scheme: str, kael_backend: Any, kael_device: Any) -> None:
    if "quantized_linear" not in kael_backend.supported_ops():
        pytest.skip(f"backend {kael_backend.name!r} has no quantized_linear kernel (its matmul decides)")
    w, _ = _weight(40, 256, scheme, kael_device)
    rng = np.random.default_rng(1)
    b = kael.tensor(rng.standard_normal(40).astype(np.float32), device=kael_device)
    x = rng.standard_normal((11, 256)).astype(np.float32)
    batched = kael.ops.quantized_linear(kael.tensor(x, device=kael_device), w, b, scheme).cpu().numpy()
    for i in range(11):
        alone = kael.ops.quantized_linear(kael.tensor(x[i : i + 1], device=kael_device), w, b, scheme)
        got = alone.cpu().numpy()[0]
        if not np.array_equal(got, batched[i]):
            worst = int(np.argmax(np.abs(got - batched[i])))
            raise AssertionError(
                f"quantized_linear ({scheme}) on {kael_backend.name!r}: row {i} alone differs from row {i} of a batch "
                f"of 11 (element {worst}: {got[worst]!r} vs {batched[i][worst]!r}); expected bit-for-bit equality"
            )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_linear_forward_and_gradient(scheme: str, kael_device: Any) -> None:
    k = 256  # a whole block of every format
    w, wv = _weight(12, k, scheme, kael_device)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    bias = rng.standard_normal(12).astype(np.float32)
    g = rng.standard_normal((2, 3, 12)).astype(np.float32)
    xt = kael.tensor(x, device=kael_device, requires_grad=True)
    bt = kael.tensor(bias, device=kael_device, requires_grad=True)
    out = kael.ops.quantized_linear(xt, w, bt, scheme)
    w64 = wv.astype(np.float64)
    assert_close(out.detach().cpu().numpy(), x @ w64.T + bias, rtol=1e-5, atol=1e-4)
    (out * kael.tensor(g, device=kael_device)).sum().backward()
    assert xt.grad is not None and bt.grad is not None
    assert_close(xt.grad.cpu().numpy(), g.astype(np.float64) @ w64, rtol=1e-5, atol=1e-4)
    assert_close(bt.grad.cpu().numpy(), g.astype(np.float64).sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)
    assert_close(kael.ops.dequantize(w, scheme).cpu().numpy(), wv, rtol=0, atol=0)
