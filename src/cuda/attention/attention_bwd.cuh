// attention backward, with the matmuls as a policy: BwdMmaSm80 (mma.sync, any sm80+ GPU) or
// BwdMmaSm90 (wgmma, Hopper, D = 64 and 128), chosen per launch. Two kernels, neither with
// atomics, so the gradients are bitwise reproducible on every run (`deterministic` is free):
//   dq kernel   (rows):    one CTA per 64 query rows of a (batch, head); walks the key tiles,
//                          recomputes P from lse, and owns dq (and dbias when the bias has a
//                          query dim);
//   dk/dv kernel (columns): one CTA per 64 keys of a (batch, KV head); walks the G query heads
//                          of the group and their query tiles (two warp groups taking turns),
//                          so the GQA sum of dk/dv stays on chip; owns dbias when the bias
//                          broadcasts over queries.
// Both recompute S = QK^T and dP = dO V^T (seven matmuls against the five of a single-kernel
// backward with dq atomics): the price of determinism without a B*H*Sq*D fp32 temporary.
// attention_bwd_aux.cu holds the small kernels around them (delta/lse2, dbias finish).
#pragma once

#include <cuda_runtime.h>

#include <climits>

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
// by end gave 1.71x and 1.27x (bench/simulate_dkdv_groups.py).
constexpr int kBwdWindow = 256;

// Dense index of dbias element (b, bias head hb, i, j) in the fp32 reduction slots, and its
// offset in the dbias tensor (whose strides are 0 on size-1 dims).
__device__ __forceinline__ int64_t dbias_dense(const AttentionBwdParams& p, int b, int64_t hb, int i, int j) {
  const int64_t* n = p.dbias_size;
  const int64_t bb = n[0] == 1 ? 0 : b, ii = n[2] == 1 ? 0 : i, jj = n[3] == 1 ? 0 : j;
  return ((bb * n[1] + hb) * n[2] + ii) * n[3] + jj;
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

// Mask tile summary row for (b, h) and query tile qt (64 x 64 tiles), or null without a mask.
__device__ __forceinline__ const uint8_t* active_row(const AttentionFwdParams& f, int b, int h, int qt) {
  if (!f.tile_active) return nullptr;
  const int mb = f.active_batches == 1 ? 0 : b, mh = int(head_index(f.mask_head_mode, h, f.G));
  const int q = f.active_q_tiles == 1 ? 0 : qt;
  return f.tile_active + ((int64_t(mb) * f.active_heads + mh) * f.active_q_tiles + q) * f.active_k_tiles;
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
// forward adds it, with no hidden-score select.
template <bool kSoftcap, bool kVisible>
__device__ __forceinline__ ScoreGrad score_grad(const AttentionFwdParams& f, float qk, float add, float lse2, float dp,
                                                float delta) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float c = capped_score<kSoftcap>(f, qk);
  const float pr = ptx::exp2_approx(fmaf(kVisible ? c + add : add_visible(c, add), kLog2e, -lse2));
  const float ds = pr * (dp - delta);
  return {pr, ds, ds * capped_slope<kSoftcap>(f, c)};
}

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
  with_softcap(f, [&](auto softcap) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const ScoreGrad g =
            score_grad<decltype(softcap)::value, kVisible>(f, s[nt][e], add_at(nt, e), lse2[r], dp[nt][e], delta[r]);
        dp[nt][e] = g.ds;
        s[nt][e] = g.dqk;
      }
  });
}

// The transposed case of the dk/dv kernel: rows are keys, columns the step's queries
// nt * 8 + 2t + (e & 1), with lse2 and delta in shared memory. st becomes P^T, dpt becomes
// dS^T * d(capped)/d(qk), db[r] += dS^T.
template <bool kVisible = false, int kTilesN, class Add>
__device__ __forceinline__ void scores_to_p_ds_t(const AttentionFwdParams& f, float (&st)[kTilesN][4],
                                                 float (&dpt)[kTilesN][4], float (&db)[2], const float* lse2,
                                                 const float* delta, int t, Add&& add_at) {
  with_softcap(f, [&](auto softcap) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int il = nt * 8 + 2 * t + (e & 1);
        const ScoreGrad g =
            score_grad<decltype(softcap)::value, kVisible>(f, st[nt][e], add_at(nt, e), lse2[il], dpt[nt][e], delta[il]);
        db[e >> 1] += g.ds;
        st[nt][e] = g.pr;
        dpt[nt][e] = g.dqk;
      }
  });
}

template <class Mma, int kHeadDim>
struct BwdDqTile {
  static constexpr int kBlockM = kBwdBlockM, kBlockN = bwd_dq_block_n(kHeadDim);
  static constexpr int kQBytes = Mma::tile_bytes(kBlockM), kKVBytes = Mma::tile_bytes(kBlockN);
  using Terms = TermTiles<kBlockM, kBlockN, true>;
  // Q, dO, K x2, V x2, two tiles of gathered KeyInfo records (dynamic-mask mode), then the
  // mask/bias tiles x2 (sized at launch: none without them), then the staged key list, then the
  // next-active table (next_active.cuh).
  static constexpr int kInfoOffset = 2 * kQBytes + 4 * kKVBytes;
  static constexpr int kTermsOffset = kInfoOffset + 2 * kBlockN * 16;
  // Dynamic-mask mode: the query tile's key list is copied to shared memory once, so that the
  // gathered row loads take their indices from there, not from a global read each (long
  // scoreboard stalls: 3.0 cycles per issue at 128K). Up to a length that keeps two CTAs per SM
  // for D = 128; longer lists are read from global memory.
  static constexpr int kMaxListedKeys = 3072;
  __host__ __device__ static int list_bytes(const AttentionFwdParams& f) {
    return f.lists.keys && f.lists.max_listed <= kMaxListedKeys ? (f.lists.max_listed * 4 + 15) / 16 * 16 : 0;
  }
  __host__ __device__ static int smem_bytes(const AttentionFwdParams& f) {
    return align_slack<Mma::kTileAlign>() + kTermsOffset + 2 * Terms::bytes(f) + list_bytes(f) + next_active_bytes(f, kBlockN);
  }
};

