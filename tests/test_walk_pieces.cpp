// The walk's pieces (src/cuda/select/walk_pieces.cuh), host side: the same arithmetic the walk
// kernel runs to find its CTA's positions of the rank order. Every position in exactly one
// piece, in order; pieces within a CTA's threads; the narrow ranks (from rank w over k * w more)
// cut 32 a piece and the others as before; without narrow ranks, exactly the pieces of
// `piece` positions the kernel took before them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "cuda/select/walk_pieces.cuh"

using fdma::cuda::WalkPiece;
using fdma::cuda::WalkShape;

namespace {

void check_pieces(int Sk, int piece, int64_t w, int k) {
  SCOPED_TRACE(testing::Message() << "Sk " << Sk << " piece " << piece << " w " << w << " k " << k);
  WalkShape sh{};
  sh.piece = piece;
  fdma::cuda::set_walk_narrow_ranks(sh, Sk, w, k);
  if (w >= Sk || k == 0) {
    EXPECT_EQ(sh.narrow_from, 0);
    EXPECT_EQ(sh.narrow_to, 0);
  } else {
    EXPECT_EQ(sh.narrow_from, w);
    EXPECT_EQ(sh.narrow_to, std::min<int64_t>(Sk, w + k * w));
  }
  const int n = fdma::cuda::walk_pieces(sh, Sk);
  int at = 0, narrow = 0;
  for (int y = 0; y < n; ++y) {
    const WalkPiece p = fdma::cuda::walk_piece(sh, Sk, y);
    ASSERT_EQ(p.first, at) << "piece " << y;
    ASSERT_GT(p.last, p.first) << "piece " << y;
    const bool in_narrow = p.first >= sh.narrow_from && p.last <= sh.narrow_to && sh.narrow_to > sh.narrow_from;
    ASSERT_LE(p.last - p.first, in_narrow ? fdma::cuda::kWalkNarrowPiece : piece) << "piece " << y;
    if (sh.narrow_to == sh.narrow_from) {
      ASSERT_EQ(p.first, y * piece);
      ASSERT_EQ(p.last, std::min(Sk, y * piece + piece));
    } else {  // no piece straddles the narrow ranks' ends
      ASSERT_FALSE(p.first < sh.narrow_from && p.last > sh.narrow_from) << "piece " << y;
      ASSERT_FALSE(p.first < sh.narrow_to && p.last > sh.narrow_to) << "piece " << y;
    }
    narrow += in_narrow;
    at = p.last;
  }
  EXPECT_EQ(at, Sk);
  EXPECT_EQ(narrow, (sh.narrow_to - sh.narrow_from + 31) / 32);
}

TEST(WalkPieces, EveryRankInOnePieceInOrder) {
  for (int Sk : {1, 31, 32, 33, 64, 1000, 8192, 8193, 32768, 100003, 262144})
    for (int piece : {64, 96, 256})
      for (int64_t w : {int64_t(1), int64_t(31), int64_t(32), int64_t(100), int64_t(1024), int64_t(Sk) - 1,
                        int64_t(Sk), int64_t(Sk) + 7})
        for (int k : {0, 1, 3, 64}) {
          if (w < 1) continue;
          check_pieces(Sk, piece, w, k);
        }
}

}  // namespace
