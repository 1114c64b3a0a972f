"""The cuda backend's weight-format kernels (``dequantize``, ``quantized_linear``) in host emulation.

Oracles: the ``gguf`` package (llama.cpp's own Python quantizer and dequantizer) for the
block formats, NumPy's float16 and PyTorch's bfloat16 for the 16-bit formats, float64
NumPy products for ``quantized_linear``. The CUDA C source is compiled with nvcc to PTX
for sm_80 and sm_90, and its dequantize kernels are also run on the host (the source
compiled by g++ with the CUDA keywords defined away, one loop iteration per thread), so
the code a GPU would run is executed here too, against the same oracle.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kael_backend_cuda import _quant

gguf = pytest.importorskip("gguf")
GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
BLOCK_SCHEMES = ("q8_0", "q4_0")
SCHEMES = ("q8_0", "q4_0", "bf16", "f16")


# -- helpers --------------------------------------------------------------------------------------
def _weight(scheme: str, a: np.ndarray) -> tuple[kael.Tensor, np.ndarray]:
    """(the cuda weight tensor of float32 a [N, K] in scheme, its exact float32 values by the oracle)."""
    if scheme in BLOCK_SCHEMES:
        blocks = np.asarray(gguf.quants.quantize(a, GGML[scheme]))
        want = np.asarray(gguf.quants.dequantize(blocks, GGML[scheme]), np.float32).reshape(a.shape)
        return kael.tensor(blocks, dtype=kael.uint8, device="cuda"), want
    if scheme == "f16":
        h = a.astype(np.float16)
        return kael.tensor(h, dtype=kael.float16, device="cuda"), h.astype(np.float32)
    torch = pytest.importorskip("torch")
    b = torch.from_numpy(a).to(torch.bfloat16)
    want = b.float().numpy()
    return kael.tensor(want, dtype=kael.bfloat16, device="cuda"), want  # want is exactly bfloat16: no rounding


def _random_blocks(rng: np.random.Generator, scheme: str, n: int, k: int) -> np.ndarray:
    """uint8 [n, k/32*B] of random bytes with finite scales (normal, subnormal, zero, negative)."""
    nb = _quant.BLOCK_BYTES[scheme]
    raw = rng.integers(0, 256, (n, k // 32, nb), dtype=np.uint8)
    d = rng.choice([0.0, 1e-7, -3e-6, 0.0123, -1.5, 60000.0], size=(n, k // 32)).astype("<f2")
    raw[..., :2] = d.view(np.uint8).reshape(n, k // 32, 2)
    return raw.reshape(n, -1)


def _dequantize(w: kael.Tensor, scheme: str, k: int) -> np.ndarray:
    out = kael.empty(w.shape[0], k, dtype=kael.float32, device="cuda")
    kael.backends.current("cuda").kernel("dequantize")(out, w, scheme)
    return out.cpu().numpy()


def _qlinear(x: kael.Tensor, w: kael.Tensor, bias: kael.Tensor | None, scheme: str, n: int) -> np.ndarray:
    out = kael.empty(*x.shape[:-1], n, dtype=kael.float32, device="cuda")
    kael.backends.current("cuda").kernel("quantized_linear")(out, x, w, bias, scheme)
    return out.cpu().numpy()


# -- dequantize -----------------------------------------------------------------------------------
def test_the_backend_serves_both_ops(emulate):
    assert {"dequantize", "quantized_linear"} <= emulate.supported_ops()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_matches_the_oracle_bit_for_bit(emulate, scheme):
    a = np.random.default_rng(0).standard_normal((5, 96)).astype(np.float32) * 3
    w, want = _weight(scheme, a)
    np.testing.assert_array_equal(_dequantize(w, scheme, 96), want)


@pytest.mark.parametrize("scheme", BLOCK_SCHEMES)
def test_dequantize_arbitrary_bytes_like_gguf(emulate, scheme):
    raw = _random_blocks(np.random.default_rng(1), scheme, 4, 128)
    want = np.asarray(gguf.quants.dequantize(raw, GGML[scheme]), np.float32).reshape(4, 128)
    got = _dequantize(kael.tensor(raw, dtype=kael.uint8, device="cuda"), scheme, 128)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scheme", BLOCK_SCHEMES)
def test_dequantize_matches_kael_quant(emulate, scheme):
    quant = pytest.importorskip("kael.quant")
    a = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    blocks = quant.quantize_array(a, scheme)
    got = _dequantize(kael.tensor(blocks, dtype=kael.uint8, device="cuda"), scheme, 64)
    np.testing.assert_array_equal(got, quant.dequantize_array(blocks, scheme, 64))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_strided_weight_and_output(emulate, scheme):
    a = np.random.default_rng(3).standard_normal((6, 64)).astype(np.float32)
    w, want = _weight(scheme, a)
    wv = w[::2]  # every other row: a non-contiguous weight
    big = kael.zeros(64, 6, dtype=kael.float32, device="cuda")
    out = big.T[:3]  # [3, 64] with strides (1, 6)
    kael.backends.current("cuda").kernel("dequantize")(out, wv, scheme)
    np.testing.assert_array_equal(out.cpu().numpy(), want[::2])
    assert (big.cpu().numpy()[:, 3:] == 0).all()  # nothing written outside the view


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_empty(emulate, scheme):
    a = np.zeros((0, 32), np.float32)
    if scheme in BLOCK_SCHEMES:
        w = kael.zeros(0, _quant.BLOCK_BYTES[scheme], dtype=kael.uint8, device="cuda")
    else:
        w = kael.zeros(0, 32, dtype=kael.float16 if scheme == "f16" else kael.bfloat16, device="cuda")
    assert _dequantize(w, scheme, 32).shape == a.shape


def test_dequantize_special_scales(emulate):
    """Scales that are infinite, NaN, subnormal or negative zero decode as IEEE half says (NumPy)."""
    scales = np.array([np.inf, -np.inf, np.nan, 6e-8, -0.0, 65504.0], "<f2")
    raw = np.zeros((1, 6, 34), np.uint8)
    raw[0, :, :2] = scales.view(np.uint8).reshape(6, 2)
    raw[0, :, 2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    got = _dequantize(kael.tensor(raw.reshape(1, -1), dtype=kael.uint8, device="cuda"), "q8_0", 192)
    with np.errstate(invalid="ignore"):
        want = (scales.astype(np.float32)[:, None] * np.arange(-16, 16, dtype=np.float32)).reshape(1, -1)
    np.testing.assert_array_equal(got, want)  # NaN compares equal to NaN here; inf * 0 is NaN in both


@settings(max_examples=25, deadline=None)
@given(
    scheme=st.sampled_from(BLOCK_SCHEMES),
    n=st.integers(1, 5),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_property(scheme, n, blocks, seed):
    from kael_backend_cuda import _xp

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_xp, "_state", _xp._State(np, True, True, "", 1))
        raw = _random_blocks(np.random.default_rng(seed), scheme, n, 32 * blocks)
        out = np.empty(n * 32 * blocks, np.float32)
        _quant.dequantize_blocks(raw.reshape(-1), out, scheme)
    want = np.asarray(gguf.quants.dequantize(raw, GGML[scheme]), np.float32).reshape(-1)
    np.testing.assert_array_equal(out, want)


# -- quantized_linear -----------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_quantized_linear_against_float64(emulate, scheme, with_bias):
    rng = np.random.default_rng(4)
    n, k = 7, 64 if scheme in BLOCK_SCHEMES else 40  # 16-bit schemes take any K
    a = rng.standard_normal((n, k)).astype(np.float32)
    w, wf = _weight(scheme, a)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    bias = kael.tensor(b, device="cuda") if with_bias else None
    got = _qlinear(kael.tensor(x, device="cuda"), w, bias, scheme, n)
    want = x.astype(np.float64) @ wf.astype(np.float64).T + (b if with_bias else 0)
    assert got.shape == (2, 3, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_row_is_the_same_alone_and_batched(emulate, scheme):
    """The op's contract: batched decode gives each row exactly what it gets alone."""
    rng = np.random.default_rng(5)
    n, k = 48, 256
    w, _ = _weight(scheme, rng.standard_normal((n, k)).astype(np.float32))
    bias = kael.tensor(rng.standard_normal(n).astype(np.float32), device="cuda")
    x = rng.standard_normal((9, k)).astype(np.float32)
    batched = _qlinear(kael.tensor(x, device="cuda"), w, bias, scheme, n)
    for i in (0, 4, 8):
        alone = _qlinear(kael.tensor(x[i : i + 1], device="cuda"), w, bias, scheme, n)
        np.testing.assert_array_equal(alone[0], batched[i])


