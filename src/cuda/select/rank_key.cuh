// The rank key of one key of the top-w selection (select_topw.cuh says why it has this shape):
// its score as order-preserving bits between its inverted row and its inverted index.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/select/select_topw.cuh"

namespace fdma::cuda {

__device__ __forceinline__ float load_score(const void* p, int dtype, int64_t off) {
  switch (dtype) {
    case 2: return __half2float(static_cast<const __half*>(p)[off]);
    case 3: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
    default: return static_cast<const float*>(p)[off];
  }
}

// Order-preserving map of a float to uint32, with NaN mapped to 1 (below -inf, which maps to
// 0x007fffff; 0 is left for padding) and -0.0 to +0.0's value: they compare equal, so they
// must tie (and fall back to the index).
__device__ __forceinline__ uint32_t sortable(float f) {
  if (isnan(f)) return 1u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Key j of row b * Hk + hk: its score's sortable bits, 0 for a padded key.
__device__ __forceinline__ uint32_t score_bits(const TopwInputs& in, int b, int hk, int j) {
  const float s = load_score(in.scores, in.score_dtype,
                             b * in.score_stride[0] + hk * in.score_stride[1] + j * in.score_stride[2]);
  const bool exists = !in.padding || in.padding[b * in.padding_stride[0] + j * in.padding_stride[1]] != 0;
  return exists ? sortable(s) : 0u;
}

// Descending order of these keys: rows in order, then higher scores, then lower indices.
__device__ __forceinline__ uint64_t rank_key(const TopwInputs& in, int row, uint32_t score, int j) {
  const uint64_t inv_index = (uint64_t(1) << in.index_bits) - 1 - uint64_t(j);
  const uint64_t inv_row = (uint64_t(1) << in.row_bits) - 1 - uint64_t(row);
  return (inv_row << (32 + in.index_bits)) | (uint64_t(score) << in.index_bits) | inv_index;
}

}  // namespace fdma::cuda
