// Host side of the mask tile summary (see mask_tile_summary.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/problem.hpp"

namespace fdma::cuda {

struct MaskTileGrid {
  int q_tiles = 0, k_tiles = 0, planes = 0;  // planes = mask batch * mask heads
  int64_t bytes() const { return int64_t(q_tiles) * k_tiles * planes; }
};

MaskTileGrid mask_tile_grid(const detail::Broadcast& mask, int64_t Sq, int64_t Sk, int block_m, int block_n);

cudaError_t launch_mask_tile_summary(const uint8_t* mask, const detail::Broadcast& bc, int block_m, int block_n,
                                     const MaskTileGrid& g, uint8_t* active, cudaStream_t stream);

}  // namespace fdma::cuda
