// Warp-specialized attention backward for Hopper (sm_90a) at D = 256: dk, dv and the fused dq
// of calls that do not ask for determinism (AttentionBwdParams::dq_acc set), whose q, k, v,
// dout and mask the copy engine can read: dense without a mask, with no bias or a per-key one;
// or masked (kMasked) without a bias, as attention_bwd_ws.cuh's masked calls: each step's
// [64 queries][64 keys] mask tile (64-byte swizzled; one summary tile) comes with its Q and
// dO, a mask broadcast over queries is read per key, the steps the summary rules out are
// skipped and those it keeps whole run unmasked; or gathered (key lists, dynamic-mask mode):
// persistent CTAs over the work list of attention_bwd_ws.cuh's gathered kind, each item's 128
// keys handed out as its two 64-key halves (each over the query tiles its own keys span),
// whose K and V rows the consumers gather; dk, dv and dscores go into the fp32 rows.
//
// At D = 256 one warp group cannot hold dk and dv of 64 keys (256 registers a thread), so the
// groups split the columns instead of the keys (attention_bwd_ws.cuh splits keys at D = 64 and
// 128). One CTA = 64 keys of a (batch, KV head); it walks the G query heads of the group and
// their 64-row query tiles:
//   producer  one thread loads K and V once, then each step's Q, dO (tensor copies) and lse2,
//             delta (bulk copies) into a two-stage ring (attention_bwd_ws.cuh's producer);
//   consumers group g computes S^T and dP^T of all 64 keys against the step's queries
//             [32 g, +32), their gradients, and stores its halves of P^T, dS^T ([keys][queries])
//             and dS ([queries][keys]); after a barrier of both groups, dv += P^T dO, dk +=
//             dS^T Q and dq = dS K for the columns [128 g, +128), all three read from shared
//             memory. After a second barrier (both groups done with the stage and the three
//             tiles) each group stages its dq block, 64 x 128 fp32, in the stage's Q (g = 0) or
//             dO (g = 1) buffer, which its first thread adds into dq_acc with four bulk
//             reductions; that thread releases the stage once the copy engine has read them,
//             one step later, the group's other threads once their staging stores are in.
// Shared memory: K, V 64 KB; two stages of Q, dO 128 KB; the three 8 KB tiles; 217 KB in all;
// masked, two 4 KB mask tiles and the walk's step bitmaps for up to 3584 steps (G * Sq / 64;
// longer walks read the summary per step) in what is left. There is no room for a separate dq
// staging buffer or a second set of P^T / dS tiles, hence the staging in the stage and the
// second barrier.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "cuda/attention/attention_bwd_ws.cuh"

