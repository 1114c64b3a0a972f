"""CUDA decoders of GGML's K-quants: 256-value super-blocks q2_k, q3_k, q4_k, q5_k, q6_k.

``__device__`` functions ``float kael_<name>_value(const unsigned char* b, int j)`` (value
``j``, 0..255, of the super-block at ``b``), bit for bit ``gguf.quants.dequantize`` (ggml's
``dequantize_row_q*_K``); ``_quant`` builds the kernels from them.

Layouts (little-endian, facts from ggml's ``block_q*_K`` structs). Value j lies in half
h = j/128; within it r = j%128, chunk c = r/32, lane l = r%32. The 2-bit fields of byte l of
a half hold its values l, l+32, l+64, l+96 (shift 2c).

* q2_k (84 bytes): scales[16] (low nibble scale, high nibble min of 16 values), qs[64], f16 d,
  f16 dmin; sub-block s = 8h + 2c + l/16; value (d*sc)*q - dmin*m.
* q3_k (110): hmask[32] (bit 4h + c of byte l: set means no -4), qs[64], scales[12] (16 6-bit
  scales: low 4 bits nibble s/8 of byte s%8, high 2 bits pair s/4 of byte 8 + s%4), f16 d;
  value (d*(sc - 32))*q.
* q4_k (144): f16 d, f16 dmin, scales[12] (8 6-bit scales and mins, ggml's get_scale_min_k4),
  qs[128] (value j: byte 32*(j/64) + j%32, high nibble when j%64 >= 32); sub-block j/32;
  value (d*sc)*q - dmin*m.
* q5_k (176): as q4_k with qh[32] (bit j/32 of byte j%32: the fifth bit) before qs.
* q6_k (210): ql[128] (low 4 bits: byte 64h + l + 32*(c%2), high nibble when c >= 2), qh[64]
  (2 high bits: byte 32h + l, shift 2c), int8 scales[16] (sub-block 8h + l/16 + 2c), f16 d;
  value (d*sc)*(q - 32).

Products and differences are ``__fmul_rn`` / ``__fsub_rn`` (no contraction into a fused
multiply-add, whose one rounding would differ from the reference's two).
"""

from __future__ import annotations

__all__ = ["KQUANT_DEVICE_SOURCE", "KQUANT_DECODERS"]

KQUANT_DEVICE_SOURCE = r"""
// Scale and min of sub-block s (0..7) from the 12 packed bytes sc (ggml's get_scale_min_k4).
__device__ __forceinline__ void kael_scale_min_k4(const unsigned char* sc, int s, int* scale, int* min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

__device__ __forceinline__ float kael_q2_k_value(const unsigned char* b, int j) {
    const int h = j >> 7, c = (j >> 5) & 3, l = j & 31;
    const int sc = b[8 * h + 2 * c + (l >> 4)];
    const int q = (b[16 + 32 * h + l] >> (2 * c)) & 3;
    const float dl = __fmul_rn(kael_half_at(b + 80), (float)(sc & 15));
    const float ml = __fmul_rn(kael_half_at(b + 82), (float)(sc >> 4));
    return __fsub_rn(__fmul_rn(dl, (float)q), ml);
}

__device__ __forceinline__ float kael_q3_k_value(const unsigned char* b, int j) {
    const int h = j >> 7, c = (j >> 5) & 3, l = j & 31;
    const int s = 8 * h + 2 * c + (l >> 4);
    const unsigned char* scales = b + 96;
    const int sc = ((scales[s & 7] >> (4 * (s >> 3))) & 15) | (((scales[8 + (s & 3)] >> (2 * (s >> 2))) & 3) << 4);
    const int high = (b[l] >> (4 * h + c)) & 1;
    const int q = ((b[32 + 32 * h + l] >> (2 * c)) & 3) - (high ? 0 : 4);
    return __fmul_rn(__fmul_rn(kael_half_at(b + 108), (float)(sc - 32)), (float)q);
}

// q4_k and q5_k: value (d*sc)*q - dmin*m of sub-block j/32 with the quant q.
__device__ __forceinline__ float kael_k4_value(const unsigned char* b, int j, int q) {
    int sc, m;
    kael_scale_min_k4(b + 4, j >> 5, &sc, &m);
    const float d = __fmul_rn(kael_half_at(b), (float)sc);
    const float dm = __fmul_rn(kael_half_at(b + 2), (float)m);
    return __fsub_rn(__fmul_rn(d, (float)q), dm);
}

__device__ __forceinline__ float kael_q4_k_value(const unsigned char* b, int j) {
    const int q = (b[16 + 32 * (j >> 6) + (j & 31)] >> ((j & 63) >= 32 ? 4 : 0)) & 15;
    return kael_k4_value(b, j, q);
}

__device__ __forceinline__ float kael_q5_k_value(const unsigned char* b, int j) {
    const int low = (b[48 + 32 * (j >> 6) + (j & 31)] >> ((j & 63) >= 32 ? 4 : 0)) & 15;
    const int high = (b[16 + (j & 31)] >> (j >> 5)) & 1;
    return kael_k4_value(b, j, low | (high << 4));
}

__device__ __forceinline__ float kael_q6_k_value(const unsigned char* b, int j) {
    const int h = j >> 7, c = (j >> 5) & 3, l = j & 31;
    const int low = (b[64 * h + l + 32 * (c & 1)] >> (c >= 2 ? 4 : 0)) & 15;
    const int high = (b[128 + 32 * h + l] >> (2 * c)) & 3;
    const int sc = (signed char)b[192 + 8 * h + (l >> 4) + 2 * c];
    return __fmul_rn(__fmul_rn(kael_half_at(b + 208), (float)sc), (float)((low | (high << 4)) - 32));
}
"""

KQUANT_DECODERS: dict[str, str] = {
    "q2_k": "kael_q2_k_value",
    "q3_k": "kael_q3_k_value",
    "q4_k": "kael_q4_k_value",
    "q5_k": "kael_q5_k_value",
    "q6_k": "kael_q6_k_value",
}
"""Scheme name -> its device decoder in KQUANT_DEVICE_SOURCE."""
