// The gathered backward's zeroing order of its dq sums (dq_zero_tile, attention_bwd_params.hpp;
// the kernel side is bwd_ws_dq_zero.cuh), host side: every (row, tile) exactly once, ranges in
// order, each tile inside its range, and each range's count what its waiters wait for, for row
// counts, tile counts and range sizes that divide and that leave a short last range.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/attention/attention_bwd_params.hpp"

using fdma::cuda::dq_zero_tile;
using fdma::cuda::dq_zero_tiles_in_range;

TEST(DqZeroTiles, EveryTileOnceInRangeOrder) {
  for (int rows : {1, 2, 3, 16, 33})
    for (int tiles : {1, 2, 7, 64, 257})
      for (int per_range : {1, 2, 5, 18, 64, 300}) {
        SCOPED_TRACE(testing::Message() << "rows " << rows << " tiles " << tiles << " per range " << per_range);
        const int ranges = (tiles + per_range - 1) / per_range;
        std::vector<int> seen(size_t(rows) * tiles, 0), per(ranges, 0);
        int last_range = 0;
        for (int c = 0; c < rows * tiles; ++c) {
          const auto z = dq_zero_tile(c, rows, tiles, per_range);
          ASSERT_GE(z.range, last_range);
          ASSERT_LT(z.range, ranges);
          ASSERT_TRUE(z.row >= 0 && z.row < rows) << c;
          ASSERT_TRUE(z.tile >= z.range * per_range && z.tile < (z.range + 1) * per_range && z.tile < tiles) << c;
          ++seen[size_t(z.row) * tiles + z.tile];
          ++per[z.range];
          last_range = z.range;
        }
        for (int v : seen) ASSERT_EQ(v, 1);
        for (int r = 0; r < ranges; ++r) ASSERT_EQ(per[r], dq_zero_tiles_in_range(r, rows, tiles, per_range)) << r;
        ASSERT_EQ(dq_zero_tiles_in_range(ranges, rows, tiles, per_range), 0);
      }
}
