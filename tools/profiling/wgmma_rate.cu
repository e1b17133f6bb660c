// How fast the tensor core runs the forward's wgmmas, alone and beside the work a forward puts
// around them: chains of m64nNk16 (bf16 in, fp32 accumulate) in the shapes the warp-specialized
// forward issues, S = Q K^T with both operands in shared memory (SS, K-major) and O += P V with P
// in registers and V N-major (RS), from one CTA an SM of one or two warp groups. Each group
// issues a chain of 8 wgmmas into one accumulator (a 128-deep product), commits, waits, and
// starts again. Ways:
//   one group, two groups;
//   ping-pong: the groups hand the turn to issue to each other with named barriers, as the
//     forward does;
//   two chains: the wgmmas of two accumulators alternate in one group;
//   S then P V: a forward step's order, an SS chain committed, an RS chain committed, then the
//     wait for each (one group, and ping-pong);
//   beside exp2, beside FMAs: group 1 runs a softmax's exponentials (multiply-add, ex2, add) or
//     multiply-adds over 64 registers a thread without a break while group 0 times its chains;
//   exp2 alone, FMAs alone: the same load with group 0 asleep, for its own pace.
// Operands are zeros, or with the argument `random` bf16 values in [-2, 2). Prints, per shape and
// way, the SM clocks a wgmma took (median over the CTAs of group 0's loop) against the nominal
// rate of 2048 multiply-adds a clock an SM (N / 2 clocks for m64nNk16), the TF/s of the whole
// grid, the SM clock over the kernel's time, and group 1's clocks a pass of its ALU load.
//   nvcc -std=c++17 -O3 -arch=sm_90a -Isrc -Iinclude -o /tmp/wgr tools/profiling/wgmma_rate.cu
//   /tmp/wgr [random]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
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
enum Way {
  kOneGroup,
  kTwoGroups,
  kPingPong,
  kTwoChains,
  kBesideExp,
  kBesideFma,
  kSThenPv,
  kSThenPvPingPong,
  kExpAlone,
  kFmaAlone
};
constexpr const char* kWayNames[] = {"one group",  "two groups", "ping-pong",  "two chains",
                                     "beside exp2", "beside FMAs", "S then P V", "S then P V, ping-pong",
                                     "exp2 alone",  "FMAs alone"};
#define WAY_FN __host__ __device__ constexpr
WAY_FN bool alu_load(int w) { return w == kBesideExp || w == kBesideFma || w == kExpAlone || w == kFmaAlone; }
WAY_FN bool exp_load(int w) { return w == kBesideExp || w == kExpAlone; }
WAY_FN bool alone(int w) { return w == kExpAlone || w == kFmaAlone; }
WAY_FN bool ping_pong(int w) { return w == kPingPong || w == kSThenPvPingPong; }
WAY_FN bool s_then_pv(int w) { return w == kSThenPv || w == kSThenPvPingPong; }
WAY_FN int chains(int w) { return w == kTwoChains || s_then_pv(w) ? 2 : 1; }        // group 0's accumulators
WAY_FN int wgmma_groups(int w) { return w == kTwoGroups || ping_pong(w) ? 2 : 1; }  // groups issuing wgmmas
WAY_FN int threads(int w) { return w == kOneGroup || w == kTwoChains || w == kSThenPv ? 128 : 256; }
#undef WAY_FN

