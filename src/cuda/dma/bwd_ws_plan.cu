#include "cuda/dma/bwd_ws_plan.hpp"

#include <algorithm>
#include <climits>

#include "cuda/attention/attention_fwd_params.hpp"
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
  const int64_t l2 = device_l2_bytes();
  const int64_t in_l2 = l2 / 2 / (int64_t(64) * f.B * f.H * 8 * f.D);
  const int64_t min_tiles = (BwdWsPlanShape::kMinRangeSteps + f.G - 1) / f.G;
  const int64_t tiles = std::min<int64_t>(range_steps / f.G, l2 > 0 ? in_l2 : range_steps);
  return int(std::min<int64_t>(std::max<int64_t>(min_tiles, tiles), (f.Sq + 63) / 64 + 1));
}

namespace {

// The record of n_keys keys whose intervals span queries [lo, hi): whole 64-row tiles; none
// (all zero) where there are no keys or no queries.
__device__ __forceinline__ BwdWsGroup span_record(int lo, int hi, int n_keys) {
  BwdWsGroup r{0, 0, 0, 0};
  if (n_keys > 0 && lo < hi) r.q_begin = lo / 64 * 64, r.q_tiles = (hi - r.q_begin + 63) / 64, r.n_keys = n_keys;
  return r;
}

constexpr int kGroupsPerWindow = kBwdWsWindow / kBwdWsKeys, kHalvesPerWindow = 2 * kGroupsPerWindow;

// One CTA per window of kBwdWsWindow kept keys of a (batch, KV head), a thread per key: the
// grouping of gather_key_group (bwd_key_groups.cuh) for the window's groups at once. Keys in
// order of interval end (by tile, latest first; bwd_setup.hpp) are cut into windows; a key's rank in its window is the
// number of the window's keys with a lower index, and group rank / kBwdWsKeys of the window
// holds it at place rank % kBwdWsKeys; a 64-key half's query range is the min and max of its
// keys' intervals, a group's the union of its halves'. (A CTA per group, each ranking the whole
// window to keep a quarter of it, took 46 us at 16K, H16 Hk4 w2048.)
__global__ void __launch_bounds__(kBwdWsWindow) bwd_ws_plan_kernel(const AttentionFwdParams f, const BwdWsPlan plan) {
  ptx::griddep_wait();  // the key lists
  ptx::griddep_launch_dependents();
  __shared__ __align__(16) int32_t window[kBwdWsWindow];
  __shared__ int h_lo[kHalvesPerWindow], h_hi[kHalvesPerWindow];
  __shared__ BwdWsGroup groups[kGroupsPerWindow];
  const int t = threadIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * f.Hk + hk;
  const int64_t g0 = bh * plan.groups_per_row + int64_t(blockIdx.x) * kGroupsPerWindow;  // the window's first group
  const int w0 = blockIdx.x * kBwdWsWindow, n_window = max(0, min(kBwdWsWindow, f.lists.kept_count[bh] - w0));
  // Whole 16-byte reads below: padded with INT_MAX, which no key index reaches.
  window[t] = t < n_window ? f.lists.kept_by_end[bh * f.Sk + w0 + t] : INT_MAX;
  if (t < kHalvesPerWindow) h_lo[t] = INT_MAX, h_hi[t] = INT_MIN;
  __syncthreads();
  int32_t* keys = plan.keys + g0 * kBwdWsKeys;  // the window's groups' keys, contiguous
  if (t < n_window) {
    const int mine = window[t];
    int rank = 0;
    for (int o = 0; o < n_window; o += 4) {
      const int4 w4 = *reinterpret_cast<const int4*>(window + o);
      rank += (w4.x < mine) + (w4.y < mine) + (w4.z < mine) + (w4.w < mine);
    }
    const KeyInfo ki = f.lists.info[bh * f.Sk + mine];
    keys[rank] = mine;
    atomicMin(&h_lo[rank / kBwdWsHalfKeys], ki.begin);  // integer min/max: the same in any order
    atomicMax(&h_hi[rank / kBwdWsHalfKeys], ki.end);
  } else {
    keys[t] = -1;  // ranks n_window.. hold no key
  }
  __syncthreads();
  if (t < kGroupsPerWindow) {
    const BwdWsGroup group = span_record(min(h_lo[2 * t], h_lo[2 * t + 1]), max(h_hi[2 * t], h_hi[2 * t + 1]),
                                         max(0, min(kBwdWsKeys, n_window - t * kBwdWsKeys)));
    groups[t] = group;
    plan.groups[g0 + t] = group;
  }
  if (t < kHalvesPerWindow)
    plan.halves[2 * g0 + t] = span_record(h_lo[t], h_hi[t], max(0, min(kBwdWsHalfKeys, n_window - t * kBwdWsHalfKeys)));
  __syncthreads();
  // The items: thread t takes group t % 4's ranges t / 4, t / 4 + 128, ...
  const BwdWsGroup group = groups[t % kGroupsPerWindow];
  if (group.q_tiles == 0) return;
  const BwdWsRanges ranges = bwd_ws_group_ranges(group, plan.tiles_per_range);
  for (int r = ranges.first + t / kGroupsPerWindow; r <= ranges.last; r += kBwdWsWindow / kGroupsPerWindow)
    plan.items[int64_t(r) * plan.n_groups + atomicAdd(plan.counts + r, 1)] =
        BwdWsItem{int32_t(g0 + t % kGroupsPerWindow), r};
}

}  // namespace

cudaError_t bwd_ws_plan(const AttentionFwdParams& f, const BwdWsPlan& plan, cudaStream_t stream) {
  const dim3 grid(unsigned(plan.groups_per_row / kGroupsPerWindow), unsigned(f.Hk), unsigned(f.B));
  return launch_kernel(f.overlap_previous, bwd_ws_plan_kernel, grid, kBwdWsWindow, 0, stream, f, plan);
}

}  // namespace fdma::cuda
