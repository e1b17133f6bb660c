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

template <class T>
__global__ void __launch_bounds__(128) decode_combine_kernel(DecodeAttentionArgs a) {
  ptx::griddep_wait();  // the attention's partials
  const int qrow = blockIdx.x;  // ((b * H + h) * Sq + i)
  const int i = qrow % a.Sq, bh = qrow / a.Sq, h = bh % a.H, b = bh / a.H;
  const float* lse = a.part_lse + size_t(qrow) * a.splits;
  float M = -INFINITY;
  bool nan = false;
  for (int s = 0; s < a.splits; ++s) {
    const float x = lse[s];
    nan |= isnan(x);
    M = fmaxf(M, x);
  }
  float denom = 0.f;
  if (!nan && M != -INFINITY)
    for (int s = 0; s < a.splits; ++s) denom += __expf(lse[s] - M);
  T* out = static_cast<T*>(a.out) + b * a.out_stride[0] + i * a.out_stride[1] + h * a.out_stride[2];
  const float* part = a.part_out + size_t(qrow) * a.splits * a.D;
  for (int col = threadIdx.x; col < a.D; col += blockDim.x) {
    float acc = 0.f;
    if (nan) {
      acc = NAN;
    } else if (M != -INFINITY) {
      for (int s = 0; s < a.splits; ++s) {
        const float w = __expf(lse[s] - M);
        if (w > 0.f) acc += w * part[size_t(s) * a.D + col];
      }
      acc /= denom;
    }
    out[col] = T(acc);
  }
  if (a.lse && threadIdx.x == 0)
    a.lse[b * a.lse_stride[0] + h * a.lse_stride[1] + i * a.lse_stride[2]] =
        nan ? NAN : M == -INFINITY ? -INFINITY : M + logf(denom);
}

}  // namespace

cudaError_t run_decode_combine(const DecodeAttentionArgs& a, int rows, bool bf16, cudaStream_t stream, bool overlap) {
  const auto kernel = bf16 ? decode_combine_kernel<__nv_bfloat16> : decode_combine_kernel<__half>;
  return launch_kernel(overlap, kernel, dim3(unsigned(rows)), dim3(128), 0, stream, a);
}

}  // namespace fdma::cuda
