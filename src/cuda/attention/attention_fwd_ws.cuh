// Warp-specialized attention forward for Hopper (sm_90a): dense calls (no mask, no bias;
// causal and softcap allowed) at D = 64 and 128 whose q, k and v the copy engine can read.
//
// Three warp groups per CTA of 128 query rows. The producer group gives most of its registers
// away (setmaxnreg) and one of its threads issues every copy: Q once, then K and V tiles of
// 128 keys with the bulk tensor copy engine (TMA) into a ring of kStages buffers, each with a
// "full" mbarrier the copy completes and an "empty" one the consumers arrive on. The two
// consumer groups own 64 rows each and run the wgmma forward of FwdMmaSm90 (S = Q K^T, the
// softmax, O += P V) with the softmax of tile j under the P V of tile j - 1, never waiting on
// each other: no CTA-wide barrier after the start. A pair of named barriers hands the tensor
// core back and forth (ping-pong): a group issues its step's matmuls only after the other has
// issued its own, so one group's softmax runs under the other's matmuls.
//
// The other forward (attention_fwd.cuh) loads tiles with cp.async from every thread and meets
// at a CTA barrier per key tile; it stays for masks, biases, key lists and other head dims.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/cta_order.cuh"
#include "cuda/attention/fwd_mma_sm90.cuh"
#include "cuda/attention/score_mod_sm80.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/softmax_sm80.cuh"
#include "cuda/primitives/tensor_map.hpp"
#include "cuda/primitives/tile_io_sm80.cuh"
#include "cuda/primitives/tma.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// Copy-engine descriptors of q, k and v: boxes of 64 columns by 128 rows of one head.
struct FwdTensorMaps {
  CUtensorMap q, k, v;
};

// The CTA's shape and shared memory: Q, then kStages K buffers, kStages V buffers (each
// 1024-byte aligned for the swizzle), then the mbarriers.
template <class T, int kHeadDim>
struct FwdWsShape {
  using Mma = FwdMmaSm90<T, kHeadDim>;
  static constexpr int kBlockM = Mma::kBlockM, kBlockN = Mma::kBlockN;
  static constexpr int kStages = 2;
  static constexpr int kConsumers = 2;  // warp groups of 64 rows
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // 24 x 128 + 240 x 256 registers fit the SM's 64 K.
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static constexpr int kColBlocks = kHeadDim / 64;  // copies per tile: one per 128-byte column block
  static constexpr int kQ = 0, kK = kQ + Mma::kQBytes, kV = kK + kStages * Mma::kKVBytes;
  static constexpr int kBars = kV + kStages * Mma::kKVBytes;
  // q_full, then per stage k_full, k_empty, v_full, v_empty.
  static constexpr int kNumBars = 1 + 4 * kStages;
  static constexpr int kSmemBytes = align_slack<1024>() + kBars + kNumBars * 8;
  static_assert(kSmemBytes <= 227 * 1024, "fits an SM's shared memory");

  __device__ static uint32_t q_full(uint32_t base) { return base + kBars; }
  __device__ static uint32_t k_full(uint32_t base, int s) { return base + kBars + 8 * (1 + s); }
  __device__ static uint32_t k_empty(uint32_t base, int s) { return base + kBars + 8 * (1 + kStages + s); }
  __device__ static uint32_t v_full(uint32_t base, int s) { return base + kBars + 8 * (1 + 2 * kStages + s); }
  __device__ static uint32_t v_empty(uint32_t base, int s) { return base + kBars + 8 * (1 + 3 * kStages + s); }
  __device__ static uint32_t k_tile(uint32_t base, int s) { return base + kK + s * Mma::kKVBytes; }
  __device__ static uint32_t v_tile(uint32_t base, int s) { return base + kV + s * Mma::kKVBytes; }
};

