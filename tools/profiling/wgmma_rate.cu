// How fast the tensor core runs the forward's wgmmas with nothing around them: chains of
// m64nNk16 (bf16 in, fp32 accumulate) in the shapes the warp-specialized forward issues, S = Q K^T
// with both operands in shared memory (SS, K-major) and O += P V with P in registers and V
// N-major (RS), from one CTA an SM of one or two warp groups. Each group issues a chain of 8
// wgmmas into one accumulator (a 128-deep product), commits, waits, and starts again; "two
// chains" alternates the wgmmas of two accumulators in one group, "ping-pong" hands the turn to
// issue between the groups with named barriers as the forward does. Operands are zeros (the
// rate does not depend on the values). Prints, per shape and way, the SM clocks a wgmma took
// (median over the CTAs of group 0's loop) against the nominal rate of 2048 multiply-adds a
// clock an SM (N / 2 clocks for m64nNk16), and the TF/s of the whole grid.
//   nvcc -std=c++17 -O3 -arch=sm_90a -Isrc -Iinclude -o /tmp/wgr tools/profiling/wgmma_rate.cu
//   /tmp/wgr
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"  // aligned_smem
#include "cuda/primitives/wgmma.cuh"
#include "cuda_check.h"

namespace wgmma = fdma::cuda::wgmma;
namespace ptx = fdma::cuda::ptx;
using T = __nv_bfloat16;

constexpr int kChain = 8;       // wgmmas a chain: 128 deep
constexpr int kSmem = 200 * 1024;  // one CTA an SM
enum Way { kOneGroup, kTwoGroups, kPingPong, kTwoChains };

// Shared memory: A (64 rows x 128 columns, two 64-column swizzled blocks) at 0, B after it
// (kN rows x 128 columns K-major for SS; 128 rows x kN columns N-major for RS), all zeros.
// The chain's wgmma kk into acc.
template <int kN, bool kRs>
__device__ __forceinline__ void issue_one(float (&acc)[kN / 8][4], const uint32_t (&p)[kChain][4], uint32_t a,
                                          uint32_t b, int kk) {
  if constexpr (kRs) {
    const uint64_t b_desc = wgmma::desc_n_major(b, 128 * wgmma::kSwizzleRowBytes);
    wgmma::mma_rs_n_major<T, kN>(acc, p[kk], wgmma::desc_advance(b_desc, kk * 16 * wgmma::kSwizzleRowBytes), 1);
  } else {
    const uint32_t col = (kk % 4) * 32;
    wgmma::mma_ss<T, kN>(acc, wgmma::desc_k_major(a + (kk / 4) * 64 * 128 + col),
                         wgmma::desc_advance(wgmma::desc_k_major(b), (kk / 4) * kN * 128 + col), 1);
  }
}

template <int kN, bool kRs, int kWay>
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(int iters, unsigned* cycles, float* sink) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = fdma::cuda::aligned_smem<1024>(smem_raw);
  for (int i = threadIdx.x; i < (kSmem - 2048) / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  wgmma::fence_proxy_async_smem();
  __syncthreads();
  const int group = threadIdx.x / 128;
  const uint32_t a = ptx::smem_addr(smem), b = a + 64 * 128 * 2;
  uint32_t p[kChain][4] = {};
  float x[kN / 8][4] = {}, y[kN / 8][4] = {};
  if (kWay == kPingPong && group == 1) ptx::named_barrier_arrive<1, 256>();  // group 0 goes first
  unsigned t0 = 0;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t0)::"memory");
  for (int it = 0; it < iters; ++it) {
    if constexpr (kWay == kPingPong) {
      if (group == 0)
        ptx::named_barrier_sync<1, 256>();
      else
        ptx::named_barrier_sync<2, 256>();
    }
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kChain; ++kk) {  // two chains: their wgmmas alternate
      issue_one<kN, kRs>(x, p, a, b, kk);
      if constexpr (kWay == kTwoChains) issue_one<kN, kRs>(y, p, a, b, kk);
    }
    wgmma::commit_group();
    if constexpr (kWay == kPingPong) {
      if (group == 0)
        ptx::named_barrier_arrive<2, 256>();
      else if (it + 1 < iters)
        ptx::named_barrier_arrive<1, 256>();
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(x);
    if constexpr (kWay == kTwoChains) wgmma::fence_operands(y);
  }
  unsigned t1 = 0;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t1)::"memory");
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + group] = t1 - t0;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) s += x[i][0] + y[i][1];
  if (s != 0.f) sink[threadIdx.x] = s;  // keeps the products (zeros: never written)
}

template <int kN, bool kRs, int kWay>
int measure_way(int sms, unsigned* d_cycles, float* d_sink) {
  auto kernel = wgmma_rate_kernel<kN, kRs, kWay>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const char* names[] = {"one group", "two groups", "ping-pong", "two chains"};
  const int iters = 4096, threads = kWay == kTwoGroups || kWay == kPingPong ? 256 : 128;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  kernel<<<sms, threads, kSmem>>>(16, d_cycles, d_sink);  // warm-up
  CHECK(cudaEventRecord(e0));
  kernel<<<sms, threads, kSmem>>>(iters, d_cycles, d_sink);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  std::vector<unsigned> cyc(2 * sms);
  CHECK(cudaMemcpy(cyc.data(), d_cycles, cyc.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
  std::vector<unsigned> g0;
  for (int i = 0; i < sms; ++i) g0.push_back(cyc[2 * i]);
  std::nth_element(g0.begin(), g0.begin() + sms / 2, g0.end());
  const int chains = kWay == kTwoChains ? 2 : 1, groups = threads / 128;
  const double wgmmas = double(iters) * kChain * chains;  // group 0's
  const double flops = 2.0 * 64 * kN * 16 * wgmmas * groups * sms;
  std::printf("| %s m64n%dk16 | %s | %.1f | %d | %.0f |\n", kRs ? "RS" : "SS", kN, names[kWay], g0[sms / 2] / wgmmas,
              kN / 2, flops / (ms * 1e-3) / 1e12);
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return 0;
}

// Every way; two chains only where both accumulators fit a thread's registers.
template <int kN, bool kRs>
int measure(int sms, unsigned* d_cycles, float* d_sink) {
  int rc = measure_way<kN, kRs, kOneGroup>(sms, d_cycles, d_sink);
  rc |= measure_way<kN, kRs, kTwoGroups>(sms, d_cycles, d_sink);
  rc |= measure_way<kN, kRs, kPingPong>(sms, d_cycles, d_sink);
  if constexpr (kN <= 176) rc |= measure_way<kN, kRs, kTwoChains>(sms, d_cycles, d_sink);
  return rc;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* d_cycles = nullptr;
  float* d_sink = nullptr;
  CHECK(cudaMalloc(&d_cycles, 2 * sms * sizeof(unsigned)));
  CHECK(cudaMalloc(&d_sink, 256 * sizeof(float)));
  std::printf("| wgmma | way | clocks a wgmma (group 0) | nominal | TF/s (grid) |\n|---|---|---|---|---|\n");
  int rc = 0;
  rc |= measure<64, false>(sms, d_cycles, d_sink);
  rc |= measure<128, false>(sms, d_cycles, d_sink);
  rc |= measure<176, false>(sms, d_cycles, d_sink);
  rc |= measure<64, true>(sms, d_cycles, d_sink);
  rc |= measure<128, true>(sms, d_cycles, d_sink);
  rc |= measure<256, true>(sms, d_cycles, d_sink);
  return rc;
}
