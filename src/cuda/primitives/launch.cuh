// Kernel launches that may overlap the previous kernel of the stream (programmatic dependent
// launch, compute capability 9.0+). The chains of small kernels before an attention kernel
// (selection, intervals, key records, kept and tile lists) each cost a launch gap of about
// 1 us (docs/performance.md, "key lists"); launched with overlap_previous, a kernel's CTAs can be placed
// while its predecessor finishes and wait on the GPU (ptx::griddep_wait) instead.
//
// Every kernel launched this way calls ptx::griddep_wait() before touching global memory, and
// calls ptx::griddep_launch_dependents() to let its own successor in early. One exception: the
// fused backward's finish kernel (dma/bwd_ws_finish.cu) waits instead on counters that the
// kernel before it releases as it goes, and calls griddep_wait() last.
#pragma once

#include <cuda_runtime.h>

#include <utility>

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

}  // namespace fdma::cuda
