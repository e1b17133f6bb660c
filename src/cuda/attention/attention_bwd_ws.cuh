// Warp-specialized attention backward for Hopper (sm_90a): dk, dv and the fused dq of calls at
// D = 64 and 128 that do not ask for determinism (AttentionBwdParams::dq_acc set), whose q, k,
// v, dout and terms the copy engine can read, one instantiation per kind of call (BwdWsKind):
//   dense     no mask; no bias or a per-key one ([.., 1, Sk], its dbias summed per key column);
//   masked    a mask and no bias: each step's mask tile comes with its Q, or a mask broadcast
//             over queries is read per key; the steps the mask tile summary rules out are
//             skipped, and those it keeps whole run unmasked;
//   biased    a bias with a query dim in q's dtype and no mask: each step's bias tile comes
//             with its Q. Where dbias is asked for and is one dS an element, each score's dS
//             goes back over its bias and the copy engine writes the tile out, and the
//             producer group's idle warps write the zeros of the rows no step covers; where
//             dbias sums heads or batches, each score's dS goes into the group's dq staging
//             tile as fp32 and the copy engine adds the tile into the fp32 sums
//             (AttentionBwdParams::dbias_acc) that the finish kernel writes out;
//   masked_biased  a mask with such a bias: the biased kind's steps over the masked kind's walk
//             (the summary's verdicts), with the mask laid over each step's bias tile as -inf
//             by the producer group's idle warps (bwd_ws_mask_over_bias.cuh), who also write
//             the zeros of the skipped steps' dbias tiles;
//   gathered  key lists (dynamic-mask mode, below).
//
// One CTA = 128 keys of a (batch, KV head); it walks the G query heads of the group and their
// query tiles (steps of 128 rows at D = 64, 64 otherwise), as the dk/dv kernel does, but with
// three warp groups:
//   producer  gives most of its registers away (setmaxnreg); one thread loads K and V once,
//             then each step's Q, dO (tensor copies) and lse2, delta (bulk copies) into a ring
//             of kStages buffers, each with a "full" mbarrier the copies complete and an
//             "empty" one every consumer thread arrives on;
//   consumers two groups of 64 keys each, sharing every step's Q and dO: S^T and dP^T, the
//             scores' gradients, dv += P^T dO and dk += dS^T Q for their own keys; each stores
//             its dS half into the step's [queries][128 keys] tile. After one barrier of both
//             groups, each computes one 64 x 64 block of dq over all 128 keys: its own 64
//             columns at D = 128, its own 64 of the step's 128 rows at D = 64. Each adds its
//             block into dq_acc with two bulk reductions.
// Against the dk/dv kernel's 64-key CTAs (attention_bwd_dkdv.cuh): each Q and dO tile is read
// once per 128 keys instead of once per 64, at D = 128 dq's reductions into the temporary are
// halved, and no consumer thread issues a load.
//
// Dynamic-mask mode (kGather; non-deterministic calls given the temporaries): persistent CTAs,
// one an SM, take (key group, query range) items from a list written beforehand (BwdWsPlan,
// dma/bwd_ws_plan.hpp): 128 kept keys with similar query intervals, over the query tiles of one
// range that their intervals span, from the last down with the G heads innermost. Ranges are
// handed out lowest first, so the CTAs running at a time reduce into the same dq tiles and
// read the same Q and dO tiles: in L2, where an order by key group spread them over the whole
// temporary and lost 10-20% at 16K-32K (docs/performance.md, "key lists"). The consumer groups
// gather their keys' K and V rows (cp.async) at each item's start. One producer thread hands
// the items out through two slots, each with a full and an empty mbarrier, and runs ahead into
// the next item's copies; its step count and the stage barriers' phases run on across items.
// Scores outside a key's interval are -inf. Steps are 64 queries (the plan's tiles); at D = 64
// each group computes dS K over its own keys. Every item adds its dk, dv and dscores into fp32
// rows (red.global.add) and counts itself done; the finish kernel (dma/bwd_ws_finish.hpp) writes
// dq, dk, dv and dscores out of the fp32 sums as their ranges and groups are done, under the
// kernel's last items. No dq kernel runs: five matmuls, not seven.
//
// Its pieces beside this file: the CTA's walk and the mask summary's verdicts on its steps
// (bwd_ws_walk.cuh), the per-score terms of each kind of step (bwd_ws_scores.cuh).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "cuda/attention/attention_bwd_common.cuh"
#include "cuda/attention/bwd_ws_dq_zero.cuh"
#include "cuda/attention/bwd_ws_mask_over_bias.cuh"
#include "cuda/attention/bwd_ws_scores.cuh"
#include "cuda/attention/bwd_ws_walk.cuh"
#include "cuda/attention/term_maps.hpp"
#include "cuda/primitives/fast_divmod.cuh"
#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/tensor_map.hpp"
#include "cuda/primitives/tma.cuh"

