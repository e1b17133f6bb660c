// The forward's matmuls on Hopper (sm_90a): a policy for the forward kernel
// (attention_fwd.cuh) with the same interface as FwdMmaSm80. Two warpgroups of 64 query rows
// each; S = Q K^T is one wgmma chain with Q and K read from 128-byte-swizzled shared memory,
// O += P V takes P from registers and V from shared memory as an N-major operand. The matmuls
// are issued and waited on separately so the kernel can overlap them with the softmax. The
// accumulator layout per warp equals mma.sync's (wgmma.cuh), so scores, softmax and the
// epilogue are the sm80 code.
#pragma once

#include <cstdint>

#include "cuda/attention/kernel_table.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm90.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// kKeyTile: keys per tile, 128; the warp-specialized forward's dense calls take wider ones
// (fwd_ws_key_tile: 192, 176, 80 at D = 64, 128, 256, where O alone takes 128 registers a thread).
template <class T, int kHeadDim, int kKeyTile = 128>
struct FwdMmaSm90 : TileIoSm90<T, kHeadDim, 256> {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "wgmma forward tiles: D = 64, 128 or 256");
  static constexpr int kMTiles = 1;  // per warp: 16 rows of its warpgroup's 64
  static constexpr int kThreads = 256;
  static constexpr int kBlockM = 128;  // the forward's key lists' tiles (kFwdListBlockM); up to D 128 the mask summaries'
  static constexpr int kBlockN = kKeyTile;
  static_assert(kHeadDim > 128 || kBlockM == fwd_block_m(kHeadDim), "query tiles match the mask summaries' tiles");
  static constexpr int kQBytes = wgmma::sw128_tile_bytes(kBlockM, kHeadDim);
  static constexpr int kKVBytes = wgmma::sw128_tile_bytes(kBlockN, kHeadDim);
  static constexpr int kTilesN = kBlockN / 8, kTilesD = kHeadDim / 8;
  static constexpr int kBlockBytesQ = kBlockM * wgmma::kSwizzleRowBytes;   // one 64-column block of Q
  static constexpr int kBlockBytesKV = kBlockN * wgmma::kSwizzleRowBytes;  // of K or V

  __device__ static int warp_row_offset(int warp) { return warp * 16; }


  // The kernel overlaps the softmax of key tile j with O += P(j-1) V(j-1) on the tensor core
  // (attention_fwd.cuh, overlapped loop): both matmuls are issued, then waited on separately.
  static constexpr bool kOverlapSoftmax = true;
  // Launched only when the mask and bias stream through shared-memory tiles (dispatch in
  // attention_fwd.cuh): the global-memory reads of the other layouts made this kernel spill.
  static constexpr bool kGlobalScoreTerms = false;
  using PFrag = uint32_t[kBlockN / 16][4];  // P as A fragments, 16 keys per wgmma

  // The last key tile of a list may run narrower (kKeys = 32 or 64 of its 128 rows): the
  // gathered lists of a causal top-w forward end in a tile that holds a few dozen keys
  // (attention_fwd.cuh). The swizzled K and V tiles keep their 128-row layout either way: a
  // narrower wgmma reads their first rows.
  static constexpr bool kNarrowLastTile = true;

  // Issues S = Q K^T: this warpgroup's 64 rows x kKeys keys, D / 16 chained wgmmas. kTermSlice:
  // one more, over a 16-column slice of its own for Q (q_term: kBlockM rows) and for K (k_term),
  // each a 32-byte swizzled block (wgmma::sw32_offset; the gathered forward's folded key terms).
  template <int kKeys = kBlockN, bool kTermSlice = false>
  __device__ static void qk_issue(float (&s)[1][kKeys / 8][4], uint32_t s_q, uint32_t k_tile, int warp,
                                  uint32_t q_term = 0, uint32_t k_term = 0) {
    static_assert(kKeys == 32 || kKeys == 64 || kKeys == kBlockN, "wgmma widths the wrappers provide");
    // K's descriptor is built once per tile and advanced; Q's are rebuilt per wgmma, as a Q
    // descriptor hoisted out of the key loop stays live across it and made the kernel spill.
    const uint32_t q_rows = s_q + (warp / 4) * 64 * wgmma::kSwizzleRowBytes;
    const uint64_t k_desc = wgmma::desc_k_major(k_tile);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t col = (kk % 4) * 32;  // bytes into a swizzled row: 16 elements per step
      wgmma::mma_ss<T, kKeys>(s[0], wgmma::desc_k_major(q_rows + (kk / 4) * kBlockBytesQ + col),
                              wgmma::desc_advance(k_desc, (kk / 4) * kBlockBytesKV + col), kk > 0);
    }
    if constexpr (kTermSlice)
      wgmma::mma_ss<T, kKeys>(s[0], wgmma::desc_k_major_sw32(q_term + (warp / 4) * 64 * wgmma::kSw32RowBytes),
                              wgmma::desc_k_major_sw32(k_term), 1);
    wgmma::commit_group();
  }

  // Issues O += P V over the tile's first kKeys keys: P from registers, V N-major in shared
  // memory. P must stay untouched until wait_pv: the tensor core reads the registers
  // asynchronously.
  template <int kKeys = kBlockN>
  __device__ static void pv_issue(float (&o)[1][kTilesD][4], const PFrag& p, uint32_t v_tile) {
    const uint64_t v_desc = wgmma::desc_n_major(v_tile, kBlockBytesKV);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma::mma_rs_n_major<T, kHeadDim>(o[0], p[kk], wgmma::desc_advance(v_desc, kk * 16 * wgmma::kSwizzleRowBytes), 1);
    wgmma::commit_group();
  }

  // Waits for S; kPvInFlight: a P V issued after it may keep running.
  template <bool kPvInFlight, int kCols>
  __device__ static void wait_qk(float (&s)[1][kCols][4]) {
    wgmma::wait_group<kPvInFlight ? 1 : 0>();
    wgmma::fence_operands(s[0]);
  }

  // Waits for everything issued; O is final and P's registers are free again.
  __device__ static void wait_pv(float (&o)[1][kTilesD][4], PFrag& p) {
    wgmma::wait_group<0>();
    wgmma::fence_operands(o[0]);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p[kk][e])::"memory");  // live until here
  }

  // P of the tile's first 8 * kCols keys (all of them but on a narrow last tile).
  template <int kCols>
  __device__ static void pack_p(PFrag& p, const float (&s)[1][kCols][4]) {
#pragma unroll
    for (int kk = 0; kk < kCols / 2; ++kk) ptx::pack_a_frag<T>(p[kk], s[0][2 * kk], s[0][2 * kk + 1]);
  }
};

}  // namespace fdma::cuda