// The copy-issuing thread: Q, then K(j) and V(j) for every key tile, each into its stage once
// the consumers have released what it held.
template <class Shape>
__device__ __forceinline__ void fwd_ws_produce(const FwdTensorMaps& maps, uint32_t base, int n_blocks, int row0,
                                               int h, int hk, int b) {
  using Mma = typename Shape::Mma;
  tma::prefetch_map(&maps.q);
  tma::prefetch_map(&maps.k);
  tma::prefetch_map(&maps.v);
  if (n_blocks == 0) return;  // the consumers wait for nothing: no copy may outlive the CTA
  mbar::arrive_expect_tx(Shape::q_full(base), Mma::kQBytes);
#pragma unroll
  for (int c = 0; c < Shape::kColBlocks; ++c)
    tma::load_4d(base + Shape::kQ + c * Mma::kBlockBytesQ, &maps.q, Shape::q_full(base), c * 64, row0, h, b);
  for (int j = 0; j < n_blocks; ++j) {
    const int s = j % Shape::kStages;
    const uint32_t free_parity = ((j / Shape::kStages) & 1) ^ 1;  // the first pass finds every stage free
    const int key0 = j * Shape::kBlockN;
    mbar::wait(Shape::k_empty(base, s), free_parity);
    mbar::arrive_expect_tx(Shape::k_full(base, s), Mma::kKVBytes);
#pragma unroll
    for (int c = 0; c < Shape::kColBlocks; ++c)
      tma::load_4d(Shape::k_tile(base, s) + c * Mma::kBlockBytesKV, &maps.k, Shape::k_full(base, s), c * 64, key0, hk,
                   b);
    mbar::wait(Shape::v_empty(base, s), free_parity);
    mbar::arrive_expect_tx(Shape::v_full(base, s), Mma::kKVBytes);
#pragma unroll
    for (int c = 0; c < Shape::kColBlocks; ++c)
      tma::load_4d(Shape::v_tile(base, s) + c * Mma::kBlockBytesKV, &maps.v, Shape::v_full(base, s), c * 64, key0, hk,
                   b);
  }
}

// One consumer warp group: 64 query rows against every key tile, then the epilogue.
// `warp` counts the consumer warps (0..7): group `group` holds warps 4 * group .. + 3.
template <class T, int kHeadDim, class Shape>
__device__ __forceinline__ void fwd_ws_consume(const AttentionFwdParams& p, uint32_t base, int n_blocks, int row0,
                                               int h, int b, int group, int warp, int lane) {
  using Mma = typename Shape::Mma;
  constexpr int kN = Mma::kTilesN, kDT = Mma::kTilesD;
  const int warp_row0 = row0 + Mma::warp_row_offset(warp);
  float o[1][kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[0][dt][0] = o[0][dt][1] = o[0][dt][2] = o[0][dt][3] = 0.f;
  OnlineSoftmax<kN, kDT> softmax;

  // The ping-pong: barrier 1 + g is group g's turn to issue; it takes 256 threads, its own
  // group waiting and the other arriving. Group 0 starts; each group passes the turn after
  // issuing, except group 1 after its last step, which nobody would take.
  auto take_turn = [&] {
    if (group == 0)
      ptx::named_barrier_sync<1, 256>();
    else
      ptx::named_barrier_sync<2, 256>();
  };
  auto pass_turn = [&](bool last) {
    if (group == 0)
      ptx::named_barrier_arrive<2, 256>();
    else if (!last)
      ptx::named_barrier_arrive<1, 256>();
  };
  // One arrival per consumer warp on a stage's empty barrier (initialised to 8) once this
  // warp's matmuls reading it are done.
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar::arrive(bar);
  };
  auto modify_scores = [&](float (&s)[1][kN][4], int j) {
    apply_score_mod<T, false, kN>(s[0], p, b, h, warp_row0, j * Shape::kBlockN, lane, ScoreTiles{});
  };

  if (n_blocks > 0) {
    const uint32_t s_q = base + Shape::kQ;
    typename Mma::PFrag pf;
    if (group == 1) ptx::named_barrier_arrive<1, 256>();
    mbar::wait(Shape::q_full(base), 0);
    {  // key tile 0: S only (O is zero, nothing to rescale)
      float s[1][kN][4], alpha[2];
      mbar::wait(Shape::k_full(base, 0), 0);
      take_turn();
      Mma::qk_issue(s, s_q, Shape::k_tile(base, 0), warp);
      pass_turn(n_blocks == 1);
      Mma::template wait_qk<false>(s);
      release(Shape::k_empty(base, 0));
      modify_scores(s, 0);
      softmax.scale_scores(s[0], alpha);
      Mma::pack_p(pf, s);
    }
    for (int j = 1; j < n_blocks; ++j) {
      const int s_now = j % Shape::kStages, s_prev = (j - 1) % Shape::kStages;
      float s[1][kN][4], alpha[2];
      mbar::wait(Shape::k_full(base, s_now), (j / Shape::kStages) & 1);
      mbar::wait(Shape::v_full(base, s_prev), ((j - 1) / Shape::kStages) & 1);
      take_turn();
      Mma::qk_issue(s, s_q, Shape::k_tile(base, s_now), warp);
      Mma::pv_issue(o, pf, Shape::v_tile(base, s_prev));
      pass_turn(j == n_blocks - 1);
      Mma::template wait_qk<true>(s);
      release(Shape::k_empty(base, s_now));
      modify_scores(s, j);
      softmax.scale_scores(s[0], alpha);
      Mma::wait_pv(o, pf);
      release(Shape::v_empty(base, s_prev));
      softmax.rescale(o[0], alpha);
      Mma::pack_p(pf, s);
    }
    const int last = n_blocks - 1;
    mbar::wait(Shape::v_full(base, last % Shape::kStages), (last / Shape::kStages) & 1);
    Mma::pv_issue(o, pf, Shape::v_tile(base, last % Shape::kStages));
    Mma::wait_pv(o, pf);
  }

  // Epilogue: normalise, store O (two elements per store) and lse, as the other forward.
  const int g = lane / 4, t = lane % 4;
  softmax.finish();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = warp_row0 + g + 8 * r;
    if (i >= p.Sq) continue;
    const float l = softmax.l[r];
    const float inv = l == 0.f ? 0.f : 1.f / l;
    T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<uint32_t*>(out + dt * 8 + 2 * t) = ptx::pack2<T>(o[0][dt][2 * r] * inv, o[0][dt][2 * r + 1] * inv);
    if (p.lse && t == 0)
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
          l == 0.f ? -INFINITY : softmax.m[r] + logf(l);
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(FwdWsShape<T, kHeadDim>::kThreads, 1)
    attention_fwd_ws_kernel(const AttentionFwdParams p, const __grid_constant__ FwdTensorMaps maps) {
#if FDMA_SM90_ENABLED
  using Shape = FwdWsShape<T, kHeadDim>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t base = ptx::smem_addr(aligned_smem<1024>(smem_raw));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    mbar::init(Shape::q_full(base), 1);
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar::init(Shape::k_full(base, s), 1);
      mbar::init(Shape::v_full(base, s), 1);
      mbar::init(Shape::k_empty(base, s), 4 * Shape::kConsumers);
      mbar::init(Shape::v_empty(base, s), 4 * Shape::kConsumers);
    }
    mbar::fence_init();
  }
  __syncthreads();
  ptx::griddep_wait();  // launched overlapping its predecessor: its writes (launch.cuh)

  const QueryTileCta cta = query_tile_cta(p.causal);  // causal: the longest tiles first
  const int h = cta.y, b = blockIdx.z, hk = h / p.G;
  const int row0 = cta.m_block * Shape::kBlockM;
  const int key_end = p.causal ? min(p.Sk, row0 + Shape::kBlockM + p.Sk - p.Sq) : p.Sk;
  const int n_blocks = key_end > 0 ? (key_end + Shape::kBlockN - 1) / Shape::kBlockN : 0;

  if (warp < 4) {
    wgmma::regs_shrink<Shape::kProducerRegs>();
    if (warp == 0 && lane == 0) fwd_ws_produce<Shape>(maps, base, n_blocks, row0, h, hk, b);
  } else {
    wgmma::regs_grow<Shape::kConsumerRegs>();
    const int consumer_warp = warp - 4;
    fwd_ws_consume<T, kHeadDim, Shape>(p, base, n_blocks, row0, h, b, consumer_warp / 4, consumer_warp, lane);
  }
