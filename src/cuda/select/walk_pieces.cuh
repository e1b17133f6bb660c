// How the walk (select_walk.cuh) cuts a row's rank order into pieces, a CTA each: host and
// device share it, and the C++ tests check it on the host.
//
// A step's work grows with its hits (keys whose index lies below x), and a hit is a kept key
// ranked at w or later: random scores crowd them just past rank w, where a piece of 64-256
// positions holds several steps of up to 32 hits each while most later steps are one ballot
// (tools/profiling/simulate_walk_pieces.py). The kernel lasts as long as its heaviest CTA, so
// the ranks [narrow_from, narrow_to) may be cut one step (32 positions) a piece instead.
#pragma once

#include <cstdint>

#include "cuda/primitives/host_device.cuh"

namespace fdma::cuda {

// Pieces of `piece` positions (a multiple of 32, at most the kernel's threads) but for the
// narrow ranks, 32 a piece (none where narrow_from == narrow_to); spans of `span` positions,
// `spans` = ceil(Sk / span); `words` = ceil(Sk / 32), the 32-bit words of a row's bitmap.
// prefix[row][k][words], k < spans - 1: the bitmap of the keys ranked in spans 0..k.
struct WalkShape {
  int piece, span, spans, words;
  int narrow_from = 0, narrow_to = 0;
};

constexpr int kWalkNarrowPiece = 32;

// The pieces before the narrow ranks (the last of them cut at narrow_from) and the narrow ones.
struct WalkPieceSplit {
  int before, narrow;
};
FDMA_HOST_DEVICE inline WalkPieceSplit walk_piece_split(const WalkShape& sh) {
  return {(sh.narrow_from + sh.piece - 1) / sh.piece,
          (sh.narrow_to - sh.narrow_from + kWalkNarrowPiece - 1) / kWalkNarrowPiece};
}

// The pieces a row takes: those before the narrow ranks, the narrow ones, those after.
FDMA_HOST_DEVICE inline int walk_pieces(const WalkShape& sh, int Sk) {
  const WalkPieceSplit n = walk_piece_split(sh);
  return n.before + n.narrow + (Sk - sh.narrow_to + sh.piece - 1) / sh.piece;
}

// Piece y's positions [first, last) of the rank order.
struct WalkPiece {
  int first, last;
};
FDMA_HOST_DEVICE inline WalkPiece walk_piece(const WalkShape& sh, int Sk, int y) {
  const WalkPieceSplit n = walk_piece_split(sh);
  if (y < n.before) {
    const int first = y * sh.piece;
    return {first, first + sh.piece < sh.narrow_from ? first + sh.piece : sh.narrow_from};
  }
  y -= n.before;
  if (y < n.narrow) {
    const int first = sh.narrow_from + y * kWalkNarrowPiece;
    return {first, first + kWalkNarrowPiece < sh.narrow_to ? first + kWalkNarrowPiece : sh.narrow_to};
  }
  const int first = sh.narrow_to + (y - n.narrow) * sh.piece;
  return {first, first + sh.piece < Sk ? first + sh.piece : Sk};
}

// The narrow ranks for a row of Sk keys at window w: from rank w (the first that walks) over
// `ranks_per_w` times w more, where a random row's steps still hit often (about w / rank of
// their keys do); none where w covers the row.
FDMA_HOST_DEVICE inline void set_walk_narrow_ranks(WalkShape& sh, int Sk, int64_t w, int ranks_per_w) {
  sh.narrow_from = sh.narrow_to = 0;
  if (w >= Sk || ranks_per_w <= 0) return;
  const int64_t to = w + int64_t(ranks_per_w) * w;
  sh.narrow_from = int(w);
  sh.narrow_to = int(to < Sk ? to : Sk);
}

}  // namespace fdma::cuda