def test_quantized_linear_strided_operands(emulate):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((10, 64)).astype(np.float32)
    w, wf = _weight("q8_0", a)
    xs = rng.standard_normal((64, 4)).astype(np.float32)
    x = kael.tensor(xs, device="cuda").T  # [4, 64], non-contiguous
    big = kael.zeros(10, 8, dtype=kael.float32, device="cuda")
    out = big.T[::2]  # [4, 10], non-contiguous
    kael.backends.current("cuda").kernel("quantized_linear")(out, x, w, None, "q8_0")
    np.testing.assert_allclose(out.cpu().numpy(), xs.T.astype(np.float64) @ wf.T, rtol=1e-5, atol=1e-5)
    assert (big.cpu().numpy()[:, 1::2] == 0).all()


def test_quantized_linear_empty_rows_and_k_zero(emulate):
    w, _ = _weight("q4_0", np.ones((3, 32), np.float32))
    assert _qlinear(kael.zeros(0, 32, device="cuda"), w, None, "q4_0", 3).shape == (0, 3)
    bias = kael.tensor([1.0, 2.0], device="cuda")
    w0 = kael.zeros(2, 0, dtype=kael.float16, device="cuda")
    np.testing.assert_array_equal(_qlinear(kael.zeros(3, 0, device="cuda"), w0, bias, "f16", 2), [[1, 2]] * 3)


