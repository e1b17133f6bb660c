// GatherLanes (src/cuda/attention/fwd_ws_gather_lanes.cuh), host side: the map by which the
// gathered forward's producer warps copy listed K and V rows into a 128-byte-swizzled tile, the
// same arithmetic the kernel runs. For each shape the kernel takes: every chunk of every row is
// written exactly once, at the place the swizzle gives it (chunk c of row r at c ^ (r % 8)
// within its 128-byte column block, the layout wgmma reads); each row's list entry comes from
// a lane of the warp's own quarter; and each warp-wide copy spreads over the shared-memory
// banks evenly (4 chunks a 16-byte bank group: no conflicts beyond the 4 wavefronts 512 bytes
// take).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/attention/fwd_ws_gather_lanes.cuh"

using fdma::cuda::GatherLanes;

namespace {

// The swizzled layout, written out from its definition rather than from the kernels' code.
uint32_t swizzled_offset(int rows, int row, int chunk) {
  return uint32_t(chunk / 8) * rows * 128 + uint32_t(row) * 128 + (uint32_t((chunk % 8) ^ (row % 8)) << 4);
}

template <int kHeadDim, int kRows>
void check_tile(uint32_t tile_base) {
  using L = GatherLanes<kHeadDim, kRows>;
  constexpr int kChunks = kHeadDim / 8;
  SCOPED_TRACE(testing::Message() << "D " << kHeadDim << ", " << kRows << " rows, base " << tile_base);
  ASSERT_EQ(L::kRowLanes * L::kLaneChunks, kChunks);
  ASSERT_EQ(L::kPasses * L::kRowsPerPass, L::kWarpRows);
  ASSERT_EQ(L::kPasses % L::kPhase, 0);
  std::vector<int> hits(kRows * kChunks, 0);
  for (int block = 0; block < 4; ++block)
    for (int i0 = 0; i0 < L::kPasses; i0 += L::kPhase)
      for (int u = 0; u < L::kPhase; ++u) {
        const int i = i0 + u;
        for (int c = 0; c < L::kLaneChunks; ++c) {
          int bank_groups[8] = {};  // one warp-wide copy: pass i, copy c, all 32 lanes
          for (int lane = 0; lane < 32; ++lane) {
            const int ch = L::first_chunk(lane), sub = L::pass_row(lane);
            const int r = L::row(block, sub, i), k = L::chunk(ch, c);
            ASSERT_GE(r, L::kWarpRows * block);
            ASSERT_LT(r, L::kWarpRows * (block + 1));
            ASSERT_GE(k, 0);
            ASSERT_LT(k, kChunks);
            // The row's list entry sits in lane r - kWarpRows block of the warp (one load a tile).
            ASSERT_EQ(L::source_lane(sub, i), r - L::kWarpRows * block);
            // The source: chunk k of the row, as copy 0's column plus the copy's step.
            ASSERT_EQ(L::chunk(ch, 0) * 16 + L::copy_step_bytes(c), k * 16);
            const uint32_t at = L::offset(tile_base + L::lane_base(block, sub), L::lane_swizzle(ch, sub), i, u, c);
            ASSERT_EQ(at, tile_base + swizzled_offset(kRows, r, k)) << "block " << block << " pass " << i << " copy "
                                                                    << c << " lane " << lane;
            ++hits[r * kChunks + k];
            ++bank_groups[(at / 16) % 8];
          }
          for (int g = 0; g < 8; ++g) EXPECT_EQ(bank_groups[g], 4) << "pass " << i << " copy " << c << " group " << g;
        }
      }
  for (int r = 0; r < kRows; ++r)
    for (int k = 0; k < kChunks; ++k) ASSERT_EQ(hits[r * kChunks + k], 1) << "row " << r << " chunk " << k;
}

}  // namespace

TEST(GatherLanes, EveryChunkOnceAtItsSwizzledPlace) {
  for (const uint32_t base : {0u, 1024u, 7u * 1024u}) {  // tiles are 1024-byte aligned
    check_tile<64, 128>(base);
    check_tile<128, 128>(base);
    check_tile<256, 64>(base);
  }
}

TEST(GatherLanes, LanesARow) {
  // Four lanes a row up to D 128, eight at D 256 (docs/performance.md, "four lanes a gathered row").
  EXPECT_EQ((GatherLanes<64, 128>::kRowLanes), 4);
  EXPECT_EQ((GatherLanes<128, 128>::kRowLanes), 4);
  EXPECT_EQ((GatherLanes<256, 64>::kRowLanes), 8);
}
