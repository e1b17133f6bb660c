// The attention backward's shared pieces (attention_bwd.cuh says how the two kernels divide
// the work): the CTA sizes, dbias indexing and zero-filling, and the per-score gradient loops
// that turn recomputed scores and dP into dS, each case its own unrolled loop.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <type_traits>

#include "cuda/primitives/arch_dispatch.cuh"
#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/attention/bwd_mma_sm80.cuh"
#include "cuda/attention/bwd_mma_sm90.cuh"
#include "cuda/attention/cta_order.cuh"
#include "cuda/primitives/fast_divmod.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/attention/next_active.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/attention/score_mod_sm80.cuh"
#include "cuda/attention/score_terms_bwd.cuh"
#include "cuda/primitives/softmax_sm80.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"

namespace fdma::cuda {

constexpr int kBwdThreads = 128;  // 4 warps, 16 rows (dq) or 16 keys (dk/dv) each
// Dynamic-mask mode, dk/dv kernel: the kept keys of a (batch, KV head), ordered by the end of
// their query interval, are cut into windows of kBwdWindow; a window is ranked by key index
// (where the intervals begin) and split into groups of 64 keys with similar intervals, one CTA
// each, so a CTA walks only the queries its keys' intervals span. At S = 128K, w = 2048 the CTAs
// compute 1.20x the kept pairs this way; windows of 256 or 1024 kept keys in index order ranked
// by end gave 1.71x and 1.27x (tools/profiling/simulate_dkdv_groups.py).
constexpr int kBwdWindow = 256;

// Dense index of dbias element (b, bias head hb, i, j) in the fp32 reduction slots, and its
// offset in the dbias tensor (whose strides are 0 on size-1 dims).
__device__ __forceinline__ int64_t dbias_dense(const AttentionBwdParams& p, int b, int64_t hb, int i, int j) {
  const int64_t* n = p.dbias_size;
  const int64_t bb = n[0] == 1 ? 0 : b, ii = n[2] == 1 ? 0 : i, jj = n[3] == 1 ? 0 : j;
  return ((bb * n[1] + hb) * n[2] + ii) * n[3] + jj;
}
// dbias[.., 0, j] of a bias broadcast over queries, owned by the key columns: the fp32 slot of
// (b, hk) (heads and batches sharing a dbias element share it), then the add of head h's dS
// sums db[r] of keys[r] (summed over the quad here) into half `half` of the slots (the host
// allocates two halves, one per dk/dv warp group; the finish kernel sums the slots in order,
// so the result stays reproducible). t: the thread's lane % 4.
__device__ __forceinline__ int key_column_dbias_slot(const AttentionBwdParams& p, int b, int hk) {
  const AttentionFwdParams& f = p.f;
  return (p.dbias_size[0] == 1 && f.B > 1 ? b : 0) * (f.bias_head_mode == 0 ? f.Hk : 1) +
         (f.bias_head_mode == 0 ? hk : 0);
}
__device__ __forceinline__ void add_key_column_dbias(const AttentionBwdParams& p, int b, int slot, int h, int half,
                                                     const int (&keys)[2], const float (&db)[2], int t) {
  const AttentionFwdParams& f = p.f;
  const float r0 = quad_sum(db[0]), r1 = quad_sum(db[1]);
  const int64_t hb = head_index(f.bias_head_mode, h, f.G);
  float* acc = p.dbias_acc + (int64_t(half) * (p.dbias_slots / 2) + slot) *
                                 (p.dbias_size[0] * p.dbias_size[1] * p.dbias_size[3]);
  if (t == 0 && keys[0] < f.Sk) acc[dbias_dense(p, b, hb, 0, keys[0])] += r0;
  if (t == 0 && keys[1] < f.Sk) acc[dbias_dense(p, b, hb, 0, keys[1])] += r1;
}
__device__ __forceinline__ int64_t dbias_offset(const AttentionBwdParams& p, int b, int64_t hb, int i, int j) {
  return b * p.dbias_stride[0] + hb * p.dbias_stride[1] + int64_t(i) * p.dbias_stride[2] + int64_t(j) * p.dbias_stride[3];
}
template <class T>
__device__ __forceinline__ void store_dbias(const AttentionBwdParams& p, int64_t off, float value) {
  if (p.dbias_f32)
    static_cast<float*>(p.dbias)[off] = value;
  else
    static_cast<T*>(p.dbias)[off] = T(value);
}

// Writes zeros to dbias[b, hb, i, k0:k1) for the rows i in [row0, row0 + rows): the dq kernel's
// dS on the tiles its walk skipped. Where a row's keys are contiguous, each warp takes a row
// and its lanes store 16 bytes each (2-byte stores with the full index math made these zeros
// cost 15% of a causal 4-D bias backward; docs/performance.md, "attention backward").
template <class T>
__device__ __forceinline__ void zero_dbias_keys(const AttentionBwdParams& p, int b, int64_t hb, int row0, int rows,
                                                int k0, int k1, int tid) {
  if (p.dbias_stride[3] != 1) {
    const int keys = k1 - k0;
    for (int64_t idx = tid; idx < int64_t(rows) * keys; idx += kBwdThreads)
      store_dbias<T>(p, dbias_offset(p, b, hb, row0 + int(idx / keys), k0 + int(idx % keys)), 0.f);
    return;
  }
  const int esize = p.dbias_f32 ? 4 : 2, warp = tid / 32, lane = tid % 32;
  auto zero_element = [&](char* c) {
    if (esize == 4)
      *reinterpret_cast<float*>(c) = 0.f;
    else
      *reinterpret_cast<uint16_t*>(c) = 0;
  };
  for (int r = warp; r < rows; r += kBwdThreads / 32) {
    char* row = static_cast<char*>(p.dbias) + dbias_offset(p, b, hb, row0 + r, 0) * esize;
    char *lo = row + int64_t(k0) * esize, *hi = row + int64_t(k1) * esize;
    // [lo, body) and [tail, hi) element by element, [body, tail) in aligned 16-byte stores
    char* body = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(lo) + 15) & ~uintptr_t(15));
    char* tail = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(hi) & ~uintptr_t(15));
    if (body > hi) body = hi;
    if (tail < body) tail = body;
    for (char* c = lo + lane * esize; c < body; c += 32 * esize) zero_element(c);
    for (char* c = body + lane * 16; c < tail; c += 32 * 16) *reinterpret_cast<uint4*>(c) = make_uint4(0, 0, 0, 0);
    for (char* c = tail + lane * esize; c < hi; c += 32 * esize) zero_element(c);
  }
}

