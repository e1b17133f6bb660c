// A CTA's walk over the key tiles a mask summary row leaves active, as a table in shared
// memory: next[nb] is the first active tile at or after nb. Stepping from one active tile to the
// next is then one shared-memory load, where it was a loop of dependent summary loads (one per
// skipped tile) between a tile's barrier and its next copies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_fwd_params.hpp"  // next_active_table_bytes

namespace fdma::cuda {

// Fills next[0..n] (next[n] = n; n tiles, n <= 32 * threads) from is_active(nb), read once per
// tile, with all `threads` threads of the CTA (whole warps); `next` spans
// next_active_table_bytes(n) bytes, 16-byte aligned. Syncs the CTA before and after (the
// caller's previous walk may still read the table).
template <class IsActive>
__device__ __forceinline__ void build_next_active(int16_t* next, int n, IsActive&& is_active, int tid, int threads) {
  int* warp_first = reinterpret_cast<int*>(reinterpret_cast<char*>(next) + next_active_table_bytes(n) - 32 * 4);
  // Each thread a run of tiles: the first active one in its run.
  const int per = (n + threads - 1) / threads;  // at most 32: the caller bounds n
  const int lo = min(tid * per, n), hi = min(lo + per, n);
  uint32_t bits = 0;
  int first = n;
  for (int nb = hi - 1; nb >= lo; --nb)
    if (is_active(nb)) bits |= 1u << (nb - lo), first = nb;
  // The first active tile after this thread's run: a suffix minimum over the later threads,
  // within the warp by shuffles, then over the later warps.
  const int lane = tid % 32, warp = tid / 32;
  int suffix = first;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int other = __shfl_down_sync(0xffffffffu, suffix, off);
    if (lane + off < 32) suffix = min(suffix, other);
  }
  int after = __shfl_down_sync(0xffffffffu, suffix, 1);
  if (lane == 31) after = n;
  __syncthreads();  // the previous walk's readers of warp_first and next are done
  if (lane == 0) warp_first[warp] = suffix;
  __syncthreads();
  for (int w = warp + 1; w < threads / 32; ++w) after = min(after, warp_first[w]);
  for (int nb = hi - 1; nb >= lo; --nb) {
    if (bits >> (nb - lo) & 1u) after = nb;
    next[nb] = int16_t(after);
  }
  if (tid == 0) next[n] = int16_t(n);
  __syncthreads();
}

}  // namespace fdma::cuda
