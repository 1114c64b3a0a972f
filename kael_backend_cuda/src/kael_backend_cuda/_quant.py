"""Weight formats on the GPU: the ``dequantize`` and ``quantized_linear`` fused ops.

A weight comes in one of the schemes of ``QUANT_SCHEMES``: every block format of kael's
registry (NOTE [format registry] in ``kael/quant/formats``) that has a CUDA decoder here,
plus ``bf16`` and ``f16``. A block weight is a uint8 tensor [N, K/V*B] whose rows are K/V
GGML blocks of B bytes holding V values (the registry's ``block_values`` / ``block_bytes``);
``bf16`` and ``f16`` weights are [N, K] tensors of that dtype. Backends declare what their
kernels take; the dispatcher sends other schemes through the dequantize decomposition.

The decoders are CUDA ``__device__`` functions, one file per family (``_quant_legacy``,
``_quant_kquants``, ``_quant_iq4``): ``kael_<scheme>_value(block, j)`` is value j of a block,
bit for bit ``gguf.quants.dequantize``. This module assembles them with the shared
float16/bfloat16 helpers into one CUDA source: ``kael_weight_value`` (value k of a row in any
scheme), one dequantize kernel per block scheme (one thread per value) and one few-row
``kael_qlinear_<scheme>`` per scheme.

``quantized_linear`` takes one of two paths by the number of rows M of x:

* M <= ``FEW_ROWS`` (16; decode and batched decode): ``kael_qlinear_<scheme>`` reads the weight in its
  own format (no float32 copy): one warp per output column and up to ``QROWS`` rows of x,
  lane l summing x[r, j] * W[c, j] for j = l, l + 32, ... in order (one fused multiply-add
  each), then a fixed shuffle tree. Every output is summed the same way whatever M is, so a
  row's result is bit for bit the same batched (up to 16 rows) and alone.
* M > 16 (prefill): the weight is dequantized to float32 (column chunks of at most
  ``SCRATCH_VALUES`` values) and multiplied by cuBLAS (``xp.matmul``). cuBLAS picks its
  algorithm by shape, so these rows agree with the same rows alone to float32 rounding, not
  bit for bit (DESIGN: the test says so and bounds it).

Under emulation (NOTE [host emulation] in ``_xp``) the NumPy twins run instead: the
registry's reference dequantizers (bit-exact against gguf, as the CUDA decoders are; the
tests also run the CUDA C itself on the host with g++), one [1, K] @ [K, N] product per row
for the few-row path and the same chunked dequantize + matmul glue for the many-row path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from kael import DTypeError, KaelError, ShapeError
from kael.backends import dtypes as dt
from kael.quant.formats import FORMATS

from ._io import distinct, rd, view, wr
from ._quant_iq4 import IQ4_DECODERS, IQ4_DEVICE_SOURCE
from ._quant_kquants import KQUANT_DECODERS, KQUANT_DEVICE_SOURCE
from ._quant_legacy import LEGACY_DECODERS, LEGACY_DEVICE_SOURCE
from ._xp import X, dense_view, quiet, state

__all__ = [
    "QUANT_SCHEMES",
    "QUANT_KERNELS_SOURCE",
    "QUANT_KERNEL_NAMES",
    "SCHEME_CODES",
    "BLOCK_BYTES",
    "BLOCK_VALUES",
    "FEW_ROWS",
    "QROWS",
    "SCRATCH_VALUES",
    "dequantize_blocks",
    "dequantize_weight",
    "qlinear_rows",
    "gemm_rows",
    "KERNELS",
]

_DECODERS: dict[str, str] = {**LEGACY_DECODERS, **KQUANT_DECODERS, **IQ4_DECODERS}
_DTYPES = {"bf16": dt.bfloat16, "f16": dt.float16}

QUANT_SCHEMES: tuple[str, ...] = tuple(name for name in FORMATS if name in _DECODERS or name in _DTYPES)
"""The weight schemes this backend's kernels take, in the registry's order."""
SCHEME_CODES: dict[str, int] = {name: i for i, name in enumerate(QUANT_SCHEMES)}  # the kernels' `scheme`
BLOCK_BYTES: dict[str, int] = {s: FORMATS[s].block_bytes for s in _DECODERS}
BLOCK_VALUES: dict[str, int] = {s: FORMATS[s].block_values for s in _DECODERS}
FEW_ROWS = 16  # up to this many rows of x: the fused few-row kernel (rows bit-identical batched and alone)
QROWS = 4  # rows of x one warp of kael_qlinear_<scheme> serves
SCRATCH_VALUES = 1 << 24  # float32 values of dequantized weight the many-row path holds at once (64 MiB)

# --------------------------------------------------------------------------------------------------
# CUDA C (no headers: float16 and bfloat16 are decoded from their bits).
# --------------------------------------------------------------------------------------------------
_COMMON_SOURCE = r"""
// IEEE half bits -> float, exactly (normals, subnormals, zeros, infinities, NaN).
__device__ __forceinline__ float kael_half_bits_to_float(unsigned int h) {
    const unsigned int sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * 5.9604644775390625e-08f;  // m * 2^-24: a subnormal (or zero), exact
        return sign ? -v : v;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ float kael_bf16_bits_to_float(unsigned int h) { return __uint_as_float(h << 16); }

// The little-endian float16 at b (any alignment), widened.
__device__ __forceinline__ float kael_half_at(const unsigned char* b) {
    return kael_half_bits_to_float((unsigned int)b[0] | ((unsigned int)b[1] << 8));
}
"""


def _weight_value_source() -> str:
    """``kael_weight_value``: value k of a weight row in any scheme (a switch over the scheme codes)."""
    cases = "\n".join(
        f"        case {SCHEME_CODES[s]}: return {fn}(row + (k / {BLOCK_VALUES[s]}) * {BLOCK_BYTES[s]}, "
        f"(int)(k % {BLOCK_VALUES[s]}));  // {s}"
        for s, fn in _DECODERS.items()
    )
    return f"""
// Value k of a weight row in `scheme` (SCHEME_CODES); row points at the row's first byte.
__device__ __forceinline__ float kael_weight_value(const unsigned char* row, long long k, int scheme) {{
    switch (scheme) {{
{cases}
        default: break;
    }}
    const unsigned int bits = (unsigned int)row[2 * k] | ((unsigned int)row[2 * k + 1] << 8);
    return scheme == {SCHEME_CODES["bf16"]} ? kael_bf16_bits_to_float(bits) : kael_half_bits_to_float(bits);
}}
"""


def _dequantize_source(scheme: str, fn: str) -> str:
    v, b = BLOCK_VALUES[scheme], BLOCK_BYTES[scheme]
    return f"""
// out [n] (n = blocks * {v}) = the values of the {scheme} blocks w [blocks * {b}]; one thread per value.
__global__ void kael_dequantize_{scheme}(const unsigned char* __restrict__ w, float* __restrict__ out, long long n) {{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = {fn}(w + (i / {v}) * {b}, (int)(i % {v}));
}}
"""


def _qlinear_source() -> str:
    """``kael_qlinear_rows``, the few-row fused kernel's body (a function, so that the one module-level CUDA
    source is QUANT_KERNELS_SOURCE, the string the RawModule compiles: NOTE [kernel discovery] in
    cuda_compile.py)."""
    return r"""
