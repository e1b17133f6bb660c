// The bf16/fp16 conversion primitives, alone: exhaustive round trips and rounding against a
// float64 model of round-to-nearest-even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "cpu/convert.hpp"

using namespace fdma::cpu;

namespace {

// Nearest value on the grid `step` (RNE on ties), computed in float64.
double round_to_grid(double x, double step) {
  double q = x / step, fl = std::floor(q), diff = q - fl;
  double r = diff > 0.5 ? fl + 1 : diff < 0.5 ? fl : (std::fmod(fl, 2.0) == 0 ? fl : fl + 1);
  return r * step;
}

// Reference fp16 rounding of a finite float.
double half_model(float f) {
  double x = f, ax = std::fabs(x);
  if (ax >= 65520.0) return std::copysign(INFINITY, x);
  int e = ax < 6.103515625e-05 ? -14 : std::ilogb(ax);
  return round_to_grid(x, std::ldexp(1.0, e - 10));
}

double bf16_model(float f) {
  double x = f, ax = std::fabs(x);
  if (ax == 0) return x;
  int e = std::max(std::ilogb(ax), -126);
  double r = round_to_grid(x, std::ldexp(1.0, e - 7));
  return std::fabs(r) > 3.3895313892515355e38 ? std::copysign(INFINITY, x) : r;
}

}  // namespace

TEST(Convert, HalfRoundTripIsExactForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = half_to_float(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(((h >> 10) & 0x1f) == 31 && (h & 0x3ff) != 0) << h;
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << "half bits " << h << " -> " << f;
  }
}

TEST(Convert, Bf16RoundTripIsExactForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_float(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), h) << "bf16 bits " << h;
  }
}

TEST(Convert, HalfRoundsToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-30, 17);
  for (int t = 0; t < 200000; ++t) {
    float f = std::ldexp(mant(rng), exp(rng)) * (t % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(double(half_to_float(float_to_half(f))), half_model(f)) << f;
  }
  // Ties: halfway between 1 and the next half (1 + 2^-10) goes to even (1).
  EXPECT_EQ(half_to_float(float_to_half(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(half_to_float(float_to_half(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(65520.0f))));
}

TEST(Convert, Bf16RoundsToNearestEven) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-130, 120);
  for (int t = 0; t < 200000; ++t) {
    float f = std::ldexp(mant(rng), exp(rng)) * (t % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(double(bf16_to_float(float_to_bf16(f))), bf16_model(f)) << f;
  }
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);  // tie to even
}

TEST(Convert, StridedLoadAndStore) {
  float src[6] = {1, 2, 3, 4, 5, 6};
  double dst[3];
  load_strided(src, fdma::DType::f32, 3, 2, dst);
  EXPECT_EQ(dst[0], 1);
  EXPECT_EQ(dst[1], 3);
  EXPECT_EQ(dst[2], 5);
  uint16_t out[6] = {};
  store_strided(out, fdma::DType::bf16, 3, 2, dst);
  EXPECT_EQ(bf16_to_float(out[2]), 3.0f);
  EXPECT_EQ(out[1], 0);
}
