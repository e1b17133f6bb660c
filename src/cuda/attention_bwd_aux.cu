// The small kernels around the attention backward (attention_bwd.cuh):
//   prepare: per query row, delta = rowsum(dO * O) in fp32 and lse2 = lse * log2(e) (+inf for
//            a row that saw nothing, and for the padding rows up to Sq_pad), so the main
//            kernels get P = exp2(s * log2(e) - lse2) with no special cases;
//   finish:  dbias = the fp32 reduction slots summed in slot order, converted to its dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_bwd_aux.hpp"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"
#include "cuda/score_mod_sm80.cuh"

namespace fdma::cuda {
namespace {

// Sum of the 8 products of two 16-byte vectors of bf16/fp16, in fp32.
template <class T>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // a bf16 is the top half of an fp32
      sum += __uint_as_float(x[k] << 16) * __uint_as_float(y[k] << 16);
      sum += __uint_as_float(x[k] & 0xffff0000u) * __uint_as_float(y[k] & 0xffff0000u);
    } else {
      const float2 u = __half22float2(*reinterpret_cast<const __half2*>(&x[k]));
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&y[k]));
      sum += u.x * v.x + u.y * v.y;
    }
  }
  return sum;
}

// kPrepareLanes lanes per query row, each taking 16-byte pieces of O and dO (rows are 16-byte
// aligned and D % 8 == 0: validated). A CTA takes kPrepareRowsPerBlock rows of one (batch,
// head): a work item, of which there are Sq_pad / kPrepareRowsPerBlock * H * B, in a grid-stride
// loop that loads kItems items' rows before reducing any, so that a grid of a few CTAs per SM
// (beside the list kernels) still keeps enough loads in flight; kItems = 1 with a CTA per item.
// At 16K tokens, H = 16 (128 MB read, ncu): 87.6 us with a warp per row, 2-byte loads and three
// 64-bit divisions per row; 58.7 us (2.3 TB/s) with a CTA per item. Eight rows per group took
// 63.7 us, and groups walking (query, head) pairs in memory order 70.8 us.
constexpr int kPrepareLanes = 16, kPrepareThreads = 256, kPrepareRowsPerBlock = kPrepareThreads / kPrepareLanes;
constexpr int kPrepareItemsBeside = 4;

// wait_late: launched beside the dynamic-mask backward's list kernels (dma_cuda.cu), whose
// inputs it does not touch; its own (out, dout, lse) were complete before the lists' plain CUB
// launches. So it lets its dependents in first and waits for its predecessor only at its end
// (every CTA: they are all resident, a few per SM).
template <class T, int kItems>
__global__ void __launch_bounds__(kPrepareThreads) bwd_prepare_kernel(const AttentionBwdParams p, float* delta,
                                                                      float* lse2, bool wait_late) {
  if (!wait_late) ptx::griddep_wait();  // launched overlapping (launch.cuh): out, dout first
  ptx::griddep_launch_dependents();
  const AttentionFwdParams& f = p.f;
  const int sub = threadIdx.x % kPrepareLanes, row_in_block = threadIdx.x / kPrepareLanes;
  const uint32_t group = 0xffffu << (threadIdx.x % 32 / kPrepareLanes * kPrepareLanes);
  const int row_blocks = p.Sq_pad / kPrepareRowsPerBlock;  // Sq_pad: a multiple of 64
  const int64_t items = int64_t(row_blocks) * f.H * f.B, stride = gridDim.x;
  for (int64_t first = blockIdx.x; first < items; first += kItems * stride) {
    float sum[kItems];
    int64_t row[kItems];
    float lse[kItems];
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int64_t item = first + u * stride;
      sum[u] = 0.f, row[u] = -1, lse[u] = -INFINITY;
      if (item >= items) continue;
      const int64_t bh = item / row_blocks;
      const int h = int(bh % f.H), b = int(bh / f.H);
      const int i = int(item % row_blocks) * kPrepareRowsPerBlock + row_in_block;
      row[u] = bh * p.Sq_pad + i;
      if (i >= f.Sq) continue;
      const T* o = static_cast<const T*>(f.out) + b * f.out_stride[0] + i * f.out_stride[1] + h * f.out_stride[2];
      const T* d_o = static_cast<const T*>(p.dout) + b * p.dout_stride[0] + i * p.dout_stride[1] + h * p.dout_stride[2];
      for (int d = sub * 8; d < f.D; d += kPrepareLanes * 8)
        sum[u] += dot8<T>(__ldg(reinterpret_cast<const uint4*>(o + d)), __ldg(reinterpret_cast<const uint4*>(d_o + d)));
      if (sub == 0) lse[u] = f.lse[b * f.lse_stride[0] + h * f.lse_stride[1] + i * f.lse_stride[2]];
    }
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
#pragma unroll
      for (int off = kPrepareLanes / 2; off >= 1; off /= 2) sum[u] += __shfl_xor_sync(group, sum[u], off);
      if (sub == 0 && row[u] >= 0) {  // rows past Sq: delta 0 and lse2 +inf
        delta[row[u]] = sum[u];
        lse2[row[u]] = lse[u] == -INFINITY ? INFINITY : lse[u] * 1.4426950408889634f;
      }
    }
  }
  if (wait_late) ptx::griddep_wait();
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

}  // namespace

template <class T>
cudaError_t launch_bwd_prepare(const AttentionBwdParams& p, cudaStream_t stream, bool beside) {
  // A CTA per item unless beside (each CTA's first item then its only one).
  const int64_t items = int64_t(p.Sq_pad / kPrepareRowsPerBlock) * p.f.H * p.f.B;
  int64_t ctas = items;
  if (beside) {
    // Every CTA resident at once, so that the kernels after it can start (they need all of its
    // CTAs to have let them in), with room beside it for theirs: two CTAs per SM.
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    ctas = std::min<int64_t>(ctas, 2 * int64_t(sms));
  }
  ctas = std::max<int64_t>(1, std::min<int64_t>(ctas, INT32_MAX));
  auto kernel = beside ? bwd_prepare_kernel<T, kPrepareItemsBeside> : bwd_prepare_kernel<T, 1>;
  return launch_kernel(p.f.overlap_previous, kernel, unsigned(ctas), kPrepareThreads, 0, stream, p, p.delta, p.lse2, beside);
}

template <class T>
cudaError_t launch_dbias_finish(const AttentionBwdParams& p, cudaStream_t stream) {
  const int64_t numel = p.dbias_size[0] * p.dbias_size[1] * p.dbias_size[2] * p.dbias_size[3];
  return launch_kernel(p.f.overlap_previous, dbias_finish_kernel<T>, unsigned((numel + 255) / 256), 256, 0, stream, p);
}

template cudaError_t launch_bwd_prepare<__nv_bfloat16>(const AttentionBwdParams&, cudaStream_t, bool);
template cudaError_t launch_bwd_prepare<__half>(const AttentionBwdParams&, cudaStream_t, bool);
template cudaError_t launch_dbias_finish<__nv_bfloat16>(const AttentionBwdParams&, cudaStream_t);
template cudaError_t launch_dbias_finish<__half>(const AttentionBwdParams&, cudaStream_t);

}  // namespace fdma::cuda
