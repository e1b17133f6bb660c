// The backward's matmuls on Hopper (sm_90a): the BwdMmaSm80 interface with wgmma. A 4-warp
// group is one warpgroup, its A operand the 64 rows of a 128-byte-swizzled tile (Q in the dq
// kernel, K or V in the dk/dv kernel); the accumulators come out in the mma.sync layout per
// warp (wgmma.cuh), so the kernels' score code is unchanged. Two products of the same shape
// are issued back to back and waited on together.
#pragma once

#include <cstdint>

#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm90.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// The fused dq's shared-memory stores (the dk/dv kernel and the warp-specialized backwards).
// dS^T of a step, rows = a warp group's 64 keys, columns = 8 * kTilesQ queries (the dk/dv
// accumulator layout), stored transposed as dq's K-major A operand: a [queries][64 keys] tile,
// one 128-byte swizzled row a query. Element (key 16w + g + 8 (e >> 1), query 8 nt + 2t + (e &
// 1)) is 16-byte chunk 2w + (e >> 1) of its query's row, half-word g.
template <class T, int kTilesQ>
__device__ __forceinline__ void store_ds_t(unsigned char* ds_tile, const float (&dst)[kTilesQ][4], int warp, int lane) {
  constexpr int kRowBytes = wgmma::kSwizzleRowBytes;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t q = nt * 8 + 2 * t + (e & 1), chunk = 2 * warp + (e >> 1);
      *reinterpret_cast<T*>(ds_tile + q * kRowBytes + ((chunk ^ (q % 8)) << 4) + g * 2) = T(dst[nt][e]);
    }
}
// One 64-column block of dS K (64 rows, the accumulator layout) into two consecutive staging
// tiles in dq_acc's tile layout (attention_bwd_params.hpp) from shared address `stage`: rows
// 0-31 (warps 0, 1) to the first, rows 32-63 to the second.
__device__ __forceinline__ void store_dq_block(uint32_t stage, const float (&acc)[8][4], int warp, int lane) {
  const int g = lane / 4, t = lane % 4;
  const uint32_t out = warp < 2 ? stage : stage + kDqAccTileBytes;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
      ptx::st_shared_f32x2(out + 4 * dq_acc_in_tile(16 * (warp % 2) + g + 8 * hr, nt * 8 + 2 * t), acc[nt][2 * hr],
                           acc[nt][2 * hr + 1]);
}

