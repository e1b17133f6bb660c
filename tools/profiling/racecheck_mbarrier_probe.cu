// Does compute-sanitizer racecheck order shared-memory accesses through mbarriers?
//
// The gathered warp-specialized forward (attention_fwd_ws.cuh) has this shape: producer
// threads fill a two-slot ring (cp.async, then cp.async.mbarrier.arrive.noinc on the slot's
// "full" barrier), consumer threads wait on "full", read the slot with ordinary loads, and
// arrive on its "empty" barrier, which the producer waits on before refilling it. This kernel
// has the same protocol and no race by construction, in three variants: the producer writes
// with cp.async (mode 0) or with plain stores followed by mbarrier.arrive (mode 1), and every
// consumer thread arrives on "empty"; or (mode 2) as mode 0, but the consumer warp hands the
// slot back with one arrival, lane 0's after a __syncwarp.
//
// Build: nvcc -O2 -arch=sm_90a tools/profiling/racecheck_mbarrier_probe.cu -o racecheck_mbarrier_probe
// Run:   compute-sanitizer --tool racecheck ./racecheck_mbarrier_probe MODE
// The host checks the values it gets back; racecheck's summary says what it saw.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/ptx.cuh"

namespace mbar = fdma::cuda::mbar;
namespace ptx = fdma::cuda::ptx;

constexpr int kSteps = 8, kSlots = 2, kWords = 128;  // 32 producer threads x one 16-byte chunk

__global__ void ring(const int4* src, int* out, int mode) {
  __shared__ __align__(16) int4 slot[kSlots][kWords / 4];
  __shared__ __align__(8) uint64_t full[kSlots], empty[kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0)
    for (int s = 0; s < kSlots; ++s) {
      mbar::init(ptx::smem_addr(&full[s]), 32);
      mbar::init(ptx::smem_addr(&empty[s]), mode == 2 ? 1 : 32);
    }
  mbar::fence_init();
  __syncthreads();
  if (warp == 0) {  // producer
    for (int j = 0; j < kSteps; ++j) {
      const int s = j % kSlots;
      mbar::wait(ptx::smem_addr(&empty[s]), ((j / kSlots) & 1) ^ 1);
      if (mode != 1) {
        ptx::cp_async_16(ptx::smem_addr(&slot[s][lane]), src + j * 32 + lane, 16);
        mbar::arrive_on_cp_async(ptx::smem_addr(&full[s]));
      } else {
        slot[s][lane] = src[j * 32 + lane];
        mbar::arrive(ptx::smem_addr(&full[s]));
      }
    }
  } else {  // consumer: reads another lane's chunk
    int acc = 0;
    for (int j = 0; j < kSteps; ++j) {
      const int s = j % kSlots;
      mbar::wait(ptx::smem_addr(&full[s]), (j / kSlots) & 1);
      acc += slot[s][31 - lane].x;
      if (mode == 2) {
        __syncwarp();
        if (lane == 0) mbar::arrive(ptx::smem_addr(&empty[s]));
      } else {
        mbar::arrive(ptx::smem_addr(&empty[s]));
      }
    }
    out[lane] = acc;
  }
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  int4 host_src[kSteps * 32];
  for (int i = 0; i < kSteps * 32; ++i) host_src[i] = make_int4(i, 0, 0, 0);
  int4* src = nullptr;
  int* out = nullptr;
  if (cudaMalloc(&src, sizeof host_src) != cudaSuccess || cudaMalloc(&out, 32 * sizeof(int)) != cudaSuccess) return 2;
  cudaMemcpy(src, host_src, sizeof host_src, cudaMemcpyHostToDevice);
  ring<<<1, 64>>>(src, out, mode);
  int host[32];
  if (cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost) != cudaSuccess) return 2;
  int bad = 0;
  for (int l = 0; l < 32; ++l) {
    int expected = 0;
    for (int j = 0; j < kSteps; ++j) expected += j * 32 + 31 - l;
    bad += host[l] != expected;
  }
  const char* what[] = {"cp.async + arrive.noinc", "stores + arrive", "cp.async, one arrival a consumer warp"};
  std::printf("mode %d (%s): %s\n", mode, what[mode],
              bad ? "WRONG VALUES" : "values ok");
  cudaFree(src);
  cudaFree(out);
  return bad ? 1 : 0;
}
