// Global -> shared tile copies with cp.async into the 128-byte-swizzled layout that wgmma
// descriptors read (wgmma.cuh). Same contract as tile_io_sm80.cuh: rows past `nrows` (or
// `nvalid`) and chunks past D are zero-filled.
#pragma once

#include <cstdint>

#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"  // for_each_chunk
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

template <int kThreads, int kHeadDim, int kRows, class T>
__device__ __forceinline__ void load_rows_sw128_async(uint32_t smem, const T* base, int64_t row_stride, int row0,
                                                      int nrows, int D, int tid) {
  static_assert(kHeadDim % 64 == 0, "the swizzled layout stores whole 64-column blocks");
  constexpr int kChunks = kHeadDim / 8;
  for_each_chunk<kThreads, kRows, kChunks>(tid, [&](int r, int ch) {
    const int row = row0 + r;
    const bool ok = row < nrows && ch * 8 < D;
    const T* src = ok ? base + row * row_stride + ch * 8 : base;
    ptx::cp_async_16(smem + wgmma::sw128_offset(kRows, r, ch), src, ok ? 16 : 0);
  });
}

// Row r of each tile is row idx[r] of its slab for r < nvalid; kCopies tiles from the same rows,
// as load_rows_gather_async (tile_io_sm80.cuh).
template <int kThreads, int kHeadDim, int kRows, int kCopies, class T>
__device__ __forceinline__ void load_rows_gather_sw128_async(const uint32_t (&smem)[kCopies],
                                                             const T* const (&base)[kCopies],
                                                             const int64_t (&row_stride)[kCopies], const int32_t* idx,
                                                             int nvalid, int D, int tid) {
  static_assert(kHeadDim % 64 == 0, "the swizzled layout stores whole 64-column blocks");
  constexpr int kChunks = kHeadDim / 8;
  const GatherSources<kCopies> src(base, row_stride);
  for_each_chunk<kThreads, kRows, kChunks>(tid, [&](int r, int ch) {
    const bool ok = r < nvalid && ch * 8 < D;
    const uint32_t offset = wgmma::sw128_offset(kRows, r, ch);
    const uint32_t row = ok ? uint32_t(idx[r]) : 0u, col = ok ? ch * 16 : 0;
#pragma unroll
    for (int c = 0; c < kCopies; ++c) ptx::cp_async_16(smem[c] + offset, src.at(c, row, col), ok ? 16 : 0);
  });
}

// The Hopper counterpart of TileIoSm80 (tile_io_sm80.cuh): swizzled tiles for wgmma.
template <class T, int kHeadDim, int kThreads>
struct TileIoSm90 {
  static constexpr bool kHopperOnly = true;  // wgmma: only sm_90a code runs it
  static constexpr int kTileAlign = 1024;    // the swizzle pattern repeats every 8 rows of 128 bytes
  template <int kRows>
  __device__ static void load_rows(uint32_t smem, const T* base, int64_t stride, int row0, int nrows, int D, int tid) {
    load_rows_sw128_async<kThreads, kHeadDim, kRows>(smem, base, stride, row0, nrows, D, tid);
  }
  template <int kRows>
  __device__ static void load_rows_gather(uint32_t smem, const T* base, int64_t stride, const int32_t* idx, int n,
                                          int D, int tid) {
    load_rows_gather_sw128_async<kThreads, kHeadDim, kRows, 1, T>({smem}, {base}, {stride}, idx, n, D, tid);
  }
  template <int kRows>
  __device__ static void load_rows_gather_pair(uint32_t smem_a, const T* base_a, int64_t stride_a, uint32_t smem_b,
                                               const T* base_b, int64_t stride_b, const int32_t* idx, int n, int D,
                                               int tid) {
    load_rows_gather_sw128_async<kThreads, kHeadDim, kRows, 2, T>(
        {smem_a, smem_b}, {base_a, base_b}, {stride_a, stride_b}, idx, n, D, tid);
  }
  // cp.async wrote the tile through the generic proxy; wgmma reads through the async proxy.
  __device__ static void tile_landed() { wgmma::fence_proxy_async_smem(); }
};

}  // namespace fdma::cuda
