"""CUDA decoders of GGML's non-linear 4-bit formats: iq4_nl (32-value blocks) and iq4_xs (256).

``__device__`` functions ``float kael_<name>_value(const unsigned char* b, int j)`` (value
``j`` of the block at ``b``), bit for bit ``gguf.quants.dequantize``; ``_quant`` builds the
kernels from them. Each 4-bit index selects one of ggml's 16 ``kvalues_iq4nl``.

Layouts (little-endian, facts from ggml's ``block_iq4_nl`` / ``block_iq4_xs``): iq4_nl (18
bytes) = f16 d, 16 bytes of nibbles (byte i: value i low, value i + 16 high), value
d * kv[q]; iq4_xs (136) = f16 d, uint16 scales_h, scales_l[4], qs[128]: sub-block ib (32
values, 16 bytes of qs packed as iq4_nl's) has the 6-bit scale ls = nibble ib%2 of
scales_l[ib/2] | bits 2ib..2ib+1 of scales_h << 4, value (d * (ls - 32)) * kv[q].
"""

from __future__ import annotations

__all__ = ["IQ4_DEVICE_SOURCE", "IQ4_DECODERS"]

IQ4_DEVICE_SOURCE = r"""
// kvalues_iq4nl[q] (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113) as the bytes of
// two 64-bit constants: a register look-up, where a __constant__ table would serialise a warp's 16 addresses.
__device__ __forceinline__ int kael_kvalue_iq4(int q) {
    const unsigned long long half = q < 8 ? 0xf6eaddcfbfad9881ull : 0x7159453526190d01ull;
    return (int)(signed char)(unsigned char)(half >> (8 * (q & 7)));
}

__device__ __forceinline__ float kael_iq4_nl_value(const unsigned char* b, int j) {
    const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return __fmul_rn(kael_half_at(b), (float)kael_kvalue_iq4(q));
}

__device__ __forceinline__ float kael_iq4_xs_value(const unsigned char* b, int j) {
    const int ib = j >> 5, t = j & 31;
    const unsigned int sh = (unsigned int)b[2] | ((unsigned int)b[3] << 8);
    const int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (int)(((sh >> (2 * ib)) & 3u) << 4);
    const unsigned char* qs = b + 8 + 16 * ib;
    const int q = t < 16 ? (qs[t] & 15) : (qs[t - 16] >> 4);
    return __fmul_rn(__fmul_rn(kael_half_at(b), (float)(ls - 32)), (float)kael_kvalue_iq4(q));
}
"""

IQ4_DECODERS: dict[str, str] = {"iq4_nl": "kael_iq4_nl_value", "iq4_xs": "kael_iq4_xs_value"}
"""Scheme name -> its device decoder in IQ4_DEVICE_SOURCE."""
