// The order in which CTAs take their work. The hardware starts CTAs in the order of their
// linear block index (x fastest, then y), so with a grid of (tiles, heads) the last head's
// tiles start last. Where the work of a tile depends on x (causal: the first key group, or the
// last query tile, sees the most; dynamic mask: the first window's keys are kept longest),
// the long CTAs of the last heads then run alone at the end. With heads_fastest the same
// (x, y) pairs are handed out with y varying fastest, so every head's long tiles start in the
// first wave. Where the work does not depend on x, the plain order keeps the CTAs running
// together on one head's K/V (L2 reuse).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fdma::cuda {

struct CtaTile {
  int x, y;  // the work coordinates that (blockIdx.x, blockIdx.y) would have had
};

__device__ __forceinline__ CtaTile cta_tile(bool heads_fastest) {
  if (!heads_fastest) return {int(blockIdx.x), int(blockIdx.y)};
  const int64_t linear = blockIdx.x + int64_t(gridDim.x) * blockIdx.y;
  return {int(linear / gridDim.y), int(linear % gridDim.y)};
}

// A forward or dq CTA's query tile (of gridDim.x) and grid y (its head or head block). With
// longest_first the last query tiles, which see the most keys (causal; the lists of a causal
// dynamic mask, up to w keys from row w on), start first, every head's together, and the
// short first tiles fill the last wave: the largest-first order of a list scheduler.
struct QueryTileCta {
  int m_block, y;
};
__device__ __forceinline__ QueryTileCta query_tile_cta(bool longest_first) {
  const CtaTile cta = cta_tile(longest_first);
  return {longest_first ? int(gridDim.x) - 1 - cta.x : cta.x, cta.y};
}

}  // namespace fdma::cuda
