// Kernel launches that may overlap the previous kernel of the stream (programmatic dependent
// launch, compute capability 9.0+). The chains of small kernels before an attention kernel
// (selection, intervals, key records, kept and tile lists) each cost a launch gap of about
// 1 us (docs/perf-notes.md); launched with overlap_previous, a kernel's CTAs can be placed
// while its predecessor finishes and wait on the GPU (ptx::griddep_wait) instead.
//
// Every kernel launched this way calls ptx::griddep_wait() before touching global memory (or, one
// that reads nothing its predecessor writes, at its end: griddep_wait_in_last_cta below), and
// calls ptx::griddep_launch_dependents() to let its own successor in early.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda/ptx.cuh"

namespace fdma::cuda {

// Whether launches on the current device overlap their predecessors: a compute capability 9.0+
// GPU, unless FDMA_OVERLAP_LAUNCHES=0 in the environment (launch.cu). Read per call, as the
// other path switches, so tests and bench/bench_switches.py can run both ways.
bool overlap_launches();

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
// overlap_previous.
template <class... Params, class... Args>
cudaError_t launch_kernel(bool overlap_previous, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (overlap_previous) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// For a kernel that reads nothing its predecessor writes and so waits for it at its end, not its
// start: only the last CTA to finish waits, so that the grid's completion still implies the
// predecessor's while every other CTA frees its SM slot at once (a CTA waiting at its end holds
// its slot, docs/perf-notes.md). `done` counts finished CTAs and is zero before the launch.
__device__ __forceinline__ void griddep_wait_in_last_cta(int32_t* done) {
  __shared__ bool last;
  __syncthreads();  // the CTA's work is done
  if (threadIdx.x == 0) last = atomicAdd(done, 1) == int32_t(gridDim.x * gridDim.y * gridDim.z - 1);
  __syncthreads();
  if (last) ptx::griddep_wait();
}

}  // namespace fdma::cuda