def test_quantized_linear_through_the_frontend(emulate):
    """kael.ops.quantized_linear on cuda dispatches to this backend's kernel (once kael.quant has landed)."""
    ops = kael.ops
    if not hasattr(ops, "quantized_linear"):
        pytest.skip("kael.ops.quantized_linear is not in this tree yet")
    rng = np.random.default_rng(7)
    w, wf = _weight("q4_0", rng.standard_normal((5, 64)).astype(np.float32))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: (seen.append(op), k)[1])
    try:
        y = ops.quantized_linear(kael.tensor(x, device="cuda"), w, None, "q4_0")
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert "quantized_linear" in seen and "matmul" not in seen, seen
    np.testing.assert_allclose(y.cpu().numpy(), x.astype(np.float64) @ wf.T, rtol=1e-5, atol=1e-5)


# -- bad input --------------------------------------------------------------------------------------
def test_bad_operands_are_clear_errors(emulate):
    k = kael.backends.current("cuda").kernel
    w, _ = _weight("q8_0", np.ones((2, 64), np.float32))
    out = kael.empty(2, 64, device="cuda")
    with pytest.raises(kael.KaelError, match=r"dequantize: scheme 'q1_5' is not a weight format"):
        k("dequantize")(out, w, "q1_5")
    with pytest.raises(
        kael.ShapeError, match=r"q4_0 weight of logical shape \[2, 64\] has shape \[2, 36\], got \[2, 68\]"
    ):
        k("dequantize")(out, w, "q4_0")
    with pytest.raises(kael.ShapeError, match="multiple of 32, got K = 48"):
        k("dequantize")(kael.empty(2, 48, device="cuda"), w, "q8_0")
    with pytest.raises(kael.DTypeError, match="a f16 weight has dtype float16, got uint8"):
        k("dequantize")(out, w, "f16")
    x = kael.ones(3, 64, device="cuda")
    with pytest.raises(kael.ShapeError, match=r"bias must have shape \[2\], got \[3\]"):
        k("quantized_linear")(kael.empty(3, 2, device="cuda"), x, w, kael.ones(3, device="cuda"), "q8_0")
    with pytest.raises(kael.DTypeError, match="x must be float32, got float64"):
        k("quantized_linear")(kael.empty(3, 2, device="cuda"), x.to(dtype=kael.float64), w, None, "q8_0")
    with pytest.raises(kael.ShapeError, match="leading dims"):
        k("quantized_linear")(kael.empty(4, 2, device="cuda"), x, w, None, "q8_0")


# -- the GPU path, without a GPU ------------------------------------------------------------------
_CTYPES = {"int": np.int32, "long long": np.int64}


def _signature(name: str) -> list[str]:
    m = re.search(rf"__global__ void {name}\(([^)]*)\)", _quant.QUANT_KERNELS_SOURCE)
    assert m, name
    return [" ".join(p.replace("__restrict__", "").split()[:-1]) for p in m.group(1).replace("\n", " ").split(",")]


