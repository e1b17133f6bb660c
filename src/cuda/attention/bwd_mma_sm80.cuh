// The backward's matmuls on sm80+ (mma.sync m16n8k16, ldmatrix), as a policy for the dq and
// dk/dv kernels (attention_bwd.cuh). Tiles are [rows][D] with padded rows; each warp of a
// 4-warp group owns 16 rows of the A operand.
#pragma once

#include <cstdint>

#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"

namespace fdma::cuda {

template <class T, int kHeadDim, int kThreads>
struct BwdMmaSm80 : TileIoSm80<T, kHeadDim, kThreads> {
  static constexpr int kRowBytes = padded_row_bytes(kHeadDim);
  static constexpr int kDkdvBlockM = bwd_dkdv_block_m(kHeadDim);  // queries per dk/dv step
  __host__ __device__ static constexpr int tile_bytes(int rows) { return rows * kRowBytes; }


  // Lane offsets for ldmatrix (fragment layouts in ptx.cuh), in bytes within a padded tile:
  // an A operand from a row-major [m][k] tile, a B operand from an [n][k] tile, and a B
  // operand from a [k][n] tile through the transposing ldmatrix.
  __device__ static uint32_t lane_a(int lane) { return (lane % 16) * kRowBytes + (lane / 16) * 16; }
  __device__ static uint32_t lane_b(int lane) { return (lane % 8 + (lane / 16) * 8) * kRowBytes + ((lane / 8) % 2) * 16; }
  __device__ static uint32_t lane_b_trans(int lane) {
    return (lane % 8 + ((lane / 8) % 2) * 8) * kRowBytes + (lane / 16) * 16;
  }

  // acc[16 x 8*kTilesN] = A[the warp's 16 rows x D] * B[8*kTilesN rows x D]^T.
  template <int kTilesN>
  __device__ static void a_bt(float (&acc)[kTilesN][4], uint32_t a_tile, uint32_t b_tile, int warp, int lane) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    const uint32_t a_lane = a_tile + 16 * warp * kRowBytes + lane_a(lane), b_lane = b_tile + lane_b(lane);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      ptx::ldmatrix_x4(a, a_lane + kk * 32);
#pragma unroll
      for (int np = 0; np < kTilesN / 2; ++np) {
        uint32_t bk[4];
        ptx::ldmatrix_x4(bk, b_lane + np * 16 * kRowBytes + kk * 32);
        ptx::mma_16816<T>(acc[2 * np], a, bk[0], bk[1]);
        ptx::mma_16816<T>(acc[2 * np + 1], a, bk[2], bk[3]);
      }
    }
  }
  // Two such products (S and dP share the shape).
  template <int kRowsA, int kRowsB, int kTilesN>
  __device__ static void a_bt_pair(float (&acc0)[kTilesN][4], uint32_t a0, uint32_t b0, float (&acc1)[kTilesN][4],
                                   uint32_t a1, uint32_t b1, int warp, int lane) {
    a_bt(acc0, a0, b0, warp, lane);
    a_bt(acc1, a1, b1, warp, lane);
  }

  // acc[16 x 8*kTilesD] += P[16 x 8*kTilesK] * B[8*kTilesK rows, columns col0.. of a [k][D]
  // tile], P from registers in accumulator layout (rounded to T).
  template <int kRowsB, int kTilesK, int kTilesD>
  __device__ static void regs_b(float (&acc)[kTilesD][4], const float (&pr)[kTilesK][4], uint32_t b_tile, int col0,
                                int lane) {
    const uint32_t b_lane = b_tile + col0 * 2 + lane_b_trans(lane);
#pragma unroll
    for (int kk = 0; kk < kTilesK / 2; ++kk) {
      uint32_t a[4];
      ptx::pack_a_frag<T>(a, pr[2 * kk], pr[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < kTilesD / 2; ++dp) {
        uint32_t bv[4];
        ptx::ldmatrix_x4_trans(bv, b_lane + kk * 16 * kRowBytes + dp * 32);
        ptx::mma_16816<T>(acc[2 * dp], a, bv[0], bv[1]);
        ptx::mma_16816<T>(acc[2 * dp + 1], a, bv[2], bv[3]);
      }
    }
  }
  template <int kRowsB, int kTilesK, int kTilesD>
  __device__ static void regs_b_pair(float (&acc0)[kTilesD][4], const float (&p0)[kTilesK][4], uint32_t b0,
                                     float (&acc1)[kTilesD][4], const float (&p1)[kTilesK][4], uint32_t b1, int col0,
                                     int lane) {
    regs_b<kRowsB, kTilesK, kTilesD>(acc0, p0, b0, col0, lane);
    regs_b<kRowsB, kTilesK, kTilesD>(acc1, p1, b1, col0, lane);
  }
};

}  // namespace fdma::cuda
