"""kael.quant's weight formats (NOTE [weight formats]) against independent oracles.

* Q8_0 / Q4_0: ``quantize_array`` gives the bytes of ``gguf.quants.quantize`` bit for bit, and
  ``dequantize_array`` the values of ``gguf.quants.dequantize`` (hypothesis over shapes and
  magnitudes from subnormal to near float32's largest, zero rows, ties, halves).
* The byte layout decoded by hand here (float16 scale, int8 values / nibbles) and the error
  bound of each scheme (|x - x~| <= d/2 for q8_0, <= d for q4_0, with d the block scale).
* bf16 equal to torch's ``.to(torch.bfloat16)`` bits, f16 to NumPy's ``astype``.
* to_device_weight / storage_shape, and bad input: a KaelError naming the function and value.
"""

from __future__ import annotations

import warnings
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.quant import (
    BLOCK_BYTES,
    BLOCK_SIZE,
    dequantize_array,
    quantizable,
    quantize_array,
    storage_shape,
    to_device_weight,
)

gguf = pytest.importorskip("gguf")
GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


def _gguf_quantize(a: np.ndarray, scheme: str) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(gguf.quants.quantize(a, GGML[scheme]))


@st.composite
def matrices(draw: st.DrawFn) -> np.ndarray:
    """float32 [N, K] (K a multiple of 32) of one magnitude (10**e), with zero rows, ties and halves."""
    n = draw(st.integers(1, 4))
    k = BLOCK_SIZE * draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "halves", "ties", "uniform"]))
    exp = draw(st.integers(-44, 37))
    a = rng.standard_normal((n, k)) * 10.0**exp
    if kind == "halves":  # x * (1/d) lands on .5 often: exercises roundf's ties away from zero
        a = np.round(rng.standard_normal((n, k)) * 8) / 2
    elif kind == "ties":  # several values of the largest magnitude (q4_0 picks the first)
        a[:, ::4] = a[:, :1]
        a[:, 1::8] = -a[:, :1]
    elif kind == "uniform":
        a = rng.uniform(-1, 1, (n, k)) * 10.0**exp
    with np.errstate(over="ignore"):
        out = np.clip(a, -3.0e38, 3.0e38).astype(np.float32)
    if draw(st.booleans()):
        out[draw(st.integers(0, n - 1))] = 0.0
    return out


