// The backward's prepare, one query row at a time: delta = rowsum(dO * O) in fp32 and lse2 =
// lse * log2(e) (+inf for a row that saw nothing and for the padding rows up to Sq_pad), so the
// main kernels get P = exp2(s * log2(e) - lse2) with no special cases. Shared by the prepare
// kernel (attention_bwd_aux.cu) and the dynamic-mask backward's setup launch (bwd_setup.cu),
// which does it on CTAs of its own beside its latency-bound sort, one launch fewer in the chain.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/primitives/mixed_radix_walk.cuh"
#include "cuda/primitives/softmax_sm80.cuh"  // kFusedExponentLimit

namespace fdma::cuda {

// What the prepare reads and writes of a call.
struct BwdPrepareRows {
  const void *out = nullptr, *dout = nullptr;
  const float* lse = nullptr;
  int64_t out_stride[3] = {}, dout_stride[3] = {}, lse_stride[3] = {};  // (batch, seq, head); lse (b, h, i)
  float *delta = nullptr, *lse2 = nullptr;                              // [B, H, Sq_pad]; null: nothing to do
  int B = 0, H = 0, Sq = 0, Sq_pad = 0, D = 0;
  bool bf16 = true;
};

inline BwdPrepareRows bwd_prepare_rows(const AttentionBwdParams& p, bool bf16) {
  BwdPrepareRows r;
  r.out = p.f.out, r.dout = p.dout, r.lse = p.f.lse;
  for (int i = 0; i < 3; ++i)
    r.out_stride[i] = p.f.out_stride[i], r.dout_stride[i] = p.dout_stride[i], r.lse_stride[i] = p.f.lse_stride[i];
  r.delta = p.delta, r.lse2 = p.lse2;
  r.B = p.f.B, r.H = p.f.H, r.Sq = p.f.Sq, r.Sq_pad = p.Sq_pad, r.D = p.f.D;
  r.bf16 = bf16;
  return r;
}

// The prepare kernel's lanes a row (prepare_row), each taking 16-byte pieces of O and dO (rows
// are 16-byte aligned and D % 8 == 0: validated).
constexpr int kPrepareLanes = 16;

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

// A row's loads for one lane of its group of kLanes: its kPieces 16-byte pieces of O and dO,
// kLanes * 8 elements apart, and, on the group's first lane, the row's lse.
template <int kPieces>
struct PrepareLoads {
  uint4 o[kPieces], g[kPieces];
  float lse;
};
template <class T, int kPieces, int kLanes = kPrepareLanes>
__device__ __forceinline__ void prepare_load(const BwdPrepareRows& p, int b, int h, int i, int sub,
                                             PrepareLoads<kPieces>& x) {
  if (i >= p.Sq) return;
  const T* o = static_cast<const T*>(p.out) + b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
  const T* d_o = static_cast<const T*>(p.dout) + b * p.dout_stride[0] + i * p.dout_stride[1] + h * p.dout_stride[2];
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int d = sub * 8 + k * kLanes * 8;
    if (d < p.D) {
      x.o[k] = *reinterpret_cast<const uint4*>(o + d);
      x.g[k] = *reinterpret_cast<const uint4*>(d_o + d);
    }
  }
  if (sub == 0) x.lse = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
}

