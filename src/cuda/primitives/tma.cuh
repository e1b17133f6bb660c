// The bulk tensor copy engine (TMA, sm_90): a tile of a tensor described by a CUtensorMap
// (built on the host, tensor_map.hpp) copied global -> shared by one thread, completing on an
// mbarrier (mbarrier.cuh) by the bytes it writes. Rows and columns outside the tensor land as
// zeros and still count. With the 128-byte swizzle the tile lands in the layout the wgmma
// descriptors read (wgmma.cuh), when its shared address is 1024-byte aligned.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fdma::cuda::tma {

// Box at coordinates (c0 innermost .. c3) of a 4-D map into shared memory at `dst`.
__device__ __forceinline__ void load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                        int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}

// Box at coordinates (c0 innermost .. c2) of a 3-D map into shared memory at `dst`.
__device__ __forceinline__ void load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// Brings the map's 128 bytes into the copy engine's cache ahead of the first copy.
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

}  // namespace fdma::cuda::tma
