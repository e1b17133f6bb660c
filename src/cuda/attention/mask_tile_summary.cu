// One pass over the mask: for each (mask batch, mask head, query tile, key tile) of the
// kernels' tile shape, whether any key is kept there (kTileSome) and whether all are
// (kTileAll). The kernels skip tiles of zero without loading K, V or bias for them, and take
// tiles the mask keeps whole as if unmasked (no mask tile, no test per score): a block-sparse
// mask then costs its active tiles' dense time.
#include <cuda_runtime.h>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/mask_tile_summary.hpp"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {
namespace {

// grid: (key tiles, query tiles, mask batch * mask heads); one CTA summarises one tile.
__global__ void mask_tile_summary_kernel(const uint8_t* mask, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                                         int heads, int rows, int keys, int block_m, int block_n, uint8_t* active) {
  ptx::griddep_launch_dependents();  // the attention kernel may be placed early (launch.cuh)
  const int kt = blockIdx.x, qt = blockIdx.y, bh = blockIdx.z;
  const int b = bh / heads, h = bh % heads;
  const int r0 = qt * block_m, r1 = min(rows, r0 + block_m);
  const int k0 = kt * block_n, k1 = min(keys, k0 + block_n);
  const int width = k1 - k0;
  bool any = false, all = true;
  // The CTA stops as soon as it has seen both values (a partial tile); kept-whole and empty
  // tiles are read to the end. Where key rows are contiguous and 16-byte aligned, each thread
  // reads 16 keys at once; else consecutive threads read consecutive keys.
  const uint8_t* base = mask + b * s0 + h * s1;
  const bool wide = s3 == 1 && width % 16 == 0 && (reinterpret_cast<uintptr_t>(base) + r0 * s2 + k0) % 16 == 0 &&
                    (r1 - r0 == 1 || s2 % 16 == 0);
  const int per_thread = wide ? 16 : 1, per_row = width / per_thread, n = (r1 - r0) * per_row;
  for (int i0 = 0; i0 < n; i0 += blockDim.x) {  // uniform trip count: the votes need every thread
    const int idx = i0 + threadIdx.x;
    if (idx < n) {
      const int r = r0 + idx / per_row, c = idx % per_row;
      if (wide) {
        const uint4 v = *reinterpret_cast<const uint4*>(base + int64_t(r) * s2 + k0 + 16 * c);
        for (const uint32_t w : {v.x, v.y, v.z, v.w}) {
          any |= w != 0;
          all &= ((w - 0x01010101u) & ~w & 0x80808080u) == 0;  // no zero byte in w
        }
      } else {
        const bool keep = base[int64_t(r) * s2 + int64_t(k0 + c) * s3] != 0;
        any |= keep;
        all &= keep;
      }
    }
    if (__syncthreads_or(any) && !__syncthreads_and(all)) break;
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
