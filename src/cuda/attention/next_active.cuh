// A CTA's walk over the key tiles a mask summary row leaves active, as a table in shared
// memory: next[nb] is the first active tile at or after nb. Stepping from one active tile to the
// next is then one shared-memory load, where it was a loop of dependent summary loads (one per
// skipped tile) between a tile's barrier and its next copies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_fwd_params.hpp"  // next_active_table_bytes
#include "cuda/attention/score_mod_sm80.cuh"        // head_index

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

// The mask tile summary's row for (b, h) and summary query tile qt, or null without a mask.
__device__ __forceinline__ const uint8_t* active_row(const AttentionFwdParams& f, int b, int h, int qt) {
  if (!f.tile_active) return nullptr;
  const int mb = f.active_batches == 1 ? 0 : b, mh = int(head_index(f.mask_head_mode, h, f.G));
  const int q = f.active_q_tiles == 1 ? 0 : qt;
  return f.tile_active + ((int64_t(mb) * f.active_heads + mh) * f.active_q_tiles + q) * f.active_k_tiles;
}

// One CTA's rows of the mask tile summary (AttentionFwdParams::tile_active) for a kernel whose
// tiles cover kRows x kCols summary tiles (the summary's are fwd_block_m x fwd_block_n of the
// mma.sync forward): a kernel tile is active if any of its summary tiles is, kept whole if all
// of them are. Null `row`: no mask, every tile active and none kept whole.
template <int kRows, int kCols>
struct SummaryTiles {
  const uint8_t* row;  // the CTA's first summary row
  int rows;            // summary rows of the CTA in range (the last query tile may hold fewer)
  int row_stride;      // between those rows: the summary's key tiles, or 0 broadcast over queries
  int k_tiles;         // the summary's key tiles (1: broadcast over keys)

  // Query tile m_block (of kRows summary rows) of (b, h).
  __device__ static SummaryTiles of(const AttentionFwdParams& p, int b, int h, int m_block) {
    if (!p.tile_active) return {nullptr, 0, 0, 0};
    const bool q_bcast = p.active_q_tiles == 1;
    const int qt = m_block * kRows;
    return {active_row(p, b, h, qt), q_bcast ? 1 : min(kRows, p.active_q_tiles - qt), q_bcast ? 0 : p.active_k_tiles,
            p.active_k_tiles};
  }

  // The summary bits of kernel key tile nb: OR for "some", AND for "all".
  __device__ uint32_t bits(int nb, bool all) const {
    uint32_t any = 0, every = kTileSome | kTileAll;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int kt = k_tiles == 1 ? 0 : nb * kCols + c;
        if (r < rows && kt < k_tiles) {
          const uint32_t v = row[r * row_stride + kt];
          any |= v, every &= v;
        }
      }
    return all ? every : any;
  }
  __device__ bool active(int nb) const { return !row || (bits(nb, false) & kTileSome); }
  __device__ bool keeps_all(int nb) const { return row && (bits(nb, true) & kTileAll); }
};

}  // namespace fdma::cuda
