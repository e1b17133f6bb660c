// The dynamic-mask backward's setup, one launch between the key lists and the backward kernels:
//   the by-end order: a CTA per (batch, KV head) orders the row's kept keys by the tile of their
//     interval end (latest first, then index: a stable counting sort in shared memory), which
//     the warp-specialized kernel's plan and the dk/dv kernel cut into key groups;
//   the prepare and the zeroing, on every other CTA: each query row's delta and lse2
//     (bwd_prepare_row.cuh), then the warp-specialized kernel's counters (its dq sums it zeroes
//     itself), the kept keys' fp32 dk/dv rows and dscores it adds into, and the dk, dv and
//     dscores of keys no query keeps (no backward kernel visits them).
// The sort is a chain of short dependent steps on a few SMs, the prepare and the zeroing
// bandwidth on all of them, so in one launch the one hides under the other, and the prepare's
// reads share the memory system with the zeroing's writes instead of following them in a launch
// of their own (docs/performance.md, "the passes around the fused backward").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_fwd_params.hpp"  // KeyInfo
#include "cuda/attention/bwd_prepare_row.cuh"       // BwdPrepareRows
#include "cuda/dma/dma_lists.hpp"                   // DmaListShape

namespace fdma::cuda {

// The sort's end tiles: rows per tile 2^quantum_log2 (64 where Sq allows: the backward walks
// 64-row query tiles, so a finer order groups no better, tools/profiling/simulate_dkdv_groups.py
// --end-quantum), bins the tiles, warps the sorting warps whose per-warp counts fit in 48 KB
// of shared memory with the kernel's own. Taller tiles past kMaxEndBins (Sq over 256K).
constexpr int kMaxEndBins = 4096;
struct EndOrder {
  int quantum_log2, bins, warps;
};
inline __host__ __device__ EndOrder end_order(int64_t Sq) {
  EndOrder o{6, 1, 0};
  while (((Sq + (int64_t(1) << o.quantum_log2) - 1) >> o.quantum_log2) > kMaxEndBins) ++o.quantum_log2;
  const int64_t tiles = (Sq + (int64_t(1) << o.quantum_log2) - 1) >> o.quantum_log2;
  o.bins = tiles > 1 ? int(tiles) : 1;
  const int fit = (48 * 1024 - 256) / (4 * o.bins);  // a warp's counts: 4 bytes a bin; 256 static
  o.warps = fit < 16 ? fit : 16;                     // at least 2 (kMaxEndBins)
  return o;
}

// What the setup zeroes besides the by-end order. The unkept keys' dk and dv rows (and their
// dscores entries, where dscores is set) in the caller's tensors; with kept_rows, the kept keys'
// fp32 rows [B * Hk * Sk][2D] and kept_dscores [B * Hk * Sk] (the warp-specialized kernel adds
// into those; the unkept keys' are never read); and `sums` (float4s), the plan's counters (the
// kernel zeroes its dq sums itself, bwd_ws_dq_zero.cuh).
struct BwdZeroArgs {
  void *dk, *dv;
  int64_t dk_stride[3], dv_stride[3];  // (batch, seq, head), elements
  int D, elem_bytes;
  void* dscores;
  int64_t dscores_stride[3];
  int dscores_bytes;
  float *kept_rows = nullptr, *kept_dscores = nullptr;
  float4* sums = nullptr;
  int64_t sum_float4s = 0;
};

// kept_by_end ([B * Hk * Sk]; the first kept_count of each row are set; null: no order wanted)
// from the kept list and its records, the prepare's rows (none where prep.delta is null; the
// backward kernels then need the prepare kernel) and the zeroing above. overlap: may start
// while the list kernels finish (launch.cuh).
cudaError_t bwd_setup(const DmaListShape& s, const KeyInfo* info, const int32_t* kept, const int32_t* kept_count,
                      int32_t* kept_by_end, const BwdZeroArgs& z, const BwdPrepareRows& prep, cudaStream_t stream,
                      bool overlap);

}  // namespace fdma::cuda
