// FastDivmod (src/cuda/primitives/fast_divmod.cuh), host side: the same arithmetic the kernels run, against
// the `/` and `%` operators, for every divisor a kernel takes (query-tile counts, GQA group
// sizes) and dividends from 0 up to 2^31 - 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/primitives/fast_divmod.cuh"

using fdma::cuda::FastDivmod;

namespace {

void expect_exact(const FastDivmod& f, int d, int n) {
  ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
  ASSERT_EQ(f.mod(n), n % d) << n << " % " << d;
}

}  // namespace

TEST(FastDivmod, SmallDivisorsAllDividendsToTwoPow16) {
  for (int d = 1; d <= 600; ++d) {
    const FastDivmod f(d);
    for (int n = 0; n < (1 << 16); ++n) expect_exact(f, d, n);
  }
}

TEST(FastDivmod, LargeDividendsAndDivisors) {
  std::mt19937_64 rng(7);
  const int edge[] = {0, 1, 2, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, INT32_MAX - 1, INT32_MAX};
  std::vector<int> divisors;
  for (int k = 0; k <= 30; ++k)  // powers of two and their neighbours: where the shift changes
    for (int64_t d : {(int64_t(1) << k) - 1, int64_t(1) << k, (int64_t(1) << k) + 1})
      if (d >= 1 && d <= INT32_MAX) divisors.push_back(int(d));
  divisors.push_back(INT32_MAX);
  for (int i = 0; i < 2000; ++i) divisors.push_back(int(rng() % INT32_MAX) + 1);
  for (const int d : divisors) {
    const FastDivmod f(d);
    for (int n : edge) expect_exact(f, d, n);
    for (int k = 0; k < 200; ++k) expect_exact(f, d, int(rng() % (uint64_t(INT32_MAX) + 1)));
    // around the largest multiples of d, where an inexact multiplier first goes wrong
    for (int64_t m = int64_t(INT32_MAX) / d; m >= 0 && m > int64_t(INT32_MAX) / d - 3; --m)
      for (int64_t o : {-1, 0, 1}) {
        const int64_t n = m * d + o;
        if (n >= 0 && n <= INT32_MAX) expect_exact(f, d, int(n));
      }
  }
}
