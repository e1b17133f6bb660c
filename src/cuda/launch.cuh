// Kernel launches that may overlap the previous kernel of the stream (programmatic dependent
// launch, compute capability 9.0+). The chains of small kernels before an attention kernel
// (selection, intervals, key records, kept and tile lists) each cost a launch gap of about
// 1 us (docs/perf-notes.md); launched with overlap_previous, a kernel's CTAs can be placed
// while its predecessor finishes and wait on the GPU (ptx::griddep_wait) instead.
//
// Every kernel launched this way calls ptx::griddep_wait() before touching global memory, and
// calls ptx::griddep_launch_dependents() to let its own successor in early.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda/arch_dispatch.cuh"  // kMaxDevices

namespace fdma::cuda {

// Whether launches on the current device overlap their predecessors: a compute capability 9.0+
// GPU, and FDMA_OVERLAP_LAUNCHES=1 in the environment (off by default until measured on the
// device). Read per call, as the other path switches, so tests can run both ways.
inline bool overlap_launches() {
  const char* env = std::getenv("FDMA_OVERLAP_LAUNCHES");
  if (!env || std::strcmp(env, "1") != 0) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  if (device >= 0 && device < kMaxDevices && cached[device].load(std::memory_order_relaxed))
    return cached[device].load(std::memory_order_relaxed) == 1;
  int major = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
  cudaGetLastError();  // a failed query means no, not an error for the caller
  if (device >= 0 && device < kMaxDevices) cached[device].store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

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

}  // namespace fdma::cuda
