// float16 and bfloat16 storage types with exact, portable conversions.
//
// Both are stored as 16 bits and computed in float32. float16 rounds to nearest
// even exactly like NumPy (npy_floatbits_to_halfbits / npy_doublebits_to_halfbits);
// bfloat16 rounds to nearest even and turns NaN into the canonical 0x7FC0, like the
// reference backend.
#pragma once

#include <cstdint>
#include <cstring>

namespace kael {

inline uint32_t f32_bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // subnormal: normalise
    exp = 127 - 15 + 1;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    man &= 0x3FFu;
    return bits_f32(sign | (exp << 23) | (man << 13));
  }
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (man << 13));
  return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

inline uint16_t float_to_half_bits(float value) {
  const uint32_t f = f32_bits(value);
  const auto h_sgn = static_cast<uint16_t>((f & 0x80000000u) >> 16);
  const uint32_t f_exp = f & 0x7F800000u;
  if (f_exp >= 0x47800000u) {  // overflow, inf or nan
    if (f_exp == 0x7F800000u) {
      const uint32_t f_sig = f & 0x007FFFFFu;
      if (f_sig != 0) {
        auto ret = static_cast<uint16_t>(0x7C00u + (f_sig >> 13));
        if (ret == 0x7C00u) ++ret;  // keep it a nan
        return static_cast<uint16_t>(h_sgn + ret);
      }
      return static_cast<uint16_t>(h_sgn + 0x7C00u);
    }
    return static_cast<uint16_t>(h_sgn + 0x7C00u);
  }
  if (f_exp <= 0x38000000u) {  // subnormal or zero half
    if (f_exp < 0x33000000u) return h_sgn;
    const uint32_t e = f_exp >> 23;
    uint32_t f_sig = 0x00800000u + (f & 0x007FFFFFu);
    f_sig >>= (113 - e);
    if ((f_sig & 0x3FFFu) != 0x1000u || (f & 0x000007FFu) != 0) f_sig += 0x1000u;
    return static_cast<uint16_t>(h_sgn + static_cast<uint16_t>(f_sig >> 13));
  }
  auto h_exp = static_cast<uint16_t>((f_exp - 0x38000000u) >> 13);
  uint32_t f_sig = f & 0x007FFFFFu;
  if ((f_sig & 0x3FFFu) != 0x1000u) f_sig += 0x1000u;
  auto h_sig = static_cast<uint16_t>(f_sig >> 13);
  return static_cast<uint16_t>(h_sgn + h_exp + h_sig);  // a carry into the exponent is correct
}

inline uint16_t double_to_half_bits(double value) {
  uint64_t d = 0;
  std::memcpy(&d, &value, 8);
  const auto h_sgn = static_cast<uint16_t>((d & 0x8000000000000000ull) >> 48);
  const uint64_t d_exp = d & 0x7FF0000000000000ull;
  if (d_exp >= 0x40F0000000000000ull) {
    if (d_exp == 0x7FF0000000000000ull) {
      const uint64_t d_sig = d & 0x000FFFFFFFFFFFFFull;
      if (d_sig != 0) {
        auto ret = static_cast<uint16_t>(0x7C00u + (d_sig >> 42));
        if (ret == 0x7C00u) ++ret;
        return static_cast<uint16_t>(h_sgn + ret);
      }
      return static_cast<uint16_t>(h_sgn + 0x7C00u);
    }
    return static_cast<uint16_t>(h_sgn + 0x7C00u);
  }
  if (d_exp <= 0x3F00000000000000ull) {
    if (d_exp < 0x3E60000000000000ull) return h_sgn;
    const uint64_t e = d_exp >> 52;
    uint64_t d_sig = 0x0010000000000000ull + (d & 0x000FFFFFFFFFFFFFull);
    d_sig <<= (e - 998);
    if ((d_sig & 0x003FFFFFFFFFFFFFull) != 0x0010000000000000ull) d_sig += 0x0010000000000000ull;
    return static_cast<uint16_t>(h_sgn + static_cast<uint16_t>(d_sig >> 53));
  }
  auto h_exp = static_cast<uint16_t>((d_exp - 0x3F00000000000000ull) >> 42);
  uint64_t d_sig = d & 0x000FFFFFFFFFFFFFull;
  if ((d_sig & 0x7FFFFFFFFFFull) != 0x20000000000ull) d_sig += 0x20000000000ull;
  auto h_sig = static_cast<uint16_t>(d_sig >> 42);
  return static_cast<uint16_t>(h_sgn + h_exp + h_sig);
}

inline float bf16_bits_to_float(uint16_t b) {
  return bits_f32(static_cast<uint32_t>(b) << 16);
}

inline uint16_t float_to_bf16_bits(float f) {
  if (f != f) return 0x7FC0u;  // NOLINT(misc-redundant-expression): nan test
  const uint32_t u = f32_bits(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// 16-bit float storage types: construct from float/double, read as float.
struct Half {
  uint16_t bits;
  Half() = default;
  explicit Half(float f) : bits(float_to_half_bits(f)) {}
  explicit Half(double d) : bits(double_to_half_bits(d)) {}
  explicit operator float() const { return half_bits_to_float(bits); }
};

struct BFloat16 {
  uint16_t bits;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(float_to_bf16_bits(f)) {}
  // like the reference backend: round to float32 first, then to bfloat16
  explicit BFloat16(double d) : bits(float_to_bf16_bits(static_cast<float>(d))) {}
  explicit operator float() const { return bf16_bits_to_float(bits); }
};

}  // namespace kael
