"""Every block format of the cuda backend (legacy, K-quants, IQ4) in host emulation.

Oracles: ``gguf.quants.dequantize`` (llama.cpp's own Python dequantizer) for the values,
float64 NumPy products for ``quantized_linear``, kael's format registry for the table of
schemes. The CUDA C of every decoder is run on the host against gguf in ``test_quant.py``
(``test_cuda_dequantize_source_run_on_the_host``); here the emulated backend, its two
``quantized_linear`` paths and the launches a GPU would get are checked.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kael_backend_cuda import _quant

gguf = pytest.importorskip("gguf")
BLOCK_SCHEMES = tuple(_quant.BLOCK_BYTES)
# byte offsets of each format's float16 scales (d, and dmin / m where it has one)
HALVES = {
    "q8_0": (0,),
    "q4_0": (0,),
    "q4_1": (0, 2),
    "q5_0": (0,),
    "q5_1": (0, 2),
    "q2_k": (80, 82),
    "q3_k": (108,),
    "q4_k": (0, 2),
    "q5_k": (0, 2),
    "q6_k": (208,),
    "iq4_nl": (0,),
    "iq4_xs": (0,),
}
SCALES = [0.0, -0.0, 6e-8, -3e-6, 1e-4, 0.0123, -0.5, 1.5, 60000.0]  # zero, subnormal, normal, large


def _ggml(scheme: str) -> Any:
    return gguf.GGMLQuantizationType[scheme.upper()]


def _random_blocks(rng: np.random.Generator, scheme: str, n: int, k: int, scales: list[float] = SCALES) -> np.ndarray:
    """uint8 [n, k/V*B] of random bytes whose float16 scales are drawn from `scales` (finite)."""
    v, b = _quant.BLOCK_VALUES[scheme], _quant.BLOCK_BYTES[scheme]
    raw = rng.integers(0, 256, (n * (k // v), b), dtype=np.uint8)
    for at in HALVES[scheme]:
        d = rng.choice(scales, size=len(raw)).astype("<f2")
        raw[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n, -1)


def _oracle(raw: np.ndarray, scheme: str, k: int) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(gguf.quants.dequantize(raw, _ggml(scheme)), np.float32).reshape(raw.shape[0], k)


def _cuda(a: np.ndarray) -> kael.Tensor:
    return kael.tensor(a, dtype=kael.uint8 if a.dtype == np.uint8 else kael.float32, device="cuda")


def _qlinear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, scheme: str, n: int) -> np.ndarray:
    out = kael.empty(*x.shape[:-1], n, dtype=kael.float32, device="cuda")
    b = _cuda(bias) if bias is not None else None
    kael.backends.current("cuda").kernel("quantized_linear")(out, _cuda(x), _cuda(w), b, scheme)
    return out.cpu().numpy()


def _assert_close_to_float64(got: np.ndarray, x: np.ndarray, wf: np.ndarray, bias: np.ndarray | None) -> None:
    """|got - x @ W.T (+ bias)| within float32 rounding of a K-term sum, computed in float64."""
    x64, w64 = x.astype(np.float64), wf.astype(np.float64)
    want = x64 @ w64.T + (bias if bias is not None else 0.0)
    bound = 4e-6 * x.shape[-1] ** 0.5 * (np.abs(x64) @ np.abs(w64).T) + 1e-6 * np.abs(want) + 1e-30
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


# -- the table ------------------------------------------------------------------------------------
def test_every_registry_format_is_served():
    """QUANT_SCHEMES: every block format of kael's registry plus the 16-bit ones, sizes from the registry
    (and those equal gguf's GGML_QUANT_SIZES)."""
    from kael.quant.formats import BLOCK_FORMATS, FORMATS

    assert set(_quant.QUANT_SCHEMES) == {*BLOCK_FORMATS, "bf16", "f16"}
    assert list(_quant.SCHEME_CODES) == list(_quant.QUANT_SCHEMES)
    assert sorted(_quant.SCHEME_CODES.values()) == list(range(len(_quant.QUANT_SCHEMES)))
    for s in BLOCK_FORMATS:
        assert (_quant.BLOCK_VALUES[s], _quant.BLOCK_BYTES[s]) == gguf.GGML_QUANT_SIZES[_ggml(s)]
        assert _quant.BLOCK_BYTES[s] == FORMATS[s].block_bytes
        assert f"kael_dequantize_{s}" in _quant.QUANT_KERNEL_NAMES


# -- dequantize -----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    scheme=st.sampled_from(BLOCK_SCHEMES),
    n=st.integers(1, 4),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_blocks_equal_gguf(scheme, n, blocks, seed):
    from kael_backend_cuda import _xp

    k = _quant.BLOCK_VALUES[scheme] * blocks
    raw = _random_blocks(np.random.default_rng(seed), scheme, n, k)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_xp, "_state", _xp._State(np, True, True, "", 1))
        out = np.empty(n * k, np.float32)
        _quant.dequantize_blocks(raw.reshape(-1), out, scheme)
    np.testing.assert_array_equal(out.reshape(n, k), _oracle(raw, scheme, k))


