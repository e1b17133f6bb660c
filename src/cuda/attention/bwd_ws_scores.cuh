// The per-score step of the warp-specialized backward (attention_bwd_ws.cuh, and the D 256
// kernel's attention_bwd_ws_d256.cuh): a consumer warp group's S^T and dP^T (rows: its warp's 16
// keys, columns: the step's queries) to P^T and dS^T, with each score's additive term from where
// the kind of call keeps it: nothing or a per-key term in registers (dense), the step's mask tile
// (masked) or its bias tile (biased, which can also take each score's dS back out for dbias), or
// the keys' intervals (gathered).
// The tiles are the copy engine's, swizzled (score_tiles_sm90.cuh), read transposed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_bwd_common.cuh"
#include "cuda/attention/score_tiles_sm90.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// Dense steps: a warp group's S^T and dP^T (its warp's 16 keys from key0, this thread's keys[2];
// queries from q0, 8 kTilesN of them) to P^T and dS^T, one loop per case: tiles whose scores
// are all visible (in range, and causal below the diagonal) with a per-key bias (kb, the
// thread's keys') or none, else the visibility tested per score (kb is zero without a bias).
template <int kTilesN>
__device__ __forceinline__ void dense_scores_to_p_ds_t(const AttentionFwdParams& f, float (&st)[kTilesN][4],
                                                       float (&dpt)[kTilesN][4], float (&db)[2], const float* lse2,
                                                       const float* delta, int q0, int key0, int n_keys,
                                                       const int (&keys)[2], bool key_bias, const float (&kb)[2],
                                                       int warp, int t) {
  const bool interior = q0 + 8 * kTilesN <= f.Sq && key0 + n_keys <= f.Sk &&
                        (!f.causal || key0 + 16 * warp + 15 <= q0 + f.Sk - f.Sq);
  if (interior && key_bias) {
    scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, [&](int, int e) { return kb[e >> 1]; });
  } else if (interior) {
    scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, NoTerm{});
  } else {
    scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t, [&](int nt, int e) {
      return visible_at(f, q0 + nt * 8 + 2 * t + (e & 1), keys[e >> 1]) ? kb[e >> 1] : -INFINITY;
    });
  }
}

// Masked steps the summary does not keep whole: dense_scores_to_p_ds_t with the mask tile's
// verdict on each score (the step's [queries][keys] bytes, kRowBytes = 128 or 64 a row with the
// matching swizzle; this thread's keys are columns `col` and col + 8 of it, its queries rows
// row0 + 8 nt + 2t (+1), row0 a multiple of 8). Rows row0 + 8 nt + c share the swizzle of row
// c, so each of the thread's two row classes is one address plus constants.
template <int kRowBytes = 128, int kTilesN>
__device__ __forceinline__ void bwd_ws_masked_scores(const AttentionFwdParams& f, float (&st)[kTilesN][4],
                                                     float (&dpt)[kTilesN][4], float (&db)[2], const float* lse2,
                                                     const float* delta, uint32_t mask, int q0, int key0,
                                                     const int (&keys)[2], int col, int row0, int warp, int t) {
  const uint32_t at[2] = {swizzled_row<kRowBytes>(mask, row0 + 2 * t, col),
                          swizzled_row<kRowBytes>(mask, row0 + 2 * t + 1, col)};
  auto kept = [&](int nt, int e) { return ptx::ld_shared_u8(at[e & 1] + nt * 8 * kRowBytes + (e >> 1) * 8) != 0; };
  const bool interior = q0 + 8 * kTilesN <= f.Sq && key0 + 64 <= f.Sk &&
                        (!f.causal || key0 + 16 * warp + 15 <= q0 + f.Sk - f.Sq);
  if (interior) {
    scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t,
                     [&](int nt, int e) { return kept(nt, e) ? 0.f : -INFINITY; });
  } else {
    scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t, [&](int nt, int e) {
      return kept(nt, e) && visible_at(f, q0 + nt * 8 + 2 * t + (e & 1), keys[e >> 1]) ? 0.f : -INFINITY;
    });
  }
}

