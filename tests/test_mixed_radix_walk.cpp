// MixedRadixWalk (src/cuda/primitives/mixed_radix_walk.cuh), host side: the same arithmetic the
// backward's prepare runs to walk (batch, head, query row) grid-strided, against the coordinates
// `/` and `%` give each linear index. Strides below one inner extent, between it and a whole
// outer slice, past several slices, and equal to them; extents of 1, and extents near 2^31.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/primitives/mixed_radix_walk.cuh"

using fdma::cuda::MixedRadixWalk;

namespace {

// Walks from `first` by `stride` through n_outer slices, checking every element's coordinates;
// `limit` caps the steps for spaces too large to walk whole.
void check_walk(int64_t n_outer, int n_mid, int n_inner, int64_t first, int64_t stride, int64_t limit = 1 << 20) {
  SCOPED_TRACE(testing::Message() << "space " << n_outer << " x " << n_mid << " x " << n_inner << ", first " << first
                                  << ", stride " << stride);
  const int64_t slice = int64_t(n_mid) * n_inner, total = n_outer * slice;
  MixedRadixWalk w(first, stride, n_mid, n_inner);
  int64_t steps = 0;
  for (int64_t r = first; r < total && steps < limit; r += stride, ++steps) {
    ASSERT_EQ(w.outer, r / slice) << "at " << r;
    ASSERT_EQ(w.mid, int(r / n_inner % n_mid)) << "at " << r;
    ASSERT_EQ(w.inner, int(r % n_inner)) << "at " << r;
    ASSERT_LT(w.outer, n_outer);
    w.advance();
  }
  if (steps < limit) {
    EXPECT_GE(w.outer, n_outer) << "the walk ends where the space does";
  }
}

}  // namespace

TEST(MixedRadixWalk, EveryStrideOfSmallSpaces) {
  for (int n_mid : {1, 2, 3, 16})
    for (int n_inner : {1, 5, 64, 130}) {
      const int64_t slice = int64_t(n_mid) * n_inner;
      for (int64_t stride = 1; stride <= 3 * slice + 2; ++stride)
        for (int64_t first : {int64_t(0), int64_t(1), stride - 1, slice - 1, slice + 3})
          if (first >= 0) check_walk(4, n_mid, n_inner, first, stride);
    }
}

TEST(MixedRadixWalk, TheSetupLaunchsShapes) {
  // 16 lanes a row over 132 SMs x 2 CTAs x 512 threads, the rows of B x H x Sq_pad.
  const int64_t stride = int64_t(132) * 2 * 512 / 16;
  for (int64_t first : {int64_t(0), int64_t(7), stride - 1})
    for (int sq : {16384, 131072, 32768, 300, 8448}) {
      check_walk(1, 16, sq, first, stride);
      check_walk(3, 2, sq, first, stride);
    }
}

TEST(MixedRadixWalk, ExtentsNearTwoPow31) {
  std::mt19937_64 rng(7);
  const int big = (1 << 30) + 12345, biggest = 2147483647;
  for (int n_inner : {big, biggest})
    for (int n_mid : {1, 3}) {
      const int64_t slice = int64_t(n_mid) * n_inner;
      for (int t = 0; t < 20; ++t) {
        const int64_t stride = int64_t(rng() % uint64_t(2 * slice)) + 1;
        const int64_t first = int64_t(rng() % uint64_t(slice));
        check_walk(5, n_mid, n_inner, first, stride, 4096);
      }
      check_walk(5, n_mid, n_inner, n_inner - 1, n_inner - 1, 4096);  // the largest inner digit plus its step
    }
}
