// Mask and bias tiles that the copy engine wrote into shared memory with a 128- or 64-byte
// swizzle (the warp-specialized forward's scored calls, attention_fwd_ws.cuh; the masked and
// biased warp-specialized backward reads its tiles transposed, attention_bwd_ws.cuh), read in the
// accumulator layout of wgmma and mma.sync: thread (g = lane / 4, t = lane % 4) of a warp
// holds rows `row` and row + 8 of the 128-row tile (row = 16 * warp + g) and keys 8 nt + 2t
// and + 1. The swizzle stores the 16-byte chunk c of tile row r at chunk c ^ (r mod 8) in
// 128-byte rows and c ^ ((r / 2) mod 4) in 64-byte rows, so the 8 rows a load touches fall in
// 8 different chunks of the banks: no bank conflicts, where unswizzled rows 128 bytes apart
// would all hit the same banks.
//
// Each load's address is the thread's row address XOR the chunk, worked out at the load from
// the stage's tile address: precomputed per chunk, the addresses are loop-invariant and the
// compiler kept them in registers across the loop (the consumers spilled 160 bytes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

// The shared address of byte `byte` (< kRowBytes) of row `row`, the row's swizzle folded in;
// for a byte < 16, chunk c's is then `that ^ (c << 4)`. `tile` is 1024-byte aligned.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzled_row(uint32_t tile, int row, int byte) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "the 128- and 64-byte swizzles");
  const uint32_t at = tile + row * kRowBytes + byte;  // bits 4..6 (4..5) clear
  return at ^ (kRowBytes == 128 ? (row & 7) << 4 : ((row >> 1) & 3) << 4);
}

// Hides (-inf) the scores a mask tile of [128 rows][kKeys bytes] does not keep (kKeys = 128 or
// 64: that many bytes a row and the matching swizzle).
template <int kKeys, int kTilesN>
__device__ __forceinline__ void hide_masked_tile(float (&s)[kTilesN][4], uint32_t tile, int row, int t) {
  const uint32_t at = swizzled_row<kKeys>(tile, row, 2 * t);
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the thread's two adjacent keys of a row in one load; row + 8: same swizzle
      const uint32_t keep = ptx::ld_shared_u16((at ^ ((nt / 2) << 4)) + (nt % 2) * 8 + r * 8 * kKeys);
      if (!(keep & 0xff)) s[nt][2 * r] = -INFINITY;
      if (!(keep >> 8)) s[nt][2 * r + 1] = -INFINITY;
    }
}

// The same for a mask row shared by every query row ([.., 1, Sk]), unswizzled.
template <int kTilesN>
__device__ __forceinline__ void hide_masked_keys(float (&s)[kTilesN][4], uint32_t keys, int t) {
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt) {
    const uint32_t keep = ptx::ld_shared_u16(keys + nt * 8 + 2 * t);
    if (!(keep & 0xff)) s[nt][0] = s[nt][2] = -INFINITY;
    if (!(keep >> 8)) s[nt][1] = s[nt][3] = -INFINITY;
  }
}

__device__ __forceinline__ float2 unpack_pair(uint32_t v, __nv_bfloat16) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}
__device__ __forceinline__ float2 unpack_pair(uint32_t v, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// One 16-bit element's bits (the low half of v) as a float, and a float rounded to one's bits.
__device__ __forceinline__ float unpack_one(uint32_t v, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16(uint16_t(v)));
}
__device__ __forceinline__ float unpack_one(uint32_t v, __half) { return __half2float(__ushort_as_half(uint16_t(v))); }
__device__ __forceinline__ uint16_t pack_one(float x, __nv_bfloat16) { return __bfloat16_as_ushort(__float2bfloat16(x)); }
__device__ __forceinline__ uint16_t pack_one(float x, __half) { return __half_as_ushort(__float2half(x)); }

// s = scale * s + bias (kScale), or s += bias, from a bias tile of 16-bit elements E: 64-key
// blocks of [128 rows][128 bytes], each with the 128-byte swizzle (the copy engine's box is
// 128 bytes wide). One multiply-add a score.
template <class E, bool kScale, int kTilesN>
__device__ __forceinline__ void add_bias_tile(float (&s)[kTilesN][4], uint32_t tile, int row, int t, float scale) {
  static_assert(sizeof(E) == 2, "bias tiles in q's dtype");
  const uint32_t at = swizzled_row<128>(tile, row, 4 * t);
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t bits = ptx::ld_shared_b32((at ^ ((nt % 8) << 4)) + (nt / 8) * 128 * 128 + r * 8 * 128);
      const float2 pair = unpack_pair(bits, E{});
      s[nt][2 * r] = kScale ? fmaf(s[nt][2 * r], scale, pair.x) : s[nt][2 * r] + pair.x;
      s[nt][2 * r + 1] = kScale ? fmaf(s[nt][2 * r + 1], scale, pair.y) : s[nt][2 * r + 1] + pair.y;
    }
}

}  // namespace fdma::cuda
