// The mask tile summary alone (mask_tile_summary.cu), compiled into this binary from the
// library's source: for random masks whose tiles are empty, kept whole, or partial (one odd
// element anywhere in the tile, or random), every tile's bits against a plain host loop. Row-
// contiguous masks take the 16-byte path; a mask one byte off alignment, a transposed one and
// ragged tile edges take the byte path; broadcast query or key dims give one-row/one-key tiles.
// Skipped where no GPU is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/problem.hpp"
#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/mask_tile_summary.hpp"
#include "fdma/fdma.hpp"

namespace {

struct SummaryCase {
  int64_t planes, rows, keys;  // rows or keys 1: a broadcast dim
  int block_m, block_n;
  bool transposed;  // keys outer, rows inner (stride[3] != 1)
  int64_t offset;   // bytes before the mask in its buffer (1: no 16-byte alignment)
};

void check(const SummaryCase& sc, uint64_t seed) {
  const int64_t plane = sc.rows * sc.keys;
  fdma::detail::Broadcast bc;
  bc.present = true;
  bc.size[0] = 1, bc.size[1] = sc.planes, bc.size[2] = sc.rows, bc.size[3] = sc.keys;
  bc.stride[1] = plane;
  bc.stride[2] = sc.rows == 1 ? 0 : sc.transposed ? 1 : sc.keys;
  bc.stride[3] = sc.keys == 1 ? 0 : sc.transposed ? sc.rows : 1;
  const int64_t Sq = sc.rows == 1 ? 300 : sc.rows, Sk = sc.keys == 1 ? 300 : sc.keys;
  const fdma::cuda::MaskTileGrid g = fdma::cuda::mask_tile_grid(bc, Sq, Sk, sc.block_m, sc.block_n);
  const int bm = sc.rows == 1 ? 1 : sc.block_m, bn = sc.keys == 1 ? 1 : sc.block_n;

  // Per tile: 0 empty, 1 kept whole, 2 whole but one element off, 3 empty but one on, 4 random.
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> host(sc.offset + sc.planes * plane);
  uint8_t* m = host.data() + sc.offset;
  for (int64_t p = 0; p < sc.planes; ++p)
    for (int qt = 0; qt < g.q_tiles; ++qt)
      for (int kt = 0; kt < g.k_tiles; ++kt) {
        const int kind = int(rng() % 5);
        const int64_t r0 = int64_t(qt) * bm, r1 = std::min<int64_t>(sc.rows, r0 + bm);
        const int64_t k0 = int64_t(kt) * bn, k1 = std::min<int64_t>(sc.keys, k0 + bn);
        const int64_t odd = int64_t(rng() % uint64_t((r1 - r0) * (k1 - k0)));
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = k0; k < k1; ++k) {
            const bool is_odd = (r - r0) * (k1 - k0) + (k - k0) == odd;
            const bool on = kind == 0 ? false : kind == 1 ? true : kind == 2 ? !is_odd : kind == 3 ? is_odd : rng() % 2;
            m[p * bc.stride[1] + r * bc.stride[2] + k * bc.stride[3]] = on;
          }
      }
  std::vector<uint8_t> want(g.bytes());
  for (int64_t p = 0; p < sc.planes; ++p)
    for (int qt = 0; qt < g.q_tiles; ++qt)
      for (int kt = 0; kt < g.k_tiles; ++kt) {
        bool any = false, all = true;
        for (int64_t r = int64_t(qt) * bm; r < std::min<int64_t>(sc.rows, int64_t(qt + 1) * bm); ++r)
          for (int64_t k = int64_t(kt) * bn; k < std::min<int64_t>(sc.keys, int64_t(kt + 1) * bn); ++k) {
            const bool on = m[p * bc.stride[1] + r * bc.stride[2] + k * bc.stride[3]] != 0;
            any |= on, all &= on;
          }
        want[(p * g.q_tiles + qt) * g.k_tiles + kt] =
            any ? (all ? fdma::cuda::kTileSome | fdma::cuda::kTileAll : fdma::cuda::kTileSome) : 0;
      }

  uint8_t *dmask = nullptr, *dactive = nullptr;
  ASSERT_EQ(cudaMalloc(&dmask, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dactive, g.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dmask, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dactive, 0xAB, g.bytes()), cudaSuccess);  // poisoned: every entry must be written
  ASSERT_EQ(fdma::cuda::launch_mask_tile_summary(dmask + sc.offset, bc, sc.block_m, sc.block_n, g, dactive, nullptr),
            cudaSuccess);
  std::vector<uint8_t> got(g.bytes());
  ASSERT_EQ(cudaMemcpy(got.data(), dactive, g.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dmask);
  cudaFree(dactive);
  for (int64_t i = 0; i < g.bytes(); ++i)
    ASSERT_EQ(int(got[i]), int(want[i])) << "tile " << i << " of " << g.bytes();
}

TEST(MaskSummaryGpu, EveryTileMatchesAHostLoop) {
  if (!fdma::cuda_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped";
  uint64_t seed = 1;
  const SummaryCase cases[] = {
      {3, 640, 768, 64, 64, false, 0},    // aligned rows: 16-byte reads
      {2, 640, 768, 128, 128, false, 0},  // tiles of 16 KB: several passes, an early stop on partial tiles
      {2, 700, 900, 64, 64, false, 0},    // ragged edges: 900 % 16 != 0, the byte path
      {2, 640, 768, 64, 64, false, 1},    // one byte off alignment: the byte path
      {2, 320, 448, 128, 64, true, 0},    // transposed: stride[3] != 1
      {2, 1, 1000, 64, 128, false, 0},    // a key padding mask: query dim broadcast
      {2, 500, 1, 128, 64, false, 0},     // a query mask: key dim broadcast
  };
  for (const SummaryCase& sc : cases)
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE(testing::Message() << "rows " << sc.rows << " keys " << sc.keys << " tile " << sc.block_m << "x"
                                      << sc.block_n << " transposed " << sc.transposed << " offset " << sc.offset);
      check(sc, seed++);
    }
}

}  // namespace