__device__ __forceinline__ bool tile_is_active(const AttentionFwdParams& f, const uint8_t* row, int kt) {
  return !row || row[f.active_k_tiles == 1 ? 0 : kt];
}
// Whether the mask keeps every score of the tile (or there is no mask): no mask tile, no test.
__device__ __forceinline__ bool mask_keeps_tile(const AttentionFwdParams& f, const uint8_t* row, int kt) {
  return !row || (row[f.active_k_tiles == 1 ? 0 : kt] & kTileAll);
}

// One score's backward terms from its raw q.k, additive term, lse (base 2), dP and delta: the
// probability, dS = P (dP - delta), and dS times d(capped)/d(qk).
struct ScoreGrad {
  float pr, ds, dqk;
};
// kVisible: the score is visible for certain (a dynamic-mask tile whose keys all cover the rows,
// or an interior tile without a mask test), so its term is its bias alone, added as the
// forward adds it, with no hidden-score select. kNoTerm: visible and no term at all; without
// softcap the raw q.k goes into the exponent's multiply-add with scale * log2(e), as the
// forward's softmax takes such scores.
template <bool kSoftcap, bool kVisible, bool kNoTerm = false>
__device__ __forceinline__ ScoreGrad score_grad(const AttentionFwdParams& f, float qk, float add, float lse2, float dp,
                                                float delta) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float c = capped_score<kSoftcap>(f, qk);
  const float pr = ptx::exp2_approx(kNoTerm && !kSoftcap ? fmaf(qk, f.scale * kLog2e, -lse2)
                                                          : fmaf(kVisible ? c + add : add_visible(c, add), kLog2e, -lse2));
  const float ds = pr * (dp - delta);
  return {pr, ds, ds * capped_slope<kSoftcap>(f, c)};
}

