// Does compute-sanitizer racecheck order accesses across a __syncthreads when the two warp
// groups before it ran different numbers of their own named barriers?
//
// The dk/dv kernel (attention_bwd.cuh) has this shape: two groups of 128 threads each sync on
// their own named barrier (bar.sync 1 / 2, 128) once per step, with as many steps as their
// share of active tiles, then group 1 hands its sums to group 0 through shared memory between
// two CTA-wide barriers. racecheck reports hazards on that hand-off only when the groups took
// different step counts (docs/hardening.md, "racecheck and named barriers"). This kernel has the same shape
// and no race by construction: every shared word is written and read by one thread, or passed
// from group 1 to group 0 across a __syncthreads.
//
// Build: nvcc -O2 -arch=sm_90a tools/profiling/racecheck_probe.cu -o racecheck_probe
// Run:   compute-sanitizer --tool racecheck ./racecheck_probe STEPS0 STEPS1
// The host checks the values it gets back; racecheck's summary says what it saw.
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

template <int kId>
__device__ __forceinline__ void group_barrier() {
  asm volatile("bar.sync %0, 128;\n" ::"n"(kId) : "memory");
}

__global__ void handoff_after_uneven_steps(float* out, int steps0, int steps1) {
  __shared__ float work[2][128];  // each group's own scratch; group 0's also receives the hand-off
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int steps = wg == 0 ? steps0 : steps1;
  float acc = 0.f;
  for (int s = 0; s < steps; ++s) {
    work[wg][tid] = float(s + tid);  // written by one thread of the group ...
    if (wg == 0) group_barrier<1>(); else group_barrier<2>();
    acc += work[wg][127 - tid];      // ... read by another thread of the same group
    if (wg == 0) group_barrier<1>(); else group_barrier<2>();
  }
  __syncthreads();  // both groups are done with their scratch
  if (wg == 1) work[0][tid] = acc;
  __syncthreads();  // group 1's sums are in place
  if (wg == 1) return;
  out[tid] = acc + work[0][tid];
}

int main(int argc, char** argv) {
  const int steps0 = argc > 1 ? atoi(argv[1]) : 3, steps1 = argc > 2 ? atoi(argv[2]) : 3;
  float* out = nullptr;
  if (cudaMalloc(&out, 128 * sizeof(float)) != cudaSuccess) return 2;
  handoff_after_uneven_steps<<<1, 256>>>(out, steps0, steps1);
  float host[128];
  if (cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost) != cudaSuccess) return 2;
  // Each group's sum over its steps of (s + 127 - tid).
  auto expected = [](int steps, int tid) {
    float a = 0.f;
    for (int s = 0; s < steps; ++s) a += float(s + 127 - tid);
    return a;
  };
  int bad = 0;
  for (int t = 0; t < 128; ++t) bad += host[t] != expected(steps0, t) + expected(steps1, t);
  std::printf("steps %d / %d: %s\n", steps0, steps1, bad ? "WRONG VALUES" : "values ok");
  cudaFree(out);
  return bad ? 1 : 0;
}
