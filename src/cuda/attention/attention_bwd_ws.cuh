// Warp-specialized attention backward for Hopper (sm_90a): dk, dv and the fused dq of calls
// without a mask at D = 64 and 128 that do not ask for determinism (AttentionBwdParams::dq_acc
// set), with no bias or a per-key one ([.., 1, Sk], its dbias summed per key column), whose q,
// k, v and dout the copy engine can read.
//
// One CTA = 128 keys of a (batch, KV head); it walks the G query heads of the group and their
// 64-row query tiles, as the dk/dv kernel does, but with three warp groups:
//   producer  gives most of its registers away (setmaxnreg); one thread loads K and V once,
//             then each step's Q, dO (tensor copies) and lse2, delta (bulk copies) into a ring
//             of kStages buffers, each with a "full" mbarrier the copies complete and an
//             "empty" one every consumer thread arrives on;
//   consumers two groups of 64 keys each, sharing every step's Q and dO: S^T and dP^T, the
//             scores' gradients, dv += P^T dO and dk += dS^T Q for their own keys; each stores
//             its dS half into the step's [64 queries][128 keys] tile. At D = 128, after one
//             barrier of both groups, each computes dq's 64 columns of its own over all 128
//             keys; at D = 64 (one 64-column block) each computes dS K over its own 64 keys.
//             Each adds its block into dq_acc with two bulk reductions.
// Against the dk/dv kernel's 64-key CTAs (attention_bwd_dkdv.cuh): each Q and dO tile is read
// once per 128 keys instead of once per 64, at D = 128 dq's reductions into the temporary are
// halved, and no consumer thread issues a load.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "cuda/attention/attention_bwd_common.cuh"
#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/tensor_map.hpp"
#include "cuda/primitives/tma.cuh"

namespace fdma::cuda {

// Copy-engine descriptors of q, dout (boxes of 64 columns by 64 rows of one head) and k, v
// (the same boxes: one per consumer group's 64 keys and column block).
struct BwdTensorMaps {
  CUtensorMap q, dout, k, v;
};

// Shared memory: K and V as one 64-key tile per consumer group; per stage Q, dO and the 64
// rows' lse2 and delta; two dS tiles (steps alternate); per consumer group the staging of its
// dq block (two dq_acc tiles); then the mbarriers. Every tile 1024-byte aligned (the swizzle).
template <class T, int kHeadDim>
struct BwdWsShape {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the warp-specialized backward: D = 64 or 128");
  using Mma = BwdMmaSm90<T, kHeadDim, kBwdThreads>;
  static constexpr int kBlockM = 64, kGroupKeys = 64, kConsumers = 2, kBlockN = kGroupKeys * kConsumers;
  static constexpr int kStages = 2;
  // Whether dq's column blocks are split between the groups (each over all 128 keys) or, with
  // one block, the keys (each group its own 64).
  static constexpr bool kSplitColumns = kHeadDim / 64 == kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // 24 x 128 + 240 x 256 registers fit the SM's 64 K (168 a thread at launch).
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kKeyTile = Mma::tile_bytes(kGroupKeys), kQTile = Mma::tile_bytes(kBlockM);
  static constexpr int kDsTile = kBlockM * kBlockN * 2;  // [64 queries][128 keys], a 64-key block per group
  static constexpr int kStageTile = 2 * kDqAccTileBytes;
  static constexpr int kLseDeltaBytes = 2 * kBlockM * 4;  // the step's lse2 then delta
  static constexpr int kK = 0, kV = kK + kConsumers * kKeyTile, kQ = kV + kConsumers * kKeyTile;
  static constexpr int kDo = kQ + kStages * kQTile, kDs = kDo + kStages * kQTile, kStage = kDs + 2 * kDsTile;
  static constexpr int kLseDelta = kStage + kConsumers * kStageTile, kBars = kLseDelta + kStages * kLseDeltaBytes;
  static constexpr int kNumBars = 1 + 2 * kStages;  // kv_full, then per stage full, empty
  static constexpr int kSmemBytes = align_slack<1024>() + kBars + kNumBars * 8;
  static_assert(kSmemBytes <= 227 * 1024, "fits an SM's shared memory");
  static_assert(kQTile % 1024 == 0 && kKeyTile % 1024 == 0 && kDsTile % 1024 == 0 && kStageTile % 1024 == 0,
                "tiles stay 1024-byte aligned");
  static constexpr uint32_t kStepBytes = 2 * kQTile + kLseDeltaBytes;  // a step's copies

