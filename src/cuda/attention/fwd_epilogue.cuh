// The forward's epilogue, shared by its kernels: a warp's 16 rows of O normalised by their
// softmax sums and stored two elements at a time, with their lse.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/softmax_sm80.cuh"

namespace fdma::cuda {

// Rows row0 .. row0 + 15 of (b, h) (g = lane / 4, t = lane % 4); the softmax is finished
// (full row sums). With kScaledMax the running max is in unscaled units, m_scale times the
// natural ones' reciprocal (the warp-specialized forward's unscaled scores).
template <class T, bool kScaledMax = false, int kTilesN, int kTilesD>
__device__ __forceinline__ void store_output_rows(const float (&o)[kTilesD][4], const OnlineSoftmax<kTilesN, kTilesD>& sm,
                                                  const AttentionFwdParams& p, int b, int h, int row0, int g, int t,
                                                  float m_scale = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + g + 8 * r;
    if (i >= p.Sq) continue;
    const float l = sm.l[r];
    const float inv = l == 0.f ? 0.f : 1.f / l;  // a NaN l stays NaN
    T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
#pragma unroll
    for (int dt = 0; dt < kTilesD; ++dt) {
      const int d = dt * 8 + 2 * t;
      if (d < p.D) *reinterpret_cast<uint32_t*>(out + d) = ptx::pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
    if (p.lse && t == 0)
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
          l == 0.f ? -INFINITY : (kScaledMax ? sm.m[r] * m_scale : sm.m[r]) + logf(l);
  }
}

}  // namespace fdma::cuda
