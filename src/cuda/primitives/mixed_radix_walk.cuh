// MixedRadixWalk: the coordinates of a grid-strided loop's elements over an index space
// [outer][mid][inner] (inner fastest), advanced by the loop's fixed stride with no division a
// step: the stride's own digits are found once, then each step adds them digit by digit with
// carries. For loops whose body needs its element's coordinates (the backward's prepare: batch,
// head, query row), where a 64-bit division a step costs a chain of instructions and registers.
#pragma once

#include <cstdint>

#include "cuda/primitives/host_device.cuh"

namespace fdma::cuda {

struct MixedRadixWalk {
  int64_t outer;  // the walk is over once it reaches the space's outer extent
  int mid, inner;
  int64_t step_outer;
  int step_mid, step_inner;
  int n_mid, n_inner;

  MixedRadixWalk() = default;
  // The element at linear index `first` of a space with n_mid x n_inner elements an outer index
  // (both > 0), stepping by `stride` > 0 elements.
  FDMA_HOST_DEVICE MixedRadixWalk(int64_t first, int64_t stride, int n_mid_, int n_inner_)
      : n_mid(n_mid_), n_inner(n_inner_) {
    outer = first / n_inner / n_mid;
    mid = int(first / n_inner % n_mid);
    inner = int(first % n_inner);
    step_outer = stride / n_inner / n_mid;
    step_mid = int(stride / n_inner % n_mid);
    step_inner = int(stride % n_inner);
  }

  // The next element: a digit plus its step and a carry stays below twice its extent, so one
  // subtraction renormalises it (summed unsigned: extents up to 2^31 - 1 do not overflow).
  FDMA_HOST_DEVICE void advance() {
    uint32_t i = uint32_t(inner) + uint32_t(step_inner);
    const bool carry_inner = i >= uint32_t(n_inner);
    inner = int(carry_inner ? i - uint32_t(n_inner) : i);
    uint32_t m = uint32_t(mid) + uint32_t(step_mid) + (carry_inner ? 1u : 0u);
    const bool carry_mid = m >= uint32_t(n_mid);
    mid = int(carry_mid ? m - uint32_t(n_mid) : m);
    outer += step_outer + (carry_mid ? 1 : 0);
  }
};

}  // namespace fdma::cuda
