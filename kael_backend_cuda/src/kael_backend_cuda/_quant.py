"""Weight formats on the GPU: the ``dequantize`` and ``quantized_linear`` fused ops.

A weight comes in one of four schemes (NOTE [weight formats] in ``kael/quant/_formats.py``):
``q8_0`` and ``q4_0`` are uint8 tensors [N, K/32*B] whose rows are K/32 GGML blocks of B
bytes (q8_0: B = 34, a little-endian float16 scale d then 32 int8 q, value d*q[i]; q4_0:
B = 18, d then 16 bytes of packed nibbles, value i < 16 = d*((q[i] & 15) - 8), value
i + 16 = d*((q[i] >> 4) - 8)); ``bf16`` and ``f16`` are [N, K] tensors of that dtype.

On a GPU the block schemes dequantize with a RawKernel, one thread per output value
(the scale is read from the block's two bytes, so no alignment is assumed); the 16-bit
schemes are CuPy casts. ``quantized_linear`` runs one fused kernel that reads the weight
in its own format (no float32 copy of it is made): one warp per output value, lane l
summing the products of the elements l, l + 32, l + 64, ... in order, then a fixed
shuffle tree. Every output is summed the same way whatever the number of rows of x,
so a row's result never depends on how many rows are batched with it (the op's
contract); cuBLAS chooses different algorithms for different row counts, which is why
it is not used here.

Under emulation (NOTE [host emulation] in ``_xp``) the NumPy twins run instead:
the same exact dequantized values (d*q is exact in float32), and the product as one
[1, K] @ [K, N] matmul per row, so the twin keeps the row independence too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from kael import DTypeError, KaelError, ShapeError
from kael.backends import dtypes as dt

from ._io import distinct, rd, view, wr
from ._xp import X, dense_view, quiet, state

__all__ = [
    "QUANT_KERNELS_SOURCE",
    "QUANT_KERNEL_NAMES",
    "SCHEME_CODES",
    "BLOCK_BYTES",
    "dequantize_blocks",
    "dequantize_weight",
    "qlinear_rows",
    "KERNELS",
]

BLOCK = 32  # values per GGML block
BLOCK_BYTES: dict[str, int] = {"q8_0": 34, "q4_0": 18}
SCHEME_CODES: dict[str, int] = {"q8_0": 0, "q4_0": 1, "bf16": 2, "f16": 3}  # the kernels' `scheme` argument
_DTYPES = {"bf16": dt.bfloat16, "f16": dt.float16}

# --------------------------------------------------------------------------------------------------
# CUDA C (no headers: float16 and bfloat16 are decoded from their bits).
# --------------------------------------------------------------------------------------------------
QUANT_KERNELS_SOURCE = r"""
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

// The float16 scale d at the start of a block (little-endian bytes, any alignment).
__device__ __forceinline__ float kael_block_scale(const unsigned char* b) {
    return kael_half_bits_to_float((unsigned int)b[0] | ((unsigned int)b[1] << 8));
}

// Value k of a weight row in `scheme` (0 q8_0, 1 q4_0, 2 bf16, 3 f16); row points at the row's first byte.
__device__ __forceinline__ float kael_weight_value(const unsigned char* row, long long k, int scheme) {
    if (scheme == 0) {
        const unsigned char* b = row + (k >> 5) * 34;
        return kael_block_scale(b) * (float)(signed char)b[2 + (k & 31)];
    }
    if (scheme == 1) {
        const unsigned char* b = row + (k >> 5) * 18;
        const int j = (int)(k & 31);
        const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        return kael_block_scale(b) * (float)(q - 8);
    }
    const unsigned int bits = (unsigned int)row[2 * k] | ((unsigned int)row[2 * k + 1] << 8);
    return scheme == 2 ? kael_bf16_bits_to_float(bits) : kael_half_bits_to_float(bits);
}

