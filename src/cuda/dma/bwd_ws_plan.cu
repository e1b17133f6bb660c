#include "cuda/dma/bwd_ws_plan.hpp"

#include <algorithm>
#include <atomic>

#include "cuda/attention/bwd_key_groups.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

BwdWsPlanShape bwd_ws_plan_shape(int64_t B, int64_t Hk, int64_t G, int64_t Sq, int64_t Sk) {
  BwdWsPlanShape s;
  s.groups = B * Hk * bwd_ws_groups_per_row(Sk);
  const int64_t tiles = (Sq + 63) / 64, min_tiles = (BwdWsPlanShape::kMinRangeSteps + G - 1) / G;
  s.max_ranges = std::max<int64_t>(1, (tiles + min_tiles - 1) / min_tiles);
  return s;
}

int bwd_ws_tiles_per_range(const AttentionFwdParams& f, int64_t window) {
  // The kept pairs of a (batch, head), Sq w (causal: less the first w queries' half), over
  // 64 x 128-pair steps of which about 78% are kept pairs, spread over the SMs, and an eighth
  // of that: the few key groups that every later query keeps walk G Sq / 64 steps, and cut
  // into ranges taken by whichever CTA is free next, no SM runs one long walk alone at the end.
  // Simulated (tools/profiling/simulate_dkdv_groups.py --keys 128 --windows 512: causal top-w,
  // H16 Hk4 w2048, 16K-128K) the makespan is 1.03-1.07x the average SM's work, against
  // 1.61-1.71x for whole walks in grid order.
  const double w = double(std::min<int64_t>(std::max<int64_t>(window, 1), f.Sk)), sq = f.Sq;
  const double pairs = f.causal ? (sq >= w ? sq * w - w * w / 2 : sq * sq / 2) : sq * w;
  const double steps = double(f.B) * f.H * pairs / (64.0 * 128.0) / 0.78;
  const int64_t range_steps = int64_t(steps / (8.0 * std::max(1, device_sm_count()))) + 1;
  // And a range's dq sums (fp32) with its Q and dO tiles (bf16) in half the L2, so that the
  // range the CTAs finish and the one they start share it: 64 rows x B x H x 8 D bytes a tile.
  static std::atomic<int> l2_cache[kMaxDevices] = {};
  const int64_t l2 = cached_per_device(l2_cache, [] { return device_attribute(cudaDevAttrL2CacheSize); });
  const int64_t in_l2 = l2 / 2 / (int64_t(64) * f.B * f.H * 8 * f.D);
  const int64_t min_tiles = (BwdWsPlanShape::kMinRangeSteps + f.G - 1) / f.G;
  const int64_t tiles = std::min<int64_t>(range_steps / f.G, l2 > 0 ? in_l2 : range_steps);
  return int(std::min<int64_t>(std::max<int64_t>(min_tiles, tiles), (f.Sq + 63) / 64 + 1));
}

namespace {

__global__ void __launch_bounds__(256) bwd_ws_plan_kernel(const AttentionFwdParams f, const BwdWsPlan plan) {
  ptx::griddep_wait();  // the key lists
  ptx::griddep_launch_dependents();
  __shared__ int32_t keys[kBwdWsKeys], window[kBwdWsWindow];
  __shared__ KeyInfo info[kBwdWsKeys];
  const int x = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int64_t g = (int64_t(b) * f.Hk + hk) * plan.groups_per_row + x;
  int q_lo = 0, q_hi = 0, n_keys = 0;
  const bool any = gather_key_group<kBwdWsKeys, kBwdWsWindow>(f, b, hk, x, keys, info, window, q_lo, q_hi, n_keys);
  int32_t* out = plan.keys + g * kBwdWsKeys;
  for (int i = threadIdx.x; i < kBwdWsKeys; i += blockDim.x) out[i] = any ? keys[i] : -1;
  if (threadIdx.x != 0) return;
  BwdWsGroup group{0, 0, 0, 0};
  if (any && q_lo < q_hi) {
    group.q_begin = q_lo / 64 * 64;
    group.q_tiles = (q_hi - group.q_begin + 63) / 64;
    group.n_keys = n_keys;
  }
  plan.groups[g] = group;
  if (group.q_tiles == 0) return;
  const int t0 = group.q_begin / 64, t1 = t0 + group.q_tiles;
  for (int r = t0 / plan.tiles_per_range; r <= (t1 - 1) / plan.tiles_per_range; ++r)
    plan.items[int64_t(r) * plan.n_groups + atomicAdd(plan.counts + r, 1)] = BwdWsItem{int32_t(g), r};
}

}  // namespace

cudaError_t bwd_ws_plan(const AttentionFwdParams& f, const BwdWsPlan& plan, cudaStream_t stream) {
  const dim3 grid(unsigned(plan.groups_per_row), unsigned(f.Hk), unsigned(f.B));
  return launch_kernel(f.overlap_previous, bwd_ws_plan_kernel, grid, 256, 0, stream, f, plan);
}

}  // namespace fdma::cuda
