"""kael's K-quant and IQ4 reference quantizers (kael.quant.formats.REFERENCE_QUANTIZERS) against
ggml's own C quantizers: ``ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, imatrix=NULL)``
from the ``libggml-base.so`` that llama-cpp-python ships (the code ``llama-quantize`` runs without an
importance matrix), byte for byte over hypothesis-drawn float32 rows; the round trip through the
registry's dequantizers (bit-exact with ``gguf.quants``) stays within each format's error."""

from __future__ import annotations

import ctypes
from typing import Any

import gguf
import llama_cpp_tools
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from kael.quant.formats import REFERENCE_QUANTIZERS, get_format

NAMES = [n for n in REFERENCE_QUANTIZERS if get_format(n).family in ("k-quant", "iq4")]
"""The K-quant and IQ4 quantizers. The legacy ones (q8_0, q4_0, q4_1, q5_0, q5_1) equal ``gguf.quants.quantize``
(tests/core/test_quant_formats_quantize.py), which differs from ggml's C code in one case: the sign of a
zero scale (a block whose values are all zero, or a q4_1/q5_1 minimum of -0.0), which decodes alike."""

_LIB: Any = None


def _ggml() -> Any:
    """ggml's base library with ``ggml_quantize_chunk`` declared; skips when llama_cpp is absent."""
    global _LIB
    if _LIB is None:
        lib = llama_cpp_tools.ggml_library("libggml-base.so")
        i64, p = ctypes.c_int64, ctypes.c_void_p
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, i64, i64, i64, p]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, i64]
        _LIB = lib
    return _LIB


def ggml_quantize(name: str, x: np.ndarray) -> np.ndarray:
    """ggml's bytes [N, row_bytes] of float32 rows `x` [N, K] in format `name` (no importance matrix)."""
    lib = _ggml()
    t = int(gguf.GGMLQuantizationType[name.upper()])
    src = np.ascontiguousarray(x, dtype=np.float32)
    n, k = src.shape
    out = np.zeros((n, lib.ggml_row_size(t, k)), np.uint8)
    written = lib.ggml_quantize_chunk(t, src.ctypes.data, out.ctypes.data, 0, n, k, None)
    assert written == out.size
    return out


def kael_quantize(name: str, x: np.ndarray) -> np.ndarray:
    """kael's reference quantizer of `name` on rows `x` [N, K] (blocks taken along each row)."""
    fmt = get_format(name)
    blocks = REFERENCE_QUANTIZERS[name](np.ascontiguousarray(x, np.float32).reshape(-1, fmt.block_values))
    assert blocks.dtype == np.uint8 and blocks.shape[1] == fmt.block_bytes
    return blocks.reshape(x.shape[0], -1)


_scale = st.sampled_from([1.0, 1e-3, 1e3, 1e-20, 1e20, 1e-38])


@st.composite
def _rows(draw: Any) -> np.ndarray:
    """1-3 rows of 256 or 512 values: normal, uniform, sparse, constant, tiny/huge and float32-extreme blocks."""
    n, k = draw(st.integers(1, 3)), draw(st.sampled_from([256, 512]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kinds = ["normal", "uniform", "positive", "sparse", "constant", "outlier", "mixed", "extreme", "wild"]
    kind = draw(st.sampled_from(kinds))
    x = rng.standard_normal((n, k))
    if kind == "uniform":
        x = rng.uniform(-1, 1, (n, k))
    elif kind == "positive":
        x = np.abs(x) + draw(st.sampled_from([0.0, 0.5, 3.0]))
    elif kind == "sparse":
        x[rng.random((n, k)) < draw(st.sampled_from([0.5, 0.9, 1.0]))] = 0.0
    elif kind == "constant":
        x = np.full((n, k), draw(st.sampled_from([0.0, -0.0, 1.0, -2.5, 7e-3])))
    elif kind == "outlier":
        x[:, rng.integers(0, k, 3)] *= 100.0
    elif kind == "mixed":  # blocks of very different magnitudes, some zero, in one row
        x *= 10.0 ** rng.integers(-6, 6, (n, k // 32, 1)).repeat(32, axis=2).reshape(n, k)
        x[:, 32:64] = 0.0
    elif kind == "extreme":  # float32's largest and smallest (denormal) magnitudes, where the sums overflow
        x = rng.choice([0.0, 3.4e38, -3.4e38, 1e-45, -1e-45, 1.0, 3e30], (n, k))
    elif kind == "wild":  # every value its own magnitude, 1e-40 .. 1e38
        x = x * 10.0 ** rng.integers(-40, 39, (n, k))
    if kind not in ("extreme", "wild"):
        x = x * draw(_scale)
    with np.errstate(over="ignore"):
        v = x.astype(np.float32)
    return np.where(np.isfinite(v), v, np.float32(0))


_extra = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 2), st.just(256)),
    elements=st.one_of(
        st.floats(-1e4, 1e4, width=32),
        st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, -8.0, 1e-30, -1e-38, 1e-45, 3e30, -3e30]),
    ),
)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(x=_rows())
def test_byte_exact_against_ggml(name: str, x: np.ndarray) -> None:
    np.testing.assert_array_equal(kael_quantize(name, x), ggml_quantize(name, x))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(x=_extra)