@settings(max_examples=150, deadline=None)
@given(a=matrices(), scheme=st.sampled_from(["q8_0", "q4_0"]))
def test_block_quantize_matches_gguf_bit_for_bit(a: np.ndarray, scheme: str) -> None:
    got = quantize_array(a, scheme)
    want = _gguf_quantize(a, scheme)
    assert got.dtype == np.uint8 and got.shape == (a.shape[0], a.shape[1] // BLOCK_SIZE * BLOCK_BYTES[scheme])
    np.testing.assert_array_equal(got, want)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(want, GGML[scheme])
    back = dequantize_array(got, scheme, a.shape[1])
    assert back.dtype == np.float32 and back.shape == a.shape
    np.testing.assert_array_equal(back, ref)  # NaN-free: scales of finite blocks stay finite or inf * 0 never met


def _decode_by_hand(data: np.ndarray, scheme: str, k: int) -> np.ndarray:
    """The layout of NOTE [weight formats], one block at a time, in float64."""
    n, b = data.shape[0], BLOCK_BYTES[scheme]
    out = np.zeros((n, k))
    for r in range(n):
        for j in range(k // BLOCK_SIZE):
            blk = data[r, j * b : (j + 1) * b]
            d = float(np.frombuffer(blk[:2].tobytes(), "<f2")[0])
            if scheme == "q8_0":
                q = np.frombuffer(blk[2:].tobytes(), np.int8).astype(np.float64)
            else:
                q = np.array([(int(v) & 15) - 8 for v in blk[2:]] + [(int(v) >> 4) - 8 for v in blk[2:]], np.float64)
            out[r, j * BLOCK_SIZE : (j + 1) * BLOCK_SIZE] = d * q
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scheme=st.sampled_from(["q8_0", "q4_0"]), exp=st.integers(-6, 4))
def test_block_layout_and_error_bound(seed: int, scheme: str, exp: int) -> None:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((3, 96)) * 10.0**exp).astype(np.float32)
    data = quantize_array(a, scheme)
    back = dequantize_array(data, scheme, 96)
    np.testing.assert_array_equal(back, _decode_by_hand(data, scheme, 96).astype(np.float32))
    blocks = a.reshape(3, 3, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = amax / (127 if scheme == "q8_0" else 8)
    err = np.abs(back.reshape(3, 3, 32) - blocks)
    b = BLOCK_BYTES[scheme]
    d16 = np.array(
        [[np.frombuffer(data[r, j * b : j * b + 2].tobytes(), "<f2")[0] for j in range(3)] for r in range(3)]
    )
    # q8_0 rounds to the nearest of 255 steps of d (error d/2); q4_0 maps [-8d, 7d] in 16 steps of d (the
    # opposite extreme clips at 7d: error up to d); plus the float16 rounding of d, times |q| <= 127 (or 8)
    slack, qmax = (1.0, 8) if scheme == "q4_0" else (0.5, 127)
    bound = slack * d + qmax * np.abs(d16.astype(np.float64)[..., None] - d) + amax * 2.0**-20
    assert np.all(err <= bound)


def test_rounding_rules_on_chosen_blocks() -> None:
    # q8_0: amax 127 gives d = 1, so q = roundf(x): ties go away from zero (2.5 -> 3, -2.5 -> -3), as C's roundf
    row = np.zeros((1, 32), np.float32)
    row[0, :5] = [127.0, 2.5, -2.5, 0.5, -0.49999997]
    data = quantize_array(row, "q8_0")
    assert np.frombuffer(data[0, :2].tobytes(), "<f2")[0] == 1.0
    assert data[0, 2:7].view(np.int8).tolist() == [127, 3, -3, 1, 0]
    # q4_0: the first value of largest magnitude sets d = m / -8; it maps to nibble 0 (-8), -m clips at 15 (+7)
    row = np.zeros((1, 32), np.float32)
    row[0, :4] = [4.0, -8.0, 8.0, 1.0]
    data = quantize_array(row, "q4_0")
    assert np.frombuffer(data[0, :2].tobytes(), "<f2")[0] == 1.0  # d = -8 / -8
    nib = [(v & 15) for v in data[0, 2:6]]
    assert nib == [4 + 8, 0, 15, 1 + 8]
    np.testing.assert_array_equal(dequantize_array(data, "q4_0", 32)[0, :4], [4.0, -8.0, 7.0, 1.0])
    # a zero block: d = 0, every q 0 (q4_0's nibble 8), and it decodes to zeros
    z = np.zeros((2, 64), np.float32)
    for s in ("q8_0", "q4_0"):
        np.testing.assert_array_equal(dequantize_array(quantize_array(z, s), s, 64), z)
    assert set(quantize_array(z, "q4_0")[:, 2:18].ravel().tolist()) == {0x88}


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), exp=st.integers(-40, 38), n=st.integers(0, 3), k=st.integers(0, 40))
def test_bf16_matches_torch_and_f16_matches_numpy(seed: int, exp: int, n: int, k: int) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        a = np.clip(rng.standard_normal((n, k)) * 10.0**exp, -3.4e38, 3.4e38).astype(np.float32)
    bits = quantize_array(a, "bf16")
    want = torch.from_numpy(a.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits, want)
    np.testing.assert_array_equal(
        dequantize_array(bits, "bf16", k), torch.from_numpy(want.view(np.int16)).view(torch.bfloat16).float().numpy()
    )
    with np.errstate(over="ignore"):
        half = a.astype(np.float16)
    np.testing.assert_array_equal(quantize_array(a, "f16"), half)
    np.testing.assert_array_equal(dequantize_array(half, "f16", k), half.astype(np.float32))