// Biased steps: dense_scores_to_p_ds_t with each score's term read from the step's bias box
// (this group's [64 queries][64 keys] of q's dtype, 128-byte swizzled, in store_ds_t's layout:
// this thread's keys are columns 16 warp + g and + 8, its queries rows 8 nt + 2t (+1)). With
// keep_ds (dbias asked for, one dS an element) each score's dS goes back over its bias, which
// makes the box the step's dbias tile; with a staging tile `sums` (dbias summed) it goes there
// as fp32: two boxes of [64 queries][32 keys], 128-byte swizzled, warps 0-1's keys in the
// first. Rows 8 nt + c share the swizzle of row c, and key + 8 is the chunk after next (fp32)
// or the next (16-bit): each of the thread's two row classes is one address, XORed and offset
// by constants.
template <class T, int kTilesN>
__device__ __forceinline__ void bwd_ws_biased_scores(const AttentionFwdParams& f, float (&st)[kTilesN][4],
                                                     float (&dpt)[kTilesN][4], float (&db)[2], const float* lse2,
                                                     const float* delta, uint32_t box, bool keep_ds, uint32_t sums,
                                                     int q0, int key0, const int (&keys)[2], int warp, int lane) {
  const int g = lane / 4, t = lane % 4;
  const uint32_t at[2] = {swizzled_row<128>(box, 2 * t, 32 * warp + 2 * g),
                          swizzled_row<128>(box, 2 * t + 1, 32 * warp + 2 * g)};
  const uint32_t sums_box = sums + (warp / 2) * 8 * kTilesN * wgmma::kSwizzleRowBytes;
  const uint32_t sums_byte = 4 * (16 * (warp % 2) + g);
  const uint32_t sum_at[2] = {swizzled_row<128>(sums_box, 2 * t, sums_byte),
                              swizzled_row<128>(sums_box, 2 * t + 1, sums_byte)};
  auto score_at = [&](int nt, int e) { return (at[e & 1] ^ ((e >> 1) << 4)) + nt * 8 * wgmma::kSwizzleRowBytes; };
  auto bias = [&](int nt, int e) { return unpack_one(ptx::ld_shared_u16(score_at(nt, e)), T{}); };
  auto keep = [&](int nt, int e, float ds) {
    if (keep_ds) ptx::st_shared_u16(score_at(nt, e), pack_one(ds, T{}));
    if (sums) ptx::st_shared_f32((sum_at[e & 1] ^ ((e >> 1) << 5)) + nt * 8 * wgmma::kSwizzleRowBytes, ds);
  };
  const bool interior = q0 + 8 * kTilesN <= f.Sq && key0 + 64 <= f.Sk &&
                        (!f.causal || key0 + 16 * warp + 15 <= q0 + f.Sk - f.Sq);
  if (interior) {
    scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, bias, keep);
  } else {
    scores_to_p_ds_t(
        f, st, dpt, db, lse2, delta, t,
        [&](int nt, int e) {
          return visible_at(f, q0 + nt * 8 + 2 * t + (e & 1), keys[e >> 1]) ? bias(nt, e) : -INFINITY;
        },
        keep);
  }
}

// Gathered steps: a warp group's S^T and dP^T over queries [q0, + 8 kTilesN) to P^T and dS^T,
// each score's term its key's bias inside the key's interval (row_keys, the thread's two keys'
// records) and -inf outside; where the warp's 16 keys are all kept by every one of those
// queries, without the interval test per score.
template <int kTilesN>
__device__ __forceinline__ void bwd_ws_gathered_scores(const AttentionFwdParams& f, float (&st)[kTilesN][4],
                                                       float (&dpt)[kTilesN][4], float (&db)[2], const float* lse2,
                                                       const float* delta, const KeyInfo (&row_keys)[2], int q0,
                                                       int t) {
  auto covers = [&](const KeyInfo& key) { return key.begin <= q0 && key.end >= q0 + 8 * kTilesN; };
  if (__all_sync(0xffffffffu, covers(row_keys[0]) && covers(row_keys[1]))) {
    scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, [&](int, int e) { return row_keys[e >> 1].bias; });
  } else {
    scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t,
                     [&](int nt, int e) { return interval_add(row_keys[e >> 1], q0 + nt * 8 + 2 * t + (e & 1)); });
  }
}

}  // namespace fdma::cuda