def _check_args(name: str, args: tuple[Any, ...]) -> None:
    params = _signature(name)
    assert len(args) == len(params), (name, params, args)
    for ptype, arg in zip(params, args):
        base = ptype.replace("const", "").strip()
        if base.endswith("*"):
            want = {"float": np.float32, "unsigned char": np.uint8}[base[:-1].strip()]
            assert isinstance(arg, np.ndarray) and arg.dtype == want and arg.flags.c_contiguous, (name, ptype)
        else:
            assert type(arg) is _CTYPES[base], (name, ptype, type(arg))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_launches_match_the_cuda_signatures(monkeypatch, scheme):
    """On "a GPU" (NumPy arrays, emulation off) every launch passes what the CUDA kernel declares, over
    a grid that covers the outputs; rows beyond gridDim.y's limit go in several launches."""
    from kael_backend_cuda import _xp

    launches: list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[Any, ...]]] = []
    monkeypatch.setattr(_xp, "_state", _xp._State(np, False, True, "", 1, None))
    monkeypatch.setattr(_quant, "_kernel", lambda name: lambda g, b, a: launches.append((name, g, b, a)))
    monkeypatch.setattr(_quant, "_MAX_GRID_Y", 2)  # 2 * QROWS = 8 rows per launch
    k, n, rows = 64, 20, 10
    nbytes = k // 32 * _quant.BLOCK_BYTES[scheme] if scheme in BLOCK_SCHEMES else 2 * k
    w = np.zeros((n, nbytes), np.uint8)
    if scheme in BLOCK_SCHEMES:
        _quant.dequantize_blocks(w.reshape(-1), np.empty(n * k, np.float32), scheme)
    _quant.qlinear_rows(
        np.ones((rows, k), np.float32), w, np.ones(n, np.float32), np.empty((rows, n), np.float32), scheme, nbytes
    )
    _quant.qlinear_rows(np.ones((1, k), np.float32), w, None, np.empty((1, n), np.float32), scheme, nbytes)
    if scheme in BLOCK_SCHEMES:
        name, grid, block, args = launches.pop(0)
        assert name == f"kael_dequantize_{scheme}" and grid[0] * block[0] >= n * k > (grid[0] - 1) * block[0]
        _check_args(name, args)
    chunks = [ln for ln in launches if ln[0] == f"kael_qlinear_{scheme}"]
    assert len(chunks) == len(launches) == 3
    assert [int(a[4]) for *_, a in chunks] == [8, 2, 1]  # 10 rows: 8, then 2, then the single row
    assert [g[1] for _, g, _, _ in chunks] == [2, 1, 1]  # QROWS rows of x per warp
    for name, grid, block, args in chunks:
        assert block == (256,) and grid[0] * 8 >= n > (grid[0] - 1) * 8
        _check_args(name, args)
    assert [int(a[-1]) for *_, a in chunks] == [1, 1, 0]  # has_bias


def test_kernel_names_are_in_the_source():
    for name in _quant.QUANT_KERNEL_NAMES:
        assert re.search(rf"__global__ void {name}\(", _quant.QUANT_KERNELS_SOURCE), name


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_source_compiles_with_nvcc(tmp_path, arch):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    cu = tmp_path / "quant.cu"
    cu.write_text(_quant.QUANT_KERNELS_SOURCE)
    ptx = tmp_path / "quant.ptx"
    r = subprocess.run(
        [nvcc, f"-arch={arch}", "-std=c++14", "--ptx", str(cu), "-o", str(ptx)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, f"nvcc failed:\n{r.stderr}"
    entries = set(re.findall(r"\.entry (\w+)\(", ptx.read_text()))
    assert entries == set(_quant.QUANT_KERNEL_NAMES)  # extern "C": unmangled names, as CuPy looks them up


# -- a quantized model end to end -------------------------------------------------------------------
@pytest.mark.usefixtures("float_activations")  # cpu's float path is the oracle (tests/conftest.py)
@pytest.mark.parametrize("scheme", ["q8_0", "q4_0", "bf16"])
def test_quantized_tiny_gpt2_on_cuda_matches_cpu(emulate, scheme):
    """The reference tiny GPT-2 with weights=scheme: cuda's logits (its own kernels) are cpu's, and a
    prompt decoded in a batch of two gives each row what it gives alone."""
    from kael.models import from_pretrained

    tiny = Path(__file__).resolve().parents[1] / "data" / "tiny-gpt2"
    cpu = from_pretrained(tiny, weights=scheme)
    gpu = from_pretrained(tiny, weights=scheme).to("cuda")  # the same bytes, moved
    assert gpu.weights_scheme == cpu.weights_scheme == scheme
    ids = [[5, 17, 3, 99, 42, 7], [1, 2, 3, 4, 5, 6]]
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: (seen.append(f"{dev}:{op}"), k)[1])
    try:
        with kael.no_grad():
            want = cpu(kael.tensor(ids)).numpy()
            got = gpu(kael.tensor(ids, device="cuda")).cpu().numpy()
            alone = gpu(kael.tensor(ids[1:], device="cuda")).cpu().numpy()
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert "cuda:quantized_linear" in seen, sorted(set(seen))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(alone[0], got[1])
