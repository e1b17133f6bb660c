// The mask laid over a bias tile as -inf (the warp-specialized kernels' calls with a mask and a
// bias with a query dim where shared memory holds the bias tiles but not the mask's besides:
// backward at D 64 and 128, attention_bwd_ws.cuh; forward at D 256, attention_fwd_ws.cuh).
// The producer group's idle warps read the tile's mask bytes from global memory once the copy
// engine has landed the bias tile and write -inf over the terms of the scores the mask drops:
// the consumers then run the bias-only code, P = 0 where masked, so dS and dbias are 0 there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/score_tiles_sm90.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

// The threads that lay the mask: the producer group's warps 1-3, beside the copy-issuing thread
// (their `a` 0..95); each stage's "ready" mbarrier counts one arrival from each.
constexpr int kMaskHelperThreads = 96;

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
static __device__ __noinline__ uint4 mask_chunk_tail(const uint8_t* row, int n) {
  uint32_t w[4] = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};  // (constant indices: registers)
#pragma unroll
  for (int k = 0; k < 16; ++k)
    if (k < n) w[k / 4] = (w[k / 4] & ~(0xffu << (8 * (k % 4)))) | (uint32_t(__ldg(row + k)) << (8 * (k % 4)));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Mask chunk e of a tile of kKeys keys (16 keys' bytes of one row, kKeys / 16 chunks a row): all
// kept where it lies past Sq or Sk (the consumers hide those scores themselves).
template <int kKeys>
__device__ __forceinline__ uint4 mask_chunk(const AttentionFwdParams& f, const uint8_t* mask, int q0, int key0, int e) {
  const int q = q0 + e / (kKeys / 16), key = key0 + 16 * (e % (kKeys / 16));
  uint4 m = make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
  if (q >= f.Sq || key >= f.Sk) return m;
  const uint8_t* row = mask + q * f.mask_stride[2] + key;
  if (key + 16 <= f.Sk) return __ldg(reinterpret_cast<const uint4*>(row));  // can_tile: 16-byte aligned
  return mask_chunk_tail(row, f.Sk - key);
}

// -inf over the bias terms the mask drops in a tile of [kRows queries][kKeys keys] (from q0 and
// key0; mask: the (batch, head)'s plane, rows mask_stride[2] apart, keys contiguous and 16-byte
// aligned): kKeys / 64 boxes of [kRows][64] terms of T, kRows * 128 bytes apart from `tile`,
// 128-byte swizzled. By kThreads threads (a < kThreads); wait_landed() waits for the tile's
// copy, called after the first loads are in flight. Chunks whose 16 keys are all kept are not
// written.
template <class T, int kRows, int kKeys, int kThreads, class WaitLanded>
__device__ __forceinline__ void lay_mask_over_bias(const AttentionFwdParams& f, const uint8_t* mask, int q0, int key0,
                                                   uint32_t tile, WaitLanded&& wait_landed, int a) {
  static_assert(kKeys % 64 == 0, "whole 64-key boxes");
  constexpr int kChunks = kRows * kKeys / 16, kRowChunks = kKeys / 16;
  constexpr int kAtOnce = 2;  // chunks in flight a thread (3 spilled more at the producers' 24 registers)
  constexpr uint32_t kNegInf2 = std::is_same_v<T, __nv_bfloat16> ? 0xff80ff80u : 0xfc00fc00u;
  for (int e0 = a; e0 < kChunks; e0 += kAtOnce * kThreads) {
    uint4 m[kAtOnce];
#pragma unroll
    for (int k = 0; k < kAtOnce; ++k) {
      const int e = e0 + k * kThreads;
      m[k] = e < kChunks ? mask_chunk<kKeys>(f, mask, q0, key0, e)
                         : make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
    }
    wait_landed();  // (at once after the first round)
#pragma unroll
    for (int k = 0; k < kAtOnce; ++k) {
      if (__vcmpeq4(m[k].x, 0u) == 0 && __vcmpeq4(m[k].y, 0u) == 0 && __vcmpeq4(m[k].z, 0u) == 0 &&
          __vcmpeq4(m[k].w, 0u) == 0)
        continue;  // all 16 kept (or past the tensor)
      const int e = e0 + k * kThreads, row = e / kRowChunks, c = e % kRowChunks;
      const uint32_t box = tile + (c / 4) * kRows * 128;  // the 64-key box of the chunk's keys
      const uint32_t at0 = swizzled_row<128>(box, row, 32 * (c % 4)), at1 = swizzled_row<128>(box, row, 32 * (c % 4) + 16);
      const uint4 t0 = ptx::ld_shared_v4(at0), t1 = ptx::ld_shared_v4(at1);
      ptx::st_shared_v4(at0, hide_dropped_terms(t0, m[k].x, m[k].y, kNegInf2));
      ptx::st_shared_v4(at1, hide_dropped_terms(t1, m[k].z, m[k].w, kNegInf2));
    }
  }
}

}  // namespace fdma::cuda