namespace fdma::cuda {

// Copy-engine descriptors of q, dout (boxes of 64 columns by a step's rows of one head), k, v
// (the same boxes: one per consumer group's 64 keys and column block; unused when gathered), a
// mask (boxes of 128 keys by a step's rows, 128-byte swizzled; masked calls), a bias and its
// dbias (boxes of 64 keys by a step's rows, 128-byte swizzled; biased calls; where dbias is
// summed, its fp32 sums in boxes of 32 keys).
struct BwdTensorMaps {
  CUtensorMap q, dout, k, v, mask, bias, dbias;
};

enum class BwdWsKind { dense, masked, biased, masked_biased, gathered };  // gathered last: launch_attention_bwd_ws sizes its table by it

// Shared memory: K and V as one 64-key tile per consumer group; per stage Q, dO and the step's
// rows' lse2 and delta; two dS tiles (steps alternate); per consumer group the staging of its
// dq block (two dq_acc tiles); masked, per stage the step's mask tile; biased, per stage the
// step's bias tile; gathered, two slots for the item being handed out; then the mbarriers.
// masked_biased takes the biased layout plus the masked walk's step bitmaps.
// Every tile 1024-byte aligned (the swizzle).
template <class T, int kHeadDim, BwdWsKind kKind = BwdWsKind::dense>
struct BwdWsShape {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the warp-specialized backward: D = 64 or 128");
  static constexpr bool kGather = kKind == BwdWsKind::gathered;
  // kMasked: the walk takes the mask summary's verdicts; kMaskTiles: each step's mask tile comes
  // with its Q; kMaskOverBias: the mask is laid over the bias tile (bwd_ws_mask_over_bias.cuh).
  static constexpr bool kMaskOverBias = kKind == BwdWsKind::masked_biased;
  static constexpr bool kMasked = kKind == BwdWsKind::masked || kMaskOverBias, kMaskTiles = kKind == BwdWsKind::masked;
  static constexpr bool kBiased = kKind == BwdWsKind::biased || kMaskOverBias;
  // Mask over bias, where the consumers wait for the helpers: at D = 64 after S^T and dP^T
  // (which do not read the bias tile), so that laying the mask runs under them, 1.5-2.6% faster;
  // at D = 128 before them (after: 0.3-1.5% slower; the helpers are done before the step starts).
  // docs/performance.md, "attention backward".
  static constexpr bool kReadyAfterProducts = kMaskOverBias && kHeadDim == 64;
  static constexpr bool kReadyBeforeProducts = kMaskOverBias && !kReadyAfterProducts;
  using Mma = BwdMmaSm90<T, kHeadDim, kBwdThreads>;
  // Queries a step: 128 for dense calls at D = 64, where a step's fixed costs (the barriers,
  // the dq staging and its reductions) would otherwise weigh as much as its matmuls; 64
  // elsewhere (D = 128 leaves no registers for wider S^T and dP^T; gathered items walk 64-query
  // tiles; masked steps are the mask summary's 64-row tiles; two stages of 128-query mask or
  // bias tiles would not fit beside the rest).
  static constexpr int kBlockM = kHeadDim == 64 && kKind == BwdWsKind::dense ? 128 : 64;
  static constexpr int kGroupKeys = 64, kConsumers = 2, kBlockN = kGroupKeys * kConsumers, kKeyTiles = kConsumers;
  static constexpr int kStages = 2;
  static constexpr int kItemParts = 1;  // gathered: a plan item's keys are the CTA's (bwd_ws_hand_out_items)
  static_assert(kItemParts == bwd_ws_item_parts(kHeadDim), "the finish kernel counts parts so");
  // How the groups share dq = dS K, each one 64 x 64 block a step: split by column blocks (D =
  // 128) or by 64-row halves of the step (128-query steps), each over all 128 keys; or, with
  // one block of each, by keys (each group over its own 64).
  static constexpr bool kSplitColumns = kHeadDim / 64 == kConsumers, kSplitRows = kBlockM / 64 == kConsumers;
  static constexpr bool kDqOverBothGroups = kSplitColumns || kSplitRows;
  static_assert(!(kSplitColumns && kSplitRows), "one 64 x 64 dq block per group and step");
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // 24 x 128 + 240 x 256 registers: what the CTA's 168 a thread at launch give (a consumer
  // group may take only what the producer group gave back, or its setmaxnreg waits forever);
  // gathered, the producer's item hand-out spilled at 24: 40 x 128 + 232 x 256. (The mask over
  // the bias spills a little at 24; its consumers spilled more at 232.)
  static constexpr int kProducerRegs = kGather ? 40 : 24, kConsumerRegs = kGather ? 232 : 240;
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kKeyTile = Mma::tile_bytes(kGroupKeys), kQTile = Mma::tile_bytes(kBlockM);
  static constexpr int kDsTile = kBlockM * kBlockN * 2;  // [queries][128 keys], a 64-key block per group
  static constexpr int kStageTile = 2 * kDqAccTileBytes;
  static constexpr int kLseDeltaBytes = 2 * kBlockM * 4;  // the step's lse2 then delta
  static constexpr int kMaskTile = kMaskTiles ? kBlockM * kBlockN : 0;  // [queries][128 keys] bytes
  // [queries][64 keys] of q's dtype per consumer group, each in store_ds_t's layout
  static constexpr int kBiasBox = kBiased ? kBlockM * wgmma::kSwizzleRowBytes : 0, kBiasTile = kConsumers * kBiasBox;
  static constexpr int kK = 0, kV = kK + kConsumers * kKeyTile, kQ = kV + kConsumers * kKeyTile;
  static constexpr int kDo = kQ + kStages * kQTile, kDs = kDo + kStages * kQTile, kStage = kDs + 2 * kDsTile;
  static_assert(kBlockN == kBwdWsKeys, "a gathered item's keys fill the CTA");
  static constexpr int kMask = kStage + kConsumers * kStageTile, kBias = kMask + kStages * kMaskTile;
  static constexpr int kLseDelta = kBias + kStages * kBiasTile;
  // Masked: the walk's steps as two bitmaps (the summary keeps some / all of the step), up to
  // kMaxMaskSteps steps a CTA (BwdWsMaskSteps); with the bias tiles at D 128, what is left.
  static constexpr int kMaxMaskSteps = !kMasked ? 0 : kMaskOverBias && kHeadDim == 128 ? 3840 : 32768;
  static constexpr int kMaskSteps = kLseDelta + kStages * kLseDeltaBytes;
  static constexpr int kSlots = kMaskSteps + 2 * kMaxMaskSteps / 8;
  static constexpr int kBars = kSlots + (kGather ? 16 : 0);
  // kv_full, then per stage full, empty; gathered, per item slot full, empty; mask over bias, per
  // stage ready (the mask laid over the stage's bias tile)
  static constexpr int kNumBars = 1 + 2 * kStages + (kGather ? 4 : 0) + (kMaskOverBias ? kStages : 0);
  static constexpr int kSmemBytes = align_slack<1024>() + kBars + kNumBars * 8;
  static_assert(kSmemBytes <= 227 * 1024, "fits an SM's shared memory");
  static_assert(kQTile % 1024 == 0 && kKeyTile % 1024 == 0 && kDsTile % 1024 == 0 && kStageTile % 1024 == 0 &&
                    kMaskTile % 1024 == 0 && kBiasBox % 1024 == 0,
                "tiles stay 1024-byte aligned");
  static constexpr uint32_t kStepBytes = 2 * kQTile + kLseDeltaBytes + kBiasTile;  // a step's copies, its mask tile apart
  // Masked: the summary's tiles a step covers (64 rows, two 64-key tiles).
  using Summary = SummaryTiles<kBlockM / kBwdBlockM, kBlockN / kBwdBlockN>;