extern "C" {

// out [n] (n = blocks * 32) = the values of the Q8_0 blocks w [blocks * 34]; one thread per value.
__global__ void kael_dequantize_q8_0(const unsigned char* __restrict__ w, float* __restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = kael_weight_value(w + (i >> 5) * 34, i & 31, 0);
}

// out [n] (n = blocks * 32) = the values of the Q4_0 blocks w [blocks * 18]; one thread per value.
__global__ void kael_dequantize_q4_0(const unsigned char* __restrict__ w, float* __restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = kael_weight_value(w + (i >> 5) * 18, i & 31, 1);
}

// out [rows, n] = x [rows, k] @ W.T (+ bias [n]), W [n, k] in `scheme`, its rows row_bytes apart.
// One warp per output (blockDim.x = 256: 8 outputs of one row of x per block; grid (ceil(n / 8), rows)).
// Lane l sums x[r, j] * W[c, j] for j = l, l + 32, ... in order, then the warp adds the 32 partial sums
// in a fixed tree: the same additions for an output whatever `rows` is.
__global__ void kael_qlinear(const float* __restrict__ x, const unsigned char* __restrict__ w,
                             const float* __restrict__ bias, float* __restrict__ out, long long k, long long n,
                             long long row_bytes, int scheme, int has_bias) {
    const long long r = blockIdx.y;
    const long long c = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (c >= n) return;  // a whole warp leaves together, so the shuffles below see full warps
    const float* xr = x + r * k;
    const unsigned char* wr = w + c * row_bytes;
    float acc = 0.0f;
    for (long long j = lane; j < k; j += 32) acc = fmaf(xr[j], kael_weight_value(wr, j, scheme), acc);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[r * n + c] = has_bias ? acc + bias[c] : acc;
}

}  // extern "C"
"""

QUANT_KERNEL_NAMES: tuple[str, ...] = ("kael_dequantize_q8_0", "kael_dequantize_q4_0", "kael_qlinear")
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
def _np_blocks_to_float(blocks: np.ndarray, scheme: str) -> np.ndarray:
    """float32 [nblocks, 32] from uint8 blocks [nblocks, B] (NumPy)."""
    d = np.ascontiguousarray(blocks[:, :2]).view("<f2").astype(np.float32)  # [nblocks, 1]
    if scheme == "q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
    else:
        packed = blocks[:, 2:]
        q = np.concatenate([packed & 15, packed >> 4], axis=1).astype(np.float32) - np.float32(8)
    return d * q


def dequantize_blocks(w: Any, out: Any, scheme: str) -> None:
    """out float32 [nblocks * 32] (flat) = the values of the uint8 blocks w [nblocks * B] (flat)."""
    nb = BLOCK_BYTES[scheme]
    n = int(out.size)
    if n == 0:
        return
    if X.emulated:
        out[...] = _np_blocks_to_float(w.reshape(-1, nb), scheme).reshape(-1)
        return
    grid = ((n + _THREADS - 1) // _THREADS,)
    _kernel(f"kael_dequantize_{scheme}")(grid, (_THREADS,), (w, out, np.int64(n)))


def qlinear_rows(x: Any, w: Any, bias: Any, out: Any, scheme: str, row_bytes: int) -> None:
    """out float32 [rows, n] = x float32 [rows, k] @ dequantize(w).T + bias; w: uint8 [n, row_bytes] (the
    weight's bytes, 16-bit schemes as their little-endian bits); bias float32 [n] or None."""
    rows, k = x.shape
    n = out.shape[1]
    if rows == 0 or n == 0:
        return
    if X.emulated:
        wf = _np_weight_to_float(w, scheme, k)
        # one [1, K] @ [K, N] product per row: every row takes the same BLAS path whatever `rows` is
        y = np.matmul(x[:, None, :], wf.T)[:, 0, :]
        out[...] = y + bias if bias is not None else y
        return
    kernel = _kernel("kael_qlinear")
    for r0 in range(0, rows, _MAX_GRID_Y):  # gridDim.y is at most 65535: launch the rows in chunks
        r1 = min(rows, r0 + _MAX_GRID_Y)
        args = (
            x[r0:r1],
            w,
            bias if bias is not None else x,  # unread when has_bias == 0
            out[r0:r1],
            np.int64(k),
            np.int64(n),
            np.int64(row_bytes),
            np.int32(SCHEME_CODES[scheme]),
            np.int32(bias is not None),
        )
        kernel(((n + _WARPS - 1) // _WARPS, r1 - r0), (_THREADS,), args)


def _np_weight_to_float(w: np.ndarray, scheme: str, k: int) -> np.ndarray:
    """float32 [n, k] from the weight's bytes w uint8 [n, row_bytes] (NumPy)."""
    n = w.shape[0]
    if scheme in BLOCK_BYTES:
        return _np_blocks_to_float(w.reshape(-1, BLOCK_BYTES[scheme]), scheme).reshape(n, k)
    bits = np.ascontiguousarray(w).view("<u2").reshape(n, k)
    if scheme == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return bits.view("<f2").astype(np.float32)


# --------------------------------------------------------------------------------------------------
# The fused ops (the glue: operand checks, layouts, outputs).
# --------------------------------------------------------------------------------------------------
def _check_weight(op: str, weight: Any, scheme: str, n: int, k: int) -> None:
    """Raise unless weight holds an [n, k] matrix in `scheme` (the frontend checks first; kernels called
    directly get the same clear errors)."""
    if scheme not in SCHEME_CODES:
        raise KaelError(f"{op}: scheme {scheme!r} is not a weight format; expected one of {tuple(SCHEME_CODES)}")
    if scheme in BLOCK_BYTES:
        if weight.dtype is not dt.uint8:
            raise DTypeError(f"{op}: a {scheme} weight is uint8 blocks, got dtype {weight.dtype.name}")
        if k % BLOCK:
            raise ShapeError(f"{op}: {scheme} needs K a multiple of {BLOCK}, got K = {k}")
        want = (n, k // BLOCK * BLOCK_BYTES[scheme])
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
    qlinear_rows(x2, w, b, dst, scheme, int(w.shape[1]))
    if not direct:
        wr(out, dst.reshape(out.shape))


_PLAIN: dict[str, Callable[..., None]] = {"dequantize": dequantize, "quantized_linear": quantized_linear}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