namespace fdma::cuda {

template <class T, BwdWsKind kKind = BwdWsKind::dense>
struct BwdWs256Shape {
  static_assert(kKind == BwdWsKind::dense || kKind == BwdWsKind::masked || kKind == BwdWsKind::gathered,
                "D = 256: dense, masked or gathered calls");
  static constexpr int kHeadDim = 256, kBlockM = 64, kBlockN = 64, kStages = 2, kConsumers = 2;
  static constexpr int kGroupKeys = 64, kKeyTiles = 1;  // K and V: one tile each (bwd_ws_produce_keys)
  // Dense, masked or gathered calls, no bias with a query dim (bwd_ws_produce_steps)
  static constexpr bool kGather = kKind == BwdWsKind::gathered, kMasked = kKind == BwdWsKind::masked;
  static constexpr bool kBiased = false, kMaskTiles = kMasked, kMaskOverBias = false;
  // Gathered: a plan item's kBwdWsKeys keys are handed out as parts of the CTA's 64.
  static constexpr int kItemParts = kGather ? kBwdWsKeys / kBlockN : 1;
  static_assert(!kGather || kItemParts == bwd_ws_item_parts(kHeadDim), "the finish kernel counts parts so");
  static constexpr int kColBlocks = kHeadDim / 64, kGroupCols = kHeadDim / kConsumers;
  static constexpr int kGroupQueries = kBlockM / kConsumers;  // S^T, dP^T columns a group computes
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // Gathered, the producer's hand-out takes registers as at D 64 and 128 (BwdWsShape).
  static constexpr int kProducerRegs = kGather ? 40 : 24, kConsumerRegs = kGather ? 232 : 240;
  static constexpr int kTile = wgmma::sw128_tile_bytes(64, kHeadDim);  // K, V, and a stage's Q, dO: 32 KB
  static constexpr int kKeyTile = kTile;
  static constexpr int kPairTile = 64 * 64 * 2;                        // P^T, dS^T, dS: 8 KB
  static constexpr int kLseDeltaBytes = 2 * kBlockM * 4;
  static constexpr int kK = 0, kV = kTile, kQ = 2 * kTile, kDo = kQ + kStages * kTile, kPt = kDo + kStages * kTile;
  static constexpr int kDst = kPt + kPairTile, kDs = kDst + kPairTile, kMask = kDs + kPairTile;
  static constexpr int kMaskTile = kMasked ? kBlockM * kBlockN : 0;  // [64 queries][64 keys] bytes
  static constexpr int kLseDelta = kMask + kStages * kMaskTile;
  static constexpr int kMaxMaskSteps = kMasked ? 3584 : 0;  // BwdWsMaskSteps' bitmaps
  static constexpr int kMaskSteps = kLseDelta + kStages * kLseDeltaBytes;
  static constexpr int kSlots = kMaskSteps + 2 * kMaxMaskSteps / 8;
  static constexpr int kBars = kSlots + (kGather ? 16 : 0);
  static constexpr int kNumBars = 1 + 2 * kStages + (kGather ? 4 : 0);  // kv_full, per stage full, empty; item slots
  static constexpr int kSmemBytes = align_slack<1024>() + kBars + kNumBars * 8;
  static_assert(kSmemBytes <= 227 * 1024, "fits an SM's shared memory");
  static_assert(kTile == kConsumers * 2 * kDqAccTileBytes, "a group's dq block fits its stage buffer");
  static constexpr uint32_t kStepBytes = 2 * kTile + kLseDeltaBytes;  // its mask tile apart
  static_assert(kMask % 1024 == 0 && kMaskTile % 1024 == 0, "mask tiles stay 1024-byte aligned");
  using Summary = SummaryTiles<1, 1>;  // a step is one summary tile

  __device__ static uint32_t kv_full(uint32_t base) { return base + kBars; }
  __device__ static uint32_t full(uint32_t base, int s) { return base + kBars + 8 * (1 + s); }
  __device__ static uint32_t empty(uint32_t base, int s) { return base + kBars + 8 * (1 + kStages + s); }
  __device__ static uint32_t k_tile(uint32_t base, int) { return base + kK; }
  __device__ static uint32_t v_tile(uint32_t base, int) { return base + kV; }
  __device__ static uint32_t q_tile(uint32_t base, int s) { return base + kQ + s * kTile; }
  __device__ static uint32_t do_tile(uint32_t base, int s) { return base + kDo + s * kTile; }
  __device__ static int lse_delta_offset(int s) { return kLseDelta + s * kLseDeltaBytes; }
  __device__ static uint32_t mask_tile(uint32_t base, int s) { return base + kMask + s * kMaskTile; }
  // Gathered: the hand-out slots and their barriers, as BwdWsShape's.
  __device__ static volatile int* item_slot(unsigned char* smem, int n) {
    return reinterpret_cast<volatile int*>(smem + kSlots) + (n & 1);
  }
  __device__ static uint32_t item_full(uint32_t base, int n) { return base + kBars + 8 * (1 + 2 * kStages + (n & 1)); }
  __device__ static uint32_t item_empty(uint32_t base, int n) { return base + kBars + 8 * (3 + 2 * kStages + (n & 1)); }
};

// The products of one group. A-operand tiles in shared memory are [64 rows][64 columns] of
// 16-bit elements, 128-byte swizzled (wgmma.cuh); the [64][256] tiles hold 4 column blocks.
template <class T>
struct BwdWs256Mma {
  static constexpr int kRowBytes = wgmma::kSwizzleRowBytes, kBlockBytes = 64 * kRowBytes;

