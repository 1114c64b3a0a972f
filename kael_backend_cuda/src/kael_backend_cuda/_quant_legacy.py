"""CUDA decoders of GGML's legacy 32-value block formats: q8_0, q4_0, q4_1, q5_0, q5_1.

Each is a ``__device__`` function ``float kael_<name>_value(const unsigned char* b, int j)``:
value ``j`` (0..31) of the block starting at byte ``b``, bit for bit what
``gguf.quants.dequantize`` (and ggml's ``dequantize_row_*``) gives. ``_quant`` assembles
these into its kernels (the dequantize kernel of each format and the fused
``quantized_linear``); this file holds device code only, so it compiles nowhere by itself.

Layouts (little-endian, facts from ggml's ``block_q*`` structs): q8_0 (34 bytes) = f16 d,
int8 q[32], value d*q; q4_0 (18) = f16 d, 16 bytes of nibbles (byte i: value i in the low
nibble, value i + 16 in the high one), value d*(q - 8); q4_1 (20) = f16 d, f16 m, nibbles,
value d*q + m; q5_0 (22) = f16 d, uint32 qh (bit j: the fifth bit of value j), nibbles,
value d*(q - 16); q5_1 (24) = f16 d, f16 m, qh, nibbles, value d*q + m.

The products and sums are ``__fmul_rn`` / ``__fadd_rn``: nvcc would otherwise contract
``d*q + m`` into one fused multiply-add, whose single rounding differs from the reference's two.
"""

from __future__ import annotations

__all__ = ["LEGACY_DEVICE_SOURCE", "LEGACY_DECODERS"]

LEGACY_DEVICE_SOURCE = r"""
// Nibble j (0..31) of 16 packed bytes: values 0..15 are the low nibbles, 16..31 the high ones.
__device__ __forceinline__ int kael_nibble32(const unsigned char* qs, int j) {
    return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}

// The little-endian uint32 at b (any alignment).
__device__ __forceinline__ unsigned int kael_u32(const unsigned char* b) {
    return (unsigned int)b[0] | ((unsigned int)b[1] << 8) | ((unsigned int)b[2] << 16) | ((unsigned int)b[3] << 24);
}

__device__ __forceinline__ float kael_q8_0_value(const unsigned char* b, int j) {
    return __fmul_rn(kael_half_at(b), (float)(signed char)b[2 + j]);
}

__device__ __forceinline__ float kael_q4_0_value(const unsigned char* b, int j) {
    return __fmul_rn(kael_half_at(b), (float)(kael_nibble32(b + 2, j) - 8));
}

__device__ __forceinline__ float kael_q4_1_value(const unsigned char* b, int j) {
    return __fadd_rn(__fmul_rn(kael_half_at(b), (float)kael_nibble32(b + 4, j)), kael_half_at(b + 2));
}

__device__ __forceinline__ float kael_q5_0_value(const unsigned char* b, int j) {
    const int q = kael_nibble32(b + 6, j) | (int)(((kael_u32(b + 2) >> j) & 1u) << 4);
    return __fmul_rn(kael_half_at(b), (float)(q - 16));
}

__device__ __forceinline__ float kael_q5_1_value(const unsigned char* b, int j) {
    const int q = kael_nibble32(b + 8, j) | (int)(((kael_u32(b + 4) >> j) & 1u) << 4);
    return __fadd_rn(__fmul_rn(kael_half_at(b), (float)q), kael_half_at(b + 2));
}
"""

LEGACY_DECODERS: dict[str, str] = {
    "q8_0": "kael_q8_0_value",
    "q4_0": "kael_q4_0_value",
    "q4_1": "kael_q4_1_value",
    "q5_0": "kael_q5_0_value",
    "q5_1": "kael_q5_1_value",
}
"""Scheme name -> its device decoder in LEGACY_DEVICE_SOURCE."""
