// The attention backward's dk/dv kernel: one CTA per 64 keys of a (batch, KV head) (in
// dynamic-mask mode, 64 kept keys with similar query intervals) walks the G query heads of the
// group and their query tiles, so the GQA sum of dk/dv stays on chip; owns dkey_scores, and
// dbias when the bias broadcasts over queries.
#pragma once

#include "cuda/attention/attention_bwd_common.cuh"
#include "cuda/attention/bwd_key_groups.cuh"
#include "cuda/primitives/tma.cuh"

namespace fdma::cuda {

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
  // The fused dq's tiles after everything else, at the swizzle's alignment: per warp group its
  // step's dS, [kBlockM queries][kBlockN keys] (bwd_mma_sm90.cuh, store_ds_t); then per warp
  // group the staging of dS K's last 64-column block (two dq_acc tiles, attention_bwd_params.hpp).
  static constexpr int kDsBytes = kBlockM * kBlockN * 2, kStageBytes = 2 * kDqAccTileBytes;
  __host__ __device__ static int ds_offset(int groups, const AttentionFwdParams& f) {
    const int end = smem_bytes(groups, f) - align_slack<Mma::kTileAlign>();
    return (end + Mma::kTileAlign - 1) / Mma::kTileAlign * Mma::kTileAlign;
  }
  __host__ __device__ static int stage_offset(int groups, const AttentionFwdParams& f) {
    return ds_offset(groups, f) + groups * kDsBytes;
  }
  __host__ __device__ static int fused_smem_bytes(int groups, const AttentionFwdParams& f) {
    return align_slack<Mma::kTileAlign>() + stage_offset(groups, f) + groups * kStageBytes;
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
//
// kFusedDq (sm_90a, not gathered; AttentionBwdParams::dq_acc): each step also stores its dS
// in shared memory and reduces dS K into dq_acc, so no dq kernel runs.
template <class T, int kHeadDim, bool kGather, class Mma, bool kFusedDq>
__device__ __forceinline__ void attention_bwd_dkdv_body(const AttentionBwdParams& p) {
  static_assert(!kFusedDq || (Mma::kHopperOnly && !kGather), "the fused dq: wgmma tiles, keys not gathered");
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
  // Split walks (gathered only): blockIdx.z = b * splits + this CTA's share. A constant 1 in
  // the dense kernel, so that it holds no more registers across its loop (the sm_90a one spilled).
  const int splits = kGather ? max(1, p.dkdv_splits) : 1, b = blockIdx.z / splits, share = blockIdx.z % splits;
  const int hk = head_chunk / Tile::kChunks, chunk = head_chunk % Tile::kChunks;
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
  // This CTA's steps [it_begin, it_end): a contiguous share of them when the walk is split.
  const int per_share = (n_steps + splits - 1) / splits;
  const int it_begin = min(n_steps, share * per_share), it_end = min(n_steps, it_begin + per_share);
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
    // (The table exists only unsplit, where [it_begin, it_end) is every step.)
    if (Tile::table_bytes(n_groups, f)) return it < it_end ? wg + int(table_of(wg)[(it - wg) / n_groups]) * n_groups : it;
    while (it < it_end && !step_active(it)) it += n_groups;
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
  const int db_slot = key_column_dbias_slot(p, b, hk);

  int it = next_active(it_begin + wg);
  if (it < it_end) load_step(it, 0);
  ptx::cp_async_commit();
  if (n_groups > 1) {  // K and V, loaded by group 0, must land for both groups
    ptx::cp_async_wait<0>();
    Mma::tile_landed();
    __syncthreads();
  }

  for (int buf = 0; it < it_end; buf ^= 1) {
    const int it_next = next_active(it + n_groups);
    if (it_next < it_end) load_step(it_next, buf ^ 1);
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
        if constexpr (!kMask && kBias == BiasTerm::none) {
          scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, NoTerm{});
        } else {
          scores_to_p_ds_t<!kMask>(f, st, dpt, db, lse2, delta, t, [&](int nt, int e) {  // as in the dq kernel
            const int r = e >> 1, il = nt * 8 + 2 * t + (e & 1);
            return tile_term<kMask, kBias>(kMask ? terms[il * mask_pitch + kl[r]] : 0u,
                                           bias_tile + il * Terms::kBiasPitch + kl[r], kb[r]);
          });
        }
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
    if constexpr (kFusedDq)  // dS for dq = dS K, while dpt still holds it
      store_ds_t<T>(smem + Tile::ds_offset(n_groups, f) + wg * Tile::kDsBytes, dpt, warp, lane);
    Mma::template regs_b_pair<kBM>(dv, st, do_tile, dk, dpt, q_tile, col0, lane);  // dv += P^T dO, dk += dS^T Q
    if constexpr (kFusedDq) {
      // dS K in 64-column blocks, each through shared memory into dq_acc as two 8 KB bulk
      // reductions issued by the group's first thread. The last block is staged in the group's
      // own tiles, read out long before the next step stages there (the wait below, a step
      // later); at D = 128 block 0 goes to the step's Q tile, done with, which the load at the
      // next step's start overwrites: waited for at this step's end. (Staging everything in
      // the step's Q and dO tiles put a full wait on the end of every step: the group's other
      // warps stalled at the closing barrier for 11% of the kernel's samples.)
      static_assert(kHeadDim == 64 || kHeadDim == 128, "one block in Q at most");
      static_assert(Tile::kQBytes >= 2 * kDqAccTileBytes || kHeadDim == 64, "block 0 fits the Q tile");
      if (tid == 0) tma::bulk_wait_group_read<0>();  // the previous step's reductions have read their tiles
      wgmma::fence_proxy_async_smem();  // the group's dS stores, before its wgmmas read them
      sync_group();
      const uint32_t ds_tile = ptx::smem_addr(smem + Tile::ds_offset(n_groups, f) + wg * Tile::kDsBytes);
      const uint32_t own_stage = ptx::smem_addr(smem + Tile::stage_offset(n_groups, f) + wg * Tile::kStageBytes);
      const int64_t tile0 = ((int64_t(b) * f.H + h) * (p.Sq_pad / kDqAccTileRows) + q0 / kDqAccTileRows) *
                            (kHeadDim / kDqAccTileCols);
      constexpr int kBlocks = kHeadDim / 64;
#pragma unroll 1
      for (int block = 0; block < kBlocks; ++block) {
        float acc[8][4];
        Mma::ds_times_k(acc, ds_tile, s_k, block);
        const uint32_t stage = block == kBlocks - 1 ? own_stage : q_tile;
        store_dq_block(stage, acc, warp, lane);
        wgmma::fence_proxy_async_smem();  // the stores, before the copy engine reads them
        sync_group();
        if (tid == 0) {
#pragma unroll
          for (int half = 0; half < 2; ++half)
            tma::reduce_add_f32(p.dq_acc + (tile0 + half * kBlocks + block) * (kDqAccTileRows * kDqAccTileCols),
                                stage + half * kDqAccTileBytes, kDqAccTileBytes);
          tma::bulk_commit_group();
        }
      }
      if (kBlocks > 1 && tid == 0) tma::bulk_wait_group_read<1>();  // block 0's Q tile, reloaded next
    }

    // Whether it_next is past this head's last step (steps are head-major where not gathered):
    // a multiply, where head_of(it_next) was a second integer division per step.
    const bool head_ends = it_next >= (h - hk * f.G + 1) * n_q;
    // dbias[.., 0, j] (bias broadcast over queries): after each head, its sums for the keys
    // this thread's quad owns; heads sharing a bias head add in order, each warp group into
    // its own half of the slots.
    if (db_cols && head_ends) add_key_column_dbias(p, b, db_slot, h, wg, keys, db, t);
    if (!gather && head_ends) db[0] = db[1] = 0.f;
    sync_group();
    it = it_next;
  }
  ptx::cp_async_wait<0>();  // nothing may still land in shared memory when the CTA exits
  if constexpr (kFusedDq)
    if (tid == 0) tma::bulk_wait_group<0>();  // every dq reduction done

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

  const int64_t bh = int64_t(b) * f.Hk + hk;
  if (gather && f.lists.dscores && chunk == 0) {
    // dscores(j): dS summed over the group's heads and the queries that keep j, in order.
    const float r0 = quad_sum(db[0]), r1 = quad_sum(db[1]);
    for (int r = 0; r < 2; ++r) {
      const int local = keys[r] - key0;
      if (t != 0 || local >= n_group) continue;
      if (splits > 1) {  // this share's part, added up by dkdv_split_sum
        p.dscores_partial[(share * int64_t(f.B) * f.Hk + bh) * f.Sk + s_keys[local]] = r ? r1 : r0;
        continue;
      }
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
    if (gather && splits > 1) {  // fp32 partial rows [dk | dv], added up by dkdv_split_sum
      float* part = p.dkdv_partial + ((share * int64_t(f.B) * f.Hk + bh) * f.Sk + row) * (2 * f.D);
#pragma unroll
      for (int dt = 0; dt < kDC; ++dt) {
        const int d = col0 + dt * 8 + 2 * t;
        if (d >= f.D) continue;
        *reinterpret_cast<float2*>(part + d) = make_float2(dk[dt][2 * r], dk[dt][2 * r + 1]);
        *reinterpret_cast<float2*>(part + f.D + d) = make_float2(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
      continue;
    }
#pragma unroll
    for (int dt = 0; dt < kDC; ++dt) {
      const int d = col0 + dt * 8 + 2 * t;
      if (d >= f.D) continue;
      *reinterpret_cast<uint32_t*>(dk_base + row * p.dk_stride[1] + d) = ptx::pack2<T>(dk[dt][2 * r], dk[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv_base + row * p.dv_stride[1] + d) = ptx::pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <class T, int kHeadDim, bool kGather, class Mma, bool kFusedDq = false>
__global__ void __launch_bounds__(2 * kBwdThreads) attention_bwd_dkdv_kernel(const AttentionBwdParams p) {
  // It reads nothing dq writes, but waits for it all the same: then its own completion implies
  // the prepare kernel's and everything before (launch.cuh).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  if constexpr (Mma::kHopperOnly && !FDMA_SM90_ENABLED)  // as attention_fwd_kernel
    __trap();
  else
    attention_bwd_dkdv_body<T, kHeadDim, kGather, Mma, kFusedDq>(p);
}

}  // namespace fdma::cuda