template <class T, int kHeadDim, int kThreads>
struct BwdMmaSm90 : TileIoSm90<T, kHeadDim, kThreads> {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "wgmma backward tiles: D = 64 or 128");
  static constexpr int kRowBytes = wgmma::kSwizzleRowBytes;
  // Queries per dk/dv step: 64 for every D. Without ldmatrix fragments to stage, D = 128 fits
  // S^T and dP^T of 64 queries in registers (mma.sync spilled there and takes 32).
  static constexpr int kDkdvBlockM = 64;
  __host__ __device__ static constexpr int tile_bytes(int rows) { return wgmma::sw128_tile_bytes(rows, kHeadDim); }


  template <int kRowsA, int kRowsB, int kTilesN>
  __device__ static void issue_a_bt(float (&acc)[kTilesN][4], uint32_t a_tile, uint32_t b_tile) {
    static_assert(kRowsA == 64 && kRowsB == 8 * kTilesN, "A is one warpgroup's 64 rows, B the whole tile");
    const uint64_t a_desc = wgmma::desc_k_major(a_tile), b_desc = wgmma::desc_k_major(b_tile);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t col = (kk % 4) * 32;  // 16 elements per step within a 64-column block
      wgmma::mma_ss<T, 8 * kTilesN>(acc, wgmma::desc_advance(a_desc, (kk / 4) * kRowsA * kRowBytes + col),
                                    wgmma::desc_advance(b_desc, (kk / 4) * kRowsB * kRowBytes + col), kk > 0);
    }
  }
  // acc0 = A0 B0^T and acc1 = A1 B1^T: [64 rows x 8*kTilesN], K = D.
  template <int kRowsA, int kRowsB, int kTilesN>
  __device__ static void a_bt_pair(float (&acc0)[kTilesN][4], uint32_t a0, uint32_t b0, float (&acc1)[kTilesN][4],
                                   uint32_t a1, uint32_t b1, int, int) {
    wgmma::fence();
    issue_a_bt<kRowsA, kRowsB>(acc0, a0, b0);
    issue_a_bt<kRowsA, kRowsB>(acc1, a1, b1);
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc0);
    wgmma::fence_operands(acc1);
  }

  template <int kTilesK>
  __device__ static void pack_a(uint32_t (&a)[kTilesK / 2][4], const float (&pr)[kTilesK][4]) {
#pragma unroll
    for (int kk = 0; kk < kTilesK / 2; ++kk) {
      ptx::pack_a_frag<T>(a[kk], pr[2 * kk], pr[2 * kk + 1]);
    }
  }
  template <int kRowsB, int kTilesK, int kTilesD>
  __device__ static void issue_regs_b(float (&acc)[kTilesD][4], const uint32_t (&a)[kTilesK / 2][4], uint32_t b_tile,
                                      int col0) {
    static_assert(kRowsB == 8 * kTilesK, "B is the whole [k][D] tile");
    // col0: a multiple of 64
    const uint64_t b_desc = wgmma::desc_n_major(b_tile + (col0 / 64) * kRowsB * kRowBytes, kRowsB * kRowBytes);
#pragma unroll
    for (int kk = 0; kk < kTilesK / 2; ++kk)
      wgmma::mma_rs_n_major<T, 8 * kTilesD>(acc, a[kk], wgmma::desc_advance(b_desc, kk * 16 * kRowBytes), 1);
  }
  template <int kTilesK>
  __device__ static void keep_live(uint32_t (&a)[kTilesK / 2][4]) {  // A registers stay untouched until the wait
#pragma unroll
    for (int kk = 0; kk < kTilesK / 2; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[kk][e])::"memory");
  }

  // acc += P B, P [64 rows x 8*kTilesK] from registers, B rows [0, 8*kTilesK) of a [k][D] tile,
  // columns col0 .. col0 + 8*kTilesD.
  template <int kRowsB, int kTilesK, int kTilesD>
  __device__ static void regs_b(float (&acc)[kTilesD][4], const float (&pr)[kTilesK][4], uint32_t b_tile, int col0,
                                int) {
    uint32_t a[kTilesK / 2][4];
    pack_a<kTilesK>(a, pr);
    wgmma::fence();
    issue_regs_b<kRowsB, kTilesK, kTilesD>(acc, a, b_tile, col0);
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);
    keep_live<kTilesK>(a);
  }
  // regs_b_pair's products issued and committed, not waited on: a0 and a1 (the packed P0, P1)
  // must stay untouched until the caller's wait_group, then kept live (keep_live).
  template <int kRowsB, int kTilesK, int kTilesD>
  __device__ static void issue_regs_b_pair(float (&acc0)[kTilesD][4], const float (&p0)[kTilesK][4], uint32_t b0,
                                           uint32_t (&a0)[kTilesK / 2][4], float (&acc1)[kTilesD][4],
                                           const float (&p1)[kTilesK][4], uint32_t b1, uint32_t (&a1)[kTilesK / 2][4],
                                           int col0) {
    pack_a<kTilesK>(a0, p0);
    pack_a<kTilesK>(a1, p1);
    wgmma::fence();
    issue_regs_b<kRowsB, kTilesK, kTilesD>(acc0, a0, b0, col0);
    issue_regs_b<kRowsB, kTilesK, kTilesD>(acc1, a1, b1, col0);
    wgmma::commit_group();
  }
  template <int kRowsB, int kTilesK, int kTilesD>
  __device__ static void regs_b_pair(float (&acc0)[kTilesD][4], const float (&p0)[kTilesK][4], uint32_t b0,
                                     float (&acc1)[kTilesD][4], const float (&p1)[kTilesK][4], uint32_t b1, int col0,
                                     int) {
    uint32_t a0[kTilesK / 2][4], a1[kTilesK / 2][4];
    issue_regs_b_pair<kRowsB, kTilesK, kTilesD>(acc0, p0, b0, a0, acc1, p1, b1, a1, col0);
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc0);
    wgmma::fence_operands(acc1);
    keep_live<kTilesK>(a0);
    keep_live<kTilesK>(a1);
  }

  // acc = dS K over output columns [64 block, 64 block + 64) and kKeyTiles * 64 keys, for the 64
  // queries from ds_tile: A the dS tile, K-major with one 64-key column block per key tile
  // ([kBlockRows queries][64 keys] each), B rows [0, 64) of each [keys][D] K tile (key tile j
  // at k_tile + j * tile_bytes(64)) read N-major, as regs_b reads its B.
  // The same issued and committed only (the caller waits).
  template <int kKeyTiles = 1, int kBlockRows = 64>
  __device__ static void issue_ds_times_k(float (&acc)[8][4], uint32_t ds_tile, uint32_t k_tile, int block) {
    constexpr int kKeys = 64;
    wgmma::fence();
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) {
      const uint64_t a_desc = wgmma::desc_k_major(ds_tile + j * kBlockRows * kRowBytes);
      const uint64_t b_desc =
          wgmma::desc_n_major(k_tile + j * tile_bytes(kKeys) + block * kKeys * kRowBytes, kKeys * kRowBytes);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
        wgmma::mma_ss_n_major<T, 64>(acc, wgmma::desc_advance(a_desc, kk * 32),
                                     wgmma::desc_advance(b_desc, kk * 16 * kRowBytes), j > 0 || kk > 0);
    }
    wgmma::commit_group();
  }
  template <int kKeyTiles = 1>
  __device__ static void ds_times_k(float (&acc)[8][4], uint32_t ds_tile, uint32_t k_tile, int block) {
    issue_ds_times_k<kKeyTiles>(acc, ds_tile, k_tile, block);
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);
  }
};

}  // namespace fdma::cuda
