// The gathered warp-specialized backward's dq sums zeroed inside the kernel, not by the setup
// launch before it: the producer group's three idle warps of every CTA claim the sums' 64-row
// tiles in range order (a (batch, head)'s tile of a range at a time), zero them and count each
// range's tiles done. The producer thread hands out no item of a range before the range is
// counted whole (the consumers take the item after it, through the slot's mbarrier, and the
// group's first thread, which issues its reductions, fences the async proxy at each item); the
// finish kernel waits the same way before it reads a range's sums. The zeroing then runs beside
// the kernel's first steps instead of ahead of them on the launch chain (docs/performance.md,
// "the passes around the fused backward").
//
// No wait can outlast the work: the zeroing warps wait on nothing, and whichever CTAs run claim
// and zero every tile between them.
#pragma once

#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tma.cuh"

namespace fdma::cuda {

// One warp's share: claims the next tile (lane 0, broadcast), zeroes its 64 x D floats in
// 16-byte stores, fences them for the copy engine's reductions, then counts it for its range.
__device__ __forceinline__ void bwd_ws_zero_dq_sums(const AttentionBwdParams& p, int lane) {
  const BwdWsPlan& w = p.ws;
  const int bh = p.f.B * p.f.H, total = bh * w.dq_tiles;
  for (;;) {
    int c = 0;
    if (lane == 0) c = atomicAdd(w.zero_next, 1);
    c = __shfl_sync(0xffffffffu, c, 0);
    if (c >= total) break;
    const DqZeroTile z = dq_zero_tile(c, bh, w.dq_tiles, w.tiles_per_range);
    float4* dst = reinterpret_cast<float4*>(p.dq_acc) + (int64_t(z.row) * w.dq_tiles + z.tile) * w.dq_tile_float4s;
    for (int i = lane; i < w.dq_tile_float4s; i += 32) dst[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    tma::fence_proxy_async_global();  // the stores, before other SMs' bulk reductions
    __threadfence();
    __syncwarp();
    if (lane == 0) ptx::red_release_gpu_add(w.zero_done + z.range, 1);
  }
}

// Until range r's sums are zeroed (one thread).
__device__ __forceinline__ void bwd_ws_wait_dq_zeroed(const AttentionBwdParams& p, int r) {
  const BwdWsPlan& w = p.ws;
  const int target = dq_zero_tiles_in_range(r, p.f.B * p.f.H, w.dq_tiles, w.tiles_per_range);
  while (ptx::ld_acquire_gpu(w.zero_done + r) < target) __nanosleep(128);
  tma::fence_proxy_async_global();  // the zeros, before bulk reductions after this
}

// The producer thread at an item of range r: waits once a range (a CTA's ranges only go up,
// bwd_ws_next_item); `zeroed` the last range it waited for.
__device__ __forceinline__ void bwd_ws_see_dq_zeroed(const AttentionBwdParams& p, int r, int& zeroed) {
  if (!p.ws.zero_done || r == zeroed) return;
  bwd_ws_wait_dq_zeroed(p, r);
  zeroed = r;
}

}  // namespace fdma::cuda
