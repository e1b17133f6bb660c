// The warp-specialized backward's producer-group helpers around a bias tile
// (attention_bwd_ws.cuh): the zeros of dbias rows no step computes, and, for calls with a mask
// and a bias with a query dim (BwdWsKind::masked_biased), the mask laid over each step's bias
// tile. Two stages of [64 queries][128 keys] mask tiles do not fit beside the biased kind's
// tiles at D 128 (it has under 1 KB spare), so the mask comes as -inf written over the bias
// terms of the scores it drops: P = 0 there, so dS = 0, which is also what dbias takes.
// The producer group's three warps besides the copy-issuing thread do it between the copies
// landing and the consumers reading: they read the step's mask bytes with ordinary loads
// (the issuing thread prefetched the box into L2 before waiting for the stage) and arrive on
// the stage's "ready" mbarrier, which the consumers wait on after its "full" one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/attention_bwd_common.cuh"
#include "cuda/attention/bwd_ws_walk.cuh"
#include "cuda/attention/score_tiles_sm90.cuh"
#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

constexpr int kBwdWsHelperThreads = 96;  // the producer group's warps 1-3

// Zeros of dbias (q's dtype, one dS an element) over rows [r0, r1) of head h and the CTA's keys,
// by the helper threads (a < 96): 16-byte stores (the map's layout keeps rows and key0 16-byte
// aligned), 2-byte ones for the keys of a last chunk before Sk. Lean for the producer's
// registers (zero_dbias_keys' general loop spilled there).
template <class T, class Shape>
__device__ __forceinline__ void bwd_ws_zero_dbias_rows(const AttentionBwdParams& p, const BwdWsWalk& walk, int h,
                                                       int r0, int r1, int a) {
  const AttentionFwdParams& f = p.f;
  constexpr int kChunks = Shape::kBlockN / 8, kRowsAtOnce = kBwdWsHelperThreads / kChunks;  // 8 keys a chunk
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

// A 16-byte chunk of a bias tile (8 terms of a 16-bit dtype, in key order) with neg_inf2 (two
// -inf of that dtype) over the terms whose mask byte is zero: m_lo holds the first four keys'
// bytes, m_hi the last four.
__device__ __forceinline__ uint4 hide_dropped_terms(uint4 terms, uint32_t m_lo, uint32_t m_hi, uint32_t neg_inf2) {
  const uint32_t z_lo = __vcmpeq4(m_lo, 0u), z_hi = __vcmpeq4(m_hi, 0u);  // 0xff per dropped key
  // Each byte's verdict widened over its key's 16-bit term.
  auto pick = [&](uint32_t t, uint32_t z) { return (t & ~z) | (neg_inf2 & z); };
  return make_uint4(pick(terms.x, __byte_perm(z_lo, 0, 0x1100)), pick(terms.y, __byte_perm(z_lo, 0, 0x3322)),
                    pick(terms.z, __byte_perm(z_hi, 0, 0x1100)), pick(terms.w, __byte_perm(z_hi, 0, 0x3322)));
}

// The first n < 16 bytes of a mask chunk at `row`, the rest kept. Out of line: only a last key
// tile ending inside a chunk takes it, and inlined it cost the helpers' few registers.
static __device__ __noinline__ uint4 bwd_ws_mask_chunk_tail(const uint8_t* row, int n) {
  uint32_t w[4] = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};  // (constant indices: registers)
#pragma unroll
  for (int k = 0; k < 16; ++k)
    if (k < n) w[k / 4] = (w[k / 4] & ~(0xffu << (8 * (k % 4)))) | (uint32_t(__ldg(row + k)) << (8 * (k % 4)));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Mask chunk e of a step (16 keys' bytes of one row; 8 chunks a row of the CTA's 128 keys):
// all kept where it lies past Sq or Sk (the consumers hide those scores themselves).
__device__ __forceinline__ uint4 bwd_ws_mask_chunk(const AttentionFwdParams& f, const uint8_t* mask, int q0, int key0,
                                                   int e) {
  const int q = q0 + e / 8, key = key0 + 16 * (e % 8);
  uint4 m = make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
  if (q >= f.Sq || key >= f.Sk) return m;
  const uint8_t* row = mask + q * f.mask_stride[2] + key;
  if (key + 16 <= f.Sk) return __ldg(reinterpret_cast<const uint4*>(row));  // can_tile: 16-byte aligned
  return bwd_ws_mask_chunk_tail(row, f.Sk - key);
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
  constexpr int kBM = Shape::kBlockM, kChunks = kBM * Shape::kBlockN / 16;
  static_assert(Shape::kBlockN == 128 && Shape::kGroupKeys == 64, "8 mask chunks a row, 4 per bias box");
  constexpr int kAtOnce = 2;  // chunks in flight a thread (3 spilled more at the producer's 24 registers)
  constexpr uint32_t kNegInf2 = std::is_same_v<T, __nv_bfloat16> ? 0xff80ff80u : 0xfc00fc00u;
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
      for (int e0 = a; e0 < kChunks; e0 += kAtOnce * kBwdWsHelperThreads) {
        uint4 m[kAtOnce];
#pragma unroll
        for (int k = 0; k < kAtOnce; ++k) {
          const int e = e0 + k * kBwdWsHelperThreads;
          m[k] = e < kChunks ? bwd_ws_mask_chunk(f, mask, q0, walk.key0, e)
                             : make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
        }
        mbar::wait(Shape::full(base, s), parity);  // the bias tiles landed (at once after the first round)
#pragma unroll
        for (int k = 0; k < kAtOnce; ++k) {
          if (__vcmpeq4(m[k].x, 0u) == 0 && __vcmpeq4(m[k].y, 0u) == 0 && __vcmpeq4(m[k].z, 0u) == 0 &&
              __vcmpeq4(m[k].w, 0u) == 0)
            continue;  // all 16 kept (or past the tensor)
          const int e = e0 + k * kBwdWsHelperThreads, row = e / 8, c = e % 8;
          const uint32_t box = Shape::bias_box(base, s, c / 4);  // keys [64 (c / 4), +64) of the CTA
          const uint32_t at0 = swizzled_row<128>(box, row, 32 * (c % 4)), at1 = swizzled_row<128>(box, row, 32 * (c % 4) + 16);
          const uint4 t0 = ptx::ld_shared_v4(at0), t1 = ptx::ld_shared_v4(at1);
          ptx::st_shared_v4(at0, hide_dropped_terms(t0, m[k].x, m[k].y, kNegInf2));
          ptx::st_shared_v4(at1, hide_dropped_terms(t1, m[k].z, m[k].w, kNegInf2));
        }
      }
    }
    mbar::arrive(Shape::ready(base, s));  // releases the writes to the consumers
  }
  if (zeros) bwd_ws_zero_dbias_above<T, Shape>(p, walk, a);
}

}  // namespace fdma::cuda
