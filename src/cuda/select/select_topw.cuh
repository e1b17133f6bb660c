// Top-w selection on the GPU. Each key gets a 64-bit rank key, high bits first: its inverted
// row (b * Hk + hk), its score as an order-preserving integer (0 for padding, 1 << 16 for NaN,
// every number above; of 16-bit scores only the bits that are not decided by the others, see
// score_decided_low_bits), and its inverted index. One descending sort of all rows at once (CUB)
// then keeps the rows in order and ranks ties by lower index without relying on sort stability
// (measured: CUB's segmented descending sort reversed ties). One device-wide sort, not a
// segmented one: CUB sorts a segment per thread block, so the few long rows of a long
// sequence ran on a few SMs (about 1.5 of the 1.8 ms the causal selection took at 128K).
// B * Hk * Sk < 2^31 (checked on the host) keeps row and index bits within 32.
// The rank order is exactly the CPU backend's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fdma/fdma.h"

namespace fdma::cuda {

struct TopwInputs {
  const void* scores;  // [B, Hk, Sk]
  int score_dtype;     // fdma_dtype: f32, f16 or bf16
  int64_t score_stride[3];
  const uint8_t* padding;  // optional [B, Sk]
  int64_t padding_stride[2];
  int B, Hk, Sk;
  int index_bits;      // bits of the inverted index at the bottom of each rank key
  int score_key_bits;  // bits of the score above them: 32 less score_decided_low_bits
  int row_bits;        // bits of the inverted row at the top
  // A packed variable-length batch (fdma.h, "varlen"): row b * Hk + hk is sequence b's, Sk
  // is max_seqlen_k, and key j of sequence b is packed key cu_k[b] + j (scores [1, Hk,
  // total_k], padding [1, total_k]), which exists while j is below the sequence's length. Its
  // intervals are written at the packed key, in query indices of the sequence (0-based, up to
  // its cu_q length). Offsets are read on the device and clamped to [0, total_*].
  const int32_t *cu_q = nullptr, *cu_k = nullptr;
  int total_q = 0, total_k = 0;
};

// Low bits of a score's order-preserving integer (rank_key.cuh, sortable) that its higher bits
// decide, by the scores' dtype (fdma_dtype). A float widened from bfloat16 (float16) ends in 16
// (13) zero mantissa bits, which that map turns into all zeros or all ones by the sign; NaN
// (1 << 16) and padding (0) differ above them. So sorts may leave them out: the device-wide
// sort's rank keys drop them, the cluster sort's 8-bit passes skip 16 bits for bfloat16 and 8
// for float16, the CTA's sort 16 for bfloat16 (docs/performance.md, "selection").
__host__ __device__ constexpr int score_decided_low_bits(int score_dtype) {
  return score_dtype == FDMA_BFLOAT16 ? 16 : score_dtype == FDMA_FLOAT16 ? 13 : 0;
}

// Sets index_bits, score_key_bits and row_bits from Sk, the scores' dtype and B * Hk.
void set_rank_bits(TopwInputs& in);

// Whether the key behind a sorted rank key exists (is not padding: score bits 0).
__host__ __device__ inline bool rank_key_exists(uint64_t key, const TopwInputs& in) {
  return ((key >> in.index_bits) & ((uint64_t(1) << in.score_key_bits) - 1)) != 0;
}

// Device scratch for the sort; sizes come from topw_workspace with the same inputs.
struct TopwScratch {
  uint64_t *keys_in, *keys_out;
  int32_t *idx_in, *idx_out;
  void* cub_temp;
  size_t cub_bytes;
};

// Bytes of each piece (laid out in this order, 256-byte aligned) and their total.
size_t topw_workspace(const TopwInputs& in, size_t* cub_bytes);
TopwScratch carve_topw(void* base, const TopwInputs& in);

// Causal selection. Once ranked, key j at rank position r is kept by queries
// [max(0, j - off), x - off) (off = Sk - Sq), where x is the w-th smallest index among the r
// keys ranked above it (none if r < w: kept to the end). A wavelet matrix over the ranked
// indices answers "w-th smallest of a prefix" for every key in parallel in O(log Sk); its
// levels are built level by level, by a CTA per row or by device-wide kernels (select_rows.cuh).
struct WaveletScratch {
  int levels;
  int32_t* rank0;          // [levels][n + 1]: zeros before position t at each level (global scan)
  int32_t *flags, *a, *b;  // [n + 1], [n], [n]
  void* scan_temp;
  size_t scan_bytes;
};
size_t wavelet_workspace(const TopwInputs& in, size_t* scan_bytes);
WaveletScratch carve_wavelet(void* base, const TopwInputs& in);

// Kept keys per block of 2^block_log2 consecutive keys of each row ([B * Hk][blocks], counts),
// added up by the walk as it writes the intervals, for the key lists (dma_lists.hpp): with the
// counts known, the records and the kept list take one launch after the selection instead of
// two. The counts and *flag (nullable; the lists' fold flag) are zeroed by the walk's first
// kernel, so a selection counts only where that kernel runs: select_intervals says whether.
struct KeptCounts {
  int32_t* counts;
  int blocks, block_log2;
  int32_t* flag;
};

// The selection as per-key query intervals [begin, end) (strided [B, Hk, Sk] int32): ranks
// every row, then non-causal (wv null): [0, Sq) for the kept keys, (0, 0) for the others;
// causal: through the wavelet matrix in wv. Ranks land in s.keys_out/s.idx_out: idx_out[row *
// Sk + t] is the t-th ranked key of the row, kept iff t < w and rank_key_exists(keys_out[...], in).
// overlap: the intervals kernel may start while the ranking finishes (launch.cuh). counts
// (nullable): count the kept keys as well where the path allows (a causal walk over rows of more
// than one span, not a packed batch); *counted says whether they were.
cudaError_t select_intervals(const TopwInputs& in, const TopwScratch& s, const WaveletScratch* wv, int64_t w, int Sq,
                             int32_t* begin, const int64_t (&begin_stride)[3], int32_t* end,
                             const int64_t (&end_stride)[3], cudaStream_t stream, bool overlap = false,
                             const KeptCounts* counts = nullptr, bool* counted = nullptr);

}  // namespace fdma::cuda
