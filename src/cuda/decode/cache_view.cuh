// Device-side reads of a KV cache (CacheView): a sequence's length and where a position
// lives. Lengths are clamped to the cache and positions on pages outside [0, num_pages) are
// absent, so bad cache_seqlens or block_table values never move an access out of the caches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/decode/decode_params.hpp"

namespace fdma::cuda {

// Keys of sequence b after this call's append (no lengths: every cache is full).
__device__ __forceinline__ int cache_length(const CacheView& c, int b) {
  if (!c.seqlens) return c.capacity;
  const int64_t len = int64_t(c.seqlens[b * c.seqlens_stride]) + c.Snew;
  return int(len < 0 ? 0 : len > c.capacity ? c.capacity : len);
}

// Position `pos` (0 <= pos < capacity) of sequence b: the outer index (page or batch) and the
// inner one (slot or position); false where the page is not one of the cache's.
__device__ __forceinline__ bool locate(const CacheView& c, int b, int pos, int& outer, int& inner) {
  if (!c.block_table) {
    outer = b, inner = pos;
    return true;
  }
  const int page_index = c.page_size.div(pos);
  inner = pos - page_index * c.page_size.divisor;
  outer = c.block_table[b * c.table_stride[0] + page_index * c.table_stride[1]];
  return outer >= 0 && outer < c.num_pages;
}

// Element `off` of a score buffer of fdma_dtype `dtype` (f32, f16 or bf16), as a float.
__device__ __forceinline__ float load_score(const void* scores, int dtype, int64_t off) {
  switch (dtype) {
    case 2: return __half2float(static_cast<const __half*>(scores)[off]);
    case 3: return __bfloat162float(static_cast<const __nv_bfloat16*>(scores)[off]);
    default: return static_cast<const float*>(scores)[off];
  }
}

__device__ __forceinline__ float load_cached_score(const CacheView& c, int outer, int inner, int hk) {
  return load_score(c.scores, c.score_dtype,
                    outer * c.score_stride[0] + inner * c.score_stride[1] + hk * c.score_stride[2]);
}

// A kept key's score as a select_state stores it (fdma.h): its float bits, NaN as one
// canonical pattern, so that every backend writes the same bytes whatever payload it read.
__device__ __forceinline__ int32_t state_score_bits(float s) { return isnan(s) ? 0x7fc00000 : __float_as_int(s); }

// Order-preserving bits of a score (rank_key.cuh's rule: NaN 1, -0.0 as +0.0, 0 for absent).
__device__ __forceinline__ uint32_t score_order_bits(float f) {
  if (isnan(f)) return 1u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A key's rank as one integer: higher bits rank above, ties go to the lower position.
__device__ __forceinline__ uint64_t rank_of(uint32_t bits, int pos) {
  return (uint64_t(bits) << 32) | uint32_t(0x7fffffff - pos);
}

}  // namespace fdma::cuda
