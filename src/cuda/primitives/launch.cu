// overlap_launches() (launch.cuh): out of line, so that changing the switch rebuilds one file
// rather than every kernel.
#include "cuda/primitives/launch.cuh"

#include <atomic>

#include "cuda/primitives/arch_dispatch.cuh"  // kMaxDevices
#include "cuda/primitives/path_switches.hpp"

namespace fdma::cuda {

bool overlap_launches() {
  if (!overlap_launches_allowed()) return false;
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

}  // namespace fdma::cuda