  __device__ static uint32_t kv_full(uint32_t base) { return base + kBars; }
  __device__ static uint32_t full(uint32_t base, int s) { return base + kBars + 8 * (1 + s); }
  __device__ static uint32_t empty(uint32_t base, int s) { return base + kBars + 8 * (1 + kStages + s); }
  __device__ static uint32_t ready(uint32_t base, int s) { return base + kBars + 8 * (1 + 2 * kStages + s); }
  __device__ static uint32_t k_tile(uint32_t base, int g) { return base + kK + g * kKeyTile; }
  __device__ static uint32_t v_tile(uint32_t base, int g) { return base + kV + g * kKeyTile; }
  __device__ static uint32_t q_tile(uint32_t base, int s) { return base + kQ + s * kQTile; }
  __device__ static uint32_t do_tile(uint32_t base, int s) { return base + kDo + s * kQTile; }
  __device__ static int ds_offset(int step) { return kDs + (step & 1) * kDsTile; }
  __device__ static uint32_t stage_tile(uint32_t base, int g) { return base + kStage + g * kStageTile; }
  __device__ static int lse_delta_offset(int s) { return kLseDelta + s * kLseDeltaBytes; }
  __device__ static uint32_t mask_tile(uint32_t base, int s) { return base + kMask + s * kMaskTile; }
  __device__ static uint32_t bias_box(uint32_t base, int s, int g) { return base + kBias + s * kBiasTile + g * kBiasBox; }
  // Gathered: the item of the n-th hand-out (two slots: one may be written while the other is
  // read), its "full" mbarrier the producer arrives on once it wrote it, its "empty" one every
  // consumer thread arrives on once it read it.
  __device__ static volatile int* item_slot(unsigned char* smem, int n) {
    return reinterpret_cast<volatile int*>(smem + kSlots) + (n & 1);
  }
  __device__ static uint32_t item_full(uint32_t base, int n) { return base + kBars + 8 * (1 + 2 * kStages + (n & 1)); }
  __device__ static uint32_t item_empty(uint32_t base, int n) { return base + kBars + 8 * (3 + 2 * kStages + (n & 1)); }
};

// The K/V barrier and the stages' full (the copies) and empty (every consumer thread) barriers.
template <class Shape>
__device__ __forceinline__ void bwd_ws_init_ring(uint32_t base) {
  mbar::init(Shape::kv_full(base), 1);
  for (int s = 0; s < Shape::kStages; ++s) {
    mbar::init(Shape::full(base, s), 1);
    mbar::init(Shape::empty(base, s), 128 * Shape::kConsumers);
    if constexpr (Shape::kMaskOverBias) mbar::init(Shape::ready(base, s), kMaskHelperThreads);
  }
}

// Gathered: the hand-out slots' barriers (full: the producer's write; empty: every consumer thread's read).
template <class Shape>
__device__ __forceinline__ void bwd_ws_init_item_slots(uint32_t base) {
  for (int n = 0; n < 2; ++n) {
    mbar::init(Shape::item_full(base, n), 1);
    mbar::init(Shape::item_empty(base, n), 128 * Shape::kConsumers);
  }
}

// Dense: K and V, once, by tensor copies onto kv_full: kKeyTiles tiles of 64 keys each.
template <class Shape>
__device__ __forceinline__ void bwd_ws_produce_keys(const BwdTensorMaps& maps, uint32_t base, const BwdWsWalk& walk) {
  constexpr int kBlock = Shape::kGroupKeys * wgmma::kSwizzleRowBytes;  // one column block of a key tile
  mbar::arrive_expect_tx(Shape::kv_full(base), 2 * Shape::kKeyTiles * Shape::kKeyTile);
#pragma unroll
  for (int g = 0; g < Shape::kKeyTiles; ++g)
#pragma unroll
    for (int c = 0; c < Shape::kColBlocks; ++c) {
      const int key = walk.key0 + g * Shape::kGroupKeys;
      tma::load_4d(Shape::k_tile(base, g) + c * kBlock, &maps.k, Shape::kv_full(base), c * 64, key, walk.hk, walk.b);
      tma::load_4d(Shape::v_tile(base, g) + c * kBlock, &maps.v, Shape::kv_full(base), c * 64, key, walk.hk, walk.b);
    }
}

// The copy-issuing thread's steps: each step's Q, dO, lse2 and delta (masked: and its mask tile,
// unless the summary keeps the step whole; biased: and its bias tile) into its stage once the
// consumers have released what it held; masked steps the summary rules out are skipped. j0:
// the steps this CTA issued before (the stages' phases run on across a persistent CTA's items).
template <class Shape>
__device__ __forceinline__ void bwd_ws_produce_steps(const BwdTensorMaps& maps, const AttentionBwdParams& p,
                                                     uint32_t base, const BwdWsWalk& walk, int j0,
                                                     const unsigned char* smem = nullptr) {
  const AttentionFwdParams& f = p.f;
  constexpr bool kGather = Shape::kGather;
  constexpr int kQBlock = Shape::kBlockM * wgmma::kSwizzleRowBytes;
  const auto steps = bwd_ws_mask_steps<Shape>(smem, f, walk);
  int issued = 0;  // masked: the steps not skipped so far
  for (int i = walk.it_begin; i < walk.it_end; ++i) {
    bool mask_all = true;
    if constexpr (Shape::kMasked) {
      i = steps.next(f, walk, i);
      if (i >= walk.it_end) break;
      mask_all = steps.keeps_all(f, walk, i);
    }
    const int h = walk.template head<kGather>(f, i), q0 = walk.template q0<kGather, Shape::kBlockM>(i);
    const int j = Shape::kMasked ? j0 + issued++ : j0 + i - walk.it_begin, s = j % Shape::kStages;
    const uint32_t free_parity = ((j / Shape::kStages) & 1) ^ 1;  // the first pass finds every stage free
    if constexpr (Shape::kMaskOverBias)  // into L2 while the stage drains, for the helper warps' loads
      if (!mask_all && f.mask_stride[2] != 0)
        tma::prefetch_4d(&maps.mask, walk.key0, q0, int(head_index(f.mask_head_mode, h, f.G)),
                         f.mask_stride[0] == 0 ? 0 : walk.b);
    mbar::wait(Shape::empty(base, s), free_parity);
    if constexpr (Shape::kMaskTiles) {
      mask_all |= f.mask_stride[2] == 0;  // a mask broadcast over queries: read per key by the consumers
      mbar::arrive_expect_tx(Shape::full(base, s), Shape::kStepBytes + (mask_all ? 0 : Shape::kMaskTile));
      if (!mask_all)
        tma::load_4d(Shape::mask_tile(base, s), &maps.mask, Shape::full(base, s), walk.key0, q0,
                     int(head_index(f.mask_head_mode, h, f.G)), f.mask_stride[0] == 0 ? 0 : walk.b);
    } else {
      mbar::arrive_expect_tx(Shape::full(base, s), Shape::kStepBytes);
    }
    if constexpr (Shape::kBiased) {
      const int hb = int(head_index(f.bias_head_mode, h, f.G)), bb = f.bias_stride[0] == 0 ? 0 : walk.b;
#pragma unroll
      for (int g = 0; g < Shape::kConsumers; ++g)
        tma::load_4d(Shape::bias_box(base, s, g), &maps.bias, Shape::full(base, s), walk.key0 + g * Shape::kGroupKeys,
                     q0, hb, bb);
    }
#pragma unroll
    for (int c = 0; c < Shape::kColBlocks; ++c) {
      tma::load_4d(Shape::q_tile(base, s) + c * kQBlock, &maps.q, Shape::full(base, s), c * 64, q0, h, walk.b);
      tma::load_4d(Shape::do_tile(base, s) + c * kQBlock, &maps.dout, Shape::full(base, s), c * 64, q0, h, walk.b);
    }
    // lse2 and delta are padded to Sq_pad (a multiple of 64): whole rows of 256 bytes exist.
    const int64_t row = (int64_t(walk.b) * f.H + h) * p.Sq_pad + q0;
    const uint32_t rows = base + Shape::lse_delta_offset(s);
    tma::load_bytes(rows, p.lse2 + row, Shape::kBlockM * 4, Shape::full(base, s));
    tma::load_bytes(rows + Shape::kBlockM * 4, p.delta + row, Shape::kBlockM * 4, Shape::full(base, s));
  }
}

// Dense: the copy-issuing thread, K and V once, then every step.
template <class Shape>
__device__ __forceinline__ void bwd_ws_produce(const BwdTensorMaps& maps, const AttentionBwdParams& p, uint32_t base,
                                               const unsigned char* smem, const BwdWsWalk& walk) {
  tma::prefetch_map(&maps.q);
  tma::prefetch_map(&maps.dout);
  tma::prefetch_map(&maps.k);
  tma::prefetch_map(&maps.v);
  if constexpr (Shape::kMasked) tma::prefetch_map(&maps.mask);  // (mask over bias: a broadcast one unused)
  if constexpr (Shape::kBiased) tma::prefetch_map(&maps.bias);
  if (walk.it_begin >= walk.it_end) return;  // the consumers wait for nothing: no copy may outlive the CTA
  bwd_ws_produce_keys<Shape>(maps, base, walk);
  bwd_ws_produce_steps<Shape>(maps, p, base, walk, 0, smem);
}

// One consumer group's steps (`group` 0 or 1, `tid` 0..127 within it): its 64 keys (dense:
// walk.key0 + 64 group; gathered: the item's [64 group, +64), whose records are row_keys) over
// the walk, into dk, dv and db (biased with dbias: each step's dS tile written out). j0 as in
// bwd_ws_produce_steps.
template <class T, int kHeadDim, class Shape>
__device__ __forceinline__ void bwd_ws_consume_steps(const BwdTensorMaps& maps, const AttentionBwdParams& p,
                                                     uint32_t base, unsigned char* smem, const BwdWsWalk& walk,
                                                     int group, int tid, int j0,
                                                     const KeyInfo (&row_keys)[2], float (&dk)[kHeadDim / 8][4],
                                                     float (&dv)[kHeadDim / 8][4], float (&db)[2]) {
  using Mma = typename Shape::Mma;
  constexpr bool kGather = Shape::kGather;
  constexpr int kBM = Shape::kBlockM, kNq = kBM / 8;
  const AttentionFwdParams& f = p.f;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int key0 = walk.key0 + group * Shape::kGroupKeys;
  const int keys[2] = {key0 + 16 * warp + g, key0 + 16 * warp + g + 8};  // dense: this thread's two keys
  const uint32_t k_tile = Shape::k_tile(base, group), v_tile = Shape::v_tile(base, group);
  // This group's own barrier (the other's is 2 + other; barrier 1 is both groups').
  auto sync_group = [&] {
    if (group == 0)
      ptx::named_barrier_sync<2, kBwdThreads>();
    else
      ptx::named_barrier_sync<3, kBwdThreads>();
  };
  // Dense with a per-key bias: this thread's two keys' biases, read when the head changes, and
  // their dS sums over the head's queries, added into the dbias slots of (batch, KV head) as the
  // dk/dv kernel does (the first half: the groups own different keys). Gathered: db sums the
  // keys' dS over the whole walk (dscores).
  // Masked with a mask broadcast over queries ([.., 1, Sk]): kb holds 0 or -inf per key instead,
  // read when the head changes (skipped steps may pass over a head's first).
  const bool key_bias = !kGather && !Shape::kBiased && f.bias != nullptr;
  const bool db_cols = !kGather && p.dbias_owner == DbiasOwner::columns;
  const bool mask_keys = Shape::kMaskTiles && f.mask_stride[2] == 0;
  // Biased with dbias: each step's dS tile is dbias's (ds_out), or is added into its fp32 sums
  // from the group's dq staging tile (ds_sums).
  const bool ds_sums = Shape::kBiased && p.dbias_owner == DbiasOwner::rows && p.dbias_acc;
  const bool ds_out = Shape::kBiased && p.dbias_owner == DbiasOwner::rows && !p.dbias_acc;
  float kb[2] = {0.f, 0.f};
  int kb_head = -1;
  const auto steps = bwd_ws_mask_steps<Shape>(smem, f, walk);
  int done = 0;  // masked: the steps not skipped so far
  for (int i = walk.it_begin; i < walk.it_end; ++i) {
    bool mask_all = true;
    if constexpr (Shape::kMasked) {  // the producer's walk (bwd_ws_produce_steps)
      i = steps.next(f, walk, i);
      if (i >= walk.it_end) break;
      mask_all = steps.keeps_all(f, walk, i);
    }
    const int h = walk.template head<kGather>(f, i), q0 = walk.template q0<kGather, Shape::kBlockM>(i);
    const int j = Shape::kMasked ? j0 + done++ : j0 + i - walk.it_begin, s = j % Shape::kStages;
    const uint32_t q_tile = Shape::q_tile(base, s), do_tile = Shape::do_tile(base, s);
    const bool head_starts = !kGather && i % walk.n_q == 0, head_ends = !kGather && i % walk.n_q == walk.n_q - 1;
    if (key_bias && head_starts)
      kb[0] = key_bias_at<T>(f, walk.b, h, keys[0]), kb[1] = key_bias_at<T>(f, walk.b, h, keys[1]);
    if (mask_keys && h != kb_head) {
      kb_head = h;
      kb[0] = key_mask_at(f, walk.b, h, keys[0]), kb[1] = key_mask_at(f, walk.b, h, keys[1]);
    }
    mbar::wait(Shape::full(base, s), (j / Shape::kStages) & 1);
    if constexpr (Shape::kReadyBeforeProducts) mbar::wait(Shape::ready(base, s), (j / Shape::kStages) & 1);
    // S^T = K Q^T and dP^T = V dO^T: rows are this warp's 16 keys, columns the step's queries.
    float st[kNq][4], dpt[kNq][4];
    Mma::template a_bt_pair<Shape::kGroupKeys, kBM>(st, k_tile, q_tile, dpt, v_tile, do_tile, warp, lane);
    if (ds_sums) {  // the staging tile takes this step's dS: free once the last dq reduction has read it
      if (tid == 0) tma::bulk_wait_group_read<0>();
      sync_group();
    }
    if constexpr (Shape::kReadyAfterProducts) mbar::wait(Shape::ready(base, s), (j / Shape::kStages) & 1);
    const float* lse2 = reinterpret_cast<const float*>(smem + Shape::lse_delta_offset(s));
    const float* delta = lse2 + kBM;
    if constexpr (kGather) {
      bwd_ws_gathered_scores(f, st, dpt, db, lse2, delta, row_keys, q0, t);
    } else if constexpr (Shape::kBiased) {
      bwd_ws_biased_scores<T>(f, st, dpt, db, lse2, delta, Shape::bias_box(base, s, group), ds_out,
                              ds_sums ? Shape::stage_tile(base, group) : 0u, q0, key0, keys, warp, lane);
    } else if (!mask_all && !mask_keys) {
      bwd_ws_masked_scores(f, st, dpt, db, lse2, delta, Shape::mask_tile(base, s), q0, key0, keys,
                           group * Shape::kGroupKeys + 16 * warp + g, 0, warp, t);
    } else {  // a key padding mask as per-key terms (0 or -inf) where the summary does not keep the whole step
      dense_scores_to_p_ds_t(f, st, dpt, db, lse2, delta, q0, key0, Shape::kGroupKeys, keys,
                             mask_keys ? !mask_all : key_bias, kb, warp, t);
    }
    if (db_cols && head_ends) add_key_column_dbias(p, walk.b, key_column_dbias_slot(p, walk.b, walk.hk), h, 0, keys, db, t);
    if (head_ends) db[0] = db[1] = 0.f;
    // dS for dq = dS K: this group's 64-key block of the step's tile, while dpt still holds it.
    unsigned char* ds = smem + Shape::ds_offset(j);
    store_ds_t<T>(ds + group * kBM * wgmma::kSwizzleRowBytes, dpt, warp, lane);
    // dv += P^T dO, dk += dS^T Q, left running under the barrier and dq's product below.
    uint32_t p_frag[kNq / 2][4], ds_frag[kNq / 2][4];
    Mma::template issue_regs_b_pair<kBM>(dv, st, do_tile, p_frag, dk, dpt, q_tile, ds_frag, 0);

    // dq's block of this group over the 128 keys, once both groups' dS is stored: columns
    // [64 group, +64) (D = 128) or query rows [64 group, +64) (128-query steps); or dS K over
    // the group's own keys (gathered, D = 64). Staged in the group's own tiles, whose previous
    // reductions its first thread has seen read out. (Two dS tiles: a group writes step j +
    // 2's over step j's only after passing step j + 1's barrier, which the other group reaches
    // after its dq of step j.)
    if (tid == 0) tma::bulk_wait_group_read<0>();
    wgmma::fence_proxy_async_smem();  // the dS stores, before the wgmmas (and the dbias store) read them
    if constexpr (Shape::kDqOverBothGroups)
      ptx::named_barrier_sync<1, 2 * kBwdThreads>();
    else
      sync_group();
    if ((ds_out || ds_sums) && tid == 0) {  // the group's dS is whole: into dbias[b, h's, q0.., key0..]
      const int hb = int(head_index(f.bias_head_mode, h, f.G)), bb = p.dbias_size[0] == 1 ? 0 : walk.b;
      if (ds_out) {
        tma::store_4d(&maps.dbias, Shape::bias_box(base, s, group), key0, q0, hb, bb);
      } else {
        const uint32_t sums = Shape::stage_tile(base, group);
        tma::reduce_add_4d(&maps.dbias, sums, key0, q0, hb, bb);
        tma::reduce_add_4d(&maps.dbias, sums + kBM * wgmma::kSwizzleRowBytes, key0 + 32, q0, hb, bb);
      }
      tma::bulk_commit_group();
    }
    float acc[8][4];
    if constexpr (Shape::kDqOverBothGroups) {
      const int rows = Shape::kSplitRows ? group * 64 : 0, block = Shape::kSplitColumns ? group : 0;
      Mma::template issue_ds_times_k<Shape::kConsumers, kBM>(acc, ptx::smem_addr(ds + rows * wgmma::kSwizzleRowBytes),
                                                             Shape::k_tile(base, 0), block);
    } else {
      Mma::issue_ds_times_k(acc, ptx::smem_addr(ds + group * kBM * wgmma::kSwizzleRowBytes), k_tile, 0);
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(dv);
    wgmma::fence_operands(dk);
    wgmma::fence_operands(acc);
    Mma::template keep_live<kNq>(p_frag);
    Mma::template keep_live<kNq>(ds_frag);
    // The dbias store has read the stage's box, or its reductions the staging tile.
    if ((ds_out || ds_sums) && tid == 0) tma::bulk_wait_group_read<0>();
    mbar::arrive(Shape::empty(base, s));  // this thread is done with the stage's Q, dO, lse2, delta
    if (ds_sums) sync_group();  // the staging tile is free for dq's block
    const uint32_t stage = Shape::stage_tile(base, group);
    store_dq_block(stage, acc, warp, lane);
    wgmma::fence_proxy_async_smem();  // the stores, before the copy engine reads them
    sync_group();
    if (tid == 0) {
      constexpr int kBlocks = kHeadDim / kDqAccTileCols;
      const int row0 = q0 + (Shape::kSplitRows ? group * 64 : 0);
      const int64_t tile0 =
          ((int64_t(walk.b) * f.H + h) * (p.Sq_pad / kDqAccTileRows) + row0 / kDqAccTileRows) * kBlocks;
#pragma unroll
      for (int half = 0; half < 2; ++half)
        tma::reduce_add_f32(p.dq_acc + (tile0 + half * kBlocks + (Shape::kSplitColumns ? group : 0)) *
                                           (kDqAccTileRows * kDqAccTileCols),
                            stage + half * kDqAccTileBytes, kDqAccTileBytes);
      tma::bulk_commit_group();
    }
  }
}

// Dense: this thread's two keys' rows of dk and dv, columns col0 + 8 dt + 2t (+1) of the
// accumulators' layout; keys past Sk not written.
template <class T, int kTiles>
__device__ __forceinline__ void bwd_ws_store_dk_dv(const AttentionBwdParams& p, const BwdWsWalk& walk,
                                                   const int (&keys)[2], const float (&dk)[kTiles][4],
                                                   const float (&dv)[kTiles][4], int col0, int t) {
  T* dk_base = static_cast<T*>(p.dk) + walk.b * p.dk_stride[0] + walk.hk * p.dk_stride[2];
  T* dv_base = static_cast<T*>(p.dv) + walk.b * p.dv_stride[0] + walk.hk * p.dv_stride[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= p.f.Sk) continue;
#pragma unroll
    for (int dt = 0; dt < kTiles; ++dt) {
      const int d = col0 + dt * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dk_base + keys[r] * p.dk_stride[1] + d) = ptx::pack2<T>(dk[dt][2 * r], dk[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv_base + keys[r] * p.dv_stride[1] + d) = ptx::pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <int kDC>
__device__ __forceinline__ void bwd_ws_zero(float (&dk)[kDC][4], float (&dv)[kDC][4], float (&db)[2]) {
#pragma unroll
  for (int dt = 0; dt < kDC; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  db[0] = db[1] = 0.f;
}

// Dense: one consumer group's keys over the CTA's walk, then their dk and dv rows.
template <class T, int kHeadDim, class Shape>
__device__ __forceinline__ void bwd_ws_consume(const BwdTensorMaps& maps, const AttentionBwdParams& p, uint32_t base,
                                               unsigned char* smem, const BwdWsWalk& walk, int group, int tid) {
  constexpr int kDC = kHeadDim / 8;
  const int t = tid % 4, key0 = walk.key0 + group * Shape::kGroupKeys + 16 * (tid / 32) + (tid % 32) / 4;
  const int keys[2] = {key0, key0 + 8};
  float dk[kDC][4], dv[kDC][4], db[2];
  bwd_ws_zero(dk, dv, db);
  const KeyInfo none[2] = {};
  if (walk.it_begin < walk.it_end) mbar::wait(Shape::kv_full(base), 0);
  bwd_ws_consume_steps<T, kHeadDim, Shape>(maps, p, base, smem, walk, group, tid, 0, none, dk, dv, db);
  if (tid == 0) tma::bulk_wait_group<0>();  // every dq reduction (and dbias store) done before the CTA exits
  bwd_ws_store_dk_dv<T>(p, walk, keys, dk, dv, 0, t);
}

// Gathered: item `item` of the plan as a walk: its group's steps (half >= 0: those of the
// group's 64-key half `half`, none if that half's keys span none of the range) over the query
// tiles of its range.
__device__ __forceinline__ BwdWsWalk bwd_ws_item_walk(const AttentionBwdParams& p, int item, int half = -1) {
  const AttentionFwdParams& f = p.f;
  const BwdWsItem it = p.ws.items[item];
  const BwdWsGroup grp = half < 0 ? p.ws.groups[it.group] : p.ws.halves[2 * it.group + half];
  const int bh = it.group / p.ws.groups_per_row;
  const int t0 = max(grp.q_begin / 64, it.range * p.ws.tiles_per_range);
  const int t1 = min(grp.q_begin / 64 + grp.q_tiles, (it.range + 1) * p.ws.tiles_per_range);
  BwdWsWalk walk;
  walk.key0 = 0, walk.b = bh / f.Hk, walk.hk = bh % f.Hk, walk.group = it.group;
  walk.q_begin = t0 * 64, walk.n_q = max(0, t1 - t0);
  walk.by_group = FastDivmod(f.G);
  walk.it_begin = 0, walk.it_end = f.G * walk.n_q;
  return walk;
}

// Gathered: the next item for this CTA, or -1: one of the lowest range `range` with any left
// (advanced past the ranges found empty; each CTA's ranges only go up).
__device__ __forceinline__ int bwd_ws_next_item(const BwdWsPlan& plan, int& range) {
  for (; range < plan.ranges; ++range) {
    const int i = atomicAdd(plan.taken + range, 1);
    if (i < plan.counts[range]) return range * plan.n_groups + i;
  }
  return -1;
}

// Gathered: one part of plan item `item` done (or skipped: no steps), for the finish kernel
// (dma/bwd_ws_finish.hpp), which waits for every part of a range and of a group.
__device__ __forceinline__ void bwd_ws_count_done(const BwdWsPlan& plan, int item) {
  const BwdWsItem it = plan.items[item];
  ptx::red_release_gpu_add(plan.range_done + it.range, 1);
  ptx::red_release_gpu_add(plan.group_done + it.group, 1);
}

// Gathered: the consumers' end of a part of plan item `item`: each group's dq reductions
// complete (its first thread's bulk groups) and every thread's dk, dv and dscores adds fenced,
// both groups met, then one thread counts the part done. The wait for the reductions costs a
// part's end what the CTA's end paid once.
__device__ __forceinline__ void bwd_ws_handout_done(const BwdWsPlan& plan, int item, int group, int tid) {
  if (tid == 0) {
    tma::bulk_wait_group<0>();
    tma::fence_proxy_async_global();
  }
  __threadfence();
  ptx::named_barrier_sync<1, 2 * kBwdThreads>();
  if (group == 0 && tid == 0) bwd_ws_count_done(plan, item);
}

// Gathered: the records of this thread's two keys (key: their indices, -1 past the hand-out's
// keys, whose records stay empty: every score -inf).
__device__ __forceinline__ void bwd_ws_row_keys(const AttentionFwdParams& f, const BwdWsWalk& walk,
                                                const int32_t (&key)[2], KeyInfo (&row_keys)[2]) {
  const KeyInfo* info = f.lists.info + (int64_t(walk.b) * f.Hk + walk.hk) * f.Sk;
#pragma unroll
  for (int r = 0; r < 2; ++r) row_keys[r] = key[r] >= 0 ? info[key[r]] : KeyInfo{};
}

// Gathered: a consumer thread's start of a hand-out: both groups done with the last one's K and
// V; gather(k, v) issues this thread's cp.async copies of the new rows from the (batch, KV
// head)'s K and V; this thread's two keys (keys[local], keys[local + 8]) and their records; the
// accumulators zeroed; then every row landed, for both groups.
template <class T, int kTiles, class Gather>
__device__ __forceinline__ void bwd_ws_start_handout(const AttentionFwdParams& f, const BwdWsWalk& walk,
                                                     const int32_t* keys, int local, Gather&& gather,
                                                     int32_t (&key)[2], KeyInfo (&row_keys)[2],
                                                     float (&dk)[kTiles][4], float (&dv)[kTiles][4], float (&db)[2]) {
  ptx::named_barrier_sync<1, 2 * kBwdThreads>();  // both groups done with the last hand-out's K and V
  gather(static_cast<const T*>(f.k) + walk.b * f.k_stride[0] + walk.hk * f.k_stride[2],
         static_cast<const T*>(f.v) + walk.b * f.v_stride[0] + walk.hk * f.v_stride[2]);
  ptx::cp_async_commit();
  key[0] = keys[local], key[1] = keys[local + 8];
  bwd_ws_row_keys(f, walk, key, row_keys);
  bwd_ws_zero(dk, dv, db);
  ptx::cp_async_wait<0>();
  wgmma::fence_proxy_async_smem();  // cp.async wrote through the generic proxy, wgmma reads through the async one
  ptx::named_barrier_sync<1, 2 * kBwdThreads>();  // every row landed (dq reads both groups' K)
}

// Gathered: this thread's two keys' dk and dv columns col0 + 8 dt + 2t (+1) and their dS sums
// db (summed over the quad here) added into the fp32 rows (the finish kernel writes them out).
template <int kTiles>
__device__ __forceinline__ void bwd_ws_add_key_rows(const AttentionBwdParams& p, const BwdWsWalk& walk,
                                                    const int32_t (&key)[2], const float (&dk)[kTiles][4],
                                                    const float (&dv)[kTiles][4], const float (&db)[2], int col0,
                                                    int t) {
  const AttentionFwdParams& f = p.f;
  const int64_t rows = (int64_t(walk.b) * f.Hk + walk.hk) * f.Sk;
  const float r0 = quad_sum(db[0]), r1 = quad_sum(db[1]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] < 0) continue;
    const int64_t row = rows + key[r];
    if (f.lists.dscores && t == 0) atomicAdd(p.dscores_partial + row, r ? r1 : r0);
    float* out = p.dkdv_partial + row * (2 * f.D) + col0;
#pragma unroll
    for (int dt = 0; dt < kTiles; ++dt) {
      const int d = dt * 8 + 2 * t;
      ptx::red_add_f32x2(out + d, dk[dt][2 * r], dk[dt][2 * r + 1]);
      ptx::red_add_f32x2(out + f.D + d, dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

// Gathered: hand-out `handout` (item * kItemParts + part) as a walk: the whole item's, or at
// kItemParts = 2 its 64-key half `part`'s.
template <class Shape>
__device__ __forceinline__ BwdWsWalk bwd_ws_handout_walk(const AttentionBwdParams& p, int handout) {
  static_assert(Shape::kItemParts == 1 || Shape::kItemParts * kBwdWsHalfKeys == kBwdWsKeys, "whole items or halves");
  return bwd_ws_item_walk(p, handout / Shape::kItemParts, Shape::kItemParts > 1 ? handout % Shape::kItemParts : -1);
}

// Gathered: the copy-issuing thread hands out the plan's items (the next of the lowest range
// left), each as Shape::kItemParts parts of its keys (at D = 256 its two halves of 64 keys, the
// CTA's, each over the part of the range its own keys span; a part with no steps is skipped),
// through the two slots as item * kItemParts + part (-1: none left), and issues each
// hand-out's copies. A skipped part counts as done here.
template <class Shape>
__device__ __forceinline__ void bwd_ws_hand_out_items(const BwdTensorMaps& maps, const AttentionBwdParams& p,
                                                      uint32_t base, unsigned char* smem) {
  tma::prefetch_map(&maps.q);
  tma::prefetch_map(&maps.dout);
  int j0 = 0, range = 0, handout = -1, zeroed = -1;
  for (int n = 0;; ++n) {
    mbar::wait(Shape::item_empty(base, n), ((n >> 1) & 1) ^ 1);  // the first pass finds both slots free
    BwdWsWalk walk;
    for (;;) {  // the next part with steps
      if (handout < 0 || (handout + 1) % Shape::kItemParts == 0) {
        const int item = bwd_ws_next_item(p.ws, range);
        handout = item < 0 ? -1 : item * Shape::kItemParts;
      } else {
        ++handout;
      }
      if (handout < 0) break;
      walk = bwd_ws_handout_walk<Shape>(p, handout);
      if (walk.it_end > walk.it_begin) break;
      bwd_ws_count_done(p.ws, handout / Shape::kItemParts);
    }
    if (handout >= 0) bwd_ws_see_dq_zeroed(p, range, zeroed);  // before the consumers reduce into it
    *Shape::item_slot(smem, n) = handout;
    mbar::arrive(Shape::item_full(base, n));  // releases the slot's write to the consumers
    if (handout < 0) break;
    bwd_ws_produce_steps<Shape>(maps, p, base, walk, j0);
    j0 += walk.it_end - walk.it_begin;
  }
}

// Gathered: one consumer group over the items the CTA takes (-1 in the slot: none left). Per
// item: both groups done with the last one's keys (dq reads both K tiles), each gathers its 64
// keys' K and V rows, both see them landed; the steps; then the keys' dk, dv and dscores added
// into the fp32 rows.
template <class T, int kHeadDim, class Shape>
__device__ __forceinline__ void bwd_ws_consume_items(const BwdTensorMaps& maps, const AttentionBwdParams& p,
                                                     uint32_t base, unsigned char* smem, int group, int tid) {
  constexpr int kDC = kHeadDim / 8;
  const AttentionFwdParams& f = p.f;
  const int t = tid % 4, local = group * Shape::kGroupKeys + 16 * (tid / 32) + (tid % 32) / 4;
  float dk[kDC][4], dv[kDC][4], db[2];
  int j0 = 0;
  for (int n = 0;; ++n) {
    mbar::wait(Shape::item_full(base, n), (n >> 1) & 1);  // the producer has handed out item n
    const int item = *Shape::item_slot(smem, n);
    mbar::arrive(Shape::item_empty(base, n));
    if (item < 0) break;
    const BwdWsWalk walk = bwd_ws_item_walk(p, item);
    const int32_t* keys = p.ws.keys + int64_t(walk.group) * kBwdWsKeys;
    const int n_keys = p.ws.groups[walk.group].n_keys;
    int32_t key[2];
    KeyInfo row_keys[2];
    bwd_ws_start_handout<T>(f, walk, keys, local, [&](const T* k, const T* v) {  // this group's 64 keys
      Shape::Mma::template load_rows_gather_pair<Shape::kGroupKeys>(
          Shape::k_tile(base, group), k, f.k_stride[1], Shape::v_tile(base, group), v, f.v_stride[1],
          keys + group * Shape::kGroupKeys, max(0, min(Shape::kGroupKeys, n_keys - group * Shape::kGroupKeys)), f.D, tid);
    }, key, row_keys, dk, dv, db);
    if (tid == 0 && p.ws.zero_done) tma::fence_proxy_async_global();  // the range's zeros, before its reductions
    bwd_ws_consume_steps<T, kHeadDim, Shape>(maps, p, base, smem, walk, group, tid, j0, row_keys, dk, dv, db);
    j0 += walk.it_end - walk.it_begin;
    bwd_ws_add_key_rows(p, walk, key, dk, dv, db, 0, t);
    bwd_ws_handout_done(p.ws, item, group, tid);
  }
}

template <class T, int kHeadDim, BwdWsKind kKind>
__global__ void __launch_bounds__(BwdWsShape<T, kHeadDim, kKind>::kThreads, 1)
    attention_bwd_ws_kernel(const AttentionBwdParams p, const __grid_constant__ BwdTensorMaps maps) {
#if FDMA_SM90_ENABLED
  using Shape = BwdWsShape<T, kHeadDim, kKind>;
  constexpr bool kGather = Shape::kGather, kMasked = Shape::kMasked;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem<1024>(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    bwd_ws_init_ring<Shape>(base);
    if constexpr (kGather) bwd_ws_init_item_slots<Shape>(base);
    mbar::fence_init();
  }
  __syncthreads();
  // The prepare's delta and lse2 (gathered: the setup launch's), the zeroed temporaries and
  // (gathered) the plan, before any read.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  const AttentionFwdParams& f = p.f;
  if constexpr (kGather) {
    if (warp < 4) {
      wgmma::regs_shrink<Shape::kProducerRegs>();
      if (warp == 0 && lane == 0) bwd_ws_hand_out_items<Shape>(maps, p, base, smem);
      if (warp > 0 && p.ws.zero_done) bwd_ws_zero_dq_sums(p, lane);
    } else {
      wgmma::regs_grow<Shape::kConsumerRegs>();
      bwd_ws_consume_items<T, kHeadDim, Shape>(maps, p, base, smem, (tid - 128) / 128, tid % 128);
    }
  } else {
    BwdWsWalk walk = bwd_ws_dense_walk<Shape>(f, Shape::kBiased && p.dbias_acc);
    const BwdWsWalk whole = walk;  // (the helper warps zero the dbias of steps the summary rules out)
    if constexpr (kMasked) {  // the walk's verdicts; none active: nothing to load or compute
      const BwdWsMaskSteps<Shape> steps(smem, f, walk);
      if (steps.tabled) {
        BwdWsMaskSteps<Shape>::build(smem, f, walk, tid, Shape::kThreads);
        __syncthreads();
      }
      if (steps.next(f, walk, walk.it_begin) >= walk.it_end) walk.it_end = walk.it_begin;
    }
    if (warp < 4) {
      wgmma::regs_shrink<Shape::kProducerRegs>();
      if (warp == 0 && lane == 0) bwd_ws_produce<Shape>(maps, p, base, smem, walk);
      if constexpr (Shape::kMaskOverBias) {
        if (warp > 0) bwd_ws_hide_masked_bias<T, Shape>(p, base, smem, whole, tid - 32);
      } else if constexpr (Shape::kBiased) {
        if (warp > 0 && p.dbias_owner == DbiasOwner::rows && !p.dbias_acc)  // (the sums start at zero)
          bwd_ws_zero_dbias_above<T, Shape>(p, walk, tid - 32);
      }
    } else {
      wgmma::regs_grow<Shape::kConsumerRegs>();
      bwd_ws_consume<T, kHeadDim, Shape>(maps, p, base, smem, walk, (tid - 128) / 128, tid % 128);
    }
  }
#else
  __trap();  // dispatch launches it only on sm_90a code (arch_dispatch.cuh)
#endif
}

// The kind of call p is (the instantiation that would take it).
inline BwdWsKind bwd_ws_kind(const AttentionFwdParams& f) {
  const bool query_bias = f.bias && f.bias_stride[2] != 0;
  return f.lists.keys   ? BwdWsKind::gathered
         : f.mask       ? (query_bias ? BwdWsKind::masked_biased : BwdWsKind::masked)
         : query_bias   ? BwdWsKind::biased
                        : BwdWsKind::dense;
}

// Whether a biased call's dbias is the kernel's to write: none asked for; one of q's dtype
// where each dS is one element, with contiguous keys (stored tile by tile); or one summed over
// batches or heads into fp32 sums (one slot, no key broadcast, rows of whole 16 bytes), which
// the copy engine adds to tile by tile.
inline bool bwd_ws_writes_dbias(const AttentionBwdParams& p) {
  if (p.dbias_owner == DbiasOwner::none) return true;
  if (p.dbias_owner != DbiasOwner::rows) return false;
  if (p.dbias_acc) return p.dbias_slots == 1 && p.dbias_size[3] == p.f.Sk && p.f.Sk % 4 == 0;
  return !p.dbias_f32 && p.rows_batches_per_block == 1 && p.rows_heads_per_block == 1 && p.dbias_stride[3] == 1;
}

// Whether the warp-specialized backward takes this call (the caller checks the device): the
// fused dq's temporary given, D = kHeadDim, and tensors the copy engine can describe (maps
// filled here). Dense: no bias, or one broadcast over queries (whose dbias, if any, the columns
// own). Masked: the summary given, rows the copy engine can read, no bias. Biased: a bias tile
// of q's dtype and a dbias bwd_ws_writes_dbias takes. Masked-biased: both. Key lists (dynamic-mask mode): also the
// fp32 dk/dv rows and the work list; no bias tensor (the scores come with the lists), no dbias.
template <class T, int kHeadDim>
bool attention_bwd_ws_applies(const AttentionBwdParams& p, BwdTensorMaps& maps) {
  const AttentionFwdParams& f = p.f;
  const BwdWsKind kind = bwd_ws_kind(f);
  if (!bwd_ws_allowed() || f.D != kHeadDim || !p.dq_acc || p.dkdv_splits > 1) return false;
  switch (kind) {
    case BwdWsKind::gathered:
      if (!p.dkdv_partial || !f.lists.info || !p.ws.items || p.ws.tiles_per_range < 1 || f.bias ||
          p.dbias_owner != DbiasOwner::none)
        return false;
      break;
    case BwdWsKind::masked:
      if (f.bias || !f.tile_active || !f.mask_tiled || p.dbias_owner != DbiasOwner::none) return false;
      break;
    case BwdWsKind::masked_biased:
      if (!f.tile_active || !f.mask_tiled) return false;
      [[fallthrough]];
    case BwdWsKind::biased:
      if (!f.bias_tiled || f.bias_f32 || !bwd_ws_writes_dbias(p)) return false;
      break;
    case BwdWsKind::dense:
      if (p.dbias_owner == DbiasOwner::rows) return false;
      break;
  }
  // 128-query steps read lse2 and delta up to Sq_pad rounded to 128 (attention_cuda.cu pads so).
  if (kind == BwdWsKind::dense && p.Sq_pad % BwdWsShape<T, kHeadDim>::kBlockM != 0) return false;
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr CUtensorMapDataType kDtype = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  using Shape = BwdWsShape<T, kHeadDim>;
  const int rows = kind == BwdWsKind::dense ? Shape::kBlockM : 64;  // a step's Q and dO box
  if (!encode_rows_map(maps.q, f.q, bf16, f.D, f.Sq, f.H, f.B, f.q_stride, rows) ||
      !encode_rows_map(maps.dout, p.dout, bf16, f.D, f.Sq, f.H, f.B, p.dout_stride, rows))
    return false;
  // (mask over bias: the boxes the copy-issuing thread prefetches into L2)
  if ((kind == BwdWsKind::masked || kind == BwdWsKind::masked_biased) && f.mask_stride[2] != 0 &&
      !encode_mask_tiles(maps.mask, f, Shape::kBlockN, rows))
    return false;
  if (kind == BwdWsKind::biased || kind == BwdWsKind::masked_biased) {
    if (!encode_bias_tiles(maps.bias, f, kDtype, rows)) return false;
    const int64_t* n = p.dbias_size;  // the fp32 sums: dense [n0][n1][Sq][Sk] (dbias_dense)
    if (p.dbias_owner == DbiasOwner::rows &&
        !(p.dbias_acc ? encode_tile_map(maps.dbias, p.dbias_acc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, f.Sk, f.Sq,
                                        int(n[1]), int(n[0]), f.Sk, int64_t(f.Sq) * f.Sk, n[1] * f.Sq * f.Sk, 32, rows,
                                        CU_TENSOR_MAP_SWIZZLE_128B)
                      : encode_tile_map(maps.dbias, p.dbias, kDtype, 2, f.Sk, f.Sq, int(n[1]), int(n[0]),
                                        p.dbias_stride[2], p.dbias_stride[1], p.dbias_stride[0], Shape::kGroupKeys,
                                        rows, CU_TENSOR_MAP_SWIZZLE_128B)))
      return false;
  }
  return kind == BwdWsKind::gathered ||
         (encode_rows_map(maps.k, f.k, bf16, f.D, f.Sk, f.Hk, f.B, f.k_stride, Shape::kGroupKeys) &&
          encode_rows_map(maps.v, f.v, bf16, f.D, f.Sk, f.Hk, f.B, f.v_stride, Shape::kGroupKeys));
}

// The instantiation for a kind of call, and its shared memory.
template <class T, int kHeadDim>
auto bwd_ws_kernel_of(BwdWsKind kind) {
  switch (kind) {
    case BwdWsKind::gathered:
      return attention_bwd_ws_kernel<T, kHeadDim, BwdWsKind::gathered>;
    case BwdWsKind::masked:
      return attention_bwd_ws_kernel<T, kHeadDim, BwdWsKind::masked>;
    case BwdWsKind::biased:
      return attention_bwd_ws_kernel<T, kHeadDim, BwdWsKind::biased>;
    case BwdWsKind::masked_biased:
      return attention_bwd_ws_kernel<T, kHeadDim, BwdWsKind::masked_biased>;
    default:
      return attention_bwd_ws_kernel<T, kHeadDim, BwdWsKind::dense>;
  }
}
template <class T, int kHeadDim>
int bwd_ws_smem_of(BwdWsKind kind) {
  switch (kind) {
    case BwdWsKind::gathered:
      return BwdWsShape<T, kHeadDim, BwdWsKind::gathered>::kSmemBytes;
    case BwdWsKind::masked:
      return BwdWsShape<T, kHeadDim, BwdWsKind::masked>::kSmemBytes;
    case BwdWsKind::biased:
      return BwdWsShape<T, kHeadDim, BwdWsKind::biased>::kSmemBytes;
    case BwdWsKind::masked_biased:
      return BwdWsShape<T, kHeadDim, BwdWsKind::masked_biased>::kSmemBytes;
    default:
      return BwdWsShape<T, kHeadDim, BwdWsKind::dense>::kSmemBytes;
  }
}

// The kernel, then the convert kernel that writes dq from the temporary. Gathered: one
// persistent CTA an SM (its shared memory allows no second); the finish kernel writes dq
// (run_gathered_backward).
template <class T, int kHeadDim>
cudaError_t launch_attention_bwd_ws(const AttentionBwdParams& p, const BwdTensorMaps& maps, int device,
                                    cudaStream_t stream) {
  const AttentionFwdParams& f = p.f;
  const BwdWsKind kind = bwd_ws_kind(f);
  const auto kernel = bwd_ws_kernel_of<T, kHeadDim>(kind);
  const int smem = bwd_ws_smem_of<T, kHeadDim>(kind);
  static std::atomic<int> granted[int(BwdWsKind::gathered) + 1][kMaxDevices] = {};  // one row a kind
  cudaError_t err = grant_smem_once(kernel, smem, device < kMaxDevices ? granted[int(kind)] : nullptr, device);
  if (err != cudaSuccess) return err;
  using Shape = BwdWsShape<T, kHeadDim>;
  const dim3 grid = kind == BwdWsKind::gathered ? dim3(unsigned(std::max(1, device_sm_count())))
                                                : dim3((f.Sk + Shape::kBlockN - 1) / Shape::kBlockN, f.Hk, f.B);
  err = launch_kernel(f.overlap_previous, kernel, grid, Shape::kThreads, smem, stream, p, maps);
  if (err != cudaSuccess || kind == BwdWsKind::gathered) return err;
  return launch_bwd_dq_convert<T>(p, kHeadDim, stream);
}

}  // namespace fdma::cuda
