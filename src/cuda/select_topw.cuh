// Top-w selection on the GPU. Each key gets a 64-bit rank key, high bits first: an exists
// bit, its score as an order-preserving integer (NaN lowest), and the inverted index, so that
// a plain descending sort (CUB, per row) ranks ties by lower index without relying on sort
// stability (measured: CUB's segmented descending sort reversed ties). The rank order is
// exactly the CPU backend's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fdma::cuda {

struct TopwInputs {
  const void* scores;  // [B, Hk, Sk]
  int score_dtype;     // fdma_dtype: f32, f16 or bf16
  int64_t score_stride[3];
  const uint8_t* padding;  // optional [B, Sk]
  int64_t padding_stride[2];
  int B, Hk, Sk;
  int index_bits;  // bits of the inverted index at the bottom of each rank key
};

// Whether the key behind a sorted rank key exists (is not padding).
__host__ __device__ inline bool rank_key_exists(uint64_t key, int index_bits) { return (key >> (32 + index_bits)) != 0; }

// Device scratch for the sort; sizes come from topw_workspace with the same inputs.
struct TopwScratch {
  uint64_t *keys_in, *keys_out;
  int32_t *idx_in, *idx_out, *offsets;
  void* cub_temp;
  size_t cub_bytes;
};

// Bytes of each piece (laid out in this order, 256-byte aligned) and their total.
size_t topw_workspace(const TopwInputs& in, size_t* cub_bytes);
TopwScratch carve_topw(void* base, const TopwInputs& in);

// Sorts every row; afterwards idx_out[row * Sk + t] is the t-th ranked key of the row, and
// it is kept iff t < w and rank_key_exists(keys_out[row * Sk + t]).
cudaError_t topw_sort(const TopwInputs& in, const TopwScratch& s, cudaStream_t stream);

// The selection as intervals, non-causal: kept keys get [0, Sq), others (0, 0).
cudaError_t topw_intervals(const TopwInputs& in, const TopwScratch& s, int64_t w, int Sq, int32_t* begin,
                           const int64_t (&begin_stride)[3], int32_t* end, const int64_t (&end_stride)[3],
                           cudaStream_t stream);

// Causal selection. After topw_sort, key j at rank position r is kept by queries
// [max(0, j - off), x - off) (off = Sk - Sq), where x is the w-th smallest index among the r
// keys ranked above it (none if r < w: kept to the end). A wavelet matrix over the ranked
// indices answers "w-th smallest of a prefix" for every key in parallel in O(log Sk); its
// levels are built by one device-wide scan and one stable partition each.
struct WaveletScratch {
  int levels;
  int32_t* rank0;          // [levels][n + 1]: zeros before position t at each level (global scan)
  int32_t *flags, *a, *b;  // [n + 1], [n], [n]
  void* scan_temp;
  size_t scan_bytes;
};
size_t wavelet_workspace(const TopwInputs& in, size_t* scan_bytes);
WaveletScratch carve_wavelet(void* base, const TopwInputs& in);
cudaError_t causal_intervals(const TopwInputs& in, const TopwScratch& s, const WaveletScratch& wv, int64_t w, int Sq,
                             int32_t* begin, const int64_t (&begin_stride)[3], int32_t* end,
                             const int64_t (&end_stride)[3], cudaStream_t stream);

}  // namespace fdma::cuda
