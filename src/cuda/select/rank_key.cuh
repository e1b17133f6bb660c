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

// Order-preserving map of a float to uint32, with NaN mapped to 1 << 16 (below -inf, which
// maps to 0x007fffff; 0 is left for padding) and -0.0 to +0.0's value: they compare equal, so
// they must tie (and fall back to the index).
constexpr uint32_t kNanScoreBits = 1u << 16;
__device__ __forceinline__ uint32_t sortable(float f) {
  if (isnan(f)) return kNanScoreBits;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Rows [start, start + len) of a packed sequence from device offsets, clamped to [0, total]
// and to `most` rows, so that offsets that are no prefix sums never lead outside the tensors.
struct SeqRows {
  int start, len;
};
__device__ __forceinline__ SeqRows seq_rows(const int32_t* cu, int s, int total, int most) {
  const int a = min(max(cu[s], 0), total), b = min(max(cu[s + 1], a), total);
  return {a, min(b - a, most)};
}

// Key j of row b * Hk + hk: its score's sortable bits, 0 for a padded key (and, in a packed
// batch, for j past the sequence's keys).
__device__ __forceinline__ uint32_t score_bits(const TopwInputs& in, int b, int hk, int j) {
  if (in.cu_k) {
    const SeqRows keys = seq_rows(in.cu_k, b, in.total_k, in.Sk);
    if (j >= keys.len) return 0u;
    b = 0, j += keys.start;
  }
  const float s = load_score(in.scores, in.score_dtype,
                             b * in.score_stride[0] + hk * in.score_stride[1] + j * in.score_stride[2]);
  const bool exists = !in.padding || in.padding[b * in.padding_stride[0] + j * in.padding_stride[1]] != 0;
  return exists ? sortable(s) : 0u;
}

// Where the intervals of key j of row (b, hk) go (element offset of a [B, Hk, Sk] view with
// strides s0, s1, s2), or -1 for a packed sequence's padding past its keys; and the row's
// query count and causal offset (key j is visible to query i iff j <= i + offset).
struct IntervalRow {
  int Sq;
  int64_t offset;
  int key_start, keys;  // packed: the sequence's keys in the packed tensors
};
__device__ __forceinline__ IntervalRow interval_row(const TopwInputs& in, int b, int Sq) {
  if (!in.cu_k) return {Sq, int64_t(in.Sk) - Sq, 0, in.Sk};
  const SeqRows keys = seq_rows(in.cu_k, b, in.total_k, in.Sk), queries = seq_rows(in.cu_q, b, in.total_q, Sq);
  return {queries.len, int64_t(keys.len) - queries.len, keys.start, keys.len};
}
__device__ __forceinline__ int64_t interval_at(const TopwInputs& in, const IntervalRow& r, int b, int hk, int j,
                                               int64_t s0, int64_t s1, int64_t s2) {
  if (!in.cu_k) return b * s0 + hk * s1 + j * s2;
  return j < r.keys ? hk * s1 + int64_t(r.key_start + j) * s2 : -1;
}

// Key j's causal interval given x, the w-th smallest index ranked above it (x < 0: none, kept
// to the end): [max(0, j - offset), min(x - offset, Sq)), (0, 0) where empty or padded.
struct KeyInterval {
  int32_t begin, end;
};
__device__ __forceinline__ KeyInterval causal_interval(const IntervalRow& r, int j, bool exists, int64_t x) {
  if (!exists) return {0, 0};  // padded keys rank last and are never kept
  const int64_t lo = j - r.offset > 0 ? j - r.offset : 0;
  const int64_t hi = x >= 0 && x - r.offset < r.Sq ? x - r.offset : r.Sq;
  return hi <= lo ? KeyInterval{0, 0} : KeyInterval{int32_t(lo), int32_t(hi)};
}

// Descending order of these keys: rows in order, then higher scores, then lower indices. The
// score keeps its top in.score_key_bits bits (the others follow from them).
__device__ __forceinline__ uint64_t rank_key(const TopwInputs& in, int row, uint32_t score, int j) {
  const uint64_t inv_index = (uint64_t(1) << in.index_bits) - 1 - uint64_t(j);
  const uint64_t inv_row = (uint64_t(1) << in.row_bits) - 1 - uint64_t(row);
  const uint64_t top = score >> (32 - in.score_key_bits);
  return (inv_row << (in.score_key_bits + in.index_bits)) | (top << in.index_bits) | inv_index;
}

}  // namespace fdma::cuda
