// Inclusive prefix sum across the 32 lanes of a warp (all lanes take part): the step of the
// block scans in the selection and key-list kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fdma::cuda {

__device__ __forceinline__ int32_t warp_inclusive_sum(int32_t v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int32_t t = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += t;
  }
  return v;
}

}  // namespace fdma::cuda
