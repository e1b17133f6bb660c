// Dot products of 16-byte vectors of bf16/fp16, in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fdma::cuda {

// Sum of the 8 products of two 16-byte vectors of bf16/fp16, in fp32, in element order.
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

}  // namespace fdma::cuda
