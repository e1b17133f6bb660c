// The split-K merge of the decode path: each (batch, head, query) row's partial outputs, one
// per split and each normalised with its own log-sum-exp, weighted by exp(lse_s - max).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/decode/decode_combine.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {
namespace {

// A warp per row, four rows a CTA. The merge runs after the attention's last CTA, so its time
// is latency: a lane's partials are loaded a batch of splits at a time, the first batch
// together with the LSEs (it does not depend on them) and each next one before the current
// one is added, so that no load waits on another.
constexpr int kRowsPerCta = 4;
constexpr int kBatch = 4;  // splits a lane has in flight

template <class T, int kColGroups>  // 4 columns a lane per group of 128 (head dims up to 128 or 256)
__global__ void __launch_bounds__(32 * kRowsPerCta) decode_combine_kernel(DecodeAttentionArgs a, int rows) {
  ptx::griddep_wait();  // the attention's partials
  const int lane = threadIdx.x % 32;
  const int qrow = blockIdx.x * kRowsPerCta + threadIdx.x / 32;  // ((b * H + h) * Sq + i)
  if (qrow >= rows) return;
  const int i = qrow % a.Sq, bh = qrow / a.Sq, h = bh % a.H, b = bh / a.H;
  const float* lse = a.part_lse + size_t(qrow) * a.splits;
  const float* part = a.part_out + size_t(qrow) * a.splits * a.D;
  auto load_batch = [&](int first, float4 (&dst)[kBatch][kColGroups]) {
#pragma unroll
    for (int s = 0; s < kBatch; ++s)
#pragma unroll
      for (int c = 0; c < kColGroups; ++c) {
        const int col = 4 * lane + 128 * c;  // D is a multiple of 8
        dst[s][c] = first + s < a.splits && col < a.D
                        ? *reinterpret_cast<const float4*>(part + size_t(first + s) * a.D + col)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
      }
  };
  float4 cur[kBatch][kColGroups];
  load_batch(0, cur);
  // The splits' maximum LSE, NaN flag and weight sum over the warp (a lane per split).
  float M = -INFINITY;
  bool nan = false;
  for (int s = lane; s < a.splits; s += 32) {
    const float x = lse[s];
    nan |= isnan(x);
    M = fmaxf(M, x);
  }
  nan = __any_sync(0xffffffffu, nan);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
  const bool empty = nan || M == -INFINITY;
  float denom = 0.f;
  if (!empty)
    for (int s = lane; s < a.splits; s += 32) denom += __expf(lse[s] - M);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) denom += __shfl_xor_sync(0xffffffffu, denom, off);

  float4 acc[kColGroups];
#pragma unroll
  for (int c = 0; c < kColGroups; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (!empty) {
    for (int first = 0; first < a.splits; first += kBatch) {
      float4 next[kBatch][kColGroups];
      if (first + kBatch < a.splits) load_batch(first + kBatch, next);
#pragma unroll
      for (int s = 0; s < kBatch; ++s) {
        if (first + s >= a.splits) break;
        // A split without kept keys has weight 0 and a partial never written: skipped, not 0 * x.
        const float w = __expf(lse[first + s] - M);
        if (w > 0.f)
#pragma unroll
          for (int c = 0; c < kColGroups; ++c) {
            const float4 p = cur[s][c];
            acc[c].x += w * p.x, acc[c].y += w * p.y, acc[c].z += w * p.z, acc[c].w += w * p.w;
          }
      }
#pragma unroll
      for (int s = 0; s < kBatch; ++s)
#pragma unroll
        for (int c = 0; c < kColGroups; ++c) cur[s][c] = next[s][c];
    }
  }
  T* out = static_cast<T*>(a.out) + b * a.out_stride[0] + i * a.out_stride[1] + h * a.out_stride[2];
#pragma unroll
  for (int c = 0; c < kColGroups; ++c) {
    const int col = 4 * lane + 128 * c;
    if (col >= a.D) continue;
    const float v[4] = {acc[c].x, acc[c].y, acc[c].z, acc[c].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) out[col + e] = T(nan ? NAN : empty ? 0.f : v[e] / denom);
  }
  if (a.lse && lane == 0)
    a.lse[b * a.lse_stride[0] + h * a.lse_stride[1] + i * a.lse_stride[2]] =
        nan ? NAN : M == -INFINITY ? -INFINITY : M + logf(denom);
}

}  // namespace

cudaError_t run_decode_combine(const DecodeAttentionArgs& a, int rows, bool bf16, cudaStream_t stream, bool overlap) {
  const bool wide = a.D > 128;
  const auto kernel = bf16 ? (wide ? decode_combine_kernel<__nv_bfloat16, 2> : decode_combine_kernel<__nv_bfloat16, 1>)
                           : (wide ? decode_combine_kernel<__half, 2> : decode_combine_kernel<__half, 1>);
  return launch_kernel(overlap, kernel, dim3(unsigned((rows + kRowsPerCta - 1) / kRowsPerCta)),
                       dim3(32 * kRowsPerCta), 0, stream, a, rows);
}

}  // namespace fdma::cuda
