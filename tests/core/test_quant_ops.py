"""kael.ops.dequantize and kael.ops.quantized_linear against NumPy, on every CPU path.

* dequantize equals ``kael.quant.dequantize_array`` (itself checked against gguf.quants) bit for
  bit: the scale times the value is one float32 rounding on every path.
* quantized_linear against float64 NumPy (``dequantize_array`` then ``x @ W.T + b``) within a
  float32-accumulation bound; hypothesis over shapes, schemes, bias and non-contiguous x.
* Batch invariance of the fused kernels: each row of a batch equals that row alone, bit for bit.
* The gradient in x (``grad @ W``) and in the bias, against NumPy and float32 finite differences.
* ``Tensor.view(dtype)`` (the decomposition's byte reinterpretation) against torch's.
* Every path: the installed CPU backend, the reference backend's fused host kernels, the
  decompositions on a backend without fused kernels, and a backend with a dequantize kernel
  but no quantized_linear one (``mode``).
* Bad input: a KaelError subclass naming the op, the value and what was expected.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.backends import host
from kael.backends.reference import ReferenceBackend
from kael.quant import BLOCK_VALUES, dequantize_array, quantizable, quantize_array, to_device_weight

#: float oracles (NumPy, float64): quantized linears on float32 activations (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("float_activations_module")

MODES = ["default", "reference", "decomposition", "dequantize_only"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The CPU backend as installed, the reference backend (fused host kernels), one without fused kernels, and
    one with a dequantize kernel only."""
    if request.param == "default":
        yield request.param
        return
    backend = ReferenceBackend(fused=request.param == "reference")
    if request.param == "dequantize_only":  # quantized_linear = the backend's dequantize kernel, then its matmul
        backend.kernels["dequantize"] = host.kernel("dequantize")
    backend.name = f"quant_ops_{request.param}"
    backend.priority = -1

    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [backend]

    kael.backends.register(Plugin(), f"test_quant_ops_{request.param}")
    kael.backends.use("cpu", backend.name)
    try:
        yield request.param
    finally:
        kael.backends.use("cpu", None)
        kael.backends.unregister(f"test_quant_ops_{request.param}")


def _has_fused_kernel(op: str) -> bool:
    return op in kael.backends.current("cpu").supported_ops()


