// The small kernels around the attention backward (attention_bwd.cuh):
//   prepare: per query row, delta = rowsum(dO * O) in fp32 and lse2 = lse * log2(e) (+inf for
//            a row that saw nothing, and for the padding rows up to Sq_pad), so the main
//            kernels get P = exp2(s * log2(e) - lse2) with no special cases (rows whose lse is
//            too large for that: +inf where dO is all zeros, else NaN);
//   finish:  dbias = the fp32 reduction slots summed in slot order, converted to its dtype;
//   convert: dq from the fused backward's fp32 sums.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "cuda/attention/attention_bwd_aux.hpp"
#include "cuda/attention/bwd_prepare_row.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/softmax_sm80.cuh"
#include "cuda/attention/score_mod_sm80.cuh"

namespace fdma::cuda {
namespace {

// Rows from blockIdx.x and the thread, heads and batches from the grid's y and z, with no
// 64-bit division per row. At 16K tokens, H = 16 (128 MB read, ncu): 87.6 us with a warp per
// row, 2-byte loads and three 64-bit divisions per row; 58.7 us (2.3 TB/s) with 16 lanes a row
// (bwd_prepare_row.cuh). Eight rows per group took 63.7 us, and groups walking (query, head)
// pairs in memory order 70.8 us.
constexpr int kPrepareThreads = 256, kPrepareRowsPerBlock = kPrepareThreads / kPrepareLanes;

template <class T>
__global__ void __launch_bounds__(kPrepareThreads) bwd_prepare_kernel(const BwdPrepareRows p) {
  ptx::griddep_wait();  // launched overlapping (launch.cuh): out, dout and the lists' zeroing first
  ptx::griddep_launch_dependents();
  const int sub = threadIdx.x % kPrepareLanes;
  const int i = blockIdx.x * kPrepareRowsPerBlock + threadIdx.x / kPrepareLanes;
  if (i >= p.Sq_pad) return;  // whole row groups: the shuffles see whole groups
  const uint32_t group = 0xffffu << (threadIdx.x % 32 / kPrepareLanes * kPrepareLanes);
  for (int b = blockIdx.z; b < p.B; b += gridDim.z)  // loops only past 65535 batches or heads
    for (int h = blockIdx.y; h < p.H; h += gridDim.y) prepare_row<T>(p, b, h, i, sub, group);
}

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

// Eight elements of one row a thread (D % 8 == 0, rows 16-byte aligned: validated); rows of
// a (batch, head) from blockIdx.x, heads and batches from the grid's y and z.
constexpr int kConvertThreads = 256;

template <class T>
__global__ void __launch_bounds__(kConvertThreads) bwd_dq_convert_kernel(const AttentionBwdParams p, int cols) {
  ptx::griddep_wait();  // the dk/dv kernel's sums
  ptx::griddep_launch_dependents();
  const AttentionFwdParams& f = p.f;
  const int per_row = f.D / 8;
  const int64_t e = int64_t(blockIdx.x) * kConvertThreads + threadIdx.x;
  if (e >= int64_t(f.Sq) * per_row) return;
  const int i = int(e / per_row), d = int(e % per_row) * 8;
  for (int b = blockIdx.z; b < f.B; b += gridDim.z)
    for (int h = blockIdx.y; h < f.H; h += gridDim.y) {
      // 8 columns from a multiple of 8: contiguous in the tiles (the swizzle moves groups of 4 pairs)
      const float* acc = p.dq_acc + dq_acc_offset(int64_t(b) * f.H + h, i, d, p.Sq_pad, cols);
      const float4 lo = *reinterpret_cast<const float4*>(acc), hi = *reinterpret_cast<const float4*>(acc + 4);
      const uint4 out = make_uint4(ptx::pack2<T>(lo.x, lo.y), ptx::pack2<T>(lo.z, lo.w), ptx::pack2<T>(hi.x, hi.y),
                                   ptx::pack2<T>(hi.z, hi.w));
      *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] +
                                d) = out;
    }
}

}  // namespace

template <class T>
cudaError_t launch_bwd_dq_convert(const AttentionBwdParams& p, int cols, cudaStream_t stream) {
  const int64_t n = int64_t(p.f.Sq) * (p.f.D / 8);
  const dim3 grid(unsigned((n + kConvertThreads - 1) / kConvertThreads), unsigned(std::min(p.f.H, 65535)),
                  unsigned(std::min(p.f.B, 65535)));
  return launch_kernel(p.f.overlap_previous, bwd_dq_convert_kernel<T>, grid, kConvertThreads, 0, stream, p, cols);
}

template <class T>
cudaError_t launch_bwd_prepare(const AttentionBwdParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned((p.Sq_pad + kPrepareRowsPerBlock - 1) / kPrepareRowsPerBlock), unsigned(std::min(p.f.H, 65535)),
                  unsigned(std::min(p.f.B, 65535)));
  return launch_kernel(p.f.overlap_previous, bwd_prepare_kernel<T>, grid, kPrepareThreads, 0, stream,
                       bwd_prepare_rows(p, std::is_same_v<T, __nv_bfloat16>));
}

template <class T>
cudaError_t launch_dbias_finish(const AttentionBwdParams& p, cudaStream_t stream) {
  const int64_t numel = p.dbias_size[0] * p.dbias_size[1] * p.dbias_size[2] * p.dbias_size[3];
  return launch_kernel(p.f.overlap_previous, dbias_finish_kernel<T>, unsigned((numel + 255) / 256), 256, 0, stream, p);
}

template cudaError_t launch_bwd_prepare<__nv_bfloat16>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_bwd_prepare<__half>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_dbias_finish<__nv_bfloat16>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_dbias_finish<__half>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_bwd_dq_convert<__nv_bfloat16>(const AttentionBwdParams&, int, cudaStream_t);
template cudaError_t launch_bwd_dq_convert<__half>(const AttentionBwdParams&, int, cudaStream_t);

}  // namespace fdma::cuda