// out [rows, n] = x [rows, k] @ W.T (+ bias [n]), W [n, k] in `scheme`, its rows row_bytes apart.
// One warp per output column c and QROWS rows of x (blockDim.x = 256: 8 columns per block; grid
// (ceil(n / 8), ceil(rows / QROWS))). Lane l sums x[r, j] * W[c, j] for j = l, l + 32, ... in order,
// then the warp adds the 32 partial sums in a fixed tree: the same additions for an output whatever
// `rows` is and whichever rows share its warp. W's value is decoded once for the warp's rows.
// Each kael_qlinear_<scheme> passes its scheme as a constant, so the decoder's switch folds away.
__device__ __forceinline__ void kael_qlinear_rows(const float* __restrict__ x, const unsigned char* __restrict__ w,
                                                  const float* __restrict__ bias, float* __restrict__ out,
                                                  long long rows, long long k, long long n, long long row_bytes,
                                                  int scheme, int has_bias) {
    const long long r0 = (long long)blockIdx.y * KAEL_QROWS;
    const long long c = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (c >= n) return;  // a whole warp leaves together, so the shuffles below see full warps
    const int nr = rows - r0 < KAEL_QROWS ? (int)(rows - r0) : KAEL_QROWS;
    const float* xr = x + r0 * k;
    const unsigned char* wr = w + c * row_bytes;
    float acc[KAEL_QROWS];
    for (int t = 0; t < KAEL_QROWS; ++t) acc[t] = 0.0f;
    for (long long j = lane; j < k; j += 32) {
        const float wv = kael_weight_value(wr, j, scheme);
        for (int t = 0; t < KAEL_QROWS; ++t)
            if (t < nr) acc[t] = fmaf(xr[t * k + j], wv, acc[t]);
    }
    for (int t = 0; t < KAEL_QROWS; ++t) {
        float a = acc[t];
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0 && t < nr) out[(r0 + t) * n + c] = has_bias ? a + bias[c] : a;
    }
}
"""


def _qlinear_kernel_source(scheme: str) -> str:
    return f"""
