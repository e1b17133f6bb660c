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
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/softmax_sm80.cuh"
#include "cuda/attention/score_mod_sm80.cuh"

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
// aligned and D % 8 == 0: validated); rows from blockIdx.x and the thread, heads and batches
// from the grid's y and z, with no 64-bit division per row. At 16K tokens, H = 16 (128 MB
// read, ncu): 87.6 us with a warp per row, 2-byte loads and three 64-bit divisions per row;
// 58.7 us (2.3 TB/s) here. Eight rows per group took 63.7 us, and groups walking (query, head)
// pairs in memory order 70.8 us.
constexpr int kPrepareLanes = 16, kPrepareThreads = 256, kPrepareRowsPerBlock = kPrepareThreads / kPrepareLanes;

template <class T>
__global__ void __launch_bounds__(kPrepareThreads) bwd_prepare_kernel(const AttentionBwdParams p, float* delta,
                                                                      float* lse2) {
  ptx::griddep_wait();  // launched overlapping (launch.cuh): out, dout and the lists' zeroing first
  ptx::griddep_launch_dependents();
  const AttentionFwdParams& f = p.f;
  const int sub = threadIdx.x % kPrepareLanes;
  const int i = blockIdx.x * kPrepareRowsPerBlock + threadIdx.x / kPrepareLanes;
  if (i >= p.Sq_pad) return;  // whole row groups: the shuffles below see whole groups
  const uint32_t group = 0xffffu << (threadIdx.x % 32 / kPrepareLanes * kPrepareLanes);
  for (int b = blockIdx.z; b < f.B; b += gridDim.z) {  // loops only past 65535 batches or heads
    for (int h = blockIdx.y; h < f.H; h += gridDim.y) {
      const int64_t row = (int64_t(b) * f.H + h) * p.Sq_pad + i;
      if (i >= f.Sq) {
        if (sub == 0) delta[row] = 0.f, lse2[row] = INFINITY;
        continue;
      }
      const T* o = static_cast<const T*>(f.out) + b * f.out_stride[0] + i * f.out_stride[1] + h * f.out_stride[2];
      const T* d_o = static_cast<const T*>(p.dout) + b * p.dout_stride[0] + i * p.dout_stride[1] + h * p.dout_stride[2];
      float sum = 0.f;
      uint32_t d_o_bits = 0;  // dO's bits but the signs: 0 iff the row's dO is all zeros
      for (int d = sub * 8; d < f.D; d += kPrepareLanes * 8) {
        const uint4 g = *reinterpret_cast<const uint4*>(d_o + d);
        sum += dot8<T>(*reinterpret_cast<const uint4*>(o + d), g);
        d_o_bits |= (g.x | g.y | g.z | g.w) & 0x7fff7fffu;
      }
#pragma unroll
      for (int off = kPrepareLanes / 2; off >= 1; off /= 2) {
        sum += __shfl_xor_sync(group, sum, off);
        d_o_bits |= __shfl_xor_sync(group, d_o_bits, off);
      }
      if (sub == 0) {
        const float lse = f.lse[b * f.lse_stride[0] + h * f.lse_stride[1] + i * f.lse_stride[2]];
        delta[row] = sum;
        // Past kFusedExponentLimit the float lse cannot carry the row's probabilities (its own
        // rounding moves them by a factor of e^(ulp / 2) or more, on every backend) and the fused
        // exponent's rounding of lse2 puts 0 or inf in them. A row whose dO is all zeros (a
        // padded query's, whose loss is masked) gives exactly zero gradients whatever its
        // probabilities: +inf, as for a row that saw nothing. Any other such row gets NaN, so
        // that every gradient it reaches says so rather than holding a wrong finite value.
        // A NaN lse (the forward's NaN rows) stays NaN.
        const float l2 = lse * 1.4426950408889634f;
        const bool fused = fabsf(l2) < kFusedExponentLimit;
        lse2[row] = lse == -INFINITY ? INFINITY : fused || isnan(l2) ? l2 : d_o_bits == 0 ? INFINITY : NAN;
      }
    }
  }
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
  return launch_kernel(p.f.overlap_previous, bwd_prepare_kernel<T>, grid, kPrepareThreads, 0, stream, p, p.delta, p.lse2);
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
