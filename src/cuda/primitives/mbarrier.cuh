// Shared-memory mbarriers (sm_90): one tiny typed wrapper per PTX instruction. A producer
// arms a barrier with the bytes it expects (arrive_expect_tx), the copy engine counts them
// off as they land (tma.cuh), and consumers wait on the phase's parity; consumers hand a
// buffer back by arriving on its "empty" barrier. Addresses are shared-memory addresses
// (ptx::smem_addr) of 8-byte aligned words.
#pragma once

#include <cstdint>

namespace fdma::cuda::mbar {

// `count` arrivals complete a phase (plus, once armed, the expected transaction bytes).
__device__ __forceinline__ void init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the inits visible to the copy engine and the other threads (before a CTA barrier).
__device__ __forceinline__ void fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival once every cp.async this thread has issued so far has landed, counted against
// the barrier's init count (a producer whose copies are not tensor copies).
__device__ __forceinline__ void arrive_on_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Whether the phase of parity `parity` has completed. A fresh barrier is in phase 0, so
// parity 1 reads as completed: a producer's first wait on an empty buffer passes at once.
__device__ __forceinline__ bool try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
#endif
  return done != 0;
}
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  while (!try_wait(bar, parity)) {
  }
}

}  // namespace fdma::cuda::mbar