__global__ void kael_qlinear_{scheme}(const float* __restrict__ x, const unsigned char* __restrict__ w,
                                      const float* __restrict__ bias, float* __restrict__ out, long long rows,
                                      long long k, long long n, long long row_bytes, int has_bias) {{
    kael_qlinear_rows(x, w, bias, out, rows, k, n, row_bytes, {SCHEME_CODES[scheme]}, has_bias);
}}
"""


QUANT_KERNELS_SOURCE = (
    f"#define KAEL_QROWS {QROWS}\n"
    + _COMMON_SOURCE
    + LEGACY_DEVICE_SOURCE
    + KQUANT_DEVICE_SOURCE
    + IQ4_DEVICE_SOURCE
    + _weight_value_source()
    + _qlinear_source()
    + '\nextern "C" {\n'
    + "".join(_dequantize_source(s, fn) for s, fn in _DECODERS.items())
    + "".join(_qlinear_kernel_source(s) for s in QUANT_SCHEMES)
    + '\n}  // extern "C"\n'
)
"""The CUDA source of every quantized kernel (compiled by NVRTC at first use; by nvcc in CI)."""

QUANT_KERNEL_NAMES: tuple[str, ...] = (
    *(f"kael_dequantize_{s}" for s in _DECODERS),
    *(f"kael_qlinear_{s}" for s in QUANT_SCHEMES),
)
_THREADS = 256  # per block, in every kernel
_WARPS = _THREADS // 32
_MAX_GRID_Y = 65535

_module: Any = None


def _kernel(name: str) -> Any:
    """A compiled kernel of QUANT_KERNELS_SOURCE (compiled by NVRTC on first use; GPU only)."""
    global _module
    if _module is None:
        _module = state().cupy.RawModule(code=QUANT_KERNELS_SOURCE, options=("--std=c++14",))
    return _module.get_function(name)


# --------------------------------------------------------------------------------------------------
# Launchers (GPU) and NumPy twins (emulation). Arrays are xp arrays, C-contiguous.
# --------------------------------------------------------------------------------------------------
def dequantize_blocks(w: Any, out: Any, scheme: str) -> None:
    """out float32 [nblocks * V] (flat) = the values of the uint8 blocks w [nblocks * B] (flat)."""
    n = int(out.size)
    if n == 0:
        return
    if X.emulated:
        with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales decode as GGML's do
            out[...] = FORMATS[scheme].dequantize_blocks(w.reshape(-1, BLOCK_BYTES[scheme])).reshape(-1)
        return
    grid = ((n + _THREADS - 1) // _THREADS,)
    _kernel(f"kael_dequantize_{scheme}")(grid, (_THREADS,), (w, out, np.int64(n)))


def _weight_to_float(w: Any, scheme: str, k: int) -> Any:
    """A new float32 xp array [n, k] from the weight's bytes w uint8 [n, row_bytes]."""
    xp = X.xp
    n = w.shape[0]
    if scheme in BLOCK_BYTES:
        out = xp.empty((n, k), np.float32)
        dequantize_blocks(w.reshape(-1), out.reshape(-1), scheme)
        return out
    bits = xp.ascontiguousarray(w).view(np.uint16).reshape(n, k)  # little-endian hosts and GPUs
    if scheme == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def qlinear_rows(x: Any, w: Any, bias: Any, out: Any, scheme: str, row_bytes: int) -> None:
    """The few-row path: out float32 [rows, n] = x float32 [rows, k] @ dequantize(w).T + bias, by the fused
    kernel; w: uint8 [n, row_bytes] (the weight's bytes, 16-bit schemes as their little-endian bits); bias
    float32 [n] or None. Each row's result is independent of the other rows."""
    rows, k = x.shape
    n = out.shape[1]
    if rows == 0 or n == 0:
        return
    if X.emulated:
        wf = _weight_to_float(w, scheme, k)
        # one [1, K] @ [K, N] product per row: every row takes the same BLAS path whatever `rows` is
        y = np.matmul(x[:, None, :], wf.T)[:, 0, :]
        out[...] = y + bias if bias is not None else y
        return
    kernel = _kernel(f"kael_qlinear_{scheme}")
    step = _MAX_GRID_Y * QROWS  # gridDim.y is at most 65535: launch the rows in chunks
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        args = (
            x[r0:r1],
            w,
            bias if bias is not None else x,  # unread when has_bias == 0
            out[r0:r1],
            np.int64(r1 - r0),
            np.int64(k),
            np.int64(n),
            np.int64(row_bytes),
            np.int32(bias is not None),
        )
        kernel(((n + _WARPS - 1) // _WARPS, (r1 - r0 + QROWS - 1) // QROWS), (_THREADS,), args)


def gemm_rows(x: Any, w: Any, bias: Any, out: Any, scheme: str) -> None:
    """The many-row path: out float32 [rows, n] = x [rows, k] @ dequantize(w).T + bias, the weight
    dequantized to float32 in chunks of columns (at most SCRATCH_VALUES values) and multiplied by cuBLAS
    (NumPy's BLAS under emulation)."""
    xp = X.xp
    rows, k = x.shape
    n = out.shape[1]
    if rows == 0 or n == 0:
        return
    cols = max(1, min(n, SCRATCH_VALUES // max(k, 1)))
    for c0 in range(0, n, cols):
        c1 = min(n, c0 + cols)
        y = xp.matmul(x, _weight_to_float(w[c0:c1], scheme, k).T)
        if bias is not None:
            y += bias[c0:c1]
        out[:, c0:c1] = y


# --------------------------------------------------------------------------------------------------
# The fused ops (the glue: operand checks, layouts, outputs).
# --------------------------------------------------------------------------------------------------
def _check_weight(op: str, weight: Any, scheme: str, n: int, k: int) -> None:
    """Raise unless weight holds an [n, k] matrix in `scheme` (the frontend checks first; kernels called
    directly get the same clear errors)."""
    if not isinstance(scheme, str) or scheme not in SCHEME_CODES:
        raise KaelError(
            f"{op}: scheme {scheme!r} is not a weight format of the cuda backend; expected one of {QUANT_SCHEMES}"
        )
    if scheme in BLOCK_BYTES:
        if weight.dtype is not dt.uint8:
            raise DTypeError(f"{op}: a {scheme} weight is uint8 blocks, got dtype {weight.dtype.name}")
        v = BLOCK_VALUES[scheme]
        if k % v:
            raise ShapeError(f"{op}: {scheme} needs K a multiple of {v}, got K = {k}")
        want = (n, k // v * BLOCK_BYTES[scheme])
    else:
        if weight.dtype is not _DTYPES[scheme]:
            raise DTypeError(f"{op}: a {scheme} weight has dtype {_DTYPES[scheme].name}, got {weight.dtype.name}")
        want = (n, k)
    if tuple(weight.shape) != want:
        raise ShapeError(
            f"{op}: a {scheme} weight of logical shape [{n}, {k}] has shape {list(want)}, got {list(weight.shape)}"
        )


def _weight_bytes(weight: Any) -> Any:
    """The weight's elements as a C-contiguous uint8 xp array [N, row bytes] (16-bit values as their bits)."""
    v = X.xp.ascontiguousarray(view(weight))  # uint8 blocks, or uint16 (bfloat16) / float16 elements
    return v.view(np.uint8).reshape(v.shape[0], -1)


def dequantize_weight(weight: Any, scheme: str, k: int) -> Any:
    """A new float32 xp array [N, K] of weight's values (scratch for the decompositions and tests)."""
    xp = X.xp
    n = weight.shape[0]
    out = xp.empty((n, k), np.float32)
    if scheme in BLOCK_BYTES:
        dequantize_blocks(_weight_bytes(weight).reshape(-1), out.reshape(-1), scheme)
    else:
        out[...] = rd(weight)  # bfloat16 widened by a shift, float16 by a cast
    return out


def dequantize(out: Any, weight: Any, scheme: str) -> None:
    if out.dtype is not dt.float32:
        raise DTypeError(f"dequantize: out must be float32, got {out.dtype.name}")
    if out.ndim != 2:
        raise ShapeError(f"dequantize: out must be [N, K], got shape {list(out.shape)}")
    n, k = out.shape
    _check_weight("dequantize", weight, scheme, n, k)
    if out.numel() == 0:
        return
    if scheme not in BLOCK_BYTES:
        wr(out, rd(weight))  # bfloat16 widened by a shift, float16 by a cast
    elif out.is_contiguous():
        dequantize_blocks(_weight_bytes(weight).reshape(-1), dense_view(out, (n * k,)), scheme)
    else:
        wr(out, dequantize_weight(weight, scheme, k))


def quantized_linear(out: Any, x: Any, weight: Any, bias: Any, scheme: str) -> None:
    xp = X.xp
    if x.ndim < 1 or out.ndim != x.ndim:
        raise ShapeError(
            f"quantized_linear: x [.., K] and out [.., N] of the same rank, got x {list(x.shape)}, "
            f"out {list(out.shape)}"
        )
    k, n = x.shape[-1], out.shape[-1]
    for name, t in (("x", x), ("out", out), ("bias", bias)):
        if t is not None and t.dtype is not dt.float32:
            raise DTypeError(f"quantized_linear: {name} must be float32, got {t.dtype.name}")
    if tuple(out.shape[:-1]) != tuple(x.shape[:-1]):
        raise ShapeError(f"quantized_linear: out {list(out.shape)} does not fit x {list(x.shape)} (leading dims)")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ShapeError(f"quantized_linear: bias must have shape [{n}], got {list(bias.shape)}")
    _check_weight("quantized_linear", weight, scheme, n, k)
    if out.numel() == 0:
        return
    rows = out.numel() // n
    b = xp.ascontiguousarray(view(bias)) if bias is not None else None
    if k == 0:
        wr(out, b if b is not None else 0.0)
        return
    x2 = xp.ascontiguousarray(view(x)).reshape(rows, k)
    w = _weight_bytes(weight)
    direct = out.is_contiguous() and distinct(out, x, weight, bias)
    dst = dense_view(out, (rows, n)) if direct else xp.empty((rows, n), np.float32)
    if rows <= FEW_ROWS:
        qlinear_rows(x2, w, b, dst, scheme, int(w.shape[1]))
    else:
        gemm_rows(x2, w, b, dst, scheme)
    if not direct:
        wr(out, dst.reshape(out.shape))


_PLAIN: dict[str, Callable[..., None]] = {"dequantize": dequantize, "quantized_linear": quantized_linear}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