// kGather: dynamic-mask mode (f.lists), an instantiation of its own as in the forward, so that
// each kernel holds only its own loops (the instruction cache; docs/performance.md, "attention backward").
template <class T, int kHeadDim, bool kGather, class Mma>
__device__ __forceinline__ void attention_bwd_dq_body(const AttentionBwdParams& p) {
  using Tile = BwdDqTile<Mma, kHeadDim>;
  constexpr int kBN = Tile::kBlockN, kN = kBN / 8, kDT = kHeadDim / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem<Mma::kTileAlign>(smem_raw);
  const AttentionFwdParams& f = p.f;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Causal, or a causal dynamic mask's lists: the last query tiles see the most keys.
  const QueryTileCta cta = query_tile_cta(f.causal || (f.lists.keys && f.lists.longest_first));
  const int m_block = cta.m_block;
  const int row0 = m_block * Tile::kBlockM, warp_row0 = row0 + 16 * warp;
  const int rows[2] = {warp_row0 + g, warp_row0 + g + 8};
  constexpr bool gather = kGather;  // dynamic-mask mode (KeyLists)
  const KeyInfo* s_info = reinterpret_cast<const KeyInfo*>(smem + Tile::kInfoOffset);
  using Terms = typename Tile::Terms;
  unsigned char* s_terms = smem + Tile::kTermsOffset;
  const int terms_bytes = gather ? 0 : Terms::bytes(f);  // no mask or bias tiles when gathered
  BiasTerm bias_term;
  const bool terms_tiled = !gather && terms_on_chip(f, bias_term);  // interior tiles read no global terms

  const uint32_t s_q = ptx::smem_addr(smem), s_do = s_q + Tile::kQBytes;
  const uint32_t s_k = s_do + Tile::kQBytes, s_v = s_k + 2 * Tile::kKVBytes;

  const bool db_rows = !gather && p.dbias_owner == DbiasOwner::rows;  // gathered: no dbias (launch)
  const bool key_bias = key_bias_only(f);
  const bool db_direct = db_rows && !p.dbias_acc;
  const bool db_key_sum = db_rows && p.dbias_size[3] == 1 && f.Sk > 1;  // one value per row
  const bool db_scalar = db_key_sum && p.dbias_size[2] == 1 && f.Sq > 1;  // one value per block
  __shared__ float warp_sums[4];
  __shared__ typename Terms::Rows s_term_rows;  // the head's mask/bias bases (Terms::rows_of)

  for (int bi = 0; bi < p.rows_batches_per_block; ++bi)
    for (int hi = 0; hi < p.rows_heads_per_block; ++hi) {
      const int b = blockIdx.z * p.rows_batches_per_block + bi, h = cta.y * p.rows_heads_per_block + hi;
      const int hk = h / f.G;
      const int64_t hb = head_index(f.bias_head_mode, h, f.G);
      const T* q = static_cast<const T*>(f.q) + b * f.q_stride[0] + h * f.q_stride[2];
      const T* dout = static_cast<const T*>(p.dout) + b * p.dout_stride[0] + h * p.dout_stride[2];
      const T* k = static_cast<const T*>(f.k) + b * f.k_stride[0] + hk * f.k_stride[2];
      const T* v = static_cast<const T*>(f.v) + b * f.v_stride[0] + hk * f.v_stride[2];
      const int64_t row_base = (int64_t(b) * f.H + h) * p.Sq_pad;
      const float lse2[2] = {p.lse2[row_base + rows[0]], p.lse2[row_base + rows[1]]};
      const float delta[2] = {p.delta[row_base + rows[0]], p.delta[row_base + rows[1]]};
      const uint8_t* active = active_row(f, b, h, m_block);
      const int32_t* list = nullptr;
      const KeyInfo* info = nullptr;
      int n_listed = 0;
      if (gather) {
        const int64_t bh = int64_t(b) * f.Hk + hk;
        list = tile_key_list(f.lists, bh, m_block, n_listed);
        info = f.lists.info + bh * f.Sk;
      }
      if (terms_bytes) {  // in shared memory: in registers across the loop they would add to its pressure
        __syncthreads();  // the previous head's loads have read it
        if (tid == 0) s_term_rows = Terms::rows_of(f, b, h);
        __syncthreads();
      }
      const int key_end = gather ? n_listed : f.causal ? min(f.Sk, row0 + Tile::kBlockM + f.Sk - f.Sq) : f.Sk;
      const int n_blocks = key_end > 0 ? (key_end + kBN - 1) / kBN : 0;
      auto load_kv = [&](int nb, int buf) {
        const uint32_t sk = s_k + buf * Tile::kKVBytes, sv = s_v + buf * Tile::kKVBytes;
        if (gather) {
          const int n = n_listed - nb * kBN;
          Mma::template load_rows_gather_pair<kBN>(sk, k, f.k_stride[1], sv, v, f.v_stride[1], list + nb * kBN, n, f.D,
                                                   tid);
          load_key_records_async(ptx::smem_addr(s_info + buf * kBN), info, list + nb * kBN, n, kBN, tid);
        } else {
          Mma::template load_rows<kBN>(sk, k, f.k_stride[1], nb * kBN, f.Sk, f.D, tid);
          Mma::template load_rows<kBN>(sv, v, f.v_stride[1], nb * kBN, f.Sk, f.D, tid);
          if (terms_bytes)
            Terms::template load<kBwdThreads>(s_terms + buf * terms_bytes, f, s_term_rows, row0, nb * kBN, tid,
                                              mask_keeps_tile(f, active, nb * kBN / kBwdBlockN));
        }
      };
      int16_t* next_table = nullptr;
      if (!gather && active && next_active_bytes(f, kBN)) {
        next_table = reinterpret_cast<int16_t*>(s_terms + 2 * terms_bytes + Tile::list_bytes(f));
        build_next_active(next_table, n_blocks, [&](int nb) { return tile_is_active(f, active, nb * kBN / kBwdBlockN); }, tid,
                          kBwdThreads);
      }
      auto next_active = [&](int nb) {
        if (next_table) return nb < n_blocks ? int(next_table[nb]) : nb;
        while (nb < n_blocks && !tile_is_active(f, active, nb * kBN / kBwdBlockN)) ++nb;
        return nb;
      };

      float dq[kDT][4];
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
      float db_row[2] = {0.f, 0.f};

      int nb = next_active(0);
      if (nb < n_blocks) {
        Mma::template load_rows<Tile::kBlockM>(s_q, q, f.q_stride[1], row0, f.Sq, f.D, tid);
        Mma::template load_rows<Tile::kBlockM>(s_do, dout, p.dout_stride[1], row0, f.Sq, f.D, tid);
        if (gather && n_listed * 4 <= Tile::list_bytes(f)) {
          int32_t* s_list = reinterpret_cast<int32_t*>(s_terms + 2 * terms_bytes);
          for (int i = tid; i < n_listed; i += kBwdThreads) s_list[i] = list[i];
          __syncthreads();
          list = s_list;
        }
        load_kv(nb, 0);
        ptx::cp_async_commit();
      }
      for (int buf = 0; nb < n_blocks; buf ^= 1) {
        const int nb_next = next_active(nb + 1);
        if (nb_next < n_blocks) load_kv(nb_next, buf ^ 1);
        ptx::cp_async_commit();
        ptx::cp_async_wait<1>();
        Mma::tile_landed();
        __syncthreads();

        const uint32_t k_tile = s_k + buf * Tile::kKVBytes, v_tile = s_v + buf * Tile::kKVBytes;
        float s[kN][4], dp[kN][4];  // S = Q K^T and dP = dO V^T for this warp's 16 rows
        Mma::template a_bt_pair<Tile::kBlockM, kBN>(s, s_q, k_tile, dp, s_do, v_tile, warp, lane);

        // dS = P * (dP - delta): dp becomes dS, s becomes dS * d(capped)/d(qk), the A operand
        // of dq += dS K.
        const int key0 = nb * kBN;
        // interior: every (row, key) of the warp's tile is in range and not hidden by causality.
        const bool interior = warp_row0 + 16 <= f.Sq && key0 + kBN <= f.Sk &&
                              (!f.causal || key0 + kBN - 1 <= warp_row0 + f.Sk - f.Sq);
        const KeyInfo* tile_info = s_info + buf * kBN;
        auto col = [&](int nt, int e) { return key0 + nt * 8 + 2 * t + (e & 1); };
        if (gather && keys_cover_rows<kN>(tile_info, warp_row0, lane)) {  // no interval test: the keys' biases
          float kb[kN][2];
#pragma unroll
          for (int nt = 0; nt < kN; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) kb[nt][c] = tile_info[nt * 8 + 2 * t + c].bias;
          scores_to_ds<true>(f, s, dp, lse2, delta, [&](int nt, int e) { return kb[nt][e & 1]; });
        } else if (gather) {
          scores_to_ds(f, s, dp, lse2, delta,
                       [&](int nt, int e) { return interval_add(tile_info[col(nt, e) - key0], rows[e >> 1]); });
        } else if (terms_tiled && interior) {  // mask/bias from this tile's shared copies, key biases in registers
          const unsigned char* terms = s_terms + buf * terms_bytes;
          const bool mb = Terms::mask_bcast(f);
          const int mask_rows[2] = {mb ? 0 : rows[0] - row0, mb ? 0 : rows[1] - row0};
          const bool test_mask = f.mask && !mask_keeps_tile(f, active, nb * kBN / kBwdBlockN);
          with_terms(test_mask, bias_term, [&](auto has_mask, auto bias_kind) {
            constexpr bool kMask = decltype(has_mask)::value;
            constexpr BiasTerm kBias = decltype(bias_kind)::value;
            float kb[kN][2] = {};  // BiasTerm::key: the key columns' biases
            if constexpr (kBias == BiasTerm::key) {
              if (f.bias_tiled)
                Terms::template key_bias_pairs<T>(terms, f, t, kb);
              else
                key_bias_pairs_at<T>(f, b, h, key0, t, kb);
            }
            const T* bias_tile = Terms::template bias_tile<T>(terms, f);
            // Interior and no mask test: every score is visible and its term is the bias,
            // added as the forward adds it (no hidden-score select).
            scores_to_ds<!kMask>(f, s, dp, lse2, delta, [&](int nt, int e) {
              const int r = e >> 1, c = nt * 8 + 2 * t + (e & 1);
              // one load for the thread's key pair (the same address for e and e ^ 1)
              const uint32_t pair = kMask ? mask_pair(terms + mask_rows[r] * Terms::kMaskPitch + nt * 8 + 2 * t) : 0;
              return tile_term<kMask, kBias>((e & 1) ? pair >> 8 : pair & 0xff,
                                             bias_tile + (rows[r] - row0) * Terms::kBiasPitch + c, kb[nt][e & 1]);
            });
          });
        } else if (key_bias) {  // tiles on the causal diagonal or the sequence ends
          float kb[kN][2];
          key_bias_pairs_at<T>(f, b, h, key0, t, kb);
          scores_to_ds(f, s, dp, lse2, delta, [&](int nt, int e) {
            return visible_at(f, rows[e >> 1], col(nt, e)) ? kb[nt][e & 1] : -INFINITY;
          });
        } else {
          scores_to_ds(f, s, dp, lse2, delta,
                       [&](int nt, int e) { return score_add_at<T>(f, b, h, rows[e >> 1], col(nt, e)); });
        }
        if (db_rows) {
#pragma unroll
          for (int nt = 0; nt < kN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r = e >> 1, i = rows[r], j = col(nt, e);
              if (db_key_sum) {
                db_row[r] += dp[nt][e];
              } else if (i < f.Sq && j < f.Sk) {
                if (db_direct)
                  store_dbias<T>(p, dbias_offset(p, b, hb, i, j), dp[nt][e]);
                else
                  p.dbias_acc[dbias_dense(p, b, hb, i, j)] += dp[nt][e];
              }
            }
        }
        Mma::template regs_b<kBN>(dq, s, k_tile, 0, lane);  // dq += dS K
        __syncthreads();  // everyone is done with this buffer before it is refilled
        nb = nb_next;
      }
      if (db_direct && (f.causal || active)) {
        // dS is 0 on the tiles the walk skipped (masked whole, or past the causal diagonal):
        // their dbias elements are written here, or they would keep whatever the buffer held.
        // One call per run of skipped tiles.
        const int rows_here = min(Tile::kBlockM, f.Sq - row0), n_tiles = (f.Sk + kBN - 1) / kBN;
        auto walked = [&](int kt) { return kt < n_blocks && tile_is_active(f, active, kt * kBN / kBwdBlockN); };
        for (int kt = 0; kt < n_tiles;) {
          if (walked(kt)) {
            ++kt;
            continue;
          }
          int end = kt + 1;
          while (end < n_tiles && !walked(end)) ++end;
          zero_dbias_keys<T>(p, b, hb, row0, rows_here, kt * kBN, min(end * kBN, f.Sk), tid);
          kt = end;
        }
      }

      {  // dq rows
        T* dq_base = static_cast<T*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (rows[r] >= f.Sq) continue;
          T* dst = dq_base + rows[r] * p.dq_stride[1];
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) {
            const int d = dt * 8 + 2 * t;
            if (d < f.D) *reinterpret_cast<uint32_t*>(dst + d) = ptx::pack2<T>(dq[dt][2 * r], dq[dt][2 * r + 1]);
          }
        }
      }
      if (db_key_sum) {
        const float r0 = quad_sum(db_row[0]), r1 = quad_sum(db_row[1]);
        if (db_scalar) {
          // Rows beyond Sq contributed exact zeros. Fixed order: lanes by xor tree, warps 0..3.
          float sum = (t == 0 ? r0 + r1 : 0.f);
#pragma unroll
          for (int o = 16; o >= 1; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          if (lane == 0) warp_sums[warp] = sum;
          __syncthreads();
          if (tid == 0)
            p.dbias_acc[int64_t(m_block) * (p.dbias_size[0] * p.dbias_size[1]) + dbias_dense(p, b, hb, 0, 0)] +=
                (warp_sums[0] + warp_sums[1]) + (warp_sums[2] + warp_sums[3]);
          __syncthreads();
        } else if (t == 0) {
          if (rows[0] < f.Sq) p.dbias_acc[dbias_dense(p, b, hb, rows[0], 0)] += r0;
          if (rows[1] < f.Sq) p.dbias_acc[dbias_dense(p, b, hb, rows[1], 0)] += r1;
        }
      }
    }
}