  // acc = A B^T for 32 columns: A the [64][256] tile `a` (K or V), B rows [32 g, +32) of the
  // [64][256] tile `b` (Q or dO); K = 256 in 16 steps.
  __device__ static void issue_a_bt32(float (&acc)[4][4], uint32_t a, uint32_t b, int g) {
    const uint64_t a_desc = wgmma::desc_k_major(a), b_desc = wgmma::desc_k_major(b + 32 * g * kRowBytes);
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const uint32_t off = (kk / 4) * kBlockBytes + (kk % 4) * 32;
      wgmma::mma_ss<T, 32>(acc, wgmma::desc_advance(a_desc, off), wgmma::desc_advance(b_desc, off), kk > 0);
    }
  }
  // acc (+)= A B over 128 columns: A a [64][64] tile read K-major (K = its 64 columns), B
  // columns [128 g, +128) of a [64][256] tile read N-major (K = its 64 rows).
  __device__ static void issue_a_b128(float (&acc)[16][4], uint32_t a, uint32_t b, int g, bool accumulate) {
    const uint64_t a_desc = wgmma::desc_k_major(a), b_desc = wgmma::desc_n_major(b + 2 * g * kBlockBytes, kBlockBytes);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma::mma_ss_n_major<T, 128>(acc, wgmma::desc_advance(a_desc, kk * 32),
                                    wgmma::desc_advance(b_desc, kk * 16 * kRowBytes), accumulate || kk > 0);
  }
  // Accumulator element (row 16w + g8 + 8 (e >> 1), column c0 + 8 nt + 2t + (e & 1)) of a
  // 32-column block into a [64][64] tile, rows staying rows (P^T, dS^T), column pairs in one
  // 4-byte store. (dS, transposed: store_ds_t at the block's first row.)
  __device__ static void store_rows(uint32_t tile, const float (&v)[4][4], int c0, int warp, int lane) {
    const int g8 = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t r = 16 * warp + g8 + 8 * h, c = c0 + 8 * nt + 2 * t;
        ptx::st_shared_b32(tile + r * kRowBytes + (((c / 8) ^ (r % 8)) << 4) + (c % 8) * 2,
                           ptx::pack2<T>(v[nt][2 * h], v[nt][2 * h + 1]));
      }
  }
  // A 64 x 128 fp32 block into four dq_acc tiles from `stage`: column block c at stage + 2 c
  // tiles (store_dq_block: rows 0-31, then 32-63).
  __device__ static void store_dq(uint32_t stage, const float (&acc)[16][4], int warp, int lane) {
#pragma unroll
    for (int c = 0; c < 2; ++c)
      store_dq_block(stage + 2 * c * kDqAccTileBytes, *reinterpret_cast<const float(*)[8][4]>(acc[8 * c]), warp, lane);
  }
};

