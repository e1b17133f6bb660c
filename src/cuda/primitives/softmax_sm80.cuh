// Online softmax over one warp's S fragments (two rows per thread, a row spread over the
// four threads of a quad). Keeps the running max m (natural units) and the thread-partial
// row sum l; rescales the output accumulators when the max moves. A row that has seen
// only -inf keeps m = -inf and contributes exact zeros, never NaN.
#pragma once

#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// |m c| past which the softmax's fused exponent fmaf(s, c, -m c) is not used (scale_scores_log2):
// its rounding then moves a row's exponents by more than 1/2.
constexpr float kFusedExponentLimit = 16777216.f;  // 2^24

template <int kTilesN, int kTilesD>
struct OnlineSoftmax {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  // Scores -> probabilities in place (unnormalised, relative to the new running max); returns
  // in alpha the factor by which output accumulators must be rescaled. Split from `rescale` so
  // the wgmma forward can run this while the previous tile's P V is still writing O. kCols:
  // the tile's n-tiles, fewer than kTilesN on a narrow last tile (attention_fwd.cuh).
  template <int kCols>
  __device__ __forceinline__ void scale_scores(float (&s)[kCols][4], float (&alpha)[2]) {
    scale_scores_log2(s, alpha, 1.4426950408889634f);
  }

  // The same where the scores are c / log2(e) times the natural ones (c = log2_scale): raw
  // q.k products with log2_scale = scale * log2(e), which saves the kernel scaling each score
  // before the softmax (the exponent's multiply-add does it). m is then in the scores' units.
  template <int kCols>
  __device__ __forceinline__ void scale_scores_log2(float (&s)[kCols][4], float (&alpha)[2], float log2_scale) {
    const float kLog2e = log2_scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kCols; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      const float m_new = fmaxf(m[r], quad_max(mx));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // all -inf so far: exp gives 0, not NaN
      alpha[r] = ptx::exp2_approx((m[r] - m_use) * kLog2e);
      m[r] = m_new;
      l[r] *= alpha[r];
      float offset = m_use * kLog2e;
      // fmaf(s, c, -m c) rounds m c once for the row: every exponent of the row moves alike by
      // at most half an ulp of m c, the order of the scores' own float rounding, while |m c|
      // stays below kFusedExponentLimit. Past it (terms near FLT_MAX, a fully masked row's
      // -FLT_MAX sentinels) the shift reaches 2^103, or m c overflows: exponents of 0 or inf for
      // the whole row. Such rows subtract m first, exact for the scores near it. The vote keeps
      // the branch warp-uniform, so the common case keeps its one multiply-add a score; one
      // vote a row, so that a row's exponents still overlap the other row's max.
      if (!__all_sync(0xffffffffu, fabsf(offset) < kFusedExponentLimit)) {
#pragma unroll
        for (int nt = 0; nt < kCols; ++nt) {
          s[nt][2 * r] -= m_use;
          s[nt][2 * r + 1] -= m_use;
        }
        offset = 0.f;
      }
#pragma unroll
      for (int nt = 0; nt < kCols; ++nt)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[nt][e] = ptx::exp2_approx(fmaf(s[nt][e], kLog2e, -offset));
          l[r] += s[nt][e];
        }
    }
  }

  __device__ __forceinline__ static void rescale(float (&o)[kTilesD][4], const float (&alpha)[2]) {
#pragma unroll
    for (int dt = 0; dt < kTilesD; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }
  }

  __device__ __forceinline__ void update(float (&s)[kTilesN][4], float (&o)[kTilesD][4]) {
    float alpha[2];
    scale_scores(s, alpha);
    rescale(o, alpha);
  }

  // Full row sums, once at the end.
  __device__ __forceinline__ void finish() {
    l[0] = quad_sum(l[0]);
    l[1] = quad_sum(l[1]);
  }
};

}  // namespace fdma::cuda