template <class T, int kHeadDim, bool kGather, class Mma>
__global__ void __launch_bounds__(kBwdThreads) attention_bwd_dq_kernel(const AttentionBwdParams p) {
  ptx::griddep_wait();  // launched overlapping the prepare kernel (launch.cuh): its delta and lse2
  ptx::griddep_launch_dependents();
  if constexpr (Mma::kHopperOnly && !FDMA_SM90_ENABLED)  // as attention_fwd_kernel
    __trap();
  else
    attention_bwd_dq_body<T, kHeadDim, kGather, Mma>(p);
}

// Dynamic-mask mode: the 64 keys of dk/dv CTA `x` of (b, hk). The kept keys ordered by interval
// end (lists.kept_by_end: latest end first, then index) are cut into windows of kBwdWindow;
// window x / 4 is ranked by key index (the order of the intervals' begins), so each key lands
// in exactly one group, and group x % 4 takes ranks [64 (x % 4), +64): keys whose intervals end
// close together and begin close together. Fills keys (index or -1), their KeyInfo records,
// the queries they span [q_lo, q_hi), and the group's size; returns false (uniformly) for an
// empty group.
__device__ __forceinline__ bool gather_key_group(const AttentionFwdParams& f, int b, int hk, int x, int32_t* keys,
                                                 KeyInfo* kinfo, int32_t* window, int& q_lo, int& q_hi,
                                                 int& n_group) {
  constexpr int kGroup = kBwdBlockN;
  const int64_t bh = int64_t(b) * f.Hk + hk;
  const int kept = f.lists.kept_count[bh];
  const int w0 = x / (kBwdWindow / kGroup) * kBwdWindow, g0 = x % (kBwdWindow / kGroup) * kGroup;
  const int n_window = min(kBwdWindow, kept - w0);
  if (n_window <= g0) return false;
  n_group = min(kGroup, n_window - g0);
  const int32_t* by_end = f.lists.kept_by_end + bh * f.Sk + w0;
  const KeyInfo* info = f.lists.info + bh * f.Sk;
  for (int i = threadIdx.x; i < n_window; i += blockDim.x) window[i] = by_end[i];
  // Whole 16-byte reads below: pad with INT_MAX, which no key index reaches.
  const int n_pad = (n_window + 3) & ~3;
  if (threadIdx.x < n_pad - n_window) window[n_window + threadIdx.x] = INT_MAX;
  __shared__ int range[2];
  if (threadIdx.x == 0) range[0] = INT_MAX, range[1] = INT_MIN;
  __syncthreads();
  // A key's rank = the window's keys with a lower index; each thread ranks 4 keys per pass, one
  // broadcast read per 4 indices.
  for (int base = 0; base < n_window; base += 4 * blockDim.x) {
    int mine[4], rank[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int i = base + threadIdx.x + s * blockDim.x;
      mine[s] = i < n_window ? window[i] : INT_MAX;
      rank[s] = 0;
    }
    for (int o = 0; o < n_pad; o += 4) {
      const int4 w4 = *reinterpret_cast<const int4*>(window + o);
      const int other[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int s = 0; s < 4; ++s) rank[s] += other[c] < mine[s];
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if (mine[s] == INT_MAX || rank[s] < g0 || rank[s] >= g0 + n_group) continue;
      const KeyInfo ki = info[mine[s]];
      keys[rank[s] - g0] = mine[s];
      kinfo[rank[s] - g0] = ki;
      atomicMin(&range[0], ki.begin);  // integer min/max: the same result in any order
      atomicMax(&range[1], ki.end);
    }
  }
  for (int i = n_group + threadIdx.x; i < kGroup; i += blockDim.x) {
    keys[i] = -1;
    kinfo[i] = KeyInfo{0, 0, 0.f, 0};
  }
  __syncthreads();
  q_lo = range[0], q_hi = range[1];
  return true;
}