// The additive term of visible scores in calls without a term (no bias, no mask): score_grad's
// kNoTerm, and no dbias sums.
struct NoTerm {
  __device__ float operator()(int, int) const { return 0.f; }
};

// Scores (raw q.k in s, dP in dp, one warp's 16 rows) to gradients, for one way of finding
// each score's additive term add_at(nt, e) (fragment element e of n-tile nt). Each caller
// passes one lambda per uniform case, so the unrolled loop a tile executes holds only its own
// case (one loop with every case inlined per score overflowed the instruction cache: ncu "no
// instruction" stalls, docs/performance.md, "attention backward"). Rows are queries: dp becomes dS, s becomes
// dS * d(capped)/d(qk).
template <bool kVisible = false, int kTilesN, class Add>
__device__ __forceinline__ void scores_to_ds(const AttentionFwdParams& f, float (&s)[kTilesN][4],
                                             float (&dp)[kTilesN][4], const float (&lse2)[2], const float (&delta)[2],
                                             Add&& add_at) {
  constexpr bool kNoTerm = std::is_same_v<std::decay_t<Add>, NoTerm>;
  static_assert(!kNoTerm || kVisible, "NoTerm is for visible scores");
  with_softcap(f, [&](auto softcap) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const ScoreGrad g = score_grad<decltype(softcap)::value, kVisible, kNoTerm>(f, s[nt][e], add_at(nt, e), lse2[r],
                                                                                   dp[nt][e], delta[r]);
        dp[nt][e] = g.ds;
        s[nt][e] = g.dqk;
      }
  });
}

// The transposed case of the dk/dv kernel: rows are keys, columns the step's queries
// nt * 8 + 2t + (e & 1), with lse2 and delta in shared memory. st becomes P^T, dpt becomes
// dS^T * d(capped)/d(qk), db[r] += dS^T (not for NoTerm); on_ds(nt, e, dS) sees each score's dS
// (a dbias tile).
template <bool kVisible = false, int kTilesN, class Add, class OnDs>
__device__ __forceinline__ void scores_to_p_ds_t(const AttentionFwdParams& f, float (&st)[kTilesN][4],
                                                 float (&dpt)[kTilesN][4], float (&db)[2], const float* lse2,
                                                 const float* delta, int t, Add&& add_at, OnDs&& on_ds) {
  constexpr bool kNoTerm = std::is_same_v<std::decay_t<Add>, NoTerm>;
  static_assert(!kNoTerm || kVisible, "NoTerm is for visible scores");
  with_softcap(f, [&](auto softcap) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int il = nt * 8 + 2 * t + (e & 1);
        const ScoreGrad g = score_grad<decltype(softcap)::value, kVisible, kNoTerm>(f, st[nt][e], add_at(nt, e),
                                                                                   lse2[il], dpt[nt][e], delta[il]);
        if constexpr (!kNoTerm) db[e >> 1] += g.ds;
        on_ds(nt, e, g.ds);
        st[nt][e] = g.pr;
        dpt[nt][e] = g.dqk;
      }
  });
}
template <bool kVisible = false, int kTilesN, class Add>
__device__ __forceinline__ void scores_to_p_ds_t(const AttentionFwdParams& f, float (&st)[kTilesN][4],
                                                 float (&dpt)[kTilesN][4], float (&db)[2], const float* lse2,
                                                 const float* delta, int t, Add&& add_at) {
  scores_to_p_ds_t<kVisible>(f, st, dpt, db, lse2, delta, t, add_at, [](int, int, float) {});
}

}  // namespace fdma::cuda