// Consumer group `group` (tid 0..127 within it) over a walk's steps (masked: the steps the
// summary leaves active, as the producer walks them) into its columns of dk and dv and its keys'
// dS sums db. Dense: the CTA's 64 keys from walk.key0; gathered: the hand-out's, whose records
// are row_keys (scores outside a key's interval are -inf). j0: the steps this CTA took before
// (a persistent CTA's stages run on across its hand-outs).
template <class T, class Shape>
__device__ __forceinline__ void bwd_ws256_consume_steps(const AttentionBwdParams& p, uint32_t base, unsigned char* smem,
                                                        const BwdWsWalk& walk, int group, int tid, int j0,
                                                        const KeyInfo (&row_keys)[2], float (&dk)[16][4],
                                                        float (&dv)[16][4], float (&db)[2]) {
  using Mma = BwdWs256Mma<T>;
  constexpr int kQ = Shape::kGroupQueries;
  constexpr bool kGather = Shape::kGather;
  const AttentionFwdParams& f = p.f;
  const int warp = tid / 32, lane = tid % 32, t = lane % 4;
  const int keys[2] = {walk.key0 + 16 * warp + lane / 4, walk.key0 + 16 * warp + lane / 4 + 8};  // dense
  const uint32_t k_tile = base + Shape::kK, v_tile = base + Shape::kV;
  const uint32_t pt = base + Shape::kPt, dst = base + Shape::kDst, ds = base + Shape::kDs;
  const bool key_bias = !kGather && f.bias != nullptr, db_cols = !kGather && p.dbias_owner == DbiasOwner::columns;
  // A mask broadcast over queries: kb holds 0 or -inf per key, read when the head changes.
  const bool mask_keys = Shape::kMasked && f.mask_stride[2] == 0;
  float kb[2] = {0.f, 0.f};
  int kb_head = -1;
  const auto steps = bwd_ws_mask_steps<Shape>(smem, f, walk);
  int done = 0;  // masked: the steps not skipped so far
  for (int i = walk.it_begin; i < walk.it_end; ++i) {
    bool mask_all = true;
    if constexpr (Shape::kMasked) {
      i = steps.next(f, walk, i);
      if (i >= walk.it_end) break;
      mask_all = steps.keeps_all(f, walk, i);
    }
    const int j = Shape::kMasked ? j0 + done++ : j0 + i - walk.it_begin, s = j % Shape::kStages;
    const int h = walk.template head<kGather>(f, i), q0 = walk.template q0<kGather, Shape::kBlockM>(i);
    const int my_q0 = q0 + kQ * group;  // this group's 32 queries
    const uint32_t q_tile = Shape::q_tile(base, s), do_tile = Shape::do_tile(base, s);
    const bool head_starts = !kGather && i % walk.n_q == 0, head_ends = !kGather && i % walk.n_q == walk.n_q - 1;
    if (key_bias && head_starts)
      kb[0] = key_bias_at<T>(f, walk.b, h, keys[0]), kb[1] = key_bias_at<T>(f, walk.b, h, keys[1]);
    if (mask_keys && h != kb_head) {
      kb_head = h;
      kb[0] = key_mask_at(f, walk.b, h, keys[0]), kb[1] = key_mask_at(f, walk.b, h, keys[1]);
    }
    mbar::wait(Shape::full(base, s), (j / Shape::kStages) & 1);
    float st[4][4], dpt[4][4];
    wgmma::fence();
    Mma::issue_a_bt32(st, k_tile, q_tile, group);
    Mma::issue_a_bt32(dpt, v_tile, do_tile, group);
    wgmma::commit_group();
    // The last step's stage: free once the copy engine has read this group's dq block from it.
    if (tid == 0 && j > 0) {
      tma::bulk_wait_group_read<0>();
      mbar::arrive(Shape::empty(base, (j - 1) % Shape::kStages));
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(st);
    wgmma::fence_operands(dpt);
    const float* lse2 = reinterpret_cast<const float*>(smem + Shape::lse_delta_offset(s)) + kQ * group;
    const float* delta = lse2 + Shape::kBlockM;
    if constexpr (kGather) {
      bwd_ws_gathered_scores(f, st, dpt, db, lse2, delta, row_keys, my_q0, t);
    } else if (!mask_all && !mask_keys) {  // the step's mask tile, this group's 32 rows of it
      bwd_ws_masked_scores<64>(f, st, dpt, db, lse2, delta, Shape::mask_tile(base, s), my_q0, walk.key0, keys,
                               16 * warp + lane / 4, kQ * group, warp, t);
    } else {  // unmasked, or a key padding mask as per-key terms where the summary does not keep the whole step
      dense_scores_to_p_ds_t(f, st, dpt, db, lse2, delta, my_q0, walk.key0, Shape::kBlockN, keys,
                             mask_keys ? !mask_all : key_bias, kb, warp, t);
    }
    if (db_cols && head_ends) add_key_column_dbias(p, walk.b, key_column_dbias_slot(p, walk.b, walk.hk), h, group, keys, db, t);
    if (head_ends) db[0] = db[1] = 0.f;
    Mma::store_rows(pt, st, kQ * group, warp, lane);
    Mma::store_rows(dst, dpt, kQ * group, warp, lane);
    store_ds_t<T>(smem + Shape::kDs + kQ * group * wgmma::kSwizzleRowBytes, dpt, warp, lane);
    wgmma::fence_proxy_async_smem();  // the stores, before the wgmmas read them
    ptx::named_barrier_sync<1, 2 * kBwdThreads>();  // both groups' halves stored
    float acc[16][4];
    wgmma::fence();
    Mma::issue_a_b128(dv, pt, do_tile, group, true);
    Mma::issue_a_b128(dk, dst, q_tile, group, true);
    Mma::issue_a_b128(acc, ds, k_tile, group, false);
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operands(dv);
    wgmma::fence_operands(dk);
    wgmma::fence_operands(acc);
    // Both groups done with the stage's Q and dO and with the three tiles: the stage becomes
    // dq's staging, the tiles the next step's.
    ptx::named_barrier_sync<1, 2 * kBwdThreads>();
    const uint32_t stage = group == 0 ? q_tile : do_tile;
    Mma::store_dq(stage, acc, warp, lane);
    wgmma::fence_proxy_async_smem();  // the stores, before the copy engine reads them
    if (group == 0)
      ptx::named_barrier_sync<2, kBwdThreads>();
    else
      ptx::named_barrier_sync<3, kBwdThreads>();
    // Done with the stage (its staging stores are in); the first thread arrives a step later,
    // once the copy engine has read the staging. (One arrival from every thread, not a group's
    // first thread alone after the barriers: racecheck sees the order only so.)
    if (tid != 0) mbar::arrive(Shape::empty(base, s));
    if (tid == 0) {
      constexpr int kBlocks = Shape::kColBlocks;
      const int64_t tile0 = ((int64_t(walk.b) * f.H + h) * (p.Sq_pad / kDqAccTileRows) + q0 / kDqAccTileRows) * kBlocks;
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          tma::reduce_add_f32(p.dq_acc + (tile0 + half * kBlocks + 2 * group + c) * (kDqAccTileRows * kDqAccTileCols),
                              stage + (2 * c + half) * kDqAccTileBytes, kDqAccTileBytes);
      tma::bulk_commit_group();
    }
  }
}

// Dense: consumer group `group` over the CTA's walk, then its columns of dk and dv.
template <class T, class Shape>
__device__ __forceinline__ void bwd_ws256_consume(const AttentionBwdParams& p, uint32_t base, unsigned char* smem,
                                                  const BwdWsWalk& walk, int group, int tid) {
  const int key0 = walk.key0 + 16 * (tid / 32) + (tid % 32) / 4, keys[2] = {key0, key0 + 8};
  float dk[16][4], dv[16][4], db[2];
  bwd_ws_zero(dk, dv, db);
  const KeyInfo none[2] = {};
  if (walk.it_begin < walk.it_end) mbar::wait(Shape::kv_full(base), 0);
  bwd_ws256_consume_steps<T, Shape>(p, base, smem, walk, group, tid, 0, none, dk, dv, db);
  if (tid == 0) tma::bulk_wait_group<0>();  // every dq reduction done before the CTA exits
  bwd_ws_store_dk_dv<T>(p, walk, keys, dk, dv, Shape::kGroupCols * group, tid % 4);
}

// Gathered: consumer group `group` over the hand-outs the CTA takes (bwd_ws_hand_out_items; -1:
// none left). Per hand-out: both groups done with the last one's K and V, which all 256 consumer
// threads gather (cp.async) and see landed; the steps; then the group's columns of its keys'
// dk and dv, and its queries' share of their dscores, added into the fp32 rows.
template <class T, class Shape>
__device__ __forceinline__ void bwd_ws256_consume_items(const AttentionBwdParams& p, uint32_t base,
                                                        unsigned char* smem, int group, int tid) {
  const AttentionFwdParams& f = p.f;
  const int t = tid % 4, local = 16 * (tid / 32) + (tid % 32) / 4;
  float dk[16][4], dv[16][4], db[2];
  int j0 = 0;
  for (int n = 0;; ++n) {
    mbar::wait(Shape::item_full(base, n), (n >> 1) & 1);  // the producer has handed out n
    const int handout = *Shape::item_slot(smem, n);
    mbar::arrive(Shape::item_empty(base, n));
    if (handout < 0) break;
    const int part = handout % Shape::kItemParts;
    const BwdWsWalk walk = bwd_ws_handout_walk<Shape>(p, handout);
    const int32_t* keys = p.ws.keys + int64_t(walk.group) * kBwdWsKeys + part * Shape::kBlockN;
    const int n_keys = p.ws.halves[2 * walk.group + part].n_keys;
    int32_t key[2];
    KeyInfo row_keys[2];
    bwd_ws_start_handout<T>(f, walk, keys, local, [&](const T* k, const T* v) {  // all 64 keys, both groups' threads
      load_rows_gather_sw128_async<2 * kBwdThreads, Shape::kHeadDim, Shape::kBlockN, 2, T>(
          {base + Shape::kK, base + Shape::kV}, {k, v}, {f.k_stride[1], f.v_stride[1]}, keys, n_keys, f.D,
          group * kBwdThreads + tid);
    }, key, row_keys, dk, dv, db);
    if (tid == 0 && p.ws.zero_done) tma::fence_proxy_async_global();  // the range's zeros, before its reductions
    bwd_ws256_consume_steps<T, Shape>(p, base, smem, walk, group, tid, j0, row_keys, dk, dv, db);
    j0 += walk.it_end - walk.it_begin;
    bwd_ws_add_key_rows(p, walk, key, dk, dv, db, Shape::kGroupCols * group, t);
    bwd_ws_handout_done(p.ws, handout / Shape::kItemParts, group, tid);
  }
}

template <class T, BwdWsKind kKind = BwdWsKind::dense>
__global__ void __launch_bounds__(BwdWs256Shape<T, kKind>::kThreads, 1)
    attention_bwd_ws256_kernel(const AttentionBwdParams p, const __grid_constant__ BwdTensorMaps maps) {
#if FDMA_SM90_ENABLED
  using Shape = BwdWs256Shape<T, kKind>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem<1024>(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    bwd_ws_init_ring<Shape>(base);
    if constexpr (Shape::kGather) bwd_ws_init_item_slots<Shape>(base);
    mbar::fence_init();
  }
  __syncthreads();
  // The prepare's delta and lse2 (gathered: the setup launch's), the zeroed temporaries and
  // (gathered) the plan, before any read.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  if constexpr (Shape::kGather) {
    if (warp < 4) {
      wgmma::regs_shrink<Shape::kProducerRegs>();
      if (warp == 0 && lane == 0) bwd_ws_hand_out_items<Shape>(maps, p, base, smem);
      if (warp > 0 && p.ws.zero_done) bwd_ws_zero_dq_sums(p, lane);
    } else {
      wgmma::regs_grow<Shape::kConsumerRegs>();
      bwd_ws256_consume_items<T, Shape>(p, base, smem, (tid - 128) / 128, tid % 128);
    }
  } else {
    BwdWsWalk walk = bwd_ws_dense_walk<Shape>(p.f);
    if constexpr (Shape::kMasked) {  // the walk's verdicts; none active: nothing to load or compute
      const BwdWsMaskSteps<Shape> steps(smem, p.f, walk);
      if (steps.tabled) {
        BwdWsMaskSteps<Shape>::build(smem, p.f, walk, tid, Shape::kThreads);
        __syncthreads();
      }
      if (steps.next(p.f, walk, walk.it_begin) >= walk.it_end) walk.it_end = walk.it_begin;
    }
    if (warp < 4) {
      wgmma::regs_shrink<Shape::kProducerRegs>();
      if (warp == 0 && lane == 0) bwd_ws_produce<Shape>(maps, p, base, smem, walk);
    } else {
      wgmma::regs_grow<Shape::kConsumerRegs>();
      bwd_ws256_consume<T, Shape>(p, base, smem, walk, (tid - 128) / 128, tid % 128);
    }
  }
#else
  __trap();  // dispatch launches it only on sm_90a code (arch_dispatch.cuh)
#endif
}