// Shared memory: A (64 rows x 128 columns, two 64-column swizzled blocks) at 0, B after it
// (kN rows x 128 columns K-major for SS; 128 rows x kN columns N-major for RS), zeros or random.
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
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(int iters, bool random, unsigned* cycles, float* sink) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = fdma::cuda::aligned_smem<1024>(smem_raw);
  // Random operands draw more power than zeros; the tensor core's pace may depend on it.
  auto value = [&](unsigned i) -> uint32_t {
    if (!random) return 0u;
    const unsigned h = (i * 2654435761u) ^ (i >> 13) ^ (blockIdx.x * 40503u);
    const T lo = __float2bfloat16(float(int(h & 0xff) - 128) / 64.f);
    const T hi = __float2bfloat16(float(int((h >> 8) & 0xff) - 128) / 64.f);
    return uint32_t(__bfloat16_as_ushort(lo)) | uint32_t(__bfloat16_as_ushort(hi)) << 16;
  };
  for (int i = threadIdx.x; i < (kSmem - 2048) / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(value(4 * i), value(4 * i + 1), value(4 * i + 2), value(4 * i + 3));
  wgmma::fence_proxy_async_smem();
  __syncthreads();
  const int group = threadIdx.x / 128;
  volatile int* done = reinterpret_cast<volatile int*>(smem + kSmem - 2048);
  if (threadIdx.x == 0) *done = 0;
  __syncthreads();
  if (alu_load(kWay) && group == 1) {  // the ALU load, until group 0 is done; its clocks a pass x 100
    unsigned a0 = 0, a1 = 0, passes = 0;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(a0)::"memory");
    float v[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) v[i] = float(threadIdx.x + i) * 1e-3f;
    float sum = 0.f;
    while (!*done) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        if constexpr (exp_load(kWay))
          v[i] = ptx::exp2_approx(fmaf(v[i], 0.5f, -0.25f));
        else
          v[i] = fmaf(v[i], 0.999f, fmaf(v[i], v[i], 1e-3f));
        sum += v[i];
      }
      ++passes;
    }
    asm volatile("mov.u32 %0, %%clock;" : "=r"(a1)::"memory");
    if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + 1] = 100ull * (a1 - a0) / (passes ? passes : 1);
    if (sum == 12345.f) sink[threadIdx.x] = sum;
    return;
  }
  if constexpr (alone(kWay)) {  // group 0 sleeps about as long as a chain loop
    for (int it = 0; it < iters; ++it) __nanosleep(400);
    __syncwarp();
    if (threadIdx.x == 0) *done = 1;
    return;
  }
  const uint32_t a = ptx::smem_addr(smem), b = a + 64 * 128 * 2;
  uint32_t p[kChain][4];
#pragma unroll
  for (int kk = 0; kk < kChain; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) p[kk][j] = value(1000003u * threadIdx.x + 4 * kk + j);
  float x[kN / 8][4] = {}, y[kN / 8][4] = {};
  constexpr bool kPing = ping_pong(kWay), kStep = s_then_pv(kWay);
  if (kPing && group == 1) ptx::named_barrier_arrive<1, 256>();  // group 0 goes first
  unsigned t0 = 0;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t0)::"memory");
  for (int it = 0; it < iters; ++it) {
    if constexpr (kPing) {
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
    if constexpr (kStep) {
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kChain; ++kk) issue_one<kN, true>(y, p, a, b, kk);
      wgmma::commit_group();
    }
    if constexpr (kPing) {
      if (group == 0)
        ptx::named_barrier_arrive<2, 256>();
      else if (it + 1 < iters)
        ptx::named_barrier_arrive<1, 256>();
    }
    if constexpr (kStep) {
      wgmma::wait_group<1>();
      wgmma::fence_operands(x);
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(x);
    if constexpr (kWay == kTwoChains || kStep) wgmma::fence_operands(y);
  }
  unsigned t1 = 0;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t1)::"memory");
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + group] = t1 - t0;
  if (threadIdx.x == 0) *done = 1;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) s += x[i][0] + y[i][1];
  if (s == 12345.f) sink[threadIdx.x] = s;  // keeps the products (almost never written)
}

