// Global -> shared tile copies with cp.async, shared by the forward and backward kernels.
// Shared rows of a [rows, D] tile are padded by 16 bytes so that ldmatrix's eight row reads
// hit eight different bank groups.
#pragma once

#include <cstdint>

#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

// Bytes of one padded shared row of kHeadDim 16-bit elements.
constexpr int padded_row_bytes(int head_dim) { return head_dim * 2 + 16; }

// Dynamic shared memory is only 16-byte aligned for sure: kernels whose tiles need more
// (the swizzled layout: 1024) round their base up, out of kAlign bytes of slack.
template <int kAlign>
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw) {
  if constexpr (kAlign > 16) return raw + (kAlign - ptx::smem_addr(raw) % kAlign) % kAlign;
  return raw;
}
template <int kAlign>
constexpr int align_slack() { return kAlign > 16 ? kAlign : 0; }

// Calls copy(r, ch) for every (row, 16-byte chunk) of a kRows x kChunks tile, spread over
// kThreads threads. Where the threads cover whole rows, each thread keeps one chunk column and
// the loop has a fixed trip count: unrolled, with no division per chunk (the generic loop cost
// about 25 instructions per 16-byte copy, a third of the backward's instructions).
template <int kThreads, int kRows, int kChunks, class Copy>
__device__ __forceinline__ void for_each_chunk(int tid, Copy&& copy) {
  if constexpr (kThreads % kChunks == 0 && (kRows * kChunks) % kThreads == 0) {
    constexpr int kRowStep = kThreads / kChunks;
    const int ch = tid % kChunks, r0 = tid / kChunks;
#pragma unroll
    for (int i = 0; i < kRows * kChunks / kThreads; ++i) copy(r0 + i * kRowStep, ch);
  } else {
    for (int c = tid; c < kRows * kChunks; c += kThreads) copy(c / kChunks, c % kChunks);
  }
}

// Copies rows [row0, row0 + kRows) of a [rows, D] slab (row stride in elements) into a padded
// shared tile. Rows past `nrows` and chunks past D are zero-filled.
template <int kThreads, int kHeadDim, int kRows, class T>
__device__ __forceinline__ void load_rows_async(uint32_t smem, const T* base, int64_t row_stride, int row0, int nrows,
                                                int D, int tid) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  constexpr int kRowBytes = padded_row_bytes(kHeadDim);
  for_each_chunk<kThreads, kRows, kChunks>(tid, [&](int r, int ch) {
    const int row = row0 + r;
    const bool ok = row < nrows && ch * 8 < D;
    const T* src = ok ? base + row * row_stride + ch * 8 : base;
    ptx::cp_async_16(smem + r * kRowBytes + ch * 16, src, ok ? 16 : 0);
  });
}

// The sources of a gather of kCopies tiles from the same rows (K and V): byte addresses and
// byte strides, so that a row's address is base + row * stride + column with the row an
// unsigned 32-bit list entry (one wide multiply-add and a high-word multiply) where the
// general signed 64-bit element arithmetic took about three times the instructions a chunk.
template <int kCopies>
struct GatherSources {
  const char* base[kCopies];
  uint64_t stride[kCopies];
  template <class T>
  __device__ __forceinline__ GatherSources(const T* const (&b)[kCopies], const int64_t (&row_stride)[kCopies]) {
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      base[c] = reinterpret_cast<const char*>(b[c]);
      stride[c] = uint64_t(row_stride[c]) * sizeof(T);
    }
  }
  __device__ __forceinline__ const char* at(int c, uint32_t row, uint32_t col_bytes) const {
    return base[c] + row * stride[c] + col_bytes;
  }
};

// The same for gathered rows: row r of each tile is row idx[r] of its slab for r < nvalid
// (idx may point to global or shared memory; entries are non-negative); the rest is
// zero-filled, its copies reading nothing at the slab's start. kCopies tiles from the same
// rows (K and V): each index is read once for all of them.
template <int kThreads, int kHeadDim, int kRows, int kCopies, class T>
__device__ __forceinline__ void load_rows_gather_async(const uint32_t (&smem)[kCopies], const T* const (&base)[kCopies],
                                                       const int64_t (&row_stride)[kCopies], const int32_t* idx,
                                                       int nvalid, int D, int tid) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kRowBytes = padded_row_bytes(kHeadDim);
  const GatherSources<kCopies> src(base, row_stride);
  for_each_chunk<kThreads, kRows, kChunks>(tid, [&](int r, int ch) {
    const bool ok = r < nvalid && ch * 8 < D;
    const uint32_t row = ok ? uint32_t(idx[r]) : 0u, col = ok ? ch * 16 : 0;
#pragma unroll
    for (int c = 0; c < kCopies; ++c)
      ptx::cp_async_16(smem[c] + r * kRowBytes + ch * 16, src.at(c, row, col), ok ? 16 : 0);
  });
}