// Whether this kernel takes the call (the caller checks the device): the fused dq's temporary
// given, D = 256, tensors the copy engine can describe (maps filled here), and no mask with no
// bias or one broadcast over queries (whose dbias, if any, the columns own); or a mask (its
// summary given; rows the copy engine can read) and no bias; or key lists (dynamic-mask mode)
// with the fp32 dk/dv rows and the work list, no bias tensor and no dbias (as at D 64 and 128).
template <class T>
bool attention_bwd_ws256_applies(const AttentionBwdParams& p, BwdTensorMaps& maps) {
  const AttentionFwdParams& f = p.f;
  if (!bwd_ws_allowed() || f.D != 256 || !p.dq_acc || p.dkdv_splits > 1) return false;
  const bool gathered = f.lists.keys != nullptr;
  if (gathered) {
    if (!p.dkdv_partial || !f.lists.info || !p.ws.items || p.ws.tiles_per_range < 1 || f.bias ||
        p.dbias_owner != DbiasOwner::none)
      return false;
  } else if (f.mask ? f.bias || !f.tile_active || !f.mask_tiled || p.dbias_owner != DbiasOwner::none
                    : f.tile_active || (f.bias && f.bias_stride[2] != 0) || p.dbias_owner == DbiasOwner::rows) {
    return false;
  }
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  if (!gathered && f.mask && f.mask_stride[2] != 0 && !encode_mask_tiles(maps.mask, f, 64, 64)) return false;
  if (!encode_rows_map(maps.q, f.q, bf16, f.D, f.Sq, f.H, f.B, f.q_stride, 64) ||
      !encode_rows_map(maps.dout, p.dout, bf16, f.D, f.Sq, f.H, f.B, p.dout_stride, 64))
    return false;
  return gathered || (encode_rows_map(maps.k, f.k, bf16, f.D, f.Sk, f.Hk, f.B, f.k_stride, 64) &&
                      encode_rows_map(maps.v, f.v, bf16, f.D, f.Sk, f.Hk, f.B, f.v_stride, 64));
}