def test_float64_input_is_converted_to_float32_first() -> None:
    a = np.linspace(-3, 3, 512).reshape(2, 256)
    for s in quantizable():
        np.testing.assert_array_equal(quantize_array(a, s), quantize_array(a.astype(np.float32), s))


def test_storage_shape_and_zero_rows() -> None:
    assert storage_shape("q8_0", 5, 64) == (5, 68) and storage_shape("q4_0", 5, 64) == (5, 36)
    assert storage_shape("bf16", 5, 7) == (5, 7) == storage_shape("f16", 5, 7)
    assert storage_shape("q4_k", 5, 512) == (5, 288) and storage_shape("iq4_xs", 2, 256) == (2, 136)
    for s in quantizable():
        data = quantize_array(np.zeros((0, 256), np.float32), s)
        assert data.shape == storage_shape(s, 0, 256)
        assert dequantize_array(data, s, 256).shape == (0, 256)


def test_to_device_weight_makes_the_tensors_the_ops_take() -> None:
    a = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    for s, dtype in (("q8_0", kael.uint8), ("q4_0", kael.uint8), ("bf16", kael.bfloat16), ("f16", kael.float16)):
        data = quantize_array(a, s)
        t = to_device_weight(data, s, "cpu")
        assert t.dtype is dtype and t.shape == data.shape and t.device.type == "cpu"
        np.testing.assert_array_equal(kael.ops.dequantize(t, s).numpy(), dequantize_array(data, s, 64))
        data[...] = 0  # the default copies
        assert kael.ops.dequantize(t, s).numpy().any()
    shared = quantize_array(a, "q8_0")
    t = to_device_weight(shared, "q8_0", "cpu", copy=False)
    shared[0, 2] ^= 1
    assert t.numpy()[0, 2] == shared[0, 2]


NOT_AN_ARRAY: Any = [[0.0] * 32]


@pytest.mark.parametrize(
    ("call", "err", "match"),
    [
        (
            lambda: quantize_array(np.zeros((2, 32), np.float32), "q7_0"),
            kael.DTypeError,
            "unknown weight scheme 'q7_0'",
        ),
        (lambda: quantize_array(np.zeros((2, 40), np.float32), "q8_0"), kael.ShapeError, "K = 40 is not a multiple"),
        (lambda: quantize_array(np.zeros(32, np.float32), "q4_0"), kael.ShapeError, r"2-D array \[N, K\]"),
        (lambda: quantize_array(np.zeros((1, 32), np.int32), "q8_0"), kael.DTypeError, "floating-point array"),
        (lambda: quantize_array(NOT_AN_ARRAY, "q8_0"), kael.DTypeError, "numpy.ndarray, got list"),
        (lambda: quantize_array(np.full((1, 32), np.inf, np.float32), "q8_0"), kael.FormatError, "finite"),
        (lambda: dequantize_array(np.zeros((2, 68), np.uint8), "q8_0", 96), kael.ShapeError, r"expected \[2, 102\]"),
        (lambda: dequantize_array(np.zeros((2, 68), np.int8), "q8_0", 64), kael.DTypeError, "must be a uint8"),
        (lambda: dequantize_array(np.zeros((2, 8), np.float16), "bf16", 8), kael.DTypeError, "bfloat16 bit patterns"),
        (lambda: dequantize_array(np.zeros((2, 68), np.uint8), "q8_0", 60), kael.ShapeError, "multiple of 32"),
        (lambda: to_device_weight(np.zeros((2, 35), np.uint8), "q8_0"), kael.ShapeError, "35 bytes"),
    ],
)
def test_bad_input_names_the_function_and_value(call: object, err: type, match: str) -> None:
    with pytest.raises(err, match=match):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("scheme", ["q7_0", "q4_k_m", "Q4_0", "", "f32"])
def test_host_decode_refuses_a_scheme_it_has_no_layout_for(scheme: str) -> None:
    """No fall-through to Q4_0: a scheme without a layout here is a DTypeError naming it."""
    from kael.backends.host._quant import decode

    with pytest.raises(kael.DTypeError, match=f"unknown weight scheme '{scheme}'"):
        decode(np.zeros((1, 18), np.uint8), scheme, 32)