// Per-key 16-byte records of gathered keys into shared memory (zeros past nvalid).
template <class Rec>
__device__ __forceinline__ void load_key_records_async(uint32_t smem, const Rec* table, const int32_t* idx, int nvalid,
                                                       int rows, int tid) {
  static_assert(sizeof(Rec) == 16, "one cp.async per record");
  if (tid < rows) {
    const bool ok = tid < nvalid;
    ptx::cp_async_16(smem + tid * 16, ok ? table + idx[tid] : table, ok ? 16 : 0);
  }
}

// Copies rows [0, valid_rows) x bytes [0, valid_bytes) of a byte-strided window into a shared
// tile of `rows` rows; everything else in the tile is zero-filled. Row starts are 16-byte
// aligned (checked on the host before tiling is chosen).
template <int kThreads>
__device__ __forceinline__ void load_bytes_tile_async(uint32_t smem, int pitch, const char* src, int64_t row_stride,
                                                      int rows, int row_bytes, int valid_rows, int valid_bytes,
                                                      int tid) {
  const int chunks = row_bytes / 16;
  for (int c = tid; c < rows * chunks; c += kThreads) {
    const int r = c / chunks, ch = c % chunks;
    const int bytes = r < valid_rows ? min(16, max(0, valid_bytes - ch * 16)) : 0;
    ptx::cp_async_16(smem + r * pitch + ch * 16, bytes > 0 ? src + r * row_stride + ch * 16 : src, bytes);
  }
}
// The same with the tile's shape fixed (kRows rows of kRowBytes): a fixed trip count per
// thread, as for_each_chunk (the backward's tiles). The forward keeps the loop above: with
// this one (four shapes) its wgmma kernel spilled.
template <int kThreads, int kRows, int kRowBytes>
__device__ __forceinline__ void load_bytes_window_async(uint32_t smem, int pitch, const char* src, int64_t row_stride,
                                                        int valid_rows, int valid_bytes, int tid) {
  static_assert(kRowBytes % 16 == 0, "whole 16-byte chunks");
  for_each_chunk<kThreads, kRows, kRowBytes / 16>(tid, [&](int r, int ch) {
    const int bytes = r < valid_rows ? min(16, max(0, valid_bytes - ch * 16)) : 0;
    ptx::cp_async_16(smem + r * pitch + ch * 16, bytes > 0 ? src + r * row_stride + ch * 16 : src, bytes);
  });
}

// The tile loads of one kernel family, as the base of its matmul policies (fwd_mma_sm80.cuh,
// bwd_mma_sm80.cuh): kThreads threads copy padded [rows][D] tiles.
template <class T, int kHeadDim, int kThreads>
struct TileIoSm80 {
  static constexpr bool kHopperOnly = false;  // runs on every target
  static constexpr int kTileAlign = 16;       // cp.async and ldmatrix need 16-byte rows
  template <int kRows>
  __device__ static void load_rows(uint32_t smem, const T* base, int64_t stride, int row0, int nrows, int D, int tid) {
    load_rows_async<kThreads, kHeadDim, kRows>(smem, base, stride, row0, nrows, D, tid);
  }
  template <int kRows>
  __device__ static void load_rows_gather(uint32_t smem, const T* base, int64_t stride, const int32_t* idx, int n,
                                          int D, int tid) {
    load_rows_gather_async<kThreads, kHeadDim, kRows, 1, T>({smem}, {base}, {stride}, idx, n, D, tid);
  }
  // Two tiles (K and V) from the same gathered rows.
  template <int kRows>
  __device__ static void load_rows_gather_pair(uint32_t smem_a, const T* base_a, int64_t stride_a, uint32_t smem_b,
                                               const T* base_b, int64_t stride_b, const int32_t* idx, int n, int D,
                                               int tid) {
    load_rows_gather_async<kThreads, kHeadDim, kRows, 2, T>({smem_a, smem_b}, {base_a, base_b}, {stride_a, stride_b},
                                                            idx, n, D, tid);
  }
  // Called after a tile's cp.async group landed and before the barrier: nothing to do here.
  __device__ static void tile_landed() {}
};

}  // namespace fdma::cuda
