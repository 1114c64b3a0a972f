"""The registry's reference block quantizers (kael.quant.formats): byte for byte equal to
``gguf.quants.quantize`` for q4_0, q4_1, q5_0, q5_1 and q8_0, and to kael.quant.quantize_array."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import quantize as gguf_quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from kael import DTypeError, FormatError, ShapeError
from kael.quant import quantize_array
from kael.quant.formats import get_format

LEGACY = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]

_values = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, -8.0, 1e-30, -1e-38, 3.4e38, -3.4e38]),
)


@pytest.mark.parametrize("name", LEGACY)
@settings(max_examples=80, deadline=None)
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.sampled_from([32, 64, 96])), elements=_values))
def test_quantize_byte_exact_against_gguf(name: str, x: np.ndarray) -> None:
    fmt = get_format(name)
    with np.errstate(all="ignore"):
        want = gguf_quantize(x, gguf.GGMLQuantizationType[name.upper()])
    got = fmt.quantize(x)
    assert got.dtype == np.uint8 and got.shape == (x.shape[0], fmt.row_bytes(x.shape[1]))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["q4_0", "q8_0"])
def test_quantize_equals_quantize_array(name: str) -> None:
    x = (np.random.default_rng(3).standard_normal((7, 128)) * 3).astype(np.float32)
    np.testing.assert_array_equal(get_format(name).quantize(x), quantize_array(x, name))


@pytest.mark.parametrize("name", LEGACY)
def test_round_trip_error_within_a_step(name: str) -> None:
    """Dequantized values lie within one quantization step of the input (half a step where nothing clips)."""
    fmt = get_format(name)
    x = np.random.default_rng(5).uniform(-2, 2, (16, 64)).astype(np.float32)
    back = fmt.dequantize(fmt.quantize(x), 64)
    step = {"q4_0": 2 / 8, "q4_1": 4 / 15, "q5_0": 2 / 16, "q5_1": 4 / 31, "q8_0": 2 / 127}[name]
    err = np.abs(back - x)
    assert np.max(err) <= step * 1.01
    if name in ("q4_1", "q5_1", "q8_0"):
        assert np.max(err) <= step * 0.6  # half a step, plus the float16 rounding of the scale
    assert np.max(err) > 0


def test_quantize_refusals() -> None:
    with pytest.raises(DTypeError, match="f16: kael has no reference block quantizer"):
        get_format("f16").quantize(np.zeros((1, 256), np.float32))
    with pytest.raises(ShapeError, match="q4_k.*40 values.*256-value"):
        get_format("q4_k").quantize(np.zeros((1, 40), np.float32))
    with pytest.raises(ShapeError, match="q4_1.*40 values.*32-value"):
        get_format("q4_1").quantize(np.zeros((1, 40), np.float32))
    with pytest.raises(FormatError, match="q5_0.*finite"):
        get_format("q5_0").quantize(np.full((1, 32), np.nan, np.float32))
    with pytest.raises(DTypeError, match="q5_1.*2-D float"):
        get_format("q5_1").quantize(np.zeros((1, 32), np.int32))
