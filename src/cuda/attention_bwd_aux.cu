// The small kernel after the attention backward (attention_bwd.cuh): dbias = the fp32 reduction
// slots summed in slot order, converted to its dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/attention_bwd_aux.hpp"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace fdma::cuda {
namespace {

template <class T>
__global__ void dbias_finish_kernel(const AttentionBwdParams p) {
  ptx::griddep_wait();  // the dq and dk/dv kernels' slots
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
cudaError_t launch_dbias_finish(const AttentionBwdParams& p, cudaStream_t stream) {
  const int64_t numel = p.dbias_size[0] * p.dbias_size[1] * p.dbias_size[2] * p.dbias_size[3];
  return launch_kernel(p.f.overlap_previous, dbias_finish_kernel<T>, unsigned((numel + 255) / 256), 256, 0, stream, p);
}

template cudaError_t launch_dbias_finish<__nv_bfloat16>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_dbias_finish<__half>(const AttentionBwdParams&, cudaStream_t);

}  // namespace fdma::cuda
