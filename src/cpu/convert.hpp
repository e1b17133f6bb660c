// Element conversions for the CPU backend. bf16 and fp16 are converted bit-exactly with
// round-to-nearest-even, independent of compiler support for _Float16/__bf16, so results
// are the same on every host compiler. Tested alone in tests/test_convert.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "fdma/fdma.hpp"

namespace fdma::cpu {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // keep NaN a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    float mag = float(mant) * 5.9604644775390625e-8f;
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (u < 0x38800000u) {                         // below 2^-14: subnormal half (or zero)
    // |f| * 2^24 is exact; rounding it to an integer (ties to even) gives the mantissa,
    // and 0x400 correctly becomes the smallest normal.
    float scaled = bits_float(u) * 16777216.0f;
    return sign | uint16_t(std::nearbyint(scaled));
  }
  uint32_t h = (((u >> 23) - 112u) << 10) | ((u >> 13) & 0x3ffu);
  const uint32_t rest = u & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may roll into the exponent: correct
  return sign | uint16_t(h);
}

inline const char* byte_ptr(const void* base, DType dt, int64_t index) {
  return static_cast<const char*>(base) + index * static_cast<int64_t>(dtype_size(dt));
}
inline char* byte_ptr(void* base, DType dt, int64_t index) {
  return static_cast<char*>(base) + index * static_cast<int64_t>(dtype_size(dt));
}

template <class Acc>
inline Acc load_one(const void* base, DType dt, int64_t index) {
  switch (dt) {
    case DType::f32: return Acc(static_cast<const float*>(base)[index]);
    case DType::f64: return Acc(static_cast<const double*>(base)[index]);
    case DType::f16: return Acc(half_to_float(static_cast<const uint16_t*>(base)[index]));
    case DType::bf16: return Acc(bf16_to_float(static_cast<const uint16_t*>(base)[index]));
    default: return Acc(0);  // validation admits no other dtype here
  }
}

template <class Acc>
inline void store_one(void* base, DType dt, int64_t index, Acc x) {
  switch (dt) {
    case DType::f32: static_cast<float*>(base)[index] = float(x); break;
    case DType::f64: static_cast<double*>(base)[index] = double(x); break;
    case DType::f16: static_cast<uint16_t*>(base)[index] = float_to_half(float(x)); break;
    case DType::bf16: static_cast<uint16_t*>(base)[index] = float_to_bf16(float(x)); break;
    default: break;
  }
}

// n elements at base[0], base[stride], ... -> dst[0..n). The dtype switch sits outside the loop.
template <class Acc>
void load_strided(const void* base, DType dt, int64_t n, int64_t stride, Acc* dst) {
  switch (dt) {
    case DType::f32: {
      auto p = static_cast<const float*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = Acc(p[i * stride]);
      break;
    }
    case DType::f64: {
      auto p = static_cast<const double*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = Acc(p[i * stride]);
      break;
    }
    case DType::f16: {
      auto p = static_cast<const uint16_t*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = Acc(half_to_float(p[i * stride]));
      break;
    }
    case DType::bf16: {
      auto p = static_cast<const uint16_t*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = Acc(bf16_to_float(p[i * stride]));
      break;
    }
    default: break;
  }
}

template <class Acc>
void store_strided(void* base, DType dt, int64_t n, int64_t stride, const Acc* src) {
  for (int64_t i = 0; i < n; ++i) store_one(base, dt, i * stride, src[i]);
}

}  // namespace fdma::cpu
