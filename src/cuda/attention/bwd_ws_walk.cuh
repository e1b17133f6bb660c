// The walk of a warp-specialized backward CTA (attention_bwd_ws.cuh, attention_bwd_ws_d256.cuh):
// which (head, query tile) steps it takes over its keys, in what order the CTAs start, and for
// masked calls the mask summary's verdicts on those steps (skipped, masked, or kept whole).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/attention/cta_order.cuh"
#include "cuda/attention/next_active.cuh"
#include "cuda/primitives/fast_divmod.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

// The walk of a CTA (gathered: of an item): steps [it_begin, it_end) over (head of the group,
// 64-query tile). Dense: the G heads of its KV head, each over the query tiles that can see its
// keys (causal: from the first key's diagonal), head-major. Gathered: the tiles its keys'
// intervals span, from the last down, the G heads innermost (by_group divides by G); group is
// the item's key group (BwdWsPlan).
struct BwdWsWalk {
  int key0, hk, b, q_begin, n_q, it_begin, it_end, group;
  FastDivmod by_group{1};
  template <bool kGather>
  __device__ int head(const AttentionFwdParams& f, int i) const {
    return hk * f.G + (kGather ? by_group.mod(i) : i / n_q);
  }
  template <bool kGather, int kRows>
  __device__ int q0(int i) const {
    return q_begin + (kGather ? n_q - 1 - by_group.div(i) : i % n_q) * kRows;
  }
};

// Dense: the CTA's walk over its kBlockN keys (causal: from the first key's diagonal; the first
// key blocks walk the most queries, so every head's start first, cta_order.cuh). With
// batches_too (a dbias summed over heads or batches), the CTAs of one key block over every
// (KV head, batch) are handed out together, so that their sums into the same dbias tiles meet
// in L2 (in the plain order each tile's additions came a head apart and went to DRAM).
template <class Shape>
__device__ __forceinline__ BwdWsWalk bwd_ws_dense_walk(const AttentionFwdParams& f, bool batches_too = false) {
  CtaTile cta = cta_tile(f.causal);
  int b = blockIdx.z;
  if (batches_too) {
    const int64_t linear = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
    const int64_t heads = int64_t(gridDim.y) * gridDim.z, rest = linear % heads;
    cta = {int(linear / heads), int(rest % gridDim.y)};
    b = int(rest / gridDim.y);
  }
  BwdWsWalk walk;
  walk.key0 = cta.x * Shape::kBlockN, walk.hk = cta.y, walk.b = b, walk.group = 0;
  walk.q_begin = f.causal ? max(0, walk.key0 - (f.Sk - f.Sq)) / Shape::kBlockM * Shape::kBlockM : 0;
  walk.n_q = walk.q_begin < f.Sq ? (f.Sq - walk.q_begin + Shape::kBlockM - 1) / Shape::kBlockM : 0;
  walk.it_begin = 0, walk.it_end = f.G * walk.n_q;
  return walk;
}

// Masked: the mask summary's verdict on step i of the CTA's walk: whether the mask keeps any of
// its scores, and whether it keeps all of them.
template <class Shape>
struct BwdWsMaskStep {
  bool active, all;
  __device__ static BwdWsMaskStep of(const AttentionFwdParams& f, const BwdWsWalk& walk, int i) {
    const int h = walk.template head<false>(f, i), q0 = walk.template q0<false, Shape::kBlockM>(i);
    const typename Shape::Summary tiles = Shape::Summary::of(f, walk.b, h, q0 / Shape::kBlockM);
    const int nb = walk.key0 / Shape::kBlockN;
    return {tiles.active(nb), tiles.keeps_all(nb)};
  }
};

// Masked: the walk's verdicts as bitmaps in shared memory, built once by all the CTA's threads,
// so that a run of ruled-out steps costs a few shared loads, not a summary read each (at 1/8 of
// the blocks kept, the walk of reads made the backward slower than the dk/dv kernel's). Walks
// of more than kMaxMaskSteps steps read the summary per step instead, as do all walks where
// the next-active table is switched off (FDMA_NEXT_ACTIVE_TABLE=0: the tests' way to reach
// that walk).
template <class Shape>
struct BwdWsMaskSteps {
  uint32_t some;  // the bitmaps' shared address (bit r: step it_begin + r), "all" kMaxMaskSteps bits on
  int n;
  bool tabled;

  __device__ BwdWsMaskSteps(const unsigned char* smem, const AttentionFwdParams& f, const BwdWsWalk& walk)
      : some(ptx::smem_addr(smem + Shape::kMaskSteps)),  // (one register, not two 64-bit pointers)
        n(walk.it_end - walk.it_begin),
        tabled(f.next_active_table && n <= Shape::kMaxMaskSteps) {}

  // Fills the bitmaps, all threads of the CTA (whole warps) taking 32 steps a warp at a time.
  __device__ static void build(unsigned char* smem, const AttentionFwdParams& f, const BwdWsWalk& walk, int tid,
                               int threads) {
    uint32_t* some = reinterpret_cast<uint32_t*>(smem + Shape::kMaskSteps);
    uint32_t* all = some + Shape::kMaxMaskSteps / 32;
    const int n = walk.it_end - walk.it_begin;
    for (int r0 = tid / 32 * 32; r0 < n; r0 += threads) {
      const int r = r0 + tid % 32;
      BwdWsMaskStep<Shape> m{false, false};
      if (r < n) m = BwdWsMaskStep<Shape>::of(f, walk, walk.it_begin + r);
      const uint32_t s = __ballot_sync(0xffffffffu, m.active), a = __ballot_sync(0xffffffffu, m.all);
      if (tid % 32 == 0) some[r0 / 32] = s, all[r0 / 32] = a;
    }
  }

  // The first step at or after i (absolute) the summary leaves active, or walk.it_end; and
  // whether the summary keeps all of step i.
  __device__ int next(const AttentionFwdParams& f, const BwdWsWalk& walk, int i) const {
    if (!tabled) {
      while (i < walk.it_end && !BwdWsMaskStep<Shape>::of(f, walk, i).active) ++i;
      return i;
    }
    for (int r = i - walk.it_begin; r < n; r = (r | 31) + 1) {
      const uint32_t w = ptx::ld_shared_b32(some + r / 32 * 4) >> (r % 32);
      if (w) return walk.it_begin + r + __ffs(w) - 1;
    }
    return walk.it_end;
  }
  __device__ bool keeps_all(const AttentionFwdParams& f, const BwdWsWalk& walk, int i) const {
    if (!tabled) return BwdWsMaskStep<Shape>::of(f, walk, i).all;
    const int r = i - walk.it_begin;
    return (ptx::ld_shared_b32(some + Shape::kMaxMaskSteps / 8 + r / 32 * 4) >> (r % 32)) & 1u;
  }
};

// The walk's verdicts of a masked call (nothing for the others).
template <class Shape>
__device__ __forceinline__ auto bwd_ws_mask_steps(const unsigned char* smem, const AttentionFwdParams& f,
                                                  const BwdWsWalk& walk) {
  if constexpr (Shape::kMasked)
    return BwdWsMaskSteps<Shape>(smem, f, walk);
  else
    return 0;
}

}  // namespace fdma::cuda
