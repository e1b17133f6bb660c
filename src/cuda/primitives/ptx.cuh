// One tiny typed wrapper per PTX instruction the kernels use (sm_80+). Destination first;
// fragment layouts are documented where they are produced. They are tested through the
// kernels (tests/gpu); the Hopper ones in wgmma.cuh also alone (tests/gpu/test_wgmma_gpu.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fdma::cuda::ptx {

// Shared-memory address as the 32-bit value ldmatrix/cp.async take.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async 16 bytes global -> shared, bypassing L1. src_bytes < 16 zero-fills the rest, so
// src_bytes = 0 writes zeros: out-of-range rows and head-dim padding are predicated this way.
__device__ __forceinline__ void cp_async_16(uint32_t dst_smem, const void* src_global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem), "l"(src_global), "r"(src_bytes));
}
// Two floats to shared memory at a 32-bit shared address (8-byte aligned): an STS even where
// the compiler could not prove a generic pointer shared (a generic store there also made the
// following proxy fence a full MEMBAR).
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t x) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float x) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t x) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(x) : "memory");
}
// Loads from a shared address: for tiles whose addresses the caller computes per use (a
// swizzle's XOR), which the compiler would otherwise hoist out of the loop as registers.
__device__ __forceinline__ uint32_t ld_shared_u8(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Adds two floats to global memory (8-byte aligned) without returning the old values: one
// vector reduction on sm_90, two scalar ones before it.
__device__ __forceinline__ void red_add_f32x2(float* addr, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(addr, x);
  atomicAdd(addr + 1, y);
#endif
}
// A counter another CTA (or kernel) waits on: the add releases at GPU scope (this thread's earlier
// writes, and those it has synchronized with, are visible to whoever acquires the new value),
// and the load acquires.
__device__ __forceinline__ void red_release_gpu_add(int* addr, int x) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ int ld_acquire_gpu(const int* addr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Barrier over kThreads threads (a multiple of 32) under kId (1..15; 0 is __syncthreads),
// so warp groups of one CTA can each pipeline on their own. A constant id keeps ptxas from
// reserving all 16 barriers.
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// Arrives at barrier kId without waiting: the other side of a bar.sync over kThreads (a
// producer/consumer hand-off between warp groups).
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// The same with the id and thread count known at run time only (kernels whose groups of
// threads are sized per launch).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ldmatrix: four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m. Each
// thread receives, per matrix, the pair (row lane/4, cols 2*(lane%4) .. +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same with each 8x8 matrix transposed on the way.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A * B + D, m16n8k16, fp32 accumulators. With g = lane / 4, t = lane % 4:
//   A (16x16, row-major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B (16x8, "col"):      b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
//   C/D (16x8):           d[0..1] = (g, 2t..2t+1), d[2..3] = (g+8, 2t..2t+1)
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the special-function unit (rel. error ~2^-22); -inf -> +0, NaN -> NaN.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> one register of two 16-bit values (lo in the low half), round to nearest.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// An m16n8k16 A fragment (16 rows x 16 k) from two adjacent accumulator tiles (columns 0-7 in
// lo, 8-15 in hi), rounded to T: how P and dS go from registers into the next mma.
template <class T>
__device__ __forceinline__ void pack_a_frag(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// Programmatic dependent launch (sm_90+; nothing on older targets, whose launches never
// overlap). A kernel launched with overlap_previous (launch.cuh) may start while the previous
// kernel of its stream still runs: griddepcontrol.wait blocks until that kernel has finished
// and its writes are visible, and returns at once in a kernel launched without the attribute.
// Such a kernel calls it first thing, before any global access and any early return, so that
// its own completion still implies its predecessors'.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Lets the stream's next kernel, if launched with overlap_previous, start its CTAs now (they
// wait in griddep_wait for this kernel to finish).
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace fdma::cuda::ptx
