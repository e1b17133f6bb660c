// The small kernels around the attention backward (attention_bwd.cuh):
//   prepare: per query row, delta = rowsum(dO * O) in fp32 and lse2 = lse * log2(e) (+inf for
//            a row that saw nothing, and for the padding rows up to Sq_pad), so the main
//            kernels get P = exp2(s * log2(e) - lse2) with no special cases;
//   finish:  dbias = the fp32 reduction slots summed in slot order, converted to its dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/attention_bwd_aux.hpp"
#include "cuda/score_mod_sm80.cuh"

namespace fdma::cuda {
namespace {

template <class T>
__global__ void bwd_prepare_kernel(const AttentionBwdParams p, float* delta, float* lse2) {
  const AttentionFwdParams& f = p.f;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t(f.B) * f.H * p.Sq_pad;
  if (row >= rows) return;
  const int i = int(row % p.Sq_pad), h = int(row / p.Sq_pad % f.H), b = int(row / p.Sq_pad / f.H);
  if (i >= f.Sq) {
    if (lane == 0) delta[row] = 0.f, lse2[row] = INFINITY;
    return;
  }
  const T* o = static_cast<const T*>(f.out) + b * f.out_stride[0] + i * f.out_stride[1] + h * f.out_stride[2];
  const T* d_o = static_cast<const T*>(p.dout) + b * p.dout_stride[0] + i * p.dout_stride[1] + h * p.dout_stride[2];
  float sum = 0.f;
  for (int d = lane; d < f.D; d += 32) sum += to_float(o[d]) * to_float(d_o[d]);
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    const float lse = f.lse[b * f.lse_stride[0] + h * f.lse_stride[1] + i * f.lse_stride[2]];
    delta[row] = sum;
    lse2[row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
}

template <class T>
__global__ void dbias_finish_kernel(const AttentionBwdParams p) {
  const int64_t* n = p.dbias_size;
  const int64_t numel = n[0] * n[1] * n[2] * n[3];
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= numel) return;
  float sum = 0.f;
  for (int s = 0; s < p.dbias_slots; ++s) sum += p.dbias_acc[s * numel + e];
  const int64_t j = e % n[3], i = e / n[3] % n[2], hb = e / (n[3] * n[2]) % n[1], b = e / (n[3] * n[2] * n[1]);
  const int64_t off = b * p.dbias_stride[0] + hb * p.dbias_stride[1] + i * p.dbias_stride[2] + j * p.dbias_stride[3];
  if (p.dbias_f32)
    static_cast<float*>(p.dbias)[off] = sum;
  else
    static_cast<T*>(p.dbias)[off] = T(sum);
}

}  // namespace

template <class T>
cudaError_t launch_bwd_prepare(const AttentionBwdParams& p, cudaStream_t stream) {
  const int64_t threads = int64_t(p.f.B) * p.f.H * p.Sq_pad * 32;
  bwd_prepare_kernel<T><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(p, p.delta, p.lse2);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_dbias_finish(const AttentionBwdParams& p, cudaStream_t stream) {
  const int64_t numel = p.dbias_size[0] * p.dbias_size[1] * p.dbias_size[2] * p.dbias_size[3];
  dbias_finish_kernel<T><<<unsigned((numel + 255) / 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t launch_bwd_prepare<__nv_bfloat16>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_bwd_prepare<__half>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_dbias_finish<__nv_bfloat16>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_dbias_finish<__half>(const AttentionBwdParams&, cudaStream_t);

}  // namespace fdma::cuda