#else
  __trap();  // dispatch launches it only on sm_90a code (arch_dispatch.cuh)
#endif
}

// Whether the warp-specialized forward takes this call: a dense call (no mask, bias or key
// lists) at exactly this head dim whose q, k and v the copy engine can describe (maps filled
// here). The caller checks the device.
template <class T, int kHeadDim>
bool attention_fwd_ws_applies(const AttentionFwdParams& p, FwdTensorMaps& maps) {
  if (p.mask || p.bias || p.lists.keys || p.D != kHeadDim || !fwd_ws_allowed()) return false;
  using Shape = FwdWsShape<T, kHeadDim>;
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  return encode_rows_map(maps.q, p.q, bf16, p.D, p.Sq, p.H, p.B, p.q_stride, Shape::kBlockM) &&
         encode_rows_map(maps.k, p.k, bf16, p.D, p.Sk, p.Hk, p.B, p.k_stride, Shape::kBlockN) &&
         encode_rows_map(maps.v, p.v, bf16, p.D, p.Sk, p.Hk, p.B, p.v_stride, Shape::kBlockN);
}

template <class T, int kHeadDim>
cudaError_t launch_attention_fwd_ws(const AttentionFwdParams& p, const FwdTensorMaps& maps, int device,
                                    cudaStream_t stream) {
  using Shape = FwdWsShape<T, kHeadDim>;
  auto kernel = attention_fwd_ws_kernel<T, kHeadDim>;
  static std::atomic<int> granted[kMaxDevices] = {};
  cudaError_t err = grant_smem_once(kernel, Shape::kSmemBytes, device < kMaxDevices ? granted : nullptr, device);
  if (err != cudaSuccess) return err;
  dim3 grid((p.Sq + Shape::kBlockM - 1) / Shape::kBlockM, p.H, p.B);
  return launch_kernel(p.overlap_previous, kernel, grid, Shape::kThreads, Shape::kSmemBytes, stream, p, maps);
}

}  // namespace fdma::cuda
