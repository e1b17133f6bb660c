// The attention backward's dq kernel: one CTA per 64 query rows of a (batch, head) walks the
// key tiles (all of them, the mask's active ones, or the query tile's list of kept keys),
// recomputes P from lse, and owns dq (and dbias when the bias has a query dim).
#pragma once

#include "cuda/attention/attention_bwd_common.cuh"

namespace fdma::cuda {

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
  const QueryTileCta cta = query_tile_cta(f.causal);
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
  // The bias row's bytes a tile when a per-key bias is the only term (else 0): in shared
  // memory, as a register live across the loop slowed the dense kernel.
  __shared__ int s_key_row_bytes;

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
        list = tile_key_list(f.lists, bh, row0, n_listed);
        info = f.lists.info + bh * f.Sk;
      }
      if (terms_bytes) {  // in shared memory: in registers across the loop they would add to its pressure
        __syncthreads();  // the previous head's loads have read it
        if (tid == 0) {
          s_term_rows = Terms::rows_of(f, b, h);
          s_key_row_bytes = !f.mask_tiled && Terms::bias_bcast(f) && Terms::bias_in_tiles(f) ? kBN * (f.bias_f32 ? 4 : 2) : 0;
        }
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
          if (terms_bytes) {
            // A per-key bias as the only term, on an interior tile: one row of whole 16-byte
            // chunks, copied by the first threads with no clamping. The general copy's per-tile
            // arithmetic held warp 0, and the warpgroup's wgmma with it, behind the other warps
            // (docs/performance.md, "attention backward").
            const int row_bytes = s_key_row_bytes;
            if (row_bytes && (nb + 1) * kBN <= f.Sk) {
              if (tid * 16 < row_bytes)
                ptx::cp_async_16(ptx::smem_addr(s_terms + buf * terms_bytes + tid * 16),
                                 s_term_rows.bias + (int64_t(nb) * row_bytes + tid * 16), 16);
            } else {
              Terms::template load<kBwdThreads>(s_terms + buf * terms_bytes, f, s_term_rows, row0, nb * kBN, tid,
                                                mask_keeps_tile(f, active, nb * kBN / kBwdBlockN));
            }
          }
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
            // added as the forward adds it (no hidden-score select), or none at all.
            if constexpr (!kMask && kBias == BiasTerm::none) {
              scores_to_ds<true>(f, s, dp, lse2, delta, NoTerm{});
            } else {
              scores_to_ds<!kMask>(f, s, dp, lse2, delta, [&](int nt, int e) {
                const int r = e >> 1, c = nt * 8 + 2 * t + (e & 1);
                // one load for the thread's key pair (the same address for e and e ^ 1)
                const uint32_t pair = kMask ? mask_pair(terms + mask_rows[r] * Terms::kMaskPitch + nt * 8 + 2 * t) : 0;
                return tile_term<kMask, kBias>((e & 1) ? pair >> 8 : pair & 0xff,
                                               bias_tile + (rows[r] - row0) * Terms::kBiasPitch + c, kb[nt][e & 1]);
              });
            }
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

}  // namespace fdma::cuda