@pytest.mark.parametrize("scheme", BLOCK_SCHEMES)
def test_dequantize_op_equals_gguf_any_bytes(emulate, scheme):
    """The backend's dequantize op on wholly random bytes (inf/NaN scales as they fall), into a
    contiguous and a strided output."""
    k = 2 * _quant.BLOCK_VALUES[scheme]
    raw = np.random.default_rng(1).integers(0, 256, (5, k // _quant.BLOCK_VALUES[scheme] * _quant.BLOCK_BYTES[scheme]))
    raw = raw.astype(np.uint8)
    want = _oracle(raw, scheme, k)
    dq = kael.backends.current("cuda").kernel("dequantize")
    out = kael.empty(5, k, dtype=kael.float32, device="cuda")
    dq(out, _cuda(raw), scheme)
    np.testing.assert_array_equal(out.cpu().numpy(), want)
    big = kael.zeros(k, 10, dtype=kael.float32, device="cuda")
    dq(big.T[::2], _cuda(raw), scheme)  # [5, k] with strides (2, 10)
    np.testing.assert_array_equal(big.cpu().numpy().T[::2], want)
    assert (big.cpu().numpy().T[1::2] == 0).all()


# -- quantized_linear -----------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", BLOCK_SCHEMES)
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
def test_quantized_linear_against_float64(emulate, scheme, rows):
    """Both paths (the few-row kernel up to 16 rows, dequantize + matmul beyond) against float64."""
    rng = np.random.default_rng(rows)
    n, k = 24, 2 * _quant.BLOCK_VALUES[scheme]
    raw = _random_blocks(rng, scheme, n, k, [0.01, -0.002, 0.05, 6e-8])
    x = rng.standard_normal((rows, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    wf = _oracle(raw, scheme, k)
    _assert_close_to_float64(_qlinear(x, raw, bias, scheme, n), x, wf, bias)
    _assert_close_to_float64(_qlinear(x.reshape(1, rows, k), raw, None, scheme, n)[0], x, wf, None)


@pytest.mark.parametrize("scheme", BLOCK_SCHEMES)
def test_rows_batched_are_bit_identical_alone(emulate, scheme):
    """Up to FEW_ROWS rows (decode, batched decode): each row's output equals the row alone bit for bit,
    in any batch size and position."""
    rng = np.random.default_rng(2)
    n, k = 40, 2 * _quant.BLOCK_VALUES[scheme]
    raw = _random_blocks(rng, scheme, n, k, [0.01, -0.002, 0.05])
    x = rng.standard_normal((_quant.FEW_ROWS, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    alone = np.stack([_qlinear(x[i : i + 1], raw, bias, scheme, n)[0] for i in range(len(x))])
    for size in (2, 3, 7, _quant.FEW_ROWS):
        for start in (0, _quant.FEW_ROWS - size):
            got = _qlinear(x[start : start + size], raw, bias, scheme, n)
            np.testing.assert_array_equal(got, alone[start : start + size])


@pytest.mark.parametrize("scheme", ["q4_k", "q5_1", "iq4_xs", "bf16"])
def test_many_rows_agree_with_rows_alone(emulate, scheme):
    """Beyond FEW_ROWS (prefill) the dequantize + matmul path: each row agrees with itself alone to float32
    rounding (cuBLAS picks its algorithm by shape, so bit identity is not promised there)."""
    rng = np.random.default_rng(3)
    n = 32
    if scheme == "bf16":
        k = 96
        w = rng.standard_normal((n, k)).astype(np.float32)
        w = (w.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # exactly bfloat16
        weight: Any = kael.tensor(w, dtype=kael.bfloat16, device="cuda")
        wf = w
    else:
        k = 2 * _quant.BLOCK_VALUES[scheme]
        raw = _random_blocks(rng, scheme, n, k, [0.01, -0.002])
        weight, wf = _cuda(raw), _oracle(raw, scheme, k)
    x = rng.standard_normal((_quant.FEW_ROWS + 9, k)).astype(np.float32)
    ql = kael.backends.current("cuda").kernel("quantized_linear")
    out = kael.empty(len(x), n, dtype=kael.float32, device="cuda")
    ql(out, _cuda(x), weight, None, scheme)
    many = out.cpu().numpy()
    _assert_close_to_float64(many, x, wf, None)
    one = kael.empty(1, n, dtype=kael.float32, device="cuda")
    for i in (0, 11, len(x) - 1):
        ql(one, _cuda(x[i : i + 1]), weight, None, scheme)
        np.testing.assert_allclose(many[i], one.cpu().numpy()[0], rtol=1e-5, atol=1e-5 * np.abs(wf).max())


@settings(max_examples=40, deadline=None)
@given(
    scheme=st.sampled_from(BLOCK_SCHEMES),
    rows=st.integers(1, 40),
    n=st.integers(1, 20),
    blocks=st.integers(1, 2),
    bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_quantized_linear_property(scheme, rows, n, blocks, bias, seed):
    """Any shape, either path: float64's answer within float32 rounding; a row of a few-row batch is
    bit for bit the row alone."""
    from kael_backend_cuda import _xp

    rng = np.random.default_rng(seed)
    k = blocks * _quant.BLOCK_VALUES[scheme]
    raw = _random_blocks(rng, scheme, n, k, [0.01, -0.002, 6e-8, 0.0])
    x = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_xp, "_state", _xp._State(np, True, True, "", 1))
        w = np.ascontiguousarray(raw)
        out = np.empty((rows, n), np.float32)
        if rows <= _quant.FEW_ROWS:
            _quant.qlinear_rows(x, w, b, out, scheme, w.shape[1])
            one = np.empty((1, n), np.float32)
            _quant.qlinear_rows(x[-1:], w, b, one, scheme, w.shape[1])
            np.testing.assert_array_equal(one[0], out[-1])
        else:
            _quant.gemm_rows(x, w, b, out, scheme)
    _assert_close_to_float64(out, x, _oracle(raw, scheme, k), b)


def test_many_rows_in_column_chunks(emulate, monkeypatch):
    """The many-row path holds at most SCRATCH_VALUES dequantized values: chunked, the same answer."""
    rng = np.random.default_rng(4)
    n, k = 30, 256
    raw = _random_blocks(rng, "q6_k", n, k, [0.01, -0.003])
    x = rng.standard_normal((20, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    whole = _qlinear(x, raw, bias, "q6_k", n)
    monkeypatch.setattr(_quant, "SCRATCH_VALUES", 7 * k)  # 5 chunks: 7, 7, 7, 7, 2 columns
    chunked = _qlinear(x, raw, bias, "q6_k", n)
    _assert_close_to_float64(chunked, x, _oracle(raw, "q6_k", k), bias)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-5)


def test_gemm_launches_a_dequantize_per_column_chunk(monkeypatch):
    """On "a GPU" (NumPy arrays, emulation off) the many-row path launches the format's dequantize kernel
    once per column chunk, over exactly that chunk's values."""
    from kael_backend_cuda import _xp

    launches: list[tuple[str, tuple[int, ...], tuple[Any, ...]]] = []
    monkeypatch.setattr(_xp, "_state", _xp._State(np, False, True, "", 1, None))

    def launch(name: str) -> Any:
        def run(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
            launches.append((name, grid, args))
            args[1][...] = 0.0  # what the kernel makes of zero bytes

        return run

    monkeypatch.setattr(_quant, "_kernel", launch)
    monkeypatch.setattr(_quant, "SCRATCH_VALUES", 3 * 256)
    n, k = 7, 256
    w = np.zeros((n, _quant.BLOCK_BYTES["q3_k"]), np.uint8)
    out = np.full((20, n), np.nan, np.float32)
    _quant.gemm_rows(np.ones((20, k), np.float32), w, None, out, "q3_k")
    assert (out == 0).all()  # every column written
    assert [name for name, _, _ in launches] == ["kael_dequantize_q3_k"] * 3
    assert [int(a[2]) for _, _, a in launches] == [3 * k, 3 * k, 1 * k]
    assert [a[0].size for _, _, a in launches] == [3 * 110, 3 * 110, 110]


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["q2_k", "q4_k", "iq4_xs", "q5_0", "iq4_nl"])
def test_shape_errors_name_the_block_size(emulate, scheme):
    v, b = _quant.BLOCK_VALUES[scheme], _quant.BLOCK_BYTES[scheme]
    dq = kael.backends.current("cuda").kernel("dequantize")
    w = kael.zeros(2, b, dtype=kael.uint8, device="cuda")
    with pytest.raises(kael.ShapeError, match=f"{scheme} needs K a multiple of {v}, got K = {v + 16}"):
        dq(kael.empty(2, v + 16, device="cuda"), w, scheme)
    with pytest.raises(kael.ShapeError, match=rf"has shape \[2, {2 * b}\], got \[2, {b}\]"):
        dq(kael.empty(2, 2 * v, device="cuda"), w, scheme)
    with pytest.raises(kael.DTypeError, match=f"a {scheme} weight is uint8 blocks, got dtype float32"):
        dq(kael.empty(2, v, device="cuda"), kael.zeros(2, b, device="cuda"), scheme)


def test_unknown_scheme_names_the_served_ones(emulate):
    with pytest.raises(kael.KaelError, match=r"'q1_0' is not a weight format of the cuda backend.*'iq4_xs'"):
        kael.backends.current("cuda").kernel("quantized_linear")(
            kael.empty(1, 2, device="cuda"), kael.empty(1, 32, device="cuda"), kael.zeros(2, 18), None, "q1_0"
        )
