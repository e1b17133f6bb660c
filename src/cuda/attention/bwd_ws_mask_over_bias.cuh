// The warp-specialized backward's producer-group helpers around a bias tile
// (attention_bwd_ws.cuh): the zeros of dbias rows no step computes, and, for calls with a mask
// and a bias with a query dim (BwdWsKind::masked_biased), the mask laid over each step's bias
// tile. Two stages of [64 queries][128 keys] mask tiles do not fit beside the biased kind's
// tiles at D 128 (it has under 1 KB spare), so the mask comes as -inf written over the bias
// terms of the scores it drops: P = 0 there, so dS = 0, which is also what dbias takes.
// The producer group's three warps besides the copy-issuing thread do it between the copies
// landing and the consumers reading (mask_over_bias_sm90.cuh; the issuing thread prefetched
// the step's mask box into L2 before waiting for the stage) and arrive on the stage's "ready"
// mbarrier, which the consumers wait on after its "full" one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_bwd_common.cuh"
#include "cuda/attention/bwd_ws_walk.cuh"
#include "cuda/attention/mask_over_bias_sm90.cuh"
#include "cuda/primitives/mbarrier.cuh"

namespace fdma::cuda {

// Zeros of dbias (q's dtype, one dS an element) over rows [r0, r1) of head h and the CTA's keys,
// by the helper threads (a < 96): 16-byte stores (the map's layout keeps rows and key0 16-byte
// aligned), 2-byte ones for the keys of a last chunk before Sk. Lean for the producer's
// registers (zero_dbias_keys' general loop spilled there).
template <class T, class Shape>
__device__ __forceinline__ void bwd_ws_zero_dbias_rows(const AttentionBwdParams& p, const BwdWsWalk& walk, int h,
                                                       int r0, int r1, int a) {
  const AttentionFwdParams& f = p.f;
  constexpr int kChunks = Shape::kBlockN / 8, kRowsAtOnce = kMaskHelperThreads / kChunks;  // 8 keys a chunk
  const int keys = min(Shape::kBlockN, f.Sk - walk.key0);
  const int c = a % kChunks, n = min(8, keys - 8 * c);  // this thread's chunk of every row, its keys
  if (n <= 0) return;
  r1 = min(r1, f.Sq);
  const int64_t pitch = p.dbias_stride[2] * 2;
  int r = r0 + a / kChunks;
  char* at = static_cast<char*>(p.dbias) +
             (dbias_offset(p, walk.b, head_index(f.bias_head_mode, h, f.G), r, walk.key0) + 8 * c) * 2;
  for (; r < r1; r += kRowsAtOnce, at += kRowsAtOnce * pitch) {
    if (n == 8)
      *reinterpret_cast<uint4*>(at) = make_uint4(0, 0, 0, 0);
    else
      for (int e = 0; e < n; ++e) reinterpret_cast<uint16_t*>(at)[e] = 0;
  }
}

// Causal CTAs: the rows [0, q_begin) of every head of the walk, whose dS no step computes.
template <class T, class Shape>
__device__ __forceinline__ void bwd_ws_zero_dbias_above(const AttentionBwdParams& p, const BwdWsWalk& walk, int a) {
  for (int h = walk.hk * p.f.G; h < (walk.hk + 1) * p.f.G; ++h)
    bwd_ws_zero_dbias_rows<T, Shape>(p, walk, h, 0, walk.q_begin, a);
}

// The helper threads (a < 96) over the CTA's walk, beside the copy-issuing thread: for each
// step the summary leaves active, once its copies landed, -inf over the bias terms its mask
// drops (none where the summary keeps the step whole), then an arrival on the stage's ready
// barrier. Where dbias is one dS an element they also write the zeros of the steps the summary
// rules out, and after the walk those of the rows above a causal CTA's keys.
template <class T, class Shape>
__device__ __forceinline__ void bwd_ws_hide_masked_bias(const AttentionBwdParams& p, uint32_t base,
                                                        const unsigned char* smem, const BwdWsWalk& walk, int a) {
  const AttentionFwdParams& f = p.f;
  constexpr int kBM = Shape::kBlockM;
  static_assert(Shape::kBiasBox == kBM * 128, "the bias boxes of 64 keys follow each other");
  const auto steps = bwd_ws_mask_steps<Shape>(smem, f, walk);
  const bool zeros = p.dbias_owner == DbiasOwner::rows && !p.dbias_acc;
  int j = 0;  // the active steps so far: the stages' uses, as the issuing thread counts them
  for (int i = walk.it_begin;; ++i) {
    const int next = steps.next(f, walk, i);
    if (zeros)
      for (; i < next; ++i) {
        const int q0 = walk.template q0<false, kBM>(i);
        bwd_ws_zero_dbias_rows<T, Shape>(p, walk, walk.template head<false>(f, i), q0, q0 + kBM, a);
      }
    i = next;
    if (i >= walk.it_end) break;
    const int s = j % Shape::kStages;
    const uint32_t parity = (j / Shape::kStages) & 1;
    ++j;
    if (steps.keeps_all(f, walk, i)) {
      // Still waited for: one arrival per use keeps the ready barrier's phases in step.
      mbar::wait(Shape::full(base, s), parity);
    } else {
      const int h = walk.template head<false>(f, i), q0 = walk.template q0<false, kBM>(i);
      const uint8_t* mask = f.mask + walk.b * f.mask_stride[0] + head_index(f.mask_head_mode, h, f.G) * f.mask_stride[1];
      lay_mask_over_bias<T, kBM, Shape::kBlockN, kMaskHelperThreads>(
          f, mask, q0, walk.key0, Shape::bias_box(base, s, 0), [&] { mbar::wait(Shape::full(base, s), parity); }, a);
    }
    mbar::arrive(Shape::ready(base, s));  // releases the writes to the consumers
  }
  if (zeros) bwd_ws_zero_dbias_above<T, Shape>(p, walk, a);
}

}  // namespace fdma::cuda