def _weight(seed: int, n: int, k: int, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """(storage data, its float32 values [n, k]) of a random weight."""
    a = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.5
    data = quantize_array(a, scheme)
    return data, dequantize_array(data, scheme, k)


def _oracle(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(x @ w.T + b in float64, a bound on the float32 accumulation error: K * 2**-23 * (|x| @ |w|.T + |b|))."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = x64 @ w64.T
    mag = np.abs(x64) @ np.abs(w64).T
    if b is not None:
        y = y + b
        mag = mag + np.abs(b)
    return y, (x.shape[-1] + 1) * 2.0**-23 * mag + 1e-30


def _wide(scheme: str, k: int) -> int:
    """A row length of the 32-value tests scaled to `scheme`'s blocks (x8 for the 256-value K-quants and IQ4_XS)."""
    return k * BLOCK_VALUES.get(scheme, 32) // 32


@pytest.mark.parametrize("scheme", quantizable())
def test_dequantize_equals_the_numpy_reference_bit_for_bit(mode: str, scheme: str) -> None:
    for n, k32 in ((1, 32), (5, 64), (17, 256), (3, 96)):
        k = _wide(scheme, k32)
        data, values = _weight(n * k, n, k, scheme)
        got = kael.ops.dequantize(to_device_weight(data, scheme), scheme)
        assert got.dtype is kael.float32 and got.shape == (n, k)
        np.testing.assert_array_equal(got.numpy(), values)


def test_dequantize_of_a_weight_at_an_odd_byte_offset(mode: str) -> None:
    data, values = _weight(1, 4, 64, "q8_0")
    flat = np.zeros(1 + data.size, np.uint8)
    flat[1:] = data.ravel()
    t = kael.from_numpy(flat)[1:].reshape(4, 68)  # contiguous, starting at byte 1
    assert t.storage_offset() == 1
    np.testing.assert_array_equal(kael.ops.dequantize(t, "q8_0").numpy(), values)
    np.testing.assert_array_equal(kael.ops.dequantize(to_device_weight(data[::2], "q8_0"), "q8_0").numpy(), values[::2])
    strided = kael.from_numpy(data)[::2]  # rows two apart: a non-contiguous weight
    np.testing.assert_array_equal(kael.ops.dequantize(strided, "q8_0").numpy(), values[::2])


@st.composite
def linear_cases(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "scheme": draw(st.sampled_from(quantizable())),
        "rows": draw(st.integers(0, 17)),
        "lead": draw(st.sampled_from([(), (2,), (1, 3)])),
        "k": 32 * draw(st.integers(1, 8)),
        "n": draw(st.integers(1, 20)),
        "bias": draw(st.booleans()),
        "layout": draw(st.sampled_from(["contiguous", "transposed", "sliced"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def _x(rng: np.random.Generator, shape: tuple[int, ...], layout: str) -> tuple[np.ndarray, kael.Tensor]:
    """x of `shape` as a contiguous tensor, a transposed view, or a strided slice (same values)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if layout == "transposed":
        t = kael.tensor(np.ascontiguousarray(np.swapaxes(x, -1, -2))).transpose(-2, -1)
    elif layout == "sliced":
        wide = np.zeros(shape[:-1] + (shape[-1] * 2,), np.float32)
        wide[..., ::2] = x
        t = kael.tensor(wide)[..., ::2]
    else:
        t = kael.tensor(x)
    return x, t


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=linear_cases())
def test_quantized_linear_matches_numpy(mode: str, case: dict[str, Any]) -> None:
    rng = np.random.default_rng(case["seed"])
    scheme, k, n = case["scheme"], _wide(case["scheme"], case["k"]), case["n"]
    data, w = _weight(case["seed"], n, k, scheme)
    b = rng.standard_normal(n).astype(np.float32) if case["bias"] else None
    x, xt = _x(rng, case["lead"] + (case["rows"], k), case["layout"])
    if xt.numel() and (case["layout"] == "sliced" or (case["layout"] == "transposed" and case["rows"] > 1)):
        assert not xt.is_contiguous()
    out = kael.ops.quantized_linear(xt, to_device_weight(data, scheme), None if b is None else kael.tensor(b), scheme)
    assert out.dtype is kael.float32 and out.shape == case["lead"] + (case["rows"], n)
    want, tol = _oracle(x, w, b)
    assert np.all(np.abs(out.numpy() - want) <= tol)


@pytest.mark.parametrize("scheme", quantizable())
def test_fused_kernel_rows_do_not_depend_on_the_batch(mode: str, scheme: str) -> None:
    if not _has_fused_kernel("quantized_linear"):
        pytest.skip("no fused quantized_linear kernel here: the decomposition's matmul makes no batch promise")
    rng = np.random.default_rng(11)
    k = _wide(scheme, 256)
    data, _ = _weight(5, 48, k, scheme)
    w = to_device_weight(data, scheme)
    b = kael.tensor(rng.standard_normal(48).astype(np.float32))
    x = rng.standard_normal((13, k)).astype(np.float32)
    batched = kael.ops.quantized_linear(kael.tensor(x), w, b, scheme).numpy()
    for i in range(13):
        alone = kael.ops.quantized_linear(kael.tensor(x[i : i + 1]), w, b, scheme).numpy()
        np.testing.assert_array_equal(alone[0], batched[i])


def test_reference_kernel_agrees_with_the_decomposition() -> None:
    """The host kernels against the registered decompositions, run on the reference backend's primitives."""
    from kael.backends import catalogue, host

    rng = np.random.default_rng(2)
    for scheme in quantizable():
        k = _wide(scheme, 96)
        data, _ = _weight(3, 9, k, scheme)
        w = to_device_weight(data, scheme)
        out = kael.empty(9, k)
        host.kernel("dequantize")(out, w, scheme)
        np.testing.assert_array_equal(out.numpy(), catalogue.decomposition("dequantize")(w, scheme).numpy())
        x = kael.tensor(rng.standard_normal((4, k)).astype(np.float32))
        b = kael.tensor(rng.standard_normal(9).astype(np.float32))
        y = kael.empty(4, 9)
        host.kernel("quantized_linear")(y, x, w, b, scheme)
        d = catalogue.decomposition("quantized_linear")(x, w, b, scheme).numpy()
        np.testing.assert_allclose(y.numpy(), d, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", quantizable())
def test_gradient_in_x_and_bias(mode: str, scheme: str) -> None:
    rng = np.random.default_rng(4)
    k = _wide(scheme, 64)
    data, w = _weight(8, 12, k, scheme)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    g = rng.standard_normal((2, 3, 12)).astype(np.float32)
    xt = kael.tensor(x, requires_grad=True)
    bt = kael.tensor(b, requires_grad=True)
    wt = to_device_weight(data, scheme)
    out = kael.ops.quantized_linear(xt, wt, bt, scheme)
    (out * kael.tensor(g)).sum().backward()
    assert xt.grad is not None and bt.grad is not None and wt.grad is None
    dx = g.astype(np.float64) @ w.astype(np.float64)
    bound = (12 + 1) * 2.0**-23 * (np.abs(g).astype(np.float64) @ np.abs(w)) + 1e-30  # float32 accumulation
    assert np.all(np.abs(xt.grad.numpy() - dx) <= bound)
    np.testing.assert_allclose(bt.grad.numpy(), g.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)


def test_gradient_in_x_by_finite_differences() -> None:
    """Central differences in float32 (the loss is linear in x, so the only error is float32 rounding)."""
    rng = np.random.default_rng(6)
    data, _ = _weight(9, 5, 32, "q4_0")
    wt = to_device_weight(data, "q4_0")
    x = rng.standard_normal((2, 32)).astype(np.float32)
    g = rng.standard_normal((2, 5)).astype(np.float32)

    def loss(v: np.ndarray) -> float:
        y = kael.ops.quantized_linear(kael.tensor(v), wt, None, "q4_0").numpy().astype(np.float64)
        return float((y * g).sum())

    xt = kael.tensor(x, requires_grad=True)
    (kael.ops.quantized_linear(xt, wt, None, "q4_0") * kael.tensor(g)).sum().backward()
    assert xt.grad is not None
    h = 0.25  # exact in float32; a linear loss has no truncation error
    for i, j in [(0, 0), (0, 17), (1, 31), (1, 5)]:
        plus, minus = x.copy(), x.copy()
        plus[i, j] += h
        minus[i, j] -= h
        fd = (loss(plus) - loss(minus)) / (2 * h)
        assert abs(fd - float(xt.grad.numpy()[i, j])) <= 1e-4 * (1 + abs(fd))


def test_zero_rows_and_no_bias(mode: str) -> None:
    data, _ = _weight(1, 7, 64, "q8_0")
    w = to_device_weight(data, "q8_0")
    x = kael.zeros(0, 64, requires_grad=True)
    out = kael.ops.quantized_linear(x, w, None, "q8_0")
    assert out.shape == (0, 7)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 64)


def test_view_dtype_reinterprets_bytes_like_torch() -> None:
    torch = pytest.importorskip("torch")
    raw = np.random.default_rng(0).integers(0, 256, (3, 34), dtype=np.uint8)
    raw[:, 1] &= 0x3F  # keep the float16 scales finite
    t, tt = kael.tensor(raw), torch.from_numpy(raw.copy())
    for kd, td in ((kael.int8, torch.int8), (kael.float16, torch.float16)):
        view = t[:, 0:2].view(kd)
        ref = tt[:, 0:2].view(td)
        assert view.shape == tuple(ref.shape) and view.stride() == ref.stride()
        np.testing.assert_array_equal(view.numpy(), ref.numpy())
    wide = t.view(kael.float16)  # [3, 17]
    assert wide.shape == (3, 17) and wide.stride() == (17, 1)
    back = wide.view(kael.uint8)
    assert back.shape == (3, 34) and np.array_equal(back.numpy(), raw)
    with pytest.raises(kael.ShapeError, match="must be multiples of 4"):
        t.view(kael.int32)  # 34 bytes a row
    with pytest.raises(kael.ShapeError, match="last dim must have stride 1"):
        t[:, ::2].view(kael.float16)
    with pytest.raises(kael.ShapeError, match="0-d tensor"):
        kael.tensor(1.0).view(kael.float16)


def _w(scheme: str = "q8_0", n: int = 4, k: int = 64) -> kael.Tensor:
    return to_device_weight(_weight(0, n, k, scheme)[0], scheme)


X = kael.zeros(2, 64)


@pytest.mark.parametrize(
    ("call", "err", "match"),
    [
        (lambda: kael.ops.quantized_linear(X, _w(), None, "q7_0"), kael.DTypeError, "unknown weight scheme 'q7_0'"),
        (lambda: kael.ops.dequantize(_w(), "int8"), kael.DTypeError, "dequantize: unknown weight scheme 'int8'"),
        (lambda: kael.ops.dequantize(_w("f16"), "bf16"), kael.DTypeError, "bf16 weight must be a bfloat16"),
        (lambda: kael.ops.dequantize(_w("q8_0"), "f16"), kael.DTypeError, "f16 weight must be a float16 tensor"),
        (lambda: kael.ops.dequantize(kael.zeros(4, 64), "q4_0"), kael.DTypeError, "must be a uint8 tensor, got"),
        (
            lambda: kael.ops.dequantize(kael.zeros(4, 35, dtype=kael.uint8), "q8_0"),
            kael.ShapeError,
            "holds 35 bytes, not a whole number of 34-byte blocks",
        ),
        (lambda: kael.ops.dequantize(kael.zeros(68, dtype=kael.uint8), "q8_0"), kael.ShapeError, "must be 2-D"),
        (
            lambda: kael.ops.quantized_linear(kael.zeros(2, 40), _w("q8_0"), None, "q8_0"),
            kael.ShapeError,
            "multiple of 32, got 40",
        ),
        (
            lambda: kael.ops.quantized_linear(kael.zeros(2, 96), _w("q8_0"), None, "q8_0"),
            kael.ShapeError,
            r"logical shape \[4, 64\]",
        ),
        (
            lambda: kael.ops.quantized_linear(kael.zeros(2, 64, dtype=kael.float64), _w(), None, "q8_0"),
            kael.DTypeError,
            "x must be float32, got",
        ),
        (lambda: kael.ops.quantized_linear(X, _w(), kael.zeros(5), "q8_0"), kael.ShapeError, r"bias has shape \[5\]"),
        (
            lambda: kael.ops.quantized_linear(X, _w(), kael.zeros(4, dtype=kael.float16), "q8_0"),
            kael.DTypeError,
            "bias must be float32",
        ),
        (lambda: kael.ops.quantized_linear(kael.tensor(1.0), _w(), None, "q8_0"), kael.ShapeError, "0-d"),
    ],
)
def test_bad_input_is_a_clear_error(call: Any, err: type, match: str) -> None:
    with pytest.raises(err, match=match):
        call()