// Row i of (b, h) from its loads, by the kLanes lanes of `group` (a warp's mask of them;
// sub: this lane's place among them). Every lane of the group calls it for the same row.
template <class T, int kPieces, int kLanes = kPrepareLanes>
__device__ __forceinline__ void prepare_finish(const BwdPrepareRows& p, int b, int h, int i, int sub, uint32_t group,
                                               const PrepareLoads<kPieces>& x) {
  const int64_t row = (int64_t(b) * p.H + h) * p.Sq_pad + i;
  if (i >= p.Sq) {
    if (sub == 0) p.delta[row] = 0.f, p.lse2[row] = INFINITY;
    return;
  }
  float sum = 0.f;
  uint32_t d_o_bits = 0;  // dO's bits but the signs: 0 iff the row's dO is all zeros
#pragma unroll
  for (int k = 0; k < kPieces; ++k)
    if (sub * 8 + k * kLanes * 8 < p.D) {
      sum += dot8<T>(x.o[k], x.g[k]);
      d_o_bits |= (x.g[k].x | x.g[k].y | x.g[k].z | x.g[k].w) & 0x7fff7fffu;
    }
#pragma unroll
  for (int off = kLanes / 2; off >= 1; off /= 2) {
    sum += __shfl_xor_sync(group, sum, off);
    d_o_bits |= __shfl_xor_sync(group, d_o_bits, off);
  }
  if (sub == 0) {
    const float lse = x.lse;
    p.delta[row] = sum;
    // Past kFusedExponentLimit the float lse cannot carry the row's probabilities (its own
    // rounding moves them by a factor of e^(ulp / 2) or more, on every backend) and the fused
    // exponent's rounding of lse2 puts 0 or inf in them. A row whose dO is all zeros (a
    // padded query's, whose loss is masked) gives exactly zero gradients whatever its
    // probabilities: +inf, as for a row that saw nothing. Any other such row gets NaN, so
    // that every gradient it reaches says so rather than holding a wrong finite value.
    // A NaN lse (the forward's NaN rows) stays NaN.
    const float l2 = lse * 1.4426950408889634f;
    const bool fused = fabsf(l2) < kFusedExponentLimit;
    p.lse2[row] = lse == -INFINITY ? INFINITY : fused || isnan(l2) ? l2 : d_o_bits == 0 ? INFINITY : NAN;
  }
}

// The whole row (D <= 256, validated with the call).
template <class T>
__device__ __forceinline__ void prepare_row(const BwdPrepareRows& p, int b, int h, int i, int sub, uint32_t group) {
  PrepareLoads<2> x;
  prepare_load<T>(p, b, h, i, sub, x);
  prepare_finish<T>(p, b, h, i, sub, group, x);
}

// Rows of every (batch, head), grid-strided: this thread's first lane index and the stride,
// multiples of the lanes a row apart so that a row's lanes stay together. A few CTAs an SM walk
// every row here (the setup launch), which is bound by the instructions it issues, not by
// memory (docs/performance.md, "setup launch"): so each lane takes two 16-byte pieces of a row
// (8 lanes a row up to D = 128, 16 past it), half the lanes paying a row's fixed cost (its
// address, lse, shuffles and stores) of sixteen lanes with a piece each. A row's (b, h, i)
// advances by the stride with no division a row (MixedRadixWalk).
__host__ __device__ constexpr int strided_prepare_lanes(int D) { return D > 16 * 8 ? 16 : 8; }

template <class T, int kLanes>
__device__ __forceinline__ void prepare_rows_strided_as(const BwdPrepareRows& p, int64_t first, int64_t stride) {
  const int sub = int(threadIdx.x) % kLanes;
  const uint32_t group = ((1u << kLanes) - 1) << (int(threadIdx.x) % 32 / kLanes * kLanes);
  MixedRadixWalk row(first / kLanes, stride / kLanes, p.H, p.Sq_pad);  // (b, h, i)
  for (; row.outer < p.B; row.advance()) {
    PrepareLoads<2> x;
    prepare_load<T, 2, kLanes>(p, int(row.outer), row.mid, row.inner, sub, x);
    prepare_finish<T, 2, kLanes>(p, int(row.outer), row.mid, row.inner, sub, group, x);
  }
}
__device__ __forceinline__ void prepare_rows_strided(const BwdPrepareRows& p, int64_t first, int64_t stride) {
  const bool wide = strided_prepare_lanes(p.D) == 16;
  if (p.bf16 && wide)
    prepare_rows_strided_as<__nv_bfloat16, 16>(p, first, stride);
  else if (p.bf16)
    prepare_rows_strided_as<__nv_bfloat16, 8>(p, first, stride);
  else if (wide)
    prepare_rows_strided_as<__half, 16>(p, first, stride);
  else
    prepare_rows_strided_as<__half, 8>(p, first, stride);
}

}  // namespace fdma::cuda
