// The work list of the warp-specialized dynamic-mask backward (AttentionBwdParams::ws,
// attention_bwd_ws.cuh): its key groups, ranked once here instead of in every CTA that takes a
// part of one, and the (group, query range) items its persistent CTAs take in turn.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/attention/attention_bwd_params.hpp"

namespace fdma::cuda {

// Sizes of the list for B x Hk rows of Sk keys, G query heads a KV head and Sq queries: ranges
// of at least kMinRangeSteps steps (G a tile), so at most max_ranges; independent of the device.
struct BwdWsPlanShape {
  static constexpr int kMinRangeSteps = 32;
  int64_t groups = 0, max_ranges = 0;
  size_t keys_bytes() const { return size_t(groups) * kBwdWsKeys * 4; }
  size_t groups_bytes() const { return size_t(groups) * sizeof(BwdWsGroup); }
  size_t halves_bytes() const { return 2 * groups_bytes(); }
  size_t items_bytes() const { return size_t(groups * max_ranges) * sizeof(BwdWsItem); }
  // counts, taken, range_done, finish_taken, group_done [groups], zero_done, zero_next [1]
  size_t counters_bytes() const { return size_t(5 * max_ranges + groups + 1) * 4; }
};
BwdWsPlanShape bwd_ws_plan_shape(int64_t B, int64_t Hk, int64_t G, int64_t Sq, int64_t Sk);

// Query tiles a range for a call keeping `window` keys a query (f describes it) on the current
// device: an eighth of the average SM's work (G steps a tile) and what half the L2 holds of
// its dq sums, Q and dO, but at least kMinRangeSteps steps.
int bwd_ws_tiles_per_range(const AttentionFwdParams& f, int64_t window);

// Writes the list: one CTA per window of kept keys (its kBwdWsWindow / kBwdWsKeys groups).
// Reads the key lists' kept_by_end, kept_count and info; plan.counts and plan.taken must be zero.
cudaError_t bwd_ws_plan(const AttentionFwdParams& f, const BwdWsPlan& plan, cudaStream_t stream);

}  // namespace fdma::cuda