def test_byte_exact_against_ggml_on_drawn_values(name: str, x: np.ndarray) -> None:
    """Element-wise drawn values: ties, signed zeros, denormals and values near float32's range."""
    np.testing.assert_array_equal(kael_quantize(name, x), ggml_quantize(name, x))


@pytest.mark.parametrize("name", NAMES)
def test_byte_exact_on_a_weight_like_matrix(name: str) -> None:
    """A 64 x 1024 matrix of Gaussian rows with per-row scales and a few outlier columns (as trained weights)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 1024)) * rng.uniform(0.005, 0.2, (64, 1))
    x[:, rng.integers(0, 1024, 8)] *= 12.0
    x = x.astype(np.float32)
    np.testing.assert_array_equal(kael_quantize(name, x), ggml_quantize(name, x))


@pytest.mark.parametrize("name", NAMES)
def test_blocks_are_independent(name: str) -> None:
    """Quantizing blocks together (vectorized) equals quantizing each block alone."""
    fmt = get_format(name)
    x = (np.random.default_rng(2).standard_normal((6, fmt.block_values)) * [[1e-3], [1], [5], [0], [1e3], [2]]).astype(
        np.float32
    )
    together = REFERENCE_QUANTIZERS[name](x)
    alone = np.concatenate([REFERENCE_QUANTIZERS[name](x[i : i + 1]) for i in range(len(x))])
    np.testing.assert_array_equal(together, alone)


@pytest.mark.parametrize("name", NAMES)
def test_runs_of_blocks_equal_the_whole(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large inputs are quantized in runs of blocks (bounded temporaries): the bytes do not change."""
    from kael.quant.formats import _kquants_search

    fmt = get_format(name)
    x = (np.random.default_rng(4).standard_normal((13, fmt.block_values)) * 0.1).astype(np.float32)
    whole = REFERENCE_QUANTIZERS[name](x)
    monkeypatch.setattr(_kquants_search, "_CHUNK_VALUES", 3 * fmt.block_values)
    np.testing.assert_array_equal(REFERENCE_QUANTIZERS[name](x), whole)


# Largest measured RMS error relative to the RMS of Gaussian weights, with headroom (ggml's own
# quantizers give the same bytes, so these bound ggml's error too): 2-bit 0.38, 3-bit 0.20, ...
_RMS_BOUND = {"q2_k": 0.45, "q3_k": 0.25, "q4_k": 0.12, "q5_k": 0.06, "q6_k": 0.03, "iq4_nl": 0.12, "iq4_xs": 0.12}


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_error(name: str) -> None:
    """dequantize(quantize(x)) (the registry's dequantizer, checked against gguf.quants) is within the format's error."""
    fmt = get_format(name)
    x = np.random.default_rng(7).standard_normal((32, 512)).astype(np.float32)
    q = kael_quantize(name, x)
    back = fmt.dequantize(q, 512)
    np.testing.assert_array_equal(back, gguf_dequantize(q, gguf.GGMLQuantizationType[name.upper()]))
    rel = float(np.sqrt(np.mean((back - x) ** 2) / np.mean(x**2)))
    assert 0 < rel <= _RMS_BOUND[name]
    # no value moves by more than the block's largest magnitude (a wrong level would)
    blocks = x.reshape(-1, fmt.block_values)
    err = np.abs(back.reshape(blocks.shape) - blocks)
    assert np.all(err <= np.max(np.abs(blocks), axis=1, keepdims=True))


@pytest.mark.parametrize("name", NAMES)
def test_zero_and_constant_blocks(name: str) -> None:
    """An all-zero block decodes to zeros; a constant block decodes close to its value."""
    fmt = get_format(name)
    x = np.zeros((2, 256), np.float32)
    x[1] = 0.75
    back = fmt.dequantize(kael_quantize(name, x), 256)
    assert np.all(back[0] == 0)
    np.testing.assert_allclose(back[1], 0.75, rtol=0.05)
