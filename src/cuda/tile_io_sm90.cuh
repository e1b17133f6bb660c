// Global -> shared tile copies with cp.async into the 128-byte-swizzled layout that wgmma
// descriptors read (wgmma.cuh). Same contract as tile_io_sm80.cuh: rows past `nrows` (or
// `nvalid`) and chunks past D are zero-filled.
#pragma once

#include <cstdint>

#include "cuda/ptx.cuh"
#include "cuda/wgmma.cuh"

namespace fdma::cuda {

template <int kThreads, int kHeadDim, int kRows, class T>
__device__ __forceinline__ void load_rows_sw128_async(uint32_t smem, const T* base, int64_t row_stride, int row0,
                                                      int nrows, int D, int tid) {
  static_assert(kHeadDim % 64 == 0, "the swizzled layout stores whole 64-column blocks");
  constexpr int kChunks = kHeadDim / 8;
#pragma unroll
  for (int c = tid; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks, row = row0 + r;
    const bool ok = row < nrows && ch * 8 < D;
    const T* src = ok ? base + row * row_stride + ch * 8 : base;
    ptx::cp_async_16(smem + wgmma::sw128_offset(kRows, r, ch), src, ok ? 16 : 0);
  }
}

// Row r of the tile is row idx[r] of the slab for r < nvalid.
template <int kThreads, int kHeadDim, int kRows, class T>
__device__ __forceinline__ void load_rows_gather_sw128_async(uint32_t smem, const T* base, int64_t row_stride,
                                                             const int32_t* idx, int nvalid, int D, int tid) {
  static_assert(kHeadDim % 64 == 0, "the swizzled layout stores whole 64-column blocks");
  constexpr int kChunks = kHeadDim / 8;
#pragma unroll
  for (int c = tid; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    const bool ok = r < nvalid && ch * 8 < D;
    const T* src = ok ? base + int64_t(idx[r]) * row_stride + ch * 8 : base;
    ptx::cp_async_16(smem + wgmma::sw128_offset(kRows, r, ch), src, ok ? 16 : 0);
  }
}

}  // namespace fdma::cuda