template <class Mma, int kHeadDim>
struct BwdDkdvTile {
  static constexpr int kBlockN = kBwdBlockN, kBlockM = Mma::kDkdvBlockM;
  static constexpr int kChunk = bwd_dkdv_chunk(kHeadDim), kChunks = kHeadDim / kChunk;
  static constexpr int kQBytes = Mma::tile_bytes(kBlockM);
  // Shared memory: K, V; then per warp group Q x2, dO x2, lse2 x2, delta x2 (padded so the
  // next group's tiles keep the policy's alignment); then, in dynamic-mask mode, the group's
  // keys and KeyInfo records and the window being ranked.
  static constexpr int kKVBytes = 2 * Mma::tile_bytes(kBlockN);
  static constexpr int kGroupBytes =
      (4 * kQBytes + 4 * kBlockM * 4 + Mma::kTileAlign - 1) / Mma::kTileAlign * Mma::kTileAlign;
  // keys and records of the group, then the window's key indices (kBwdWindow % 4 == 0: the
  // 16-byte reads' padding stays inside)
  static constexpr int kListBytes = kBlockN * (4 + 16) + kBwdWindow * 4;
  static_assert(kBwdWindow % 4 == 0, "the window is read in whole 16-byte pieces");
  // Then, per warp group, its mask/bias tiles x2 (sized at launch: none without them), then
  // per warp group the next-active table over its steps (next_active.cuh; with a mask summary
  // and f.next_active_table only): a step's summary entry sits in another row of the summary
  // than the last one's, so the walk it replaces waited on an L2 load per skipped step.
  using Terms = TermTiles<kBlockM, kBlockN, false>;
  __host__ __device__ static constexpr int terms_offset(int groups) {
    return kKVBytes + groups * kGroupBytes + kListBytes;
  }
  __host__ __device__ static int table_bytes(int groups, const AttentionFwdParams& f) {
    if (!f.next_active_table || !f.tile_active || f.lists.keys) return 0;
    const int steps = f.G * ((f.Sq + kBlockM - 1) / kBlockM), per_group = (steps + groups - 1) / groups;
    return per_group <= kMaxNextActiveTiles ? next_active_table_bytes(per_group) : 0;
  }
  __host__ __device__ static int smem_bytes(int groups, const AttentionFwdParams& f) {
    return align_slack<Mma::kTileAlign>() + terms_offset(groups) + groups * (2 * Terms::bytes(f) + table_bytes(groups, f));
  }
  // At the end, warp group 1 hands its fp32 dk, dv and key sums to group 0 through the
  // space the groups' Q/dO tiles used.
  static constexpr int kHandoffBytes = kBwdThreads * (2 * (kChunk / 8) * 4 + 2) * 4;
  static_assert(kHandoffBytes <= 2 * kGroupBytes, "the handoff fits in the two groups' tiles");
  static_assert(kChunk % 16 == 0, "output chunks are whole k16 steps");
};