// The instantiation for a call, and its shared memory.
inline BwdWsKind bwd_ws256_kind(const AttentionFwdParams& f) {
  return f.lists.keys ? BwdWsKind::gathered : f.mask ? BwdWsKind::masked : BwdWsKind::dense;
}
template <class T>
auto bwd_ws256_kernel_of(const AttentionFwdParams& f) {
  switch (bwd_ws256_kind(f)) {
    case BwdWsKind::gathered:
      return attention_bwd_ws256_kernel<T, BwdWsKind::gathered>;
    case BwdWsKind::masked:
      return attention_bwd_ws256_kernel<T, BwdWsKind::masked>;
    default:
      return attention_bwd_ws256_kernel<T, BwdWsKind::dense>;
  }
}
template <class T>
int bwd_ws256_smem_of(BwdWsKind kind) {
  return kind == BwdWsKind::gathered ? BwdWs256Shape<T, BwdWsKind::gathered>::kSmemBytes
         : kind == BwdWsKind::masked ? BwdWs256Shape<T, BwdWsKind::masked>::kSmemBytes
                                     : BwdWs256Shape<T>::kSmemBytes;
}

// The kernel, then the convert kernel that writes dq from the temporary. Gathered: one
// persistent CTA an SM, as at D 64 and 128, and the finish kernel writes dq.
template <class T>
cudaError_t launch_attention_bwd_ws256(const AttentionBwdParams& p, const BwdTensorMaps& maps, int device,
                                       cudaStream_t stream) {
  const AttentionFwdParams& f = p.f;
  const BwdWsKind kind = bwd_ws256_kind(f);
  const int smem = bwd_ws256_smem_of<T>(kind);
  static std::atomic<int> granted[int(BwdWsKind::gathered) + 1][kMaxDevices] = {};  // one row a kind
  cudaError_t err = grant_smem_once(bwd_ws256_kernel_of<T>(f), smem, device < kMaxDevices ? granted[int(kind)] : nullptr,
                                    device);
  if (err != cudaSuccess) return err;
  using Shape = BwdWs256Shape<T>;
  const dim3 grid = kind == BwdWsKind::gathered ? dim3(unsigned(std::max(1, device_sm_count())))
                                                : dim3((f.Sk + Shape::kBlockN - 1) / Shape::kBlockN, f.Hk, f.B);
  err = launch_kernel(f.overlap_previous, bwd_ws256_kernel_of<T>(f), grid, Shape::kThreads, smem, stream, p, maps);
  if (err != cudaSuccess || kind == BwdWsKind::gathered) return err;
  return launch_bwd_dq_convert<T>(p, Shape::kHeadDim, stream);
}

}  // namespace fdma::cuda
