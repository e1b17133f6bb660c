// One pass over the mask: for each (mask batch, mask head, query tile, key tile) of the
// kernels' tile shape, whether any key is kept there (kTileSome) and whether all are
// (kTileAll). The kernels skip tiles of zero without loading K, V or bias for them, and take
// tiles the mask keeps whole as if unmasked (no mask tile, no test per score): a block-sparse
// mask then costs its active tiles' dense time.
#include <cuda_runtime.h>

#include "cuda/attention_fwd_params.hpp"
#include "cuda/mask_tile_summary.hpp"

namespace fdma::cuda {
namespace {

// grid: (key tiles, query tiles, mask batch * mask heads); one CTA ORs one tile.
__global__ void mask_tile_summary_kernel(const uint8_t* mask, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                                         int heads, int rows, int keys, int block_m, int block_n, uint8_t* active) {
  const int kt = blockIdx.x, qt = blockIdx.y, bh = blockIdx.z;
  const int b = bh / heads, h = bh % heads;
  const int r0 = qt * block_m, r1 = min(rows, r0 + block_m);
  const int k0 = kt * block_n, k1 = min(keys, k0 + block_n);
  const int width = k1 - k0;
  bool any = false, all = true;
  // Consecutive threads read consecutive keys: coalesced for contiguous masks. A thread stops
  // once it has seen both values.
  for (int idx = threadIdx.x; idx < (r1 - r0) * width && (all || !any); idx += blockDim.x) {
    const int r = r0 + idx / width, j = k0 + idx % width;
    const bool keep = mask[b * s0 + h * s1 + int64_t(r) * s2 + int64_t(j) * s3] != 0;
    any |= keep;
    all &= keep;
  }
  any = __syncthreads_or(any);
  all = __syncthreads_and(all);
  if (threadIdx.x == 0)
    active[(int64_t(bh) * gridDim.y + qt) * gridDim.x + kt] = any ? (all ? kTileSome | kTileAll : kTileSome) : 0;
}

}  // namespace

MaskTileGrid mask_tile_grid(const detail::Broadcast& mask, int64_t Sq, int64_t Sk, int block_m, int block_n) {
  MaskTileGrid g;
  g.q_tiles = mask.size[2] == 1 ? 1 : int((Sq + block_m - 1) / block_m);
  g.k_tiles = mask.size[3] == 1 ? 1 : int((Sk + block_n - 1) / block_n);
  g.planes = int(mask.size[0] * mask.size[1]);
  return g;
}

cudaError_t launch_mask_tile_summary(const uint8_t* mask, const detail::Broadcast& bc, int block_m, int block_n,
                                     const MaskTileGrid& g, uint8_t* active, cudaStream_t stream) {
  const int rows = int(bc.size[2]);
  dim3 grid(g.k_tiles, g.q_tiles, g.planes);
  // A broadcast dim is one row/key wide; a full one is tiled like the forward.
  mask_tile_summary_kernel<<<grid, 128, 0, stream>>>(mask, bc.stride[0], bc.stride[1], bc.stride[2], bc.stride[3],
                                                     int(bc.size[1]), rows, int(bc.size[3]),
                                                     bc.size[2] == 1 ? 1 : block_m, bc.size[3] == 1 ? 1 : block_n,
                                                     active);
  return cudaGetLastError();
}

}  // namespace fdma::cuda
