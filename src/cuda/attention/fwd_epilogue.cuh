// The forward's epilogue, shared by its kernels: a warp's 16 rows of O normalised by their
// softmax sums, with their lse. Stored two elements at a time from registers, or laid into
// shared memory for the copy engine to store (the warp-specialized forward).
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/softmax_sm80.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// 1 / l of a finished row (0 for a row that kept nothing; a NaN l stays NaN).
__device__ __forceinline__ float output_row_inverse(float l) { return l == 0.f ? 0.f : 1.f / l; }

// Row i's lse where the caller stores it (t == 0 of its quad). With kScaledMax the running max
// is in unscaled units, m_scale times the natural ones' reciprocal (the warp-specialized
// forward's unscaled scores).
template <bool kScaledMax, int kTilesN, int kTilesD>
__device__ __forceinline__ void store_lse_row(const OnlineSoftmax<kTilesN, kTilesD>& sm, int r,
                                              const AttentionFwdParams& p, int b, int h, int i, float m_scale) {
  if (!p.lse) return;
  const float l = sm.l[r];
  p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
      l == 0.f ? -INFINITY : (kScaledMax ? sm.m[r] * m_scale : sm.m[r]) + logf(l);
}

// Rows row0 .. row0 + 15 of (b, h) (g = lane / 4, t = lane % 4); the softmax is finished
// (full row sums).
template <class T, bool kScaledMax = false, int kTilesN, int kTilesD>
__device__ __forceinline__ void store_output_rows(const float (&o)[kTilesD][4], const OnlineSoftmax<kTilesN, kTilesD>& sm,
                                                  const AttentionFwdParams& p, int b, int h, int row0, int g, int t,
                                                  float m_scale = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + g + 8 * r;
    if (i >= p.Sq) continue;
    const float inv = output_row_inverse(sm.l[r]);
    T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
#pragma unroll
    for (int dt = 0; dt < kTilesD; ++dt) {
      const int d = dt * 8 + 2 * t;
      if (d < p.D) *reinterpret_cast<uint32_t*>(out + d) = ptx::pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
    if (t == 0) store_lse_row<kScaledMax>(sm, r, p, b, h, i, m_scale);
  }
}

// The same rows laid into a shared-memory tile of `tile_rows` rows in the layout the wgmma
// forward's Q arrives in (wgmma::sw128_offset) for a copy-engine store, the warp's first row at
// tile row tile_row0; the lse stored as above. Whole rows are written: rows past Sq are the
// store's to clip. A warp's 8 rows of a 16-byte chunk land in 8 swizzled chunks: no bank
// conflicts.
template <class T, bool kScaledMax, int kTilesN, int kTilesD>
__device__ __forceinline__ void stage_output_rows_sw128(const float (&o)[kTilesD][4],
                                                        const OnlineSoftmax<kTilesN, kTilesD>& sm,
                                                        const AttentionFwdParams& p, int b, int h, int row0,
                                                        unsigned char* tile, int tile_rows, int tile_row0, int g,
                                                        int t, float m_scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int tr = tile_row0 + g + 8 * r;
    const float inv = output_row_inverse(sm.l[r]);
#pragma unroll
    for (int dt = 0; dt < kTilesD; ++dt)  // 8 columns: one 16-byte chunk, 4 bytes of it this thread's
      *reinterpret_cast<uint32_t*>(tile + wgmma::sw128_offset(tile_rows, tr, dt) + 4 * t) =
          ptx::pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    const int i = row0 + g + 8 * r;
    if (t == 0 && i < p.Sq) store_lse_row<kScaledMax>(sm, r, p, b, h, i, m_scale);
  }
}

}  // namespace fdma::cuda
