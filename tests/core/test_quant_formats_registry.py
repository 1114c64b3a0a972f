"""The weight-format registry (kael.quant.formats): its rows against the gguf package's tables, and
every format's NumPy reference dequantizer bit-exact against ``gguf.quants.dequantize``."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import DTypeError, FormatError, ShapeError
from kael.quant.formats import BLOCK_FORMATS, FORMATS, by_ggml_type, get_format

# Half-precision scales worth hitting: zero, signed zero, subnormal, tiny, one, odd, largest, inf, NaN.
_ODD_HALVES = np.array([0.0, -0.0, 6e-8, -6e-8, 1e-4, 1.0, -1.0, 0.333, 65504.0, -65504.0, np.inf, np.nan], "<f2")
# Byte offsets of the float16 scales in each block format.
_SCALE_AT = {
    "q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q2_k": (80, 82),
    "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "iq4_nl": (0,), "iq4_xs": (0,),
}  # fmt: skip


def _ggml(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name.upper()]


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_rows_match_gguf_tables() -> None:
    assert set(FORMATS) == {
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
        "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs",
    }  # fmt: skip
    for name, fmt in FORMATS.items():
        t = _ggml(name)
        assert fmt.ggml_type == t.value
        assert (fmt.block_values, fmt.block_bytes) == gguf.GGML_QUANT_SIZES[t]
        assert by_ggml_type(t.value) is fmt
        assert fmt.head in FORMATS
    assert set(BLOCK_FORMATS) == set(_SCALE_AT)


def test_unknown_names_and_types_are_refused() -> None:
    with pytest.raises(DTypeError, match="'q4_2'.*q4_k_m|'q4_2'.*iq4_xs"):
        get_format("q4_2")
    with pytest.raises(DTypeError):
        get_format(None)
    with pytest.raises(FormatError, match=r"GGML type 16 .*14 \(q6_k\)"):
        by_ggml_type(16)  # IQ2_XXS


def _blocks(data: st.DataObject, name: str, n: int) -> np.ndarray:
    fmt = FORMATS[name]
    raw = np.frombuffer(data.draw(st.binary(min_size=n * fmt.block_bytes, max_size=n * fmt.block_bytes)), np.uint8)
    blocks = raw.reshape(n, fmt.block_bytes).copy()
    for at in _SCALE_AT[name]:  # mostly finite scales, sometimes an odd one
        pick = data.draw(st.lists(st.integers(0, len(_ODD_HALVES) + 3), min_size=n, max_size=n))
        for i, p in enumerate(pick):
            if p < len(_ODD_HALVES):
                blocks[i, at : at + 2] = _ODD_HALVES[p : p + 1].view(np.uint8)
            else:
                blocks[i, at : at + 2] = np.float16(data.draw(st.floats(-4.0, 4.0, width=16))).reshape(1).view(np.uint8)
    return blocks


@pytest.mark.parametrize("name", BLOCK_FORMATS)
@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 5))
def test_dequantize_bit_exact_against_gguf(name: str, data: st.DataObject, n: int) -> None:
    fmt = FORMATS[name]
    blocks = _blocks(data, name, n)
    with np.errstate(invalid="ignore", over="ignore"):
        want = gguf_dequantize(blocks.reshape(-1), _ggml(name)).reshape(n, fmt.block_values)
    _same_bits(fmt.dequantize(blocks.reshape(1, -1), n * fmt.block_values).reshape(n, -1), want)


@pytest.mark.parametrize("name", BLOCK_FORMATS)
def test_every_byte_value_in_every_position(name: str) -> None:
    """256 blocks: block b holds byte (b + i) % 256 at every position i (all nibble and bit patterns)."""
    fmt = FORMATS[name]
    b = np.arange(256)[:, None]
    blocks = ((b + np.arange(fmt.block_bytes)[None, :]) % 256).astype(np.uint8)
    for at in _SCALE_AT[name]:
        blocks[:, at : at + 2] = np.float16(0.0371).reshape(1).view(np.uint8)  # an odd finite scale
    want = gguf_dequantize(blocks.reshape(-1), _ggml(name)).reshape(256, fmt.block_values)
    _same_bits(fmt.dequantize(blocks, fmt.block_values), want)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_float_formats(name: str) -> None:
    fmt = FORMATS[name]
    rng = np.random.default_rng(1)
    values = rng.standard_normal((3, 8)).astype(np.float32)
    raw = {"f32": values, "f16": values.astype(np.float16), "bf16": gguf.quants.quantize(values, _ggml("bf16"))}[name]
    want = gguf_dequantize(raw, _ggml(name))
    _same_bits(fmt.dequantize(np.ascontiguousarray(raw).view(np.uint8).reshape(3, -1), 8), want)


def test_row_rules() -> None:
    q4k = get_format("q4_k")
    with pytest.raises(ShapeError, match="q4_k.*100 values.*256-value"):
        q4k.row_bytes(100)
    assert q4k.row_bytes(512) == 288
    with pytest.raises(FormatError, match="q4_k: a row of 256 values takes 144 bytes.*got 143"):
        q4k.dequantize(np.zeros((2, 143), np.uint8), 256)
    with pytest.raises(DTypeError, match="q4_k"):
        q4k.dequantize(np.zeros((2, 144), np.int8), 256)