template <int kN, bool kRs, int kWay>
int measure_way(int sms, bool random, unsigned* d_cycles, float* d_sink) {
  auto kernel = wgmma_rate_kernel<kN, kRs, kWay>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int iters = 4096;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  kernel<<<sms, threads(kWay), kSmem>>>(16, random, d_cycles, d_sink);  // warm-up
  CHECK(cudaEventRecord(e0));
  kernel<<<sms, threads(kWay), kSmem>>>(iters, random, d_cycles, d_sink);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  std::vector<unsigned> cyc(2 * sms);
  CHECK(cudaMemcpy(cyc.data(), d_cycles, cyc.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
  std::vector<unsigned> g0, g1;
  for (int i = 0; i < sms; ++i) g0.push_back(cyc[2 * i]), g1.push_back(cyc[2 * i + 1]);
  std::nth_element(g0.begin(), g0.begin() + sms / 2, g0.end());
  std::nth_element(g1.begin(), g1.begin() + sms / 2, g1.end());
  char alu[32] = "-";
  if (alu_load(kWay)) std::snprintf(alu, sizeof alu, "%.0f", g1[sms / 2] / 100.0);
  const double wgmmas = double(iters) * kChain * chains(kWay);  // group 0's
  const double flops = 2.0 * 64 * kN * 16 * wgmmas * wgmma_groups(kWay) * sms;
  if (alone(kWay))
    std::printf("| - | %s | - | - | - | - | - | %s |\n", kWayNames[kWay], alu);
  else
    std::printf("| %s m64n%dk16 | %s | %s | %.1f | %d | %.0f | %.0f | %s |\n", kRs ? "RS" : "SS", kN, kWayNames[kWay],
                random ? "random" : "zeros", g0[sms / 2] / wgmmas, kN / 2, flops / (ms * 1e-3) / 1e12,
                g0[sms / 2] / (ms * 1e3), alu);
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return 0;
}

// Every way; two chains only where both accumulators fit a thread's registers; S then P V on
// the SS rows up to 128 wide.
template <int kN, bool kRs>
int measure(int sms, bool random, unsigned* d_cycles, float* d_sink) {
  int rc = measure_way<kN, kRs, kOneGroup>(sms, random, d_cycles, d_sink);
  rc |= measure_way<kN, kRs, kTwoGroups>(sms, random, d_cycles, d_sink);
  rc |= measure_way<kN, kRs, kPingPong>(sms, random, d_cycles, d_sink);
  if constexpr (kN <= 176) rc |= measure_way<kN, kRs, kTwoChains>(sms, random, d_cycles, d_sink);
  rc |= measure_way<kN, kRs, kBesideExp>(sms, random, d_cycles, d_sink);
  rc |= measure_way<kN, kRs, kBesideFma>(sms, random, d_cycles, d_sink);
  if constexpr (!kRs && kN <= 128) {  // S (SS, kN keys) then P V (RS, kN = D columns)
    rc |= measure_way<kN, kRs, kSThenPv>(sms, random, d_cycles, d_sink);
    rc |= measure_way<kN, kRs, kSThenPvPingPong>(sms, random, d_cycles, d_sink);
  }
  return rc;
}

int main(int argc, char** argv) {
  const bool random = argc > 1 && std::string(argv[1]) == "random";  // operands: zeros unless asked
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* d_cycles = nullptr;
  float* d_sink = nullptr;
  CHECK(cudaMalloc(&d_cycles, 2 * sms * sizeof(unsigned)));
  CHECK(cudaMalloc(&d_sink, 256 * sizeof(float)));
  std::printf(
      "| wgmma | way | operands | clocks a wgmma (group 0) | nominal | TF/s (grid) | SM MHz "
      "| ALU clocks a pass (group 1) |\n|---|---|---|---|---|---|---|---|\n");
  int rc = 0;
  rc |= measure_way<64, false, kExpAlone>(sms, random, d_cycles, d_sink);
  rc |= measure_way<64, false, kFmaAlone>(sms, random, d_cycles, d_sink);
  rc |= measure<64, false>(sms, random, d_cycles, d_sink);
  rc |= measure<128, false>(sms, random, d_cycles, d_sink);
  rc |= measure<176, false>(sms, random, d_cycles, d_sink);
  rc |= measure<64, true>(sms, random, d_cycles, d_sink);
  rc |= measure<128, true>(sms, random, d_cycles, d_sink);
  rc |= measure<256, true>(sms, random, d_cycles, d_sink);
  return rc;
}