// One CTA = 64 keys of a (batch, KV head) and one chunk of their dk/dv columns. blockDim is
// 128 or 256: with 256, two warp groups of 4 warps share the K/V tile and take alternate
// (head, query tile) steps, each with its own double buffer and barrier, and add their
// partial sums in a fixed order at the end (so the result stays reproducible). Halving the
// walk of a long key group matters in dynamic-mask mode, where a few groups of keys kept to
// the end of the sequence span every query (docs/performance.md, "key lists").
template <class T, int kHeadDim, bool kGather, class Mma>
__device__ __forceinline__ void attention_bwd_dkdv_body(const AttentionBwdParams& p) {
  using Tile = BwdDkdvTile<Mma, kHeadDim>;
  constexpr int kBM = Tile::kBlockM, kNq = kBM / 8, kDC = Tile::kChunk / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem<Mma::kTileAlign>(smem_raw);
  const AttentionFwdParams& f = p.f;
  const int n_groups = blockDim.x / kBwdThreads, wg = threadIdx.x / kBwdThreads;
  const int tid = threadIdx.x % kBwdThreads, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Causal or dynamic mask: the first key groups walk the most queries (cta_order.cuh).
  const CtaTile cta = cta_tile(f.causal || f.lists.keys != nullptr);
  const int x = cta.x, head_chunk = cta.y;
  const int key0 = x * Tile::kBlockN;
  const int hk = head_chunk / Tile::kChunks, chunk = head_chunk % Tile::kChunks, b = blockIdx.z;
  const int col0 = chunk * Tile::kChunk;  // this CTA's columns of dk and dv
  const int keys[2] = {key0 + 16 * warp + g, key0 + 16 * warp + g + 8};

  const uint32_t s_k = ptx::smem_addr(smem), s_v = s_k + Tile::kKVBytes / 2;
  unsigned char* group_smem = smem + Tile::kKVBytes + wg * Tile::kGroupBytes;
  const uint32_t s_q = ptx::smem_addr(group_smem), s_do = s_q + 2 * Tile::kQBytes;
  float* s_lse2 = reinterpret_cast<float*>(group_smem + 4 * Tile::kQBytes);
  float* s_delta = s_lse2 + 2 * kBM;
  int32_t* s_keys = reinterpret_cast<int32_t*>(smem + Tile::kKVBytes + n_groups * Tile::kGroupBytes);
  KeyInfo* s_kinfo = reinterpret_cast<KeyInfo*>(s_keys + Tile::kBlockN);  // group's key indices, -1 = none
  using Terms = typename Tile::Terms;
  constexpr bool gather = kGather;  // as in the dq kernel
  const int terms_bytes = gather ? 0 : Terms::bytes(f);  // no mask or bias tiles when gathered
  unsigned char* s_terms = smem + Tile::terms_offset(n_groups) + wg * 2 * terms_bytes;

  const T* k = static_cast<const T*>(f.k) + b * f.k_stride[0] + hk * f.k_stride[2];
  const T* v = static_cast<const T*>(f.v) + b * f.v_stride[0] + hk * f.v_stride[2];
  BiasTerm bias_term;
  const bool terms_tiled = !gather && terms_on_chip(f, bias_term);  // interior steps read no global terms
  int q_lo = 0, q_hi = f.Sq, n_group = 0;
  if (gather) {
    if (!gather_key_group(f, b, hk, x, s_keys, s_kinfo, reinterpret_cast<int32_t*>(s_kinfo + Tile::kBlockN),
                          q_lo, q_hi, n_group))
      return;  // past the (batch, KV head)'s kept keys
    if (wg == 0) {
      Mma::template load_rows_gather_pair<Tile::kBlockN>(s_k, k, f.k_stride[1], s_v, v, f.v_stride[1], s_keys, n_group,
                                                         f.D, tid);
    }
  } else if (wg == 0) {
    Mma::template load_rows<Tile::kBlockN>(s_k, k, f.k_stride[1], key0, f.Sk, f.D, tid);
    Mma::template load_rows<Tile::kBlockN>(s_v, v, f.v_stride[1], key0, f.Sk, f.D, tid);
  }

  // Queries that can see these keys: causality starts them at key0 - (Sk - Sq); gathered
  // keys span [q_lo, q_hi).
  const int q_begin = gather ? q_lo / kBM * kBM : f.causal ? max(0, key0 - (f.Sk - f.Sq)) / kBM * kBM : 0;
  const int n_q = q_begin < q_hi ? (q_hi - q_begin + kBM - 1) / kBM : 0;
  const int n_steps = f.G * n_q;  // (head of the group, query tile)
  // Head-major, queries ascending; gathered: query-major from the last query tile down. The
  // CTAs of a window of kept keys share their intervals' end (gather_key_group), so walking down
  // they start together at the same query tiles and read each one's Q and dO from L2, where
  // walking up from their scattered begins every read came from DRAM (docs/performance.md, "key lists").
  // Gathered: a multiply and a shift per step instead of an integer division (its fix-up
  // showed in the stall samples). Not gathered, the two registers it holds across the loop
  // made the sm_90a dk/dv kernel spill, so there it stays a division.
  const FastDivmod by_group(gather ? f.G : 1);
  auto head_of = [&](int it) { return hk * f.G + (gather ? by_group.mod(it) : it / n_q); };
  auto q0_of = [&](int it) { return q_begin + (gather ? n_q - 1 - by_group.div(it) : it % n_q) * kBM; };
  // This warp group's steps are wg, wg + n_groups, ...; mask tiles ruled out are skipped,
  // through each group's next-active table where there is one (its place and presence come from
  // the params each time, as in the forward: fewer registers held across the loop).
  auto step_active = [&](int it) {
    return tile_is_active(f, active_row(f, b, head_of(it), q0_of(it) / kBwdBlockM), key0 / kBwdBlockN);
  };
  auto table_of = [&](int group) {
    return reinterpret_cast<int16_t*>(smem + Tile::terms_offset(n_groups) + n_groups * 2 * terms_bytes +
                                      group * Tile::table_bytes(n_groups, f));
  };
  if (Tile::table_bytes(n_groups, f))
    for (int group = 0; group < n_groups; ++group) {
      const int count = n_steps > group ? (n_steps - group + n_groups - 1) / n_groups : 0;
      build_next_active(table_of(group), count, [&](int k) { return step_active(group + k * n_groups); }, threadIdx.x,
                        blockDim.x);
    }
  auto next_active = [&](int it) {
    if (Tile::table_bytes(n_groups, f)) return it < n_steps ? wg + int(table_of(wg)[(it - wg) / n_groups]) * n_groups : it;
    while (it < n_steps && !step_active(it)) it += n_groups;
    return it;
  };
  auto sync_group = [&] {
    if (wg == 0)
      ptx::named_barrier_sync<1, kBwdThreads>();
    else
      ptx::named_barrier_sync<2, kBwdThreads>();
  };
  auto load_step = [&](int it, int buf) {
    const int h = head_of(it), q0 = q0_of(it);
    const T* q = static_cast<const T*>(f.q) + b * f.q_stride[0] + h * f.q_stride[2];
    const T* dout = static_cast<const T*>(p.dout) + b * p.dout_stride[0] + h * p.dout_stride[2];
    Mma::template load_rows<kBM>(s_q + buf * Tile::kQBytes, q, f.q_stride[1], q0, f.Sq, f.D, tid);
    Mma::template load_rows<kBM>(s_do + buf * Tile::kQBytes, dout, p.dout_stride[1], q0, f.Sq, f.D, tid);
    // lse2 and delta are padded to Sq_pad (a multiple of 64), so whole 16-byte chunks exist.
    const int64_t row_base = (int64_t(b) * f.H + h) * p.Sq_pad + q0;
    if (tid < kBM / 4)
      ptx::cp_async_16(ptx::smem_addr(s_lse2 + buf * kBM + 4 * tid), p.lse2 + row_base + 4 * tid, 16);
    else if (tid < kBM / 2)
      ptx::cp_async_16(ptx::smem_addr(s_delta + buf * kBM + 4 * (tid - kBM / 4)), p.delta + row_base + 4 * (tid - kBM / 4), 16);
    if (terms_bytes)
      Terms::template load<kBwdThreads>(s_terms + buf * terms_bytes, f, Terms::rows_of(f, b, h), q0, key0, tid,
                                        mask_keeps_tile(f, active_row(f, b, h, q0 / kBwdBlockM), key0 / kBwdBlockN));
  };

  KeyInfo row_keys[2] = {};  // dynamic-mask mode: the records of this thread's two keys
  if (gather) row_keys[0] = s_kinfo[keys[0] - key0], row_keys[1] = s_kinfo[keys[1] - key0];

  float dk[kDC][4], dv[kDC][4];
#pragma unroll
  for (int dt = 0; dt < kDC; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  const bool db_cols = !gather && p.dbias_owner == DbiasOwner::columns && chunk == 0;  // as in dq
  const bool key_bias = key_bias_only(f);
  float db[2] = {0.f, 0.f};
  // A bias broadcast over queries: this thread's two keys' biases, read when the head changes
  // (not per step: those loads and their head arithmetic sat between a step's matmuls).
  const bool key_row_bias = !gather && f.bias && f.bias_stride[2] == 0;
  float kb[2] = {0.f, 0.f};
  int kb_head = -1;
  const int db_slot = (p.dbias_size[0] == 1 && f.B > 1 ? b : 0) * (f.bias_head_mode == 0 ? f.Hk : 1) +
                      (f.bias_head_mode == 0 ? hk : 0);

  int it = next_active(wg);
  if (it < n_steps) load_step(it, 0);
  ptx::cp_async_commit();
  if (n_groups > 1) {  // K and V, loaded by group 0, must land for both groups
    ptx::cp_async_wait<0>();
    Mma::tile_landed();
    __syncthreads();
  }

  for (int buf = 0; it < n_steps; buf ^= 1) {
    const int it_next = next_active(it + n_groups);
    if (it_next < n_steps) load_step(it_next, buf ^ 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    Mma::tile_landed();
    sync_group();

    const int h = head_of(it), q0 = q0_of(it);
    if (key_row_bias && h != kb_head) {
      kb[0] = key_bias_at<T>(f, b, h, keys[0]), kb[1] = key_bias_at<T>(f, b, h, keys[1]);
      kb_head = h;
    }
    const uint32_t q_tile = s_q + buf * Tile::kQBytes, do_tile = s_do + buf * Tile::kQBytes;
    // S^T = K Q^T and dP^T = V dO^T: rows are this warp's 16 keys, columns the kBM queries.
    float st[kNq][4], dpt[kNq][4];
    Mma::template a_bt_pair<Tile::kBlockN, kBM>(st, s_k, q_tile, dpt, s_v, do_tile, warp, lane);

    const float* lse2 = s_lse2 + buf * kBM;
    const float* delta = s_delta + buf * kBM;
    const bool interior = q0 + kBM <= f.Sq && key0 + Tile::kBlockN <= f.Sk &&
                          (!f.causal || key0 + 16 * warp + 15 <= q0 + f.Sk - f.Sq);
    // st becomes P^T (for dv), dpt becomes dS^T * d(capped)/d(qk) (for dk); db sums dS^T rows.
    auto query = [&](int nt, int e) { return q0 + nt * 8 + 2 * t + (e & 1); };
    // Dynamic-mask mode: where the warp's 16 keys are all kept by the step's queries, no
    // interval test per score.
    auto covers = [&](const KeyInfo& key) { return key.begin <= q0 && key.end >= q0 + kBM; };
    const bool keys_cover_step = gather && __all_sync(0xffffffffu, covers(row_keys[0]) && covers(row_keys[1]));
    if (keys_cover_step) {
      scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, [&](int, int e) { return row_keys[e >> 1].bias; });
    } else if (gather) {  // each thread's two keys keep their records in registers
      scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t,
                       [&](int nt, int e) { return interval_add(row_keys[e >> 1], query(nt, e)); });
    } else if (terms_tiled && interior) {  // mask/bias from this step's shared copies, key biases in registers
      const unsigned char* terms = s_terms + buf * terms_bytes;
      const int mask_pitch = Terms::mask_bcast(f) ? 0 : Terms::kMaskPitch;
      const int kl[2] = {keys[0] - key0, keys[1] - key0};
      const bool test_mask = f.mask && !mask_keeps_tile(f, active_row(f, b, h, q0 / kBwdBlockM), key0 / kBwdBlockN);
      with_terms(test_mask, bias_term, [&](auto has_mask, auto bias_kind) {
        constexpr bool kMask = decltype(has_mask)::value;
        constexpr BiasTerm kBias = decltype(bias_kind)::value;
        const T* bias_tile = Terms::template bias_tile<T>(terms, f);
        scores_to_p_ds_t<!kMask>(f, st, dpt, db, lse2, delta, t, [&](int nt, int e) {  // as in the dq kernel
          const int r = e >> 1, il = nt * 8 + 2 * t + (e & 1);
          return tile_term<kMask, kBias>(kMask ? terms[il * mask_pitch + kl[r]] : 0u,
                                         bias_tile + il * Terms::kBiasPitch + kl[r], kb[r]);
        });
      });
    } else if (key_bias) {  // steps on the causal diagonal or the sequence ends
      scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t, [&](int nt, int e) {
        const int r = e >> 1;
        return visible_at(f, query(nt, e), keys[r]) ? kb[r] : -INFINITY;
      });
    } else {
      scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t,
                       [&](int nt, int e) { return score_add_at<T>(f, b, h, query(nt, e), keys[e >> 1]); });
    }
    Mma::template regs_b_pair<kBM>(dv, st, do_tile, dk, dpt, q_tile, col0, lane);  // dv += P^T dO, dk += dS^T Q

    // Whether it_next is past this head's last step (steps are head-major where not gathered):
    // a multiply, where head_of(it_next) was a second integer division per step.
    const bool head_ends = it_next >= (h - hk * f.G + 1) * n_q;
    // dbias[.., 0, j] (bias broadcast over queries): after each head, add its sum for the
    // keys this thread's quad owns; heads sharing a bias head add in order. Each warp group
    // adds into its own half of the slots (the host allocates two per sharing group), and the
    // finish kernel sums the slots in order: reproducible with both groups running.
    if (db_cols && head_ends) {
      const float r0 = quad_sum(db[0]), r1 = quad_sum(db[1]);
      const int64_t hb = head_index(f.bias_head_mode, h, f.G);
      float* acc = p.dbias_acc + (int64_t(wg) * (p.dbias_slots / 2) + db_slot) *
                                     (p.dbias_size[0] * p.dbias_size[1] * p.dbias_size[3]);
      if (t == 0 && keys[0] < f.Sk) acc[dbias_dense(p, b, hb, 0, keys[0])] += r0;
      if (t == 0 && keys[1] < f.Sk) acc[dbias_dense(p, b, hb, 0, keys[1])] += r1;
    }
    if (!gather && head_ends) db[0] = db[1] = 0.f;
    sync_group();
    it = it_next;
  }
  ptx::cp_async_wait<0>();  // nothing may still land in shared memory when the CTA exits

  if (n_groups > 1) {  // group 0 adds group 1's partial sums: a fixed order, so reproducible
    float* handoff = reinterpret_cast<float*>(smem + Tile::kKVBytes) + tid;  // [slot][thread]
    __syncthreads();  // both groups are done with their tiles
    if (wg == 1) {
#pragma unroll
      for (int dt = 0; dt < kDC; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          handoff[(8 * dt + e) * kBwdThreads] = dk[dt][e];
          handoff[(8 * dt + 4 + e) * kBwdThreads] = dv[dt][e];
        }
      handoff[8 * kDC * kBwdThreads] = db[0];
      handoff[(8 * kDC + 1) * kBwdThreads] = db[1];
    }
    __syncthreads();
    if (wg == 1) return;
#pragma unroll
    for (int dt = 0; dt < kDC; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dk[dt][e] += handoff[(8 * dt + e) * kBwdThreads];
        dv[dt][e] += handoff[(8 * dt + 4 + e) * kBwdThreads];
      }
    db[0] += handoff[8 * kDC * kBwdThreads];
    db[1] += handoff[(8 * kDC + 1) * kBwdThreads];
  }

  if (gather && f.lists.dscores && chunk == 0) {
    // dscores(j): dS summed over the group's heads and the queries that keep j, in order.
    const float r0 = quad_sum(db[0]), r1 = quad_sum(db[1]);
    for (int r = 0; r < 2; ++r) {
      const int local = keys[r] - key0;
      if (t != 0 || local >= n_group) continue;
      const int64_t off = b * f.lists.dscores_stride[0] + hk * f.lists.dscores_stride[1] +
                          int64_t(s_keys[local]) * f.lists.dscores_stride[2];
      const float value = r ? r1 : r0;
      if (f.lists.dscores_f32)
        static_cast<float*>(f.lists.dscores)[off] = value;
      else
        static_cast<T*>(f.lists.dscores)[off] = T(value);
    }
  }
  T* dk_base = static_cast<T*>(p.dk) + b * p.dk_stride[0] + hk * p.dk_stride[2];
  T* dv_base = static_cast<T*>(p.dv) + b * p.dv_stride[0] + hk * p.dv_stride[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (gather ? keys[r] - key0 >= n_group : keys[r] >= f.Sk) continue;
    const int64_t row = gather ? s_keys[keys[r] - key0] : keys[r];
#pragma unroll
    for (int dt = 0; dt < kDC; ++dt) {
      const int d = col0 + dt * 8 + 2 * t;
      if (d >= f.D) continue;
      *reinterpret_cast<uint32_t*>(dk_base + row * p.dk_stride[1] + d) = ptx::pack2<T>(dk[dt][2 * r], dk[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv_base + row * p.dv_stride[1] + d) = ptx::pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <class T, int kHeadDim, bool kGather, class Mma>
__global__ void __launch_bounds__(2 * kBwdThreads) attention_bwd_dkdv_kernel(const AttentionBwdParams p) {
  // It reads nothing dq writes, but waits for it all the same: then its own completion implies
  // the prepare kernel's and everything before (launch.cuh).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  if constexpr (Mma::kHopperOnly && !FDMA_SM90_ENABLED)  // as attention_fwd_kernel
    __trap();
  else
    attention_bwd_dkdv_body<T, kHeadDim, kGather, Mma>(p);
}

// Raises a kernel's dynamic shared-memory limit when a launch needs more than the default.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes) {
  return bytes > 48 * 1024 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)
                           : cudaSuccess;
}

template <class T, int kHeadDim, class Mma>
cudaError_t launch_attention_bwd_path(const AttentionBwdParams& params, int device, cudaStream_t stream) {
  using Dq = BwdDqTile<Mma, kHeadDim>;
  using Dkdv = BwdDkdvTile<Mma, kHeadDim>;
  const bool gather = params.f.lists.keys != nullptr;
  auto dq_kernel = gather ? attention_bwd_dq_kernel<T, kHeadDim, true, Mma> : attention_bwd_dq_kernel<T, kHeadDim, false, Mma>;
  auto dkdv_kernel =
      gather ? attention_bwd_dkdv_kernel<T, kHeadDim, true, Mma> : attention_bwd_dkdv_kernel<T, kHeadDim, false, Mma>;
  // Warp groups per dk/dv CTA: bwd_dkdv_groups, or FDMA_DKDV_GROUPS=1 or 2 (A/B runs and tests).
  const bool forced = env_is("FDMA_DKDV_GROUPS", "1") || env_is("FDMA_DKDV_GROUPS", "2");
  int dkdv_groups = forced ? (env_is("FDMA_DKDV_GROUPS", "1") ? 1 : 2)
                           : bwd_dkdv_groups(kHeadDim, Mma::kHopperOnly, gather, params.f.tile_active != nullptr);
  // Mask/bias tiles that would not fit in shared memory are read per score instead: the
  // bias's first (larger), then the mask's; the next-active table is dropped before either.
  int max_smem = 0;
  cudaError_t err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  AttentionBwdParams p = params;
  auto fits = [&] { return Dq::smem_bytes(p.f) <= max_smem && Dkdv::smem_bytes(dkdv_groups, p.f) <= max_smem; };
  auto shrink = [&] {
    if (!fits()) p.f.next_active_table = false;
    if (!fits()) p.f.bias_tiled = false;
    if (!fits()) p.f.mask_tiled = false;
  };
  shrink();
  if (dkdv_groups == 1 && !forced) {  // one group pays only where two CTAs share an SM
    int per_sm = 0;
    err = allow_smem(dkdv_kernel, Dkdv::smem_bytes(1, p.f));
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dkdv_kernel, kBwdThreads, Dkdv::smem_bytes(1, p.f));
    if (err != cudaSuccess) return err;
    if (per_sm < 2) dkdv_groups = 2, shrink();
  }
  const AttentionFwdParams& f = p.f;
  if (gather && p.dbias_owner != DbiasOwner::none) return cudaErrorInvalidValue;  // the gathered kernels have no dbias
  const int dq_smem = Dq::smem_bytes(f), dkdv_smem = Dkdv::smem_bytes(dkdv_groups, f);
  err = allow_smem(dq_kernel, dq_smem);
  if (err == cudaSuccess) err = allow_smem(dkdv_kernel, dkdv_smem);
  if (err != cudaSuccess) return err;
  const dim3 dq_grid((f.Sq + Dq::kBlockM - 1) / Dq::kBlockM, f.H / p.rows_heads_per_block,
                     f.B / p.rows_batches_per_block);
  err = launch_kernel(f.overlap_previous, dq_kernel, dq_grid, kBwdThreads, dq_smem, stream, p);
  if (err != cudaSuccess) return err;
  // Dynamic-mask mode: kBwdWindow / 64 groups per window of kept keys (at most Sk of them).
  const int dkdv_x = f.lists.keys ? (f.Sk + kBwdWindow - 1) / kBwdWindow * (kBwdWindow / Dkdv::kBlockN)
                                  : (f.Sk + Dkdv::kBlockN - 1) / Dkdv::kBlockN;
  const dim3 dkdv_grid(dkdv_x, f.Hk * Dkdv::kChunks, f.B);
  return launch_kernel(f.overlap_previous, dkdv_kernel, dkdv_grid, dkdv_groups * kBwdThreads, dkdv_smem, stream, p);
}

// The wgmma kernels on Hopper for D = 64 and 128 (arch_dispatch.cuh), the mma.sync kernels
// elsewhere.
template <class T, int kHeadDim>
cudaError_t launch_attention_bwd(const AttentionBwdParams& p, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if constexpr (kHeadDim == 64 || kHeadDim == 128) {
    using Sm90 = BwdMmaSm90<T, kHeadDim, kBwdThreads>;
    if (wgmma_path_available(attention_bwd_dkdv_kernel<T, kHeadDim, false, Sm90>, device))
      return launch_attention_bwd_path<T, kHeadDim, Sm90>(p, device, stream);
  }
  return launch_attention_bwd_path<T, kHeadDim, BwdMmaSm80<T, kHeadDim, kBwdThreads>>(p, device, stream);
}

}  // namespace fdma::cuda

#define FDMA_INSTANTIATE_ATTENTION_BWD(T, HD) \
  template cudaError_t fdma::cuda::launch_attention_bwd<T, HD>(const fdma::cuda::AttentionBwdParams&, cudaStream_t);