  __device__ static uint32_t kv_full(uint32_t base) { return base + kBars; }
  __device__ static uint32_t full(uint32_t base, int s) { return base + kBars + 8 * (1 + s); }
  __device__ static uint32_t empty(uint32_t base, int s) { return base + kBars + 8 * (1 + kStages + s); }
  __device__ static uint32_t k_tile(uint32_t base, int g) { return base + kK + g * kKeyTile; }
  __device__ static uint32_t v_tile(uint32_t base, int g) { return base + kV + g * kKeyTile; }
  __device__ static uint32_t q_tile(uint32_t base, int s) { return base + kQ + s * kQTile; }
  __device__ static uint32_t do_tile(uint32_t base, int s) { return base + kDo + s * kQTile; }
  __device__ static int ds_offset(int step) { return kDs + (step & 1) * kDsTile; }
  __device__ static uint32_t stage_tile(uint32_t base, int g) { return base + kStage + g * kStageTile; }
  __device__ static int lse_delta_offset(int s) { return kLseDelta + s * kLseDeltaBytes; }
};

// The walk of a CTA: the G heads of its KV head, each over the query tiles that can see its
// keys (causal: from the first key's diagonal), head-major.
struct BwdWsWalk {
  int key0, hk, b, q_begin, n_q, n_steps;
  __device__ int head(const AttentionFwdParams& f, int i) const { return hk * f.G + i / n_q; }
  __device__ int q0(int i) const { return q_begin + (i % n_q) * 64; }
};

// The copy-issuing thread: K and V once, then per step Q, dO, lse2 and delta into the step's
// stage once the consumers have released what it held.
template <class Shape>
__device__ __forceinline__ void bwd_ws_produce(const BwdTensorMaps& maps, const AttentionBwdParams& p, uint32_t base,
                                               const BwdWsWalk& walk) {
  const AttentionFwdParams& f = p.f;
  tma::prefetch_map(&maps.q);
  tma::prefetch_map(&maps.dout);
  tma::prefetch_map(&maps.k);
  tma::prefetch_map(&maps.v);
  if (walk.n_steps == 0) return;  // the consumers wait for nothing: no copy may outlive the CTA
  constexpr int kBlock = Shape::kGroupKeys * wgmma::kSwizzleRowBytes;  // one column block of a key tile
  mbar::arrive_expect_tx(Shape::kv_full(base), 2 * Shape::kConsumers * Shape::kKeyTile);
#pragma unroll
  for (int g = 0; g < Shape::kConsumers; ++g)
#pragma unroll
    for (int c = 0; c < Shape::kColBlocks; ++c) {
      const int key = walk.key0 + g * Shape::kGroupKeys;
      tma::load_4d(Shape::k_tile(base, g) + c * kBlock, &maps.k, Shape::kv_full(base), c * 64, key, walk.hk, walk.b);
      tma::load_4d(Shape::v_tile(base, g) + c * kBlock, &maps.v, Shape::kv_full(base), c * 64, key, walk.hk, walk.b);
    }
  constexpr int kQBlock = Shape::kBlockM * wgmma::kSwizzleRowBytes;
  for (int i = 0; i < walk.n_steps; ++i) {
    const int s = i % Shape::kStages, h = walk.head(f, i), q0 = walk.q0(i);
    const uint32_t free_parity = ((i / Shape::kStages) & 1) ^ 1;  // the first pass finds every stage free
    mbar::wait(Shape::empty(base, s), free_parity);
    mbar::arrive_expect_tx(Shape::full(base, s), Shape::kStepBytes);
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

// One consumer group (`group` 0 or 1, `tid` 0..127 within it): the 64 keys walk.key0 + 64 group
// over every step, then their dk and dv rows.
template <class T, int kHeadDim, class Shape>
__device__ __forceinline__ void bwd_ws_consume(const AttentionBwdParams& p, uint32_t base, unsigned char* smem,
                                               const BwdWsWalk& walk, int group, int tid) {
  using Mma = typename Shape::Mma;
  constexpr int kBM = Shape::kBlockM, kNq = kBM / 8, kDC = kHeadDim / 8;
  const AttentionFwdParams& f = p.f;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int key0 = walk.key0 + group * Shape::kGroupKeys;
  const int keys[2] = {key0 + 16 * warp + g, key0 + 16 * warp + g + 8};
  const uint32_t k_tile = Shape::k_tile(base, group), v_tile = Shape::v_tile(base, group);
  // This group's own barrier (the other's is 2 + other; barrier 1 is both groups').
  auto sync_group = [&] {
    if (group == 0)
      ptx::named_barrier_sync<2, kBwdThreads>();
    else
      ptx::named_barrier_sync<3, kBwdThreads>();
  };
  float dk[kDC][4], dv[kDC][4];
#pragma unroll
  for (int dt = 0; dt < kDC; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  // A per-key bias: this thread's two keys' biases, read when the head changes, and their dS
  // sums over the head's queries, added into the dbias slots of (batch, KV head) as the dk/dv
  // kernel does (the first half: the groups own different keys).
  const bool key_bias = f.bias != nullptr, db_cols = p.dbias_owner == DbiasOwner::columns;
  float kb[2] = {0.f, 0.f}, db[2] = {0.f, 0.f};

  if (walk.n_steps > 0) mbar::wait(Shape::kv_full(base), 0);
  for (int i = 0; i < walk.n_steps; ++i) {
    const int s = i % Shape::kStages, h = walk.head(f, i), q0 = walk.q0(i);
    const uint32_t q_tile = Shape::q_tile(base, s), do_tile = Shape::do_tile(base, s);
    const bool head_starts = i % walk.n_q == 0, head_ends = i % walk.n_q == walk.n_q - 1;
    if (key_bias && head_starts)
      kb[0] = key_bias_at<T>(f, walk.b, h, keys[0]), kb[1] = key_bias_at<T>(f, walk.b, h, keys[1]);
    mbar::wait(Shape::full(base, s), (i / Shape::kStages) & 1);
    // S^T = K Q^T and dP^T = V dO^T: rows are this warp's 16 keys, columns the 64 queries.
    float st[kNq][4], dpt[kNq][4];
    Mma::template a_bt_pair<Shape::kGroupKeys, kBM>(st, k_tile, q_tile, dpt, v_tile, do_tile, warp, lane);
    const float* lse2 = reinterpret_cast<const float*>(smem + Shape::lse_delta_offset(s));
    const float* delta = lse2 + kBM;
    const bool interior = q0 + kBM <= f.Sq && key0 + Shape::kGroupKeys <= f.Sk &&
                          (!f.causal || key0 + 16 * warp + 15 <= q0 + f.Sk - f.Sq);
    if (interior && key_bias) {
      scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, [&](int, int e) { return kb[e >> 1]; });
    } else if (interior) {
      scores_to_p_ds_t<true>(f, st, dpt, db, lse2, delta, t, [](int, int) { return 0.f; });
    } else {  // kb is zero without a bias
      scores_to_p_ds_t(f, st, dpt, db, lse2, delta, t, [&](int nt, int e) {
        return visible_at(f, q0 + nt * 8 + 2 * t + (e & 1), keys[e >> 1]) ? kb[e >> 1] : -INFINITY;
      });
    }
    if (db_cols && head_ends) add_key_column_dbias(p, walk.b, key_column_dbias_slot(p, walk.b, walk.hk), h, 0, keys, db, t);
    if (head_ends) db[0] = db[1] = 0.f;
    // dS for dq = dS K: this group's 64-key block of the step's tile, while dpt still holds it.
    unsigned char* ds = smem + Shape::ds_offset(i);
    Mma::store_ds_t(ds + group * kBM * wgmma::kSwizzleRowBytes, dpt, warp, lane);
    // dv += P^T dO, dk += dS^T Q, left running under the barrier and dq's product below.
    uint32_t p_frag[kNq / 2][4], ds_frag[kNq / 2][4];
    Mma::template issue_regs_b_pair<kBM>(dv, st, do_tile, p_frag, dk, dpt, q_tile, ds_frag, 0);

    // dq's columns [64 group, +64) over the 128 keys, once both groups' dS is stored (D = 128),
    // or dS K over the group's own keys (D = 64); staged in the group's own tiles, whose
    // previous reductions its first thread has seen read out. (Two dS tiles: a group writes
    // step i + 2's over step i's only after passing step i + 1's barrier, which the other group
    // reaches after its dq of step i.)
    if (tid == 0) tma::bulk_wait_group_read<0>();
    wgmma::fence_proxy_async_smem();  // the dS stores, before the wgmmas read them
    float acc[8][4];
    if constexpr (Shape::kSplitColumns) {
      ptx::named_barrier_sync<1, 2 * kBwdThreads>();
      Mma::template issue_ds_times_k<Shape::kConsumers>(acc, ptx::smem_addr(ds), Shape::k_tile(base, 0), group);
    } else {
      sync_group();
      Mma::issue_ds_times_k(acc, ptx::smem_addr(ds + group * kBM * wgmma::kSwizzleRowBytes), k_tile, 0);
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(dv);
    wgmma::fence_operands(dk);
    wgmma::fence_operands(acc);
    Mma::template keep_live<kNq>(p_frag);
    Mma::template keep_live<kNq>(ds_frag);
    mbar::arrive(Shape::empty(base, s));  // this thread is done with the stage's Q, dO, lse2, delta
    const uint32_t stage = Shape::stage_tile(base, group);
    Mma::store_dq_block(stage, acc, warp, lane);
    wgmma::fence_proxy_async_smem();  // the stores, before the copy engine reads them
    sync_group();
    if (tid == 0) {
      constexpr int kBlocks = kHeadDim / kDqAccTileCols;
      const int64_t tile0 =
          ((int64_t(walk.b) * f.H + h) * (p.Sq_pad / kDqAccTileRows) + q0 / kDqAccTileRows) * kBlocks;
#pragma unroll
      for (int half = 0; half < 2; ++half)
        tma::reduce_add_f32(p.dq_acc + (tile0 + half * kBlocks + (Shape::kSplitColumns ? group : 0)) *
                                           (kDqAccTileRows * kDqAccTileCols),
                            stage + half * kDqAccTileBytes, kDqAccTileBytes);
      tma::bulk_commit_group();
    }
  }
  if (tid == 0) tma::bulk_wait_group<0>();  // every dq reduction done before the CTA exits

  T* dk_base = static_cast<T*>(p.dk) + walk.b * p.dk_stride[0] + walk.hk * p.dk_stride[2];
  T* dv_base = static_cast<T*>(p.dv) + walk.b * p.dv_stride[0] + walk.hk * p.dv_stride[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= f.Sk) continue;
#pragma unroll
    for (int dt = 0; dt < kDC; ++dt) {
      const int d = dt * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dk_base + keys[r] * p.dk_stride[1] + d) = ptx::pack2<T>(dk[dt][2 * r], dk[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv_base + keys[r] * p.dv_stride[1] + d) = ptx::pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(BwdWsShape<T, kHeadDim>::kThreads, 1)
    attention_bwd_ws_kernel(const AttentionBwdParams p, const __grid_constant__ BwdTensorMaps maps) {
#if FDMA_SM90_ENABLED
  using Shape = BwdWsShape<T, kHeadDim>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem<1024>(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    mbar::init(Shape::kv_full(base), 1);
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar::init(Shape::full(base, s), 1);
      mbar::init(Shape::empty(base, s), 128 * Shape::kConsumers);
    }
    mbar::fence_init();
  }
  __syncthreads();
  // The prepare kernel's delta and lse2, and the zeroed temporary, before any read.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  const AttentionFwdParams& f = p.f;
  // Causal: the first key groups walk the most queries, every head's first (cta_order.cuh).
  const CtaTile cta = cta_tile(f.causal);
  BwdWsWalk walk;
  walk.key0 = cta.x * Shape::kBlockN, walk.hk = cta.y, walk.b = blockIdx.z;
  walk.q_begin = f.causal ? max(0, walk.key0 - (f.Sk - f.Sq)) / Shape::kBlockM * Shape::kBlockM : 0;
  walk.n_q = walk.q_begin < f.Sq ? (f.Sq - walk.q_begin + Shape::kBlockM - 1) / Shape::kBlockM : 0;
  walk.n_steps = f.G * walk.n_q;

  if (warp < 4) {
    wgmma::regs_shrink<Shape::kProducerRegs>();
    if (warp == 0 && lane == 0) bwd_ws_produce<Shape>(maps, p, base, walk);
  } else {
    wgmma::regs_grow<Shape::kConsumerRegs>();
    bwd_ws_consume<T, kHeadDim, Shape>(p, base, smem, walk, (tid - 128) / 128, tid % 128);
  }
#else
  __trap();  // dispatch launches it only on sm_90a code (arch_dispatch.cuh)
#endif
}

// Whether the warp-specialized backward takes this call (the caller checks the device): the
// fused dq's temporary given, D = kHeadDim, no mask or key lists, no bias or one broadcast over
// queries (whose dbias, if any, the columns own), and tensors the copy engine can describe
// (maps filled here).
template <class T, int kHeadDim>
bool attention_bwd_ws_applies(const AttentionBwdParams& p, BwdTensorMaps& maps) {
  const AttentionFwdParams& f = p.f;
  if (!bwd_ws_allowed() || f.D != kHeadDim || !p.dq_acc || f.mask || f.tile_active ||
      f.lists.keys || (f.bias && f.bias_stride[2] != 0) || p.dbias_owner == DbiasOwner::rows || p.dkdv_splits > 1)
    return false;
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  using Shape = BwdWsShape<T, kHeadDim>;
  constexpr int kRows = Shape::kBlockM;
  return encode_rows_map(maps.q, f.q, bf16, f.D, f.Sq, f.H, f.B, f.q_stride, kRows) &&
         encode_rows_map(maps.dout, p.dout, bf16, f.D, f.Sq, f.H, f.B, p.dout_stride, kRows) &&
         encode_rows_map(maps.k, f.k, bf16, f.D, f.Sk, f.Hk, f.B, f.k_stride, Shape::kGroupKeys) &&
         encode_rows_map(maps.v, f.v, bf16, f.D, f.Sk, f.Hk, f.B, f.v_stride, Shape::kGroupKeys);
}

// The kernel, then the convert kernel that writes dq from the temporary.
template <class T, int kHeadDim>
cudaError_t launch_attention_bwd_ws(const AttentionBwdParams& p, const BwdTensorMaps& maps, int device,
                                    cudaStream_t stream) {
  using Shape = BwdWsShape<T, kHeadDim>;
  auto kernel = attention_bwd_ws_kernel<T, kHeadDim>;
  static std::atomic<int> granted[kMaxDevices] = {};
  cudaError_t err = grant_smem_once(kernel, Shape::kSmemBytes, device < kMaxDevices ? granted : nullptr, device);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.f.Sk + Shape::kBlockN - 1) / Shape::kBlockN, p.f.Hk, p.f.B);
  err = launch_kernel(p.f.overlap_previous, kernel, grid, Shape::kThreads, Shape::kSmemBytes, stream, p, maps);
  if (err != cudaSuccess) return err;
  return launch_bwd_dq_convert<T>(p, kHeadDim, stream);
}

}  // namespace fdma::cuda
