// Dynamic-mask mode: which kept keys a dk/dv CTA takes (attention_bwd_dkdv.cuh). A CTA walks
// every query that keeps any of its keys, so keys are grouped by their intervals
// (docs/performance.md, "key lists"). The warp-specialized backward groups 128 keys of windows
// of 512 the same way, a window at a time (dma/bwd_ws_plan.cu).
#pragma once

#include <climits>

#include "cuda/attention/attention_bwd_common.cuh"

namespace fdma::cuda {

// Dynamic-mask mode: the 64 keys of dk/dv CTA `x` of (b, hk). The kept keys ordered by interval
// end (lists.kept_by_end: the latest tile of ends first, then index; bwd_setup.hpp) are cut into windows of kBwdWindow;
// window x / 4 is ranked by key index (the order of the intervals' begins), so each key lands
// in exactly one group, and group x % 4 takes ranks [64 (x % 4), +64): keys whose intervals end
// close together and begin close together. Fills keys (index or -1), their KeyInfo records,
// the queries they span [q_lo, q_hi), and the group's size; returns false (uniformly) for an
// empty group.
__device__ __forceinline__ bool gather_key_group(const AttentionFwdParams& f, int b, int hk, int x, int32_t* keys,
                                                 KeyInfo* kinfo, int32_t* window, int& q_lo, int& q_hi,
                                                 int& n_group) {
  constexpr int kGroup = kBwdBlockN, kWindow = kBwdWindow;
  const int64_t bh = int64_t(b) * f.Hk + hk;
  const int kept = f.lists.kept_count[bh];
  const int w0 = x / (kWindow / kGroup) * kWindow, g0 = x % (kWindow / kGroup) * kGroup;
  const int n_window = min(kWindow, kept - w0);
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

}  // namespace fdma::cuda
