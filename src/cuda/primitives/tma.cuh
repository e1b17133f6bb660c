// The bulk tensor copy engine (TMA, sm_90): a tile of a tensor described by a CUtensorMap
// (built on the host, tensor_map.hpp) copied global -> shared by one thread, completing on an
// mbarrier (mbarrier.cuh) by the bytes it writes. Rows and columns outside the tensor land as
// zeros and still count. With the 128-byte swizzle the tile lands in the layout the wgmma
// descriptors read (wgmma.cuh), when its shared address is 1024-byte aligned. Also the tensor
// store back (shared -> global) and the bulk reduction of a contiguous shared range into global
// memory.
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

// The box at coordinates (c0 innermost .. c3) of a 4-D map written from shared memory at `src`
// (in the map's swizzle), by one thread; parts outside the tensor are not written. Completes in
// the issuing thread's bulk group: `src` may be overwritten after bulk_wait_group_read.
__device__ __forceinline__ void store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#endif
}

// The same box added element by element into the tensor (the map's element type; float32 adds
// are done in L2), by one thread, completing in its bulk group like store_4d.
__device__ __forceinline__ void reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) of contiguous global memory into
// shared memory at `dst`, completing on `bar` like the tensor copies: no map, for short rows.
__device__ __forceinline__ void load_bytes(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#endif
}

// *dst += src over `bytes` (a multiple of 16, both 16-byte aligned) of fp32, shared -> global,
// by one thread: the engine adds whole L2 lines, where per-thread reductions cost an L2 atomic
// per 32-byte sector. Completes in the issuing thread's bulk group.
__device__ __forceinline__ void reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Until at most N of this thread's bulk groups still read their shared source (the source may
// then be overwritten; the global writes may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}
// Until at most N of this thread's bulk groups are incomplete.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
// Orders this thread's completed bulk writes to global memory (the async proxy's) before its
// later generic accesses, such as a release that publishes them to another CTA.
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// Starts bringing the box at coordinates (c0 innermost .. c3) of a 4-D map into L2, for
// threads that will read it with ordinary loads; completes on nothing.
__device__ __forceinline__ void prefetch_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
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
