// The forward's matmuls on sm80+ (mma.sync m16n8k16, ldmatrix), as a policy for the forward
// kernel (attention_fwd.cuh): tile shapes, how Q/K/V tiles sit in shared memory (padded rows),
// S = Q K^T and O += P V for one warp's rows.
#pragma once

#include <cstdint>

#include "cuda/attention/kernel_table.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"

namespace fdma::cuda {

template <class T, int kHeadDim>
struct FwdMmaSm80 : TileIoSm80<T, kHeadDim, 128> {
  // Each warp owns kMTiles m16 row tiles: every K/V fragment read from shared memory then
  // feeds kMTiles mmas. Two tiles for D <= 128; above that the O accumulators alone would
  // need 2 * D / 2 registers per thread and spill.
  static constexpr int kMTiles = fwd_m_tiles_per_warp(kHeadDim);
  static constexpr int kThreads = 128;
  static constexpr int kBlockM = fwd_block_m(kHeadDim);
  // Keys per tile. D = 128 with two m-tiles sits at the register limit: 32-key tiles halve
  // the S registers and measured 10-18% faster than 64 (docs/performance.md, "attention forward").
  static constexpr int kBlockN = fwd_block_n(kHeadDim);
  static_assert(kBlockM == 16 * kMTiles * kThreads / 32, "tile table and kernel agree");
  static constexpr int kRowBytes = padded_row_bytes(kHeadDim);
  static constexpr int kQBytes = kBlockM * kRowBytes, kKVBytes = kBlockN * kRowBytes;
  static constexpr int kTilesN = kBlockN / 8, kTilesD = kHeadDim / 8;

  __device__ static int warp_row_offset(int warp) { return warp * 16 * kMTiles; }
  // mma.sync is synchronous: the kernel runs qk, softmax, pv in turn (attention_fwd.cuh).
  static constexpr bool kOverlapSoftmax = false;
  static constexpr bool kNarrowLastTile = false;  // every tile is kBlockN wide
  static constexpr bool kGlobalScoreTerms = true;  // masks and biases that cannot be tiled run here


  // S = Q K^T for this warp's 16 * kMTiles rows x kBlockN keys.
  __device__ static void qk(float (&s)[kMTiles][kTilesN][4], uint32_t s_q, uint32_t k_tile, int warp, int lane) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
    // Lane addresses for ldmatrix (see ptx.cuh for the fragment layouts).
    const uint32_t q_lane = s_q + (warp_row_offset(warp) + lane % 16) * kRowBytes + (lane / 16) * 16;
    const uint32_t k_lane = k_tile + (lane % 8 + (lane / 16) * 8) * kRowBytes + ((lane / 8) % 2) * 16;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) ptx::ldmatrix_x4(a[mt], q_lane + mt * 16 * kRowBytes + kk * 32);
#pragma unroll
      for (int np = 0; np < kTilesN / 2; ++np) {
        uint32_t bk[4];
        ptx::ldmatrix_x4(bk, k_lane + np * 16 * kRowBytes + kk * 32);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ptx::mma_16816<T>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          ptx::mma_16816<T>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
  }

  // O += P V: P (probabilities in s, rounded to T) from registers, V^T by transposing ldmatrix.
  __device__ static void pv(float (&o)[kMTiles][kTilesD][4], const float (&s)[kMTiles][kTilesN][4], uint32_t v_tile,
                            int, int lane) {
    const uint32_t v_lane = v_tile + (lane % 8 + ((lane / 8) % 2) * 8) * kRowBytes + (lane / 16) * 16;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::pack_a_frag<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
      }
#pragma unroll
      for (int dp = 0; dp < kTilesD / 2; ++dp) {
        uint32_t bv[4];
        ptx::ldmatrix_x4_trans(bv, v_lane + kk * 16 * kRowBytes + dp * 32);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ptx::mma_16816<T>(o[mt][2 * dp], a[mt], bv[0], bv[1]);
          ptx::mma_16816<T>(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }
};

}  // namespace fdma::cuda
